"""DPO optimizer-step throughput: our direct-alignment trainer against TRL's DPOTrainer on the
same model, data, batch size, max length, precision (fp32 on CPU), beta, learning rate and number
of steps. Target: ours >= 2x TRL's tokens/s (wall clock, median over rounds).

    uv run python bench/dpo_vs_trl.py                     # tiny and small, 3 rounds (~5 min)
    uv run python bench/dpo_vs_trl.py --quick             # smoke run: tiny, 1 round (< 1 min)
    uv run python bench/dpo_vs_trl.py --models tiny --steps 12 --rounds 5 --threads 1
    uv run python bench/dpo_vs_trl.py --trl-ref live      # TRL's default reference handling

Models: the built-in presets `tiny` (~1M parameters) and `small` (~30M, vocabulary 16384).
Data: the offline set builtin:reasoning-preferences (seed 42), at most ~115 tokens a sequence.

How it measures. Ours runs the way a user runs it: ``trainers.direct_alignment.train`` through
its command-line entry point (``main``, in this process) with ``configs/dpo.yaml`` and ``--set``
overrides; the end of each step is stamped when the trainer logs that step's metrics row, and the
step's tokens come from the row (``throughput/tokens_per_s`` x ``timing/step_s``). TRL runs a
``DPOTrainer`` built with matched settings; a callback stamps the end of every optimizer step and
reads TRL's own token count. Both count the non-pad tokens of chosen + rejected (prompt +
completion) per step. Throughput is taken over the steps after the first ``--warmup`` ones (from
the end of the last warm-up step to the end of the last step: whole loop iterations), so start-up,
model building, tokenisation and reference log-probs are left out for both. The contenders
alternate (A B, B A, ...) so drift of a shared machine falls on both; medians over rounds. Each
window is also timed in process CPU seconds ("CPU tokens/s"): with one torch thread that figure
hardly moves when neighbours load the machine, so it is the steadier comparison there.

Reference log-probs are precomputed on both sides, so no step runs a reference forward: ours reads
its on-disk cache (kept in a bench-private cache folder: the first run of each model computes it,
later runs hit it); TRL uses ``precompute_ref_log_probs=True`` (recomputed at every trainer
start). ``--trl-ref live`` gives TRL its default instead (a reference forward in every step).

Also reported: the DPO loss of both implementations on the same first batch with the same
weights, before any update (policy == reference, where it is ln 2, and a perturbed policy), and
our fast paths before/after: reference cache cold vs warm (start-up), gradient checkpointing on
vs off (one more run), and micro-benchmarks of one micro-batch's forward + backward (LM head on
completion positions only vs every position, chunked vs naive full-vocabulary log-softmax, one
concatenated forward vs two, one prompt forward per pair vs full rows, padding trimmed per
micro-batch vs padded to max_length, and an alternative packing of a pair into one row). Prints a table and writes
bench/results/dpo_vs_trl.json. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import copy
import math
import tempfile
from typing import Any

from _common import ROOT, median_of, print_table, time_variants
from _versus_trl import (
    MAX_LENGTH,
    SEED,
    TABLE_HEADERS,
    benchmark_models,
    checkpointing_line,
    checkpointing_report,
    ensure_models,
    loss_line,
    matched_cpu_overrides,
    micro_batch_facts,
    micro_lines,
    micro_report,
    micro_reps,
    parse_args,
    quiet_offline_env,
    run_our_trainer,
    run_trl_timed,
    set_target,
    set_threads,
    trl_common_args,
    write_versus_results,
)

DPO_TARGET_RATIO = 2.0  # issue 18
DPO_CONFIG = ROOT / "trainers" / "direct_alignment" / "configs" / "dpo.yaml"
# Per model: pairs per optimizer step and timed steps. `small` is ~30x the compute of `tiny` per
# token, so it gets a smaller batch and fewer steps to keep the full run near 5 minutes.
MODEL_DEFAULTS: dict[str, dict[str, int]] = {
    "tiny": {"batch_size": 8, "steps": 10},
    "small": {"batch_size": 4, "steps": 4},
}
QUICK_STEPS = 3
BETA = 0.1
LEARNING_RATE = 5e-6


# ---------------------------------------------------------------------------------------------
# DPO: data and the two contenders
# ---------------------------------------------------------------------------------------------


def preference_records(n: int, seed: int = SEED):
    """The built-in offline preference pairs our trainer generates for data.max_samples=n."""
    from trainers.direct_alignment.data import builtin_preference_records

    return builtin_preference_records(n, seed=seed)


def trl_preference_dataset(records):
    """The same pairs in TRL's conversational preference format."""
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "prompt": r.prompt,
                "chosen": [{"role": "assistant", "content": r.chosen}],
                "rejected": [{"role": "assistant", "content": r.rejected}],
            }
            for r in records
        ]
    )


