"""Our full GRPO rollout step (generate + score + train) against TRL's ``GRPOTrainer`` with
matched settings, on the built-in presets. Target: our throughput at least 2x TRL's.

    uv run python bench/grpo_vs_trl.py                 # tiny and small, ~6 min (one torch thread)
    uv run python bench/grpo_vs_trl.py --quick         # tiny only, short runs, < 1 min
    uv run python bench/grpo_vs_trl.py --models tiny,small --steps 3 --rounds 3
    uv run python bench/grpo_vs_trl.py --threads 2     # both cores; only on an idle machine

Matched: the model (a preset loaded by trainers.core.models, fp32 on the CPU, sdpa attention), the
prompts (our reasoning-gym ``spell_backward`` prompts, chat-templated by the same tokenizer; TRL
gets the same messages as a dataset of {"prompt", "answer", "prompt_index"} in the order our
prompt stream serves them, unshuffled, so step k of both sees the same prompts), the reward
(trainers.core.verifier.compute_rewards, correctness + 0.5·format, wrapped in TRL's
reward-function signature), the group size (num_generations = num_rollouts), the completion
length (max_completion_length = max_new_tokens), sampling (temperature 1.0, top_p 1.0, top_k off,
KV cache, the same end-of-turn ids; ours samples with trainers/core/decoding.py, TRL with
``model.generate``), β = 0 (no reference model), one optimizer step per rollout
step (TRL num_iterations 1 and generation batch = micro-batch × accumulation; ours
updates_per_rollout 1 with the whole rollout batch in one optimizer step, so neither runs a π_old
forward), the loss aggregation (ours ``seq_mean_token_mean`` = TRL ``loss_type="grpo"``: each
sequence's token mean, averaged over the step's sequences), group-std advantages (TRL
scale_rewards="group"), ε 0.2, AdamW at the same constant learning rate, max_grad_norm 1.0,
gradient checkpointing off. No evaluation, checkpoints, logging backends or vLLM.

Measured per optimizer step (= rollout step), warm-up steps left out: wall time, process CPU
time, completion tokens (end-of-turn token included) and the phases. Our wall phases are the
trainer's own ``timing/*`` in metrics.jsonl; TRL's come from wrapping its methods on the trainer
instance: generation = ``_generate`` (tokenise, ``model.generate``, decode), scoring =
``_calculate_rewards``, prepare = the rest of ``_generate_and_score_completions`` (padding,
advantages, its logging), training = the rest of the step (log-prob forward, loss, backward,
clip, optimizer step); CPU seconds come from the same kind of wrappers on both. Contenders run in
alternating order (bench/_common.alternate) in this one process; throughput = completion tokens
(or steps) over the timed steps' time, median over rounds. With one torch thread (the default)
the CPU-time figures hardly move with the machine's load; wall times do (on a shared 2-core
machine, two threads each are far slower than one: OpenMP workers wait on each other).

Also: our trainer with a switch flipped (π_old recomputed by an extra forward as if the shortcut
were off; gradient checkpointing on); micro-benchmarks of the fast paths without a switch (KV
cache in generation, our sampling loop with one prefill per group against ``model.generate``,
chunked log-probs, per-micro-batch padding trim); and a loss agreement check on
one fixed rollout batch (sampled and oracle-written completions, scored by our reward): our loss
(the trainer's micro-batch path; losses.py + advantages.py with a perturbed π_old) against TRL's
own ``GRPOTrainer._compute_loss``, loss value and gradient, for each pair of aggregations that
coincide (seq_mean_token_mean / grpo, token_mean / dapo, seq_mean_token_sum_norm / dr_grpo).

Prints tables and writes bench/results/grpo_vs_trl.json. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import _grpo_contenders  # noqa: F401  (first: it sets the offline environment for torch)
import torch
import transformers
from _common import alternate, median_of, print_table, write_results
from _grpo_checks import (
    fast_paths,
    loss_agreement,
)
from _grpo_contenders import (
    DIFFERENCES,
    MATCHED,
    OURS,
    OURS_CKPT,
    OURS_OLD,
    PHASES,
    TARGET_RATIO,
    TRL,
    Workload,
    load_bench_prompts,
    run_ours,
    run_trl,
)

from trainers.core.models import load_causal_lm

# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def workloads(args) -> list[Workload]:
    base = dict(
        prompts_per_step=args.prompts,
        num_generations=args.generations,
        max_new_tokens=args.max_new_tokens,
        micro_batch=args.micro_batch,
        grad_accum=args.prompts * args.generations // args.micro_batch,
        timed_steps=args.steps,
        warmup_steps=args.warmup,
    )
    return [Workload(model=m, **base) for m in args.models]


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


MEDIAN_KEYS = (
    "completion_tokens_per_s",
    "steps_per_s",
    "completion_tokens_per_cpu_s",
    "completion_tokens_per_step",
    *(f"{phase}_{unit}" for phase in PHASES for unit in ("s", "cpu_s")),
)


def benchmark_model(w: Workload, rounds: int, variants: bool) -> dict[str, Any]:
    """Alternating runs of the contenders on one model; medians and ours/TRL ratios."""
    load_causal_lm(w.model, device="cpu")  # builds the preset on first use, untimed
    prompts, order = load_bench_prompts(w)
    contenders = {
        OURS: lambda: run_ours(w),
        TRL: lambda: run_trl(w, prompts, order),
    }
    if variants:
        contenders[OURS_OLD] = lambda: run_ours(w, shortcut=False)
        contenders[OURS_CKPT] = lambda: run_ours(w, checkpointing=True)
    print(f"[{w.model}] {len(contenders)} contenders x {rounds} rounds ...", flush=True)
    runs = alternate(contenders, rounds)
    medians = {
        name: {key: median_of(rows, key) for key in MEDIAN_KEYS} for name, rows in runs.items()
    }
    ours, trl = medians[OURS], medians[TRL]
    tok_ratio = ratio(ours["completion_tokens_per_s"], trl["completion_tokens_per_s"])
    cpu_ratio = ratio(ours["completion_tokens_per_cpu_s"], trl["completion_tokens_per_cpu_s"])
    return {
        "workload": asdict(w),
        "runs": runs,
        "medians": medians,
        "ratio_ours_over_trl": {
            "completion_tokens_per_s": tok_ratio,
            "steps_per_s": ratio(ours["steps_per_s"], trl["steps_per_s"]),
            "completion_tokens_per_cpu_s": cpu_ratio,
            **{
                f"{phase}_speedup": ratio(trl[f"{phase}_s"], ours[f"{phase}_s"])
                for phase in ("generate", "train", "step")
            },
        },
        "target_ratio": TARGET_RATIO,
        "target_met": bool(tok_ratio and tok_ratio >= TARGET_RATIO),
        "target_met_cpu_basis": bool(cpu_ratio and cpu_ratio >= TARGET_RATIO),
    }


def print_throughput(results: dict[str, Any], args) -> None:
    print(
        f"\nGRPO step, median over {args.rounds} alternating rounds of {args.steps} timed steps "
        f"(+{args.warmup} warm-up), {torch.get_num_threads()} torch thread(s); seconds per step; "
        f"target ours/TRL >= {TARGET_RATIO}"
    )
    rows = []
    for model, r in results.items():
        trl = r["medians"][TRL]
        for name, m in r["medians"].items():
            rows.append(
                [
                    model,
                    name,
                    m["completion_tokens_per_s"],
                    m["steps_per_s"],
                    ratio(m["completion_tokens_per_s"], trl["completion_tokens_per_s"]),
                    m["generate_s"],
                    m["score_s"],
                    m["prepare_s"],
                    m["train_s"],
                    m["completion_tokens_per_cpu_s"],
                    ratio(m["completion_tokens_per_cpu_s"], trl["completion_tokens_per_cpu_s"]),
                ]
            )
    print_table(
        [
            "model",
            "trainer",
            "tok/s",
            "steps/s",
            "vs TRL",
            "gen s",
            "score s",
            "prep s",
            "train s",
            "tok/CPU-s",
            "vs TRL (CPU)",
        ],
        rows,
    )
    print("(CPU-s: process CPU seconds, less sensitive to a busy machine than wall time)")
    for model, r in results.items():
        q = r["ratio_ours_over_trl"]
        verdict = {True: "met", False: "NOT met"}
        print(
            f"{model}: ours/TRL {q['completion_tokens_per_s']:.2f}x completion tokens/s, "
            f"{q['steps_per_s']:.2f}x steps/s -> {TARGET_RATIO}x target "
            f"{verdict[r['target_met']]}; CPU-time basis {q['completion_tokens_per_cpu_s']:.2f}x "
            f"-> {verdict[r['target_met_cpu_basis']]}"
        )


def print_agreement(agreement: dict[str, Any]) -> None:
    print("\nLoss agreement on one fixed batch (tiny): |ours − TRL| of the loss, relative L2")
    print("difference of the gradients (TRL's own advantages / identical advantages)")
    rows = []
    for name, r in agreement.items():
        if name == "batch":
            continue
        first, off = r["first_step"], r["perturbed_pi_old"]
        rows.append(
            [
                name,
                first["ours_loss"],
                first["loss_abs_diff"],
                first["grad_vs_trl"]["rel_l2_diff"],
                first["grad_vs_trl_with_our_advantages"]["rel_l2_diff"],
                off["ours_loss"],
                off["loss_abs_diff"],
                off["grad_vs_trl"]["rel_l2_diff"],
            ]
        )
    print_table(
        [
            "pair",
            "loss",
            "loss diff",
            "grad diff",
            "grad diff same A",
            "π_old≠π loss",
            "loss diff",
            "grad diff",
        ],
        rows,
    )


def print_fast_paths(paths: dict[str, Any], results: dict[str, Any]) -> None:
    print(f"\nFast paths ({paths['model']}; micro-benchmarks: median of {paths['repeats']})")
    rows = []
    for model, r in results.items():
        med = r["medians"]
        if OURS_OLD in med:
            trainer_variants = (
                ("skip the π_old forward", OURS_OLD, "step"),
                ("no gradient checkpointing", OURS_CKPT, "train"),
            )
            for label, replaced, phase in trainer_variants:
                fast, slow = med[OURS], med[replaced]
                rows.append(
                    [
                        f"{model}: {label} ({phase})",
                        fast[f"{phase}_s"],
                        slow[f"{phase}_s"],
                        slow[f"{phase}_s"] / fast[f"{phase}_s"],
                        slow[f"{phase}_cpu_s"] / fast[f"{phase}_cpu_s"],
                        "trainer runs",
                    ]
                )
    notes = {
        "generate_kv_cache": (
            "generate with KV cache",
            lambda p: f"{p['rows']} rows x {p['new_tokens']} new tokens",
        ),
        "chunked_logprobs": (
            "chunked log-probs (fwd+bwd)",
            lambda p: f"fp32 logits not built: {p['full_logits_mb_not_built']:.0f} MB",
        ),
        "padding_trim": (
            "trim padding per micro-batch",
            lambda p: (
                "completions "
                f"{min(p['completion_lengths'])}-{max(p['completion_lengths'])} of "
                f"{p['step_completion_width']} tokens"
            ),
        ),
        "shared_prompt_forward": (
            "one prompt forward per group (fwd+bwd)",
            lambda p: (
                f"{p['rows']} rows, {p['distinct_prompts']} prompts of {p['prompt_tokens']} tokens, "
                f"completions {p['completion_width']}"
            ),
        ),
        "drop_stopped_rows": (
            "stopped rows leave the batch",
            lambda p: (
                f"{p['rows']} rows, lengths {p['completion_lengths'][0]}-"
                f"{p['completion_lengths'][-1]} of {p['new_tokens']}"
            ),
        ),
        "sampling_loop": (
            "our sampling loop vs generate",
            lambda p: (
                f"{p['rows']} rows; prefill once x{p['prefill_once_speedup']:.2f}, "
                f"lean loop x{p['lean_loop_speedup']:.2f}; "
                f"greedy identical: {p['greedy_identical']}"
            ),
        ),
    }
    for key, (label, note) in notes.items():
        p = paths[key]
        rows.append(
            [
                label,
                p["fast"]["wall_s"],
                p["replaced"]["wall_s"],
                p["speedup_wall"],
                p["speedup_cpu"],
                note(p),
            ]
        )
    print_table(["path", "fast s", "replaced s", "speedup", "speedup (CPU)", "note"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny only, short runs (< 1 min)")
    parser.add_argument("--models", default=None, help="comma-separated presets (tiny,small)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first steps per run")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="group size G")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (0: torch's default, all cores)"
    )
    parser.add_argument(
        "--variants",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time our trainer with π_old recomputed and with gradient checkpointing "
        "(default: on, off with --quick)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    quick = args.quick
    args.models = (args.models or ("tiny" if quick else "tiny,small")).split(",")
    args.steps = args.steps or (2 if quick else 3)
    args.rounds = args.rounds or (2 if quick else 3)
    args.prompts = args.prompts or (1 if quick else 2)
    args.max_new_tokens = args.max_new_tokens or (16 if quick else 32)
    if args.variants is None:
        args.variants = not quick
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    started = time.perf_counter()

    results = {w.model: benchmark_model(w, args.rounds, args.variants) for w in workloads(args)}
    print_throughput(results, args)

    # tiny, 2 prompts x 4 generations in one micro-batch of 8, 24 new tokens
    agreement_w = Workload("tiny", 2, 4, max_new_tokens=24, micro_batch=8, grad_accum=1)
    agreement = loss_agreement(agreement_w, load_bench_prompts(agreement_w)[0])
    print_agreement(agreement)

    fast_w = workloads(args)[-1]
    paths = fast_paths(fast_w, load_bench_prompts(fast_w)[0], repeats=2 if quick else 3)
    print_fast_paths(paths, results)

    write_results(
        "grpo_vs_trl",
        {
            "quick": quick,
            "settings": {
                "models": args.models,
                "rounds": args.rounds,
                "timed_steps": args.steps,
                "warmup_steps": args.warmup,
                "torch_threads": torch.get_num_threads(),
                "matched": MATCHED,
                "differences_left": DIFFERENCES,
            },
            "results": results,
            "loss_agreement": agreement,
            "fast_paths": paths,
            "wall_s": round(time.perf_counter() - started, 1),
        },
        out=args.out,
    )


if __name__ == "__main__":
    main()
