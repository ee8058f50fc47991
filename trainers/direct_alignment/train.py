"""Direct alignment from preferences: DPO and its relatives, one loop for the nine offline losses
(online DPO, whose pairs are sampled each step, has its own loop in ``online.py``).

    python -m trainers.direct_alignment.train --config configs/dpo.yaml --run-dir DIR \
        [--set loss=simpo] [--set data.max_samples=64] [--resume]

The loop, per optimizer step (the pair step's pieces are ``pairs.py``):
  1. take the next `batch_size × gradient_accumulation_steps` preference pairs;
  2. for each micro-batch, one forward pass over [chosen; rejected (; KTO mismatched pairs)],
     summed completion log-probs per sequence;
  3. look up the cached reference log-probs (computed once per dataset before training);
  4. loss = LOSSES[cfg.loss](...), scaled by the micro-batch's share of the step, backward;
  5. clip, step, schedule; log the step's metrics aggregated over all its micro-batches.
Held-out evaluation (`eval/` metrics) and sample generations run every N steps; with
``eval.gold_prompts`` > 0 each evaluation also scores greedy answers to held-out built-in prompts
with the verifier and measures the KL to the reference (``gold.py``).
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from typing import Any

import torch

from trainers.core.config import ConfigError
from trainers.core.distributed import (
    broadcast_object,
    gather_blocks,
    rank_block,
    shard_model,
    world,
)
from trainers.core.flops import step_account
from trainers.core.generation import sample_held_out
from trainers.core.harness import raise_if_stopping, trainer_main
from trainers.core.loop import (
    BestMetric,
    StepTimer,
    TrainingRun,
    data_info,
    step_metrics,
)
from trainers.core.lora import add_adapters, needs_reference_copy, reference_view
from trainers.core.models import (
    load_causal_lm,
    load_reference,
    load_tokenizer,
    model_fingerprint,
    pick_runtime,
)
from trainers.core.rundir import RunDir
from trainers.core.runfolder import SummaryFile
from trainers.core.tiny import cache_root
from trainers.core.training import (
    StepMetrics,
    optimizer_step,
    ready_to_train,
    seed_everything,
)
from trainers.core.verifier import Verifier, compute_rewards
from trainers.direct_alignment.config import BUILTIN_DATASET, ONLINE, DirectAlignmentConfig
from trainers.direct_alignment.data import fingerprint_examples
from trainers.direct_alignment.pairs import (
    compute_reference_logps,
    evaluate,
    micro_batch_loss,
    prepare_examples,
)

DATA_EXTENSIONS = (".json", ".jsonl", ".parquet", ".csv")

# ---------------------------------------------------------------------------------------------
# Checks before anything is written
# ---------------------------------------------------------------------------------------------


def preflight(cfg: DirectAlignmentConfig) -> None:
    """Checks that need no model: fail before anything is written."""
    ds = cfg.data.dataset
    looks_local = ds.startswith((".", "/", "~")) or ds.endswith(DATA_EXTENSIONS)
    if looks_local and not Path(ds).expanduser().exists():
        raise ConfigError(
            f"data.dataset: file not found: {ds}. Use an existing file, a hub id, or the "
            f"offline set {BUILTIN_DATASET}"
        )
    if cfg.data.max_prompt_length and cfg.data.max_prompt_length >= cfg.data.max_length:
        raise ConfigError("data.max_prompt_length must be smaller than data.max_length")
    if cfg.loss == ONLINE and cfg.reward.model:  # a reward model that cannot rank: refused now
        from trainers.core.reward_scorer import inspect_reward_model

        inspect_reward_model(cfg.reward.model, key="reward.model")


# ---------------------------------------------------------------------------------------------
# The reference's log-probs, computed once per dataset and cached
# ---------------------------------------------------------------------------------------------


def reference_cache_path(cfg: DirectAlignmentConfig, examples, dtype) -> Path:
    ref = cfg.model.ref_name or cfg.model.name
    key = hashlib.sha256(
        f"{model_fingerprint(ref)}|{fingerprint_examples(examples)}|{dtype}|v1".encode()
    ).hexdigest()[:24]
    return cache_root() / "ref_logps" / f"{key}.pt"


def load_or_compute_reference(
    cfg, examples, pad_id, device, dtype, attn, policy: torch.nn.Module | None = None
) -> tuple[dict, dict]:
    """Reference log-probs from the disk cache, or computed once with a temporary reference
    model that is freed afterwards; with LoRA (``policy`` given, with adapters) from the
    policy's base, its adapters off, without a second copy. Returns (logps, info). Under
    torchrun the reference model is sharded too, each rank computes its block of the examples,
    the blocks are gathered on every rank, and rank 0 writes the cache (rank 0 decides hit or
    miss for all)."""
    path = reference_cache_path(cfg, examples, dtype)
    if broadcast_object(path.is_file()):
        return torch.load(path, weights_only=True), {
            "ref_cache": "hit",
            "ref_cache_path": str(path),
        }
    t0 = time.time()
    with_kl, batch_size = cfg.loss == "kto", cfg.eval.eval_batch_size
    block = rank_block(len(examples))
    mine = [examples[i] for i in block]
    if policy is not None:
        with reference_view(policy) as ref:
            logps = compute_reference_logps(ref, mine, pad_id, device, batch_size, with_kl)
        policy.train()
    else:
        ref = load_reference(cfg.model, device, dtype, attn)
        shard_model(ref)
        logps = compute_reference_logps(ref, mine, pad_id, device, batch_size, with_kl)
        del ref
    logps = {k: gather_blocks(v, len(examples)) for k, v in logps.items()}
    if world().is_main:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{time.time_ns()}")
        torch.save(logps, tmp)
        tmp.replace(path)
    info = {
        "ref_cache": "miss",
        "ref_cache_path": str(path),
        "timing/reference_s": time.time() - t0,
    }
    return logps, info


# ---------------------------------------------------------------------------------------------
# Held-out samples and the gold evaluation
# ---------------------------------------------------------------------------------------------


def sample_generations(
    cfg: DirectAlignmentConfig,
    model: torch.nn.Module,
    tokenizer: Any,
    eval_records: list[Any],
    event: int,
) -> list[dict[str, Any]]:
    """Completions for ``eval.num_samples`` held-out prompts, taken round-robin by event."""
    picked, completions = sample_held_out(model, tokenizer, eval_records, event, cfg.eval)
    return [
        {"prompt": r.prompt[-1]["content"], "completion": c, "chosen": r.chosen}
        for r, c in zip(picked, completions, strict=True)
    ]


def gold_evaluation(cfg: DirectAlignmentConfig, run: RunDir, tokenizer, eval_records, runtime):
    """The gold evaluation (``gold.py``) when ``eval.gold_prompts`` > 0, else None. Without
    LoRA (or with a ``model.ref_name`` other than the base) the reference is loaded here and kept
    for the run; with LoRA it is the policy's base, adapters off."""
    if cfg.eval.gold_prompts <= 0:
        return None
    from trainers.direct_alignment.gold import GOLD_FILE, build_gold_eval

    device, dtype, attn = runtime
    ref_model = (
        load_reference(cfg.model, device, dtype, attn) if needs_reference_copy(cfg.model) else None
    )
    out_path = run.path / GOLD_FILE if run.writer else None
    return build_gold_eval(cfg, tokenizer, eval_records, ref_model, out_path, runtime)