def ours_dpo_overrides(model: str, batch_size: int, steps: int, extra: list[str]) -> list[str]:
    return matched_cpu_overrides(
        model,
        batch_size,
        steps,
        LEARNING_RATE,
        after_data=["loss=dpo", f"beta={BETA}"],
        evaluation=[
            "eval.eval_every=0",
            "eval.sample_every=0",
            "eval.num_samples=0",
            "eval.eval_batch_size=8",
        ],
        extra=extra,
    )


def run_ours_dpo(model: str, batch_size: int, steps: int, warmup: int, extra=()) -> dict:
    from trainers.direct_alignment import train as da_train

    overrides = ours_dpo_overrides(model, batch_size, steps, list(extra))
    return run_our_trainer(da_train.main, DPO_CONFIG, overrides, warmup)


def build_trl_dpo(model: str, records, batch_size: int, steps: int, out_dir: str, ref: str):
    """A DPOTrainer with settings matched to ours; ``ref`` is "precompute" or "live"."""
    from trl import DPOConfig, DPOTrainer

    from trainers.core.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(model)
    policy = load_causal_lm(model, device="cpu", dtype="fp32", trainable=True)
    config = DPOConfig(
        **trl_common_args(out_dir, batch_size, steps, LEARNING_RATE),
        beta=BETA,
        loss_type=["sigmoid"],
        max_length=MAX_LENGTH,
        precompute_ref_log_probs=ref == "precompute",
        precompute_ref_batch_size=8,
    )
    return DPOTrainer(
        model=policy,
        args=config,
        train_dataset=trl_preference_dataset(records),
        processing_class=tokenizer,
    )


def run_trl_dpo(model: str, batch_size: int, steps: int, warmup: int, ref: str) -> dict:
    records = preference_records(batch_size * steps)
    return run_trl_timed(
        lambda out_dir: build_trl_dpo(model, records, batch_size, steps, out_dir, ref),
        warmup,
        "bench-trl-",
    )


# ---------------------------------------------------------------------------------------------
# Loss agreement on one batch
# ---------------------------------------------------------------------------------------------


def perturbed_copy(model, scale: float, seed: int):
    """A copy of ``model`` with seeded Gaussian noise on every weight (policy != reference)."""
    import torch

    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return other


