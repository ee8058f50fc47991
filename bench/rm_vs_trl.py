"""Preference (Bradley-Terry) reward-model optimizer-step throughput: our reward-model trainer
(kind preference) against TRL's RewardTrainer on the same backbone, pairs, batch size, max length,
precision (fp32 on CPU), learning rate and number of steps. Target: ours >= 1.5x TRL's tokens/s
(wall clock, median over rounds).

    uv run python bench/rm_vs_trl.py                      # tiny and small, 3 rounds
    uv run python bench/rm_vs_trl.py --quick              # smoke run: tiny, 1 round (< 1 min)
    uv run python bench/rm_vs_trl.py --models small --steps 6 --rounds 3 --threads 1

Same method and helpers as bench/dpo_vs_trl.py: ours runs ``trainers.reward_models.train``
through its command-line entry point in this process with ``configs/preference_rm.yaml`` and
``--set`` overrides; TRL runs a ``RewardTrainer`` on an ``AutoModelForSequenceClassification``
built from the same preset folder (scalar head without bias, score at the last non-pad token, as
ours). TRL gets the pairs pre-tokenised by our tokeniser code (``chosen_ids`` / ``rejected_ids``,
a documented RewardTrainer input), so both train on the same token ids. Tokens per step = non-pad
tokens of chosen + rejected (prompt + response) on both sides; the first ``--warmup`` steps are
left out; the contenders alternate; medians over rounds; wall clock and process CPU time.

Also reported: the Bradley-Terry loss of both on the same batch with the same weights (TRL's
backbone and head are loaded from ours) before any update, and our switches before/after
(gradient checkpointing on vs off; micro-benchmarks of one micro-batch's forward + backward: one
one prompt forward per pair vs full rows, one concatenated forward vs two, padding trimmed per
micro-batch vs padded to max_length, and an alternative packing of a pair into one row). Prints a table and writes
bench/results/rm_vs_trl.json. A benchmark, not a test.
"""

from __future__ import annotations

import copy
import tempfile
from typing import Any

import _versus_trl as harness
import dpo_vs_trl as dpo
from _common import ROOT, print_table, time_variants

TARGET_RATIO = harness.TARGET_RATIO
RM_CONFIG = ROOT / "trainers" / "reward_models" / "configs" / "preference_rm.yaml"
MODEL_DEFAULTS = dpo.MODEL_DEFAULTS
MAX_LENGTH = harness.MAX_LENGTH
LEARNING_RATE = 5e-5  # the book's reward-model rate (configs/preference_rm.yaml)
SEED = harness.SEED


def ours_rm_overrides(model: str, batch_size: int, steps: int, extra: list[str]) -> list[str]:
    return harness.matched_cpu_overrides(
        model,
        batch_size,
        steps,
        LEARNING_RATE,
        leading=["kind=preference", "freeze_backbone=false"],
        evaluation=["eval.eval_every=0", "eval.num_samples=0"],
        extra=extra,
    )


def run_ours_rm(model: str, batch_size: int, steps: int, warmup: int, extra=()) -> dict:
    from trainers.reward_models import train as rm_train

    overrides = ours_rm_overrides(model, batch_size, steps, list(extra))
    return harness.run_our_trainer(rm_train.main, RM_CONFIG, overrides, warmup)


def tokenized_pairs(model: str, n: int):
    """Our tokenisation of the first ``n`` built-in pairs (what our trainer trains on)."""
    from trainers.core.models import load_tokenizer
    from trainers.reward_models.data import tokenize_records

    tokenizer = load_tokenizer(model)
    examples, _ = tokenize_records(dpo.preference_records(n), tokenizer, MAX_LENGTH)
    return tokenizer, examples


def trl_pair_dataset(examples):
    """Pre-tokenised pairs for RewardTrainer: full sequences, prompt + response."""
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "chosen_ids": ex.prompt_ids + ex.chosen_ids,
                "rejected_ids": ex.prompt_ids + ex.rejected_ids,
            }
            for ex in examples
        ]
    )