# ---------------------------------------------------------------------------------------------
# The training loop
# ---------------------------------------------------------------------------------------------


def train(
    cfg: DirectAlignmentConfig, run: RunDir, resume: bool, *, verifier: Verifier = compute_rewards
) -> SummaryFile:
    """Tokenise, cache the reference log-probs, then the DPO-family loop; see the module doc.
    ``verifier``: online DPO's ranker's verifier (``reward.verifier``)."""
    if cfg.loss == ONLINE:  # pairs sampled from the policy each step: its own loop
        from trainers.direct_alignment.online import train_online

        return train_online(cfg, run, resume, verifier=verifier)
    seed_everything(cfg.seed)
    device, dtype, attn = pick_runtime(cfg.model)
    tokenizer = load_tokenizer(cfg.model.name)
    pad_id = tokenizer.pad_token_id

    run.update_phase("tokenizing")
    train_ex, eval_ex, eval_records, data_stats = prepare_examples(cfg, tokenizer)
    info = data_info(data_stats, len(train_ex), len(eval_ex))
    loop = TrainingRun.over_epochs(run, cfg, len(train_ex))

    def load_policy() -> torch.nn.Module:
        run.update_phase("loading_model", loop.total_steps)
        model = load_causal_lm(
            cfg.model.name, device=device, dtype=dtype, attn_implementation=attn, trainable=True
        )
        return add_adapters(model, cfg.model.lora)  # LoRA when model.lora.enabled

    # LoRA: the policy loads first, its base (adapters off) is the reference; else the
    # reference is its own model, loaded and freed before the policy loads
    model = None if needs_reference_copy(cfg.model) else load_policy()
    ref = ref_eval = None
    if cfg.needs_reference:
        run.update_phase("reference_logprobs", loop.total_steps)
        ref, cache_info = load_or_compute_reference(
            cfg, train_ex + eval_ex, pad_id, device, dtype, attn, policy=model
        )
        ref_eval = {k: v[len(train_ex) :] for k, v in ref.items()}
        ref = {k: v[: len(train_ex)] for k, v in ref.items()}
        info.update(cache_info)
        print(f"reference log-probs: cache {cache_info['ref_cache']}", flush=True)

    model = model if model is not None else load_policy()
    ready_to_train(model, cfg.model)
    optimizer, scheduler, state = loop.optimizer_and_resume(
        model, model.parameters(), cfg.train, resume
    )
    account = step_account(model, device, dtype)  # reference log-probs precomputed: no pass
    loop.start_tracker(cfg.logging, cfg.model_dump(mode="json"), f"{cfg.loss}-{run.path.name}")
    best = BestMetric("eval/accuracy")
    gold = gold_evaluation(cfg, run, tokenizer, eval_records, (device, dtype, attn))

    def held_out(step: int) -> dict[str, float]:
        out = evaluate(cfg, model, eval_ex, ref_eval, pad_id, device)
        return out if gold is None else {**out, **gold.run(model, step)}

    def run_eval() -> None:
        loop.progress("evaluating")
        loop.last_eval = held_out(loop.step)
        loop.log("eval", loop.last_eval)
        best.update(loop.last_eval)

    def after_step() -> None:  # the step's evaluation and samples, when due
        if loop.every(cfg.eval.eval_every) and eval_ex:
            run_eval()
        if loop.every(cfg.eval.sample_every):
            loop.progress("generating")
            event = loop.event(cfg.eval.sample_every)
            loop.log_samples(sample_generations(cfg, model, tokenizer, eval_records, event))

    if not resume and cfg.eval.eval_every > 0 and eval_ex:  # the starting point, for contrast
        loop.progress("evaluating")
        loop.log_start(held_out(0))
    if loop.redo_events:  # stopped during the evaluation after the checkpoint's step
        after_step()

    position = state["data_position"] if state else None
    for pos in loop.epoch_steps(len(train_ex), cfg.train, cfg.seed, position):
        timer = StepTimer(account)
        agg, step_tokens = StepMetrics(), 0
        for m in range(0, len(pos.local_ids), cfg.train.batch_size):
            raise_if_stopping("micro_batch")
            ids = pos.local_ids[m : m + cfg.train.batch_size]
            loss, metrics, n_tok = micro_batch_loss(cfg, model, train_ex, ids, ref, pad_id, device)
            (loss * len(ids) / len(pos.ids)).backward()
            agg.add(metrics, weight=len(ids))
            step_tokens += n_tok
        grad_norm, lr = optimizer_step(
            model.parameters(), optimizer, scheduler, cfg.train.max_grad_norm
        )
        row = step_metrics(
            agg.mean(), grad_norm, lr, step_tokens, timer, device, epoch=pos.epoch_progress
        )
        loop.step_done(row, step_tokens, cfg.logging.log_every, "accuracy")
        loop.end_step(after_step, epoch=pos.epoch)

    loop.save_final_model(model, tokenizer)
    loop.finish()
    return loop.summary(cfg.loss, best, device, **info)


main = trainer_main(__doc__, DirectAlignmentConfig, preflight, train)


if __name__ == "__main__":
    sys.exit(main())