def dpo_loss_agreement(model: str, batch_size: int) -> dict[str, Any]:
    """Both implementations' DPO (sigmoid) loss on the same first batch, same weights, no update:
    once with policy == reference (ln 2 by definition) and once with a perturbed policy."""
    import torch
    from trl import DPOConfig, DPOTrainer

    from trainers.core.models import load_causal_lm, load_tokenizer
    from trainers.direct_alignment.config import DirectAlignmentConfig
    from trainers.direct_alignment.data import tokenize_records
    from trainers.direct_alignment.pairs import compute_reference_logps, micro_batch_loss

    torch.manual_seed(SEED)
    records = preference_records(batch_size)
    tokenizer = load_tokenizer(model)
    reference = load_causal_lm(model, device="cpu", dtype="fp32", trainable=False)
    examples, _ = tokenize_records(records, tokenizer, MAX_LENGTH)
    pad_id = tokenizer.pad_token_id
    device = torch.device("cpu")
    cfg = DirectAlignmentConfig(loss="dpo", beta=BETA, model={"name": model})
    ids = list(range(len(examples)))
    ref_logps = compute_reference_logps(
        reference, examples, pad_id, device, batch_size, with_kl=False
    )

    out: dict[str, Any] = {"n_pairs": len(examples), "beta": BETA}
    with tempfile.TemporaryDirectory(prefix="bench-trl-loss-") as tmp:
        for label, policy in (
            ("policy_equals_reference", copy.deepcopy(reference)),
            ("perturbed_policy", perturbed_copy(reference, scale=0.02, seed=SEED)),
        ):
            with torch.no_grad():
                ours, _, _ = micro_batch_loss(cfg, policy, examples, ids, ref_logps, pad_id, device)
            trainer = DPOTrainer(
                model=copy.deepcopy(policy).requires_grad_(True),
                ref_model=copy.deepcopy(reference),
                args=DPOConfig(
                    **trl_common_args(tmp, batch_size, 1, LEARNING_RATE),
                    beta=BETA,
                    loss_type=["sigmoid"],
                    max_length=MAX_LENGTH,
                ),
                train_dataset=trl_preference_dataset(records),
                processing_class=tokenizer,
            )
            rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
            same_tokens = len(rows) == len(examples) and all(
                (r["prompt_ids"], r["chosen_ids"], r["rejected_ids"])
                == (e.prompt_ids, e.chosen_ids, e.rejected_ids)
                for r, e in zip(rows, examples, strict=False)
            )
            with torch.no_grad():
                theirs = trainer.compute_loss(trainer.model, trainer.data_collator(rows))
            out[label] = {
                "ours": float(ours),
                "trl": float(theirs),
                "abs_diff": abs(float(ours) - float(theirs)),
            }
            out["same_token_ids"] = same_tokens
    out["ln2"] = math.log(2)
    return out


# ---------------------------------------------------------------------------------------------
# Fast paths: micro-benchmarks of one forward + backward on a batch
# ---------------------------------------------------------------------------------------------


def naive_completion_logps(model, input_ids, attention_mask, loss_mask):
    """The textbook way: full logits, full-vocabulary float32 log_softmax, gather."""
    import torch

    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    logps = torch.log_softmax(logits.float(), dim=-1)
    picked = logps.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = loss_mask[:, 1:].float()
    return (picked * mask).sum(-1), mask.sum(-1)


def every_position_logps(model, input_ids, attention_mask, loss_mask):
    """Our chunked head applied at every position, prompt and padding included (what
    completion_logps did before it projected only the completion positions)."""
    from trainers.core.logprobs import hidden_to_logps

    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask)
    logps = hidden_to_logps(
        hidden.last_hidden_state[:, :-1], model.get_output_embeddings(), input_ids[:, 1:]
    )
    mask = loss_mask[:, 1:].float()
    return (logps * mask).sum(-1), mask.sum(-1)


OURS_DPO_VARIANT = "ours: one row per pair (block mask), trimmed, head on completions"