def trl_reward_model(model: str):
    """AutoModelForSequenceClassification (num_labels=1) on the preset's weights, fp32, with our
    loader's attention implementation; its score head is freshly initialised."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from trainers.core.models import pick_attn_implementation, resolve_model
    from trainers.core.tiny import quiet_hf

    attn = pick_attn_implementation("auto", torch.device("cpu"), torch.float32)
    with quiet_hf():
        return AutoModelForSequenceClassification.from_pretrained(
            str(resolve_model(model).path),
            num_labels=1,
            dtype=torch.float32,
            attn_implementation=attn,
        )


def build_trl_rm(
    model: str, examples, tokenizer, batch_size: int, steps: int, out_dir: str, lm=None
):
    from trl import RewardConfig, RewardTrainer

    config = RewardConfig(
        **harness.trl_common_args(out_dir, batch_size, steps, LEARNING_RATE),
        max_length=MAX_LENGTH,
        center_rewards_coefficient=None,
    )
    return RewardTrainer(
        model=lm if lm is not None else trl_reward_model(model),
        args=config,
        train_dataset=trl_pair_dataset(examples),
        processing_class=tokenizer,
    )


def run_trl_rm(model: str, batch_size: int, steps: int, warmup: int) -> dict:
    def build(out_dir: str) -> Any:
        tokenizer, examples = tokenized_pairs(model, batch_size * steps)
        return build_trl_rm(model, examples, tokenizer, batch_size, steps, out_dir)

    return harness.run_trl_timed(build, warmup, "bench-trl-rm-")


# ---------------------------------------------------------------------------------------------
# Loss agreement and micro-benchmarks
# ---------------------------------------------------------------------------------------------


def our_reward_model(model: str):
    import torch

    from trainers.core.reward_model import build_reward_model

    torch.manual_seed(SEED)
    return build_reward_model(model, "preference", device="cpu", dtype="fp32", trainable=True)


def rm_loss_agreement(model: str, batch_size: int) -> dict[str, Any]:
    """Bradley-Terry loss of both on the same first batch: TRL's backbone and score head are
    loaded with our model's weights. Checked with our fresh head and with the head scaled x30
    (so the loss is far from ln 2)."""
    import torch

    from trainers.reward_models.data import collate_pairs
    from trainers.reward_models.losses import bradley_terry_loss

    tokenizer, examples = tokenized_pairs(model, batch_size)
    ours = our_reward_model(model)
    out: dict[str, Any] = {"n_pairs": len(examples)}
    with tempfile.TemporaryDirectory(prefix="bench-trl-rm-loss-") as tmp:
        for label, head_scale in (("fresh_head", 1.0), ("head_x30", 30.0)):
            model_copy = copy.deepcopy(ours)
            with torch.no_grad():
                model_copy.head.weight.mul_(head_scale)
            theirs_lm = trl_reward_model(model)
            theirs_lm.model.load_state_dict(model_copy.backbone.get_decoder().state_dict())
            with torch.no_grad():
                theirs_lm.score.weight.copy_(model_copy.head.weight)
            trainer = build_trl_rm(model, examples, tokenizer, batch_size, 1, tmp, lm=theirs_lm)
            batch = collate_pairs(examples, tokenizer.pad_token_id)
            with torch.no_grad():
                scores = model_copy.sequence_scores(batch["input_ids"], batch["attention_mask"])
                n = len(examples)
                loss_ours, _ = bradley_terry_loss(scores[:n], scores[n:])
                rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
                loss_trl = trainer.compute_loss(trainer.model, trainer.data_collator(rows))
            out[label] = {
                "ours": float(loss_ours),
                "trl": float(loss_trl),
                "abs_diff": abs(float(loss_ours) - float(loss_trl)),
            }
    return out


OURS_RM_VARIANT = "ours: one row per pair (block mask), trimmed padding"


def rm_micro_benchmarks(model: str, batch_size: int, reps: int) -> dict[str, Any]:
    """Forward + backward of one micro-batch's Bradley-Terry loss through variants of our code."""
    import torch
    import torch.nn.functional as F

    from trainers.core.pair_packing import pack_examples
    from trainers.reward_models.data import collate_pairs, collate_pairs_split
    from trainers.reward_models.losses import bradley_terry_loss

    tokenizer, examples = tokenized_pairs(model, batch_size)
    rm = our_reward_model(model)
    pad_id = tokenizer.pad_token_id
    batch = collate_pairs(examples, pad_id)
    ids, attn = batch["input_ids"], batch["attention_mask"]
    split = collate_pairs_split(examples, pad_id)
    n = len(examples)

    packed_pairs = pack_examples(examples, pad_id, rm.backbone)

    def ours():
        s = rm.packed_pair_scores(packed_pairs)
        loss, _ = bradley_terry_loss(s[:n], s[n:])
        loss.backward()
        rm.zero_grad(set_to_none=True)

    def kv_shared():
        s = rm.split_sequence_scores(
            split["input_ids"], split["attention_mask"], split["prompt_width"]
        )
        loss, _ = bradley_terry_loss(s[:n], s[n:])
        loss.backward()
        rm.zero_grad(set_to_none=True)

    def concatenated(ids=ids, attn=attn):
        def run():
            s = rm.sequence_scores(ids, attn)
            loss, _ = bradley_terry_loss(s[:n], s[n:])
            loss.backward()
            rm.zero_grad(set_to_none=True)

        return run

    def two_forwards():
        c = rm.sequence_scores(ids[:n], attn[:n])
        r = rm.sequence_scores(ids[n:], attn[n:])
        loss, _ = bradley_terry_loss(c, r)
        loss.backward()
        rm.zero_grad(set_to_none=True)

    with torch.no_grad():
        plain = rm.sequence_scores(ids, attn)
        ours_scores = rm.split_sequence_scores(
            split["input_ids"], split["attention_mask"], split["prompt_width"]
        )
        packed = rm.packed_pair_scores(packed_pairs)
    extra = MAX_LENGTH - ids.shape[1]
    padded = (F.pad(ids, (0, extra), value=pad_id), F.pad(attn, (0, extra), value=0))
    variants = {
        OURS_RM_VARIANT: ours,
        "before: one prompt forward per pair (KV cache gathered per row)": kv_shared,
        "before: every row forwards its prompt (right-padded rows)": concatenated(),
        "two forwards (chosen, rejected)": two_forwards,
        f"padded to max_length={MAX_LENGTH}": concatenated(*padded),
    }
    seconds = time_variants(variants, reps)
    return {
        **harness.micro_batch_facts(model, n, reps, ids, attn),
        **harness.micro_report(seconds, OURS_RM_VARIANT),
        "shared_prompt_max_abs_score_diff": float((ours_scores - plain).abs().max()),
        "packed_pair_max_abs_score_diff": float((packed - plain).abs().max()),
    }