def dpo_micro_benchmarks(model: str, batch_size: int, reps: int) -> dict[str, Any]:
    """Forward + backward of one micro-batch (the policy side of a DPO step) through variants of
    our log-prob code: what each fast path saves, with the same model and batch."""
    import torch
    import torch.nn.functional as F

    from trainers.core.logprobs import DEFAULT_CHUNK, completion_logps, split_completion_logps
    from trainers.core.models import load_causal_lm, load_tokenizer
    from trainers.core.pair_packing import pack_examples, packed_response_logps
    from trainers.direct_alignment.data import collate, collate_split, tokenize_records

    tokenizer = load_tokenizer(model)
    policy = load_causal_lm(model, device="cpu", dtype="fp32", trainable=True)
    examples, _ = tokenize_records(preference_records(batch_size), tokenizer, MAX_LENGTH)
    pad_id = tokenizer.pad_token_id
    batch = collate(examples, pad_id)
    ids, attn, lmask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    split = collate_split(examples, pad_id)
    split_args = (
        split["input_ids"],
        split["attention_mask"],
        split["prompt_width"],
        split["completion_mask"],
    )
    n = len(examples)
    extra = MAX_LENGTH - ids.shape[1]
    padded = (
        F.pad(ids, (0, extra), value=pad_id),
        F.pad(attn, (0, extra), value=0),
        F.pad(lmask, (0, extra), value=0),
    )

    def fwd_bwd(fn, *tensors):
        def run():
            sums, _ = fn(policy, *tensors)
            sums.sum().backward()
            policy.zero_grad(set_to_none=True)

        return run

    def two_forwards():
        for half in (slice(0, n), slice(n, 2 * n)):
            sums, _ = completion_logps(policy, ids[half], attn[half], lmask[half])
            sums.sum().backward()
        policy.zero_grad(set_to_none=True)

    packed_pairs = pack_examples(examples, pad_id, policy)

    def packed_rows():
        sums, _ = packed_response_logps(policy, packed_pairs)
        sums.sum().backward()
        policy.zero_grad(set_to_none=True)

    with torch.no_grad():
        plain, _ = completion_logps(policy, ids, attn, lmask)
        shared, _ = split_completion_logps(policy, *split_args)
        packed, _ = packed_response_logps(policy, packed_pairs)
    packed_diff = float((packed - plain).abs().max())
    shared_diff = float((shared - plain).abs().max())

    variants = {
        OURS_DPO_VARIANT: packed_rows,
        "before: one prompt forward per pair (KV cache gathered per row)": fwd_bwd(
            split_completion_logps, *split_args
        ),
        "before: every row forwards its prompt (right-padded rows)": fwd_bwd(
            completion_logps, ids, attn, lmask
        ),
        "before: chunked head on every position": fwd_bwd(every_position_logps, ids, attn, lmask),
        "naive full-vocabulary fp32 log_softmax": fwd_bwd(naive_completion_logps, ids, attn, lmask),
        "two forwards (chosen, rejected)": two_forwards,
        f"padded to max_length={MAX_LENGTH}": fwd_bwd(completion_logps, *padded),
    }
    seconds = time_variants(variants, reps)
    vocab = policy.get_output_embeddings().weight.shape[0]
    rows, width = ids.shape
    scored = int(lmask[:, 1:].sum())
    return {
        **micro_batch_facts(model, n, reps, ids, attn),
        "completion_share_of_positions": round(scored / (rows * (width - 1)), 3),
        **micro_report(seconds, OURS_DPO_VARIANT),
        "shared_prompt_max_abs_logp_diff": shared_diff,
        "packed_pair_max_abs_logp_diff": packed_diff,
        "largest_fp32_logits_mib": {
            "naive (whole batch)": round(rows * (width - 1) * vocab * 4 / 2**20, 2),
            "ours (one chunk)": round(min(DEFAULT_CHUNK, scored) * vocab * 4 / 2**20, 2),
        },
    }


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def steps_for(model: str, args) -> int:
    if args.steps:
        return args.steps
    return QUICK_STEPS if args.quick else MODEL_DEFAULTS[model]["steps"]


def add_dpo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trl-ref",
        choices=("precompute", "live"),
        default="precompute",
        help="TRL reference log-probs: precomputed at start (matched to ours) or a reference "
        "forward in every step (TRL's default)",
    )


def main(argv: list[str] | None = None) -> None:
    quiet_offline_env()
    set_target(DPO_TARGET_RATIO)
    args = parse_args(argv, __doc__, MODEL_DEFAULTS, add_dpo_arguments)
    threads = set_threads(args.threads)
    ensure_models(args.models)

    results, table = benchmark_models(
        args,
        MODEL_DEFAULTS,
        steps_for,
        {
            "ours": lambda m, b, t: run_ours_dpo(m, b, t, args.warmup),
            "trl": lambda m, b, t: run_trl_dpo(m, b, t, args.warmup, args.trl_ref),
        },
        dpo_loss_agreement,
        dpo_fast_paths,
        {
            "beta": BETA,
            "loss": "sigmoid (dpo)",
            "learning_rate": LEARNING_RATE,
            "trl_reference": args.trl_ref,
        },
    )

    print()
    print(f"DPO step throughput, fp32 CPU, {threads} torch thread(s); target ours/TRL >= 2")
    print_table(TABLE_HEADERS, table)
    print()
    for model, res in results.items():
        la = res["loss_agreement"]
        same = f"  (same token ids: {la['same_token_ids']})"
        for label in ("policy_equals_reference", "perturbed_policy"):
            print(loss_line(model, label, la[label], same))
        for line in fast_path_lines(res["fast_paths"]):
            print(f"{model}: {line}")
    write_versus_results(
        "dpo_vs_trl",
        "DPOTrainer",
        args,
        threads,
        results,
        DPO_NOTES,
        {"trl_reference": args.trl_ref},
    )


DPO_NOTES = [
    "tokens = non-pad tokens of chosen + rejected (prompt + completion) per optimizer step, "
    "both sides (ours: attention-mask sum of the concatenated micro-batch; TRL: its "
    "_total_train_tokens, also attention-mask sums)",
    "window = end of the last warm-up step to the end of the last step: whole loop iterations "
    "(collate, forward, backward, clip, optimizer, scheduler, per-step logging); start-up, "
    "tokenisation and reference log-probs are outside it for both",
    "reference: ours reads reference log-probs from its on-disk cache (computed once per dataset "
    "and model; the first run of each model computed it, see fast_paths.reference_cache); TRL "
    "used precompute_ref_log_probs=True (computed at every trainer start, in startup_s). "
    "Neither runs a reference forward inside a step",
    "matched: same records (builtin:reasoning-preferences, seed 42), same token ids (checked on "
    "the first batch), batch size, max_length (nothing truncated), beta, loss sigmoid, learning "
    "rate with linear decay and no warm-up, max_grad_norm 1.0, AdamW betas/eps, fp32, CPU, no "
    "gradient checkpointing, gradient accumulation 1, one torch thread setting for both",
    "optimizer: AdamW with the same hyper-parameters, each side's implementation: ours "
    "torch.optim.AdamW's per-tensor loop (trainers.core.training.build_optimizer), TRL "
    "transformers' default adamw_torch_fused (one fused kernel; on small ~20 ms a step against "
    "~120 ms for the loop on one thread, in TRL's favour)",
    "not matched (each side's own way): example order (each side's seeded shuffle; tokens/s "
    "normalises for the different lengths), TRL's extra per-step metrics (entropy, mean logits)",
    "CPU tokens/s = the same tokens over the window's process CPU seconds; with one torch "
    "thread it is the steadier figure on a shared machine, wall-clock tokens/s is the headline",
]


def dpo_fast_paths(model: str, batch_size: int, total: int, args, ours_runs) -> dict[str, Any]:
    """Our switches, before/after: reference cache cold vs warm (start-up), gradient
    checkpointing on vs off (step throughput), and micro-benchmarks of the log-prob code."""
    cold = [r for r in ours_runs if r.get("ref_cache") == "miss"]
    warm = [r for r in ours_runs if r.get("ref_cache") == "hit"]
    fast: dict[str, Any] = {
        "reference_cache": {
            "cold_startup_s": cold[0]["startup_s"] if cold else None,
            "cold_reference_s": cold[0].get("reference_s") if cold else None,
            "warm_startup_s": median_of(warm, "startup_s"),
            "note": "start-up of our run before its first step (data, tokenisation, reference "
            "log-probs, model load); steps are the same either way",
        }
    }
    if not args.quick:
        print(f"[{model}] gradient checkpointing on (one run)", flush=True)
        gc_run = run_ours_dpo(
            model, batch_size, total, args.warmup, extra=["model.gradient_checkpointing=true"]
        )
        fast["gradient_checkpointing"] = checkpointing_report(ours_runs, gc_run)
    print(f"[{model}] log-prob micro-benchmarks", flush=True)
    fast["logprob_micro_benchmarks"] = dpo_micro_benchmarks(
        model, batch_size, reps=micro_reps(model, args.quick)
    )
    return fast


def fast_path_lines(fast: dict[str, Any]) -> list[str]:
    lines = []
    rc = fast["reference_cache"]
    if rc["cold_startup_s"] is not None:
        warm = rc["warm_startup_s"]
        lines.append(
            f"reference cache: start-up cold {rc['cold_startup_s']:.2f}s (reference log-probs "
            f"{rc['cold_reference_s']:.2f}s of it), warm "
            + (f"{warm:.2f}s" if warm is not None else "- (no second run)")
        )
    if "gradient_checkpointing" in fast:
        lines.append(checkpointing_line(fast["gradient_checkpointing"]))
    lines += micro_lines(fast["logprob_micro_benchmarks"])
    return lines


if __name__ == "__main__":
    main()