def rm_fast_paths(model: str, batch_size: int, total: int, args, ours_runs) -> dict[str, Any]:
    fast: dict[str, Any] = {}
    if not args.quick:
        print(f"[{model}] gradient checkpointing on (one run)", flush=True)
        gc_run = run_ours_rm(
            model, batch_size, total, args.warmup, extra=["model.gradient_checkpointing=true"]
        )
        fast["gradient_checkpointing"] = harness.checkpointing_report(ours_runs, gc_run)
    print(f"[{model}] forward/backward micro-benchmarks", flush=True)
    fast["micro_benchmarks"] = rm_micro_benchmarks(
        model, batch_size, reps=harness.micro_reps(model, args.quick)
    )
    return fast


RM_NOTES = [
    "tokens = non-pad tokens of chosen + rejected (prompt + response) per optimizer step, both "
    "sides (attention-mask sums; TRL: its _total_train_tokens)",
    "window = end of the last warm-up step to the end of the last step (whole loop iterations); "
    "start-up, data generation, tokenisation and model building are outside it",
    "matched: same records (builtin:reasoning-preferences, seed 42) and token ids (TRL gets our "
    "tokenisation as chosen_ids/rejected_ids), batch size, max_length (nothing truncated), "
    "Bradley-Terry loss without margin or centring, learning rate with linear decay and no "
    "warm-up, weight decay 0, max_grad_norm 1.0, fp32, CPU, no gradient checkpointing, gradient "
    "accumulation 1, one torch thread setting for both; both score the last non-pad token with a "
    "bias-free scalar head",
    "optimizer: AdamW with the same hyper-parameters and the same fused kernel on both sides "
    "(ours: train.fused_adamw, the default since issue 18; TRL: transformers' adamw_torch_fused)",
    "not matched (each side's own way): example order (each side's seeded shuffle), TRL's "
    "per-step reward metrics",
    "CPU tokens/s = the same tokens over the window's process CPU seconds; with one torch "
    "thread it is the steadier figure on a shared machine, wall-clock tokens/s is the headline",
    "the same scores and loss on both sides; ours forwards each pair's prompt once and its KV "
    "cache serves both responses (trainers.core.logprobs.shared_prompt_hidden), TRL forwards "
    "[chosen; rejected] full rows; see fast_paths.micro_benchmarks",
]


def add_fused_flag(parser) -> None:
    parser.add_argument(
        "--fused-adamw",
        action="store_true",
        help="ours with train.fused_adamw=true (the fused kernel TRL uses by default)",
    )


def main(argv: list[str] | None = None) -> None:
    harness.quiet_offline_env()
    args = harness.parse_args(argv, __doc__, MODEL_DEFAULTS, add_fused_flag)
    ours_extra = ["train.fused_adamw=true"] if args.fused_adamw else []
    threads = harness.set_threads(args.threads)
    harness.ensure_models(args.models)

    results, table = harness.benchmark_models(
        args,
        MODEL_DEFAULTS,
        dpo.steps_for,
        {
            "ours": lambda m, b, t: run_ours_rm(m, b, t, args.warmup, extra=ours_extra),
            "trl": lambda m, b, t: run_trl_rm(m, b, t, args.warmup),
        },
        rm_loss_agreement,
        rm_fast_paths,
        {"learning_rate": LEARNING_RATE},
    )

    print()
    print(
        f"Reward-model step throughput, fp32 CPU, {threads} torch thread(s); target ours/TRL >= 1.5"
    )
    print_table(harness.TABLE_HEADERS, table)
    print()
    for model, res in results.items():
        la = res["loss_agreement"]
        for label in ("fresh_head", "head_x30"):
            print(harness.loss_line(model, label, la[label]))
        if "gradient_checkpointing" in res["fast_paths"]:
            gc = res["fast_paths"]["gradient_checkpointing"]
            print(f"{model}: {harness.checkpointing_line(gc)}")
        for line in harness.micro_lines(res["fast_paths"]["micro_benchmarks"]):
            print(f"{model}: {line}")
    harness.write_versus_results(
        "rm_vs_trl",
        "RewardTrainer",
        args,
        threads,
        results,
        RM_NOTES,
        {"ours_fused_adamw": args.fused_adamw},
    )


if __name__ == "__main__":
    main()
