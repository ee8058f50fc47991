"""Rejection sampling: generate N completions per prompt, score them, select, SFT, evaluate.

    python -m trainers.rejection_sampling.train --config configs/top_per_prompt.yaml \
        --run-dir DIR [--set data.dataset=builtin:chain_sum] [--set model.name=tiny] [--resume]

Stages, all writing into the run directory:
  1. generate N sampled completions for each training prompt with the policy;
  2. score every completion (the verifier, or a trained reward model) and mark its verifier
     correctness; stages 1-2 are cached in $RLHF_LAB_CACHE/rs_generations/ under a key that
     leaves the strategy out, so the four strategies share one pool (summary.json: cache);
  3a. select with the strategy (selection.py) and write the selection to selection.jsonl;
      pool, selection and diagnostic metrics (phase "rollout", step 0) and plots/*.png;
  3b. evaluate the starting policy on the held-out prompts (greedy exact match, step 0);
  3c. SFT on the selection with trainers.sft (phase "train" rows, checkpoints/, final_model/);
  4. evaluate the SFT model the same way (phase "eval" at the last SFT step).
Read every reward-selected run beside its matched random control (README.md).

Under ``torchrun --nproc-per-node N`` each rank generates, scores and evaluates its part of the
prompts (sampling with seed + rank; ``generation.rollout_batch_size`` is global, a rank's call
takes its share) and rank 0 alone reads and writes the cache and the run folder
(:mod:`.ranks`); the SFT stage runs sharded as trainers.sft does.
"""

from __future__ import annotations

import gc
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from trainers.core.config import ConfigError
from trainers.core.distributed import (
    any_rank,
    check_divisible,
    describe,
    rank_seed,
    world,
    world_from_env,
)
from trainers.core.harness import StopRequested, Tracker, stop_requested, trainer_main
from trainers.core.loop import eval_line
from trainers.core.models import (
    ModelError,
    hub_offline,
    hub_reachable,
    load_causal_lm,
    load_tokenizer,
    pick_runtime,
    resolve_model,
)
from trainers.core.rundir import RunDir, atomic_write_json, atomic_write_text, read_jsonl
from trainers.core.runfolder import SummaryFile
from trainers.core.tasks import import_reasoning_gym
from trainers.core.training import list_checkpoints, peak_memory_gb, seed_everything
from trainers.rejection_sampling import pipeline
from trainers.rejection_sampling.config import (
    MATCHED_CONTROL,
    RejectionSamplingConfig,
    selection_size,
)
from trainers.rejection_sampling.diagnostics import (
    diagnose,
    diagnostic_metrics,
    summary_view,
    write_plots,
)
from trainers.rejection_sampling.pipeline import DataError, RSPrompt
from trainers.rejection_sampling.ranks import read_on_main, split_work, write_on_main
from trainers.rejection_sampling.selection import Pick, select
from trainers.rejection_sampling.sft_stage import SilentTracker, run_sft

SELECTION_FILE = "selection.jsonl"
DIAGNOSTICS_FILE = "diagnostics.json"

# ---------------------------------------------------------------------------------------------
# Checks before anything is written
# ---------------------------------------------------------------------------------------------


def preflight(cfg: RejectionSamplingConfig) -> None:
    """Checks that need no model weights: fail before anything is written."""
    size = world_from_env().size
    check_divisible(cfg.generation.rollout_batch_size, "generation.rollout_batch_size", size)
    try:
        resolve_model(cfg.model.name)
    except ModelError as err:
        raise ConfigError(f"model.name: {err}") from None
    if not cfg.scorer.is_verifier:
        folder = Path(cfg.scorer.name).expanduser()
        if not (folder / "reward_model.json").is_file():
            raise ConfigError(
                f"scorer.name: {cfg.scorer.name!r} is neither 'verifier' nor a saved reward "
                "model folder (no reward_model.json); pass a trainers.reward_models run's "
                "final_model/ or use scorer.name=verifier"
            )
    d = cfg.data
    if d.is_builtin:
        known = set(import_reasoning_gym().factory.DATASETS)
        unknown = [t for t in d.builtin_tasks if t not in known]
        if unknown:
            raise ConfigError(
                f"data.dataset: unknown reasoning-gym task(s) {unknown}; e.g. builtin:chain_sum"
            )
    for name in (d.dataset, d.test_dataset):
        if name and not name.startswith("builtin:") and pipeline.looks_like_path(name):
            if not Path(name).expanduser().exists():
                raise ConfigError(
                    f"data: file not found: {name}. Use an existing GSM8K-schema file "
                    "(question, answer), openai/gsm8k, or builtin:<task> (offline)"
                )
    local = (
        d.is_builtin or pipeline.looks_like_path(d.dataset) or Path(d.dataset).expanduser().exists()
    )
    if local:  # cheap to load: check the schema and the sizes now
        try:
            train_prompts, _ = pipeline.load_prompts(cfg)
        except DataError as err:
            raise ConfigError(f"data: {err}") from None
        size = selection_size(
            cfg.strategy,
            len(train_prompts),
            cfg.generation.num_completions_per_prompt,
            cfg.top_k,
        )
        if cfg.sft.eval_size >= size:
            raise ConfigError(
                f"sft.eval_size ({cfg.sft.eval_size}) must be smaller than the selection "
                f"({size} examples)"
            )
    elif hub_offline():
        import datasets

        try:
            datasets.load_dataset_builder(d.dataset, d.subset)
        except Exception as err:
            raise ConfigError(
                f"data.dataset: {d.dataset!r} is a hub id and is not in the local cache "
                f"(HF_HUB_OFFLINE is set: {type(err).__name__}). Offline, use a local "
                "GSM8K-schema file or builtin:<task> (e.g. builtin:chain_sum)"
            ) from None
    elif not hub_reachable():
        raise ConfigError(
            f"data.dataset: {d.dataset!r} is a hub id but the Hugging Face Hub cannot be "
            "reached. Set HF_HUB_OFFLINE=1 to use a cached copy, or use a local file or "
            "builtin:<task>"
        )


# ---------------------------------------------------------------------------------------------
# The policy, loaded once and only when needed
# ---------------------------------------------------------------------------------------------


class PolicyHolder:
    """Loads the starting policy on first use (a full cache hit never loads it)."""

    def __init__(self, cfg: RejectionSamplingConfig, device, dtype, attn):
        self.cfg, self.device, self.dtype, self.attn = cfg, device, dtype, attn
        self.model = None

    def get(self):
        if self.model is None:
            self.model = load_causal_lm(
                self.cfg.model.name,
                device=self.device,
                dtype=self.dtype,
                attn_implementation=self.attn,
                trainable=False,
            )
        return self.model

    def release(self) -> None:
        self.model = None
        free_memory(self.device)


def free_memory(device) -> None:
    gc.collect()
    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Stages 1-2: the scored pool (cached)
# ---------------------------------------------------------------------------------------------


def build_pool(
    cfg: RejectionSamplingConfig,
    run: RunDir,
    policy: PolicyHolder,
    tokenizer,
    prompts: list[RSPrompt],
    system_prompt: str,
    runtime: dict[str, str],
    total_steps: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scored pool {completions, lengths, scores, correct, predictions, timing} and the
    cache record {status, rollouts, scores, key, path}. Generation and scoring run only on a
    cache miss."""
    size = world().size  # the pool depends on the ranks' seeds
    fields_r = pipeline.cache_fields(cfg, prompts, with_scorer=False, world_size=size, **runtime)
    fields_s = pipeline.cache_fields(cfg, prompts, with_scorer=True, world_size=size, **runtime)
    key_r, key_s = pipeline.cache_key(fields_r), pipeline.cache_key(fields_s)
    path_r = pipeline.cache_dir() / f"{key_r}.rollouts.json"
    path_s = pipeline.cache_dir() / f"{key_s}.json"
    info: dict[str, Any] = {"key": key_s, "path": str(path_s), "enabled": cfg.use_cache}
    timing = {"generate_s": 0.0, "score_s": 0.0}

    scored = read_on_main(lambda: pipeline.read_cache(path_s, fields_s) if cfg.use_cache else None)
    if scored is not None:
        info.update(status="hit", rollouts="hit", scores="hit")
        print(f"generations + scores: cache hit ({path_s.name})", flush=True)
        return _pool_from(scored), {**info, "timing": timing, "cached_timing": scored["timing"]}

    rollouts = read_on_main(
        lambda: pipeline.read_cache(path_r, fields_r) if cfg.use_cache else None
    )
    if rollouts is None:
        info["rollouts"] = "miss"

        def on_batch(done: int, total: int) -> None:
            run.write_progress(
                0, total_steps, phase="generating", stage="generate", prompts_done=done
            )
            print(f"generated {done}/{total} prompts", flush=True)
            if stop_requested() and not world().distributed:  # else: all ranks, below
                raise StopRequested(
                    "SIGTERM during generation: nothing to checkpoint (the cache is written "
                    "only when the pool is complete); --resume starts generation again"
                )

        t0 = time.time()
        seed_everything(rank_seed(cfg.seed))  # one process: the config's seed
        per_call = cfg.generation.rollout_batch_size // world().size
        completions = split_work(
            prompts,
            lambda mine: pipeline.generate_pool(
                policy.get(), tokenizer, mine, system_prompt, cfg, on_batch, per_call
            ),
        )
        if world().distributed and any_rank(stop_requested()):
            raise StopRequested(
                "SIGTERM during generation: nothing to checkpoint (the cache is written only "
                "when the pool is complete); --resume starts generation again"
            )
        timing["generate_s"] = time.time() - t0
        rollouts = {
            "completions": completions,
            "lengths": pipeline.token_lengths(tokenizer, completions),
            "questions": [p.question for p in prompts],
            "timing": {"generate_s": timing["generate_s"]},
        }
        if cfg.use_cache:
            write_on_main(lambda: pipeline.write_cache(path_r, fields_r, rollouts))
    else:
        info["rollouts"] = "hit"
        print(f"generations: cache hit ({path_r.name}); scoring", flush=True)

    run.write_progress(0, total_steps, phase="generating", stage="score")
    if not cfg.scorer.is_verifier:
        policy.release()  # the reward model takes its place in memory
    scored_part = score_on_ranks(cfg, prompts, rollouts["completions"], system_prompt)
    timing["score_s"] = scored_part.pop("score_s")
    scored = {
        "prompts": [
            {
                "question": p.question,
                "gold": p.gold,
                "task": p.task,
                "completions": rollouts["completions"][i],
                "lengths": rollouts["lengths"][i],
                "scores": [pipeline.finite_or_none(s) for s in scored_part["scores"][i]],
                "correct": scored_part["correct"][i],
                "predictions": scored_part["predictions"][i],
            }
            for i, p in enumerate(prompts)
        ],
        "timing": {**rollouts["timing"], "score_s": timing["score_s"]},
    }
    if cfg.use_cache:
        write_on_main(lambda: pipeline.write_cache(path_s, fields_s, scored))
    info.update(status="partial" if info["rollouts"] == "hit" else "miss", scores="miss")
    if not cfg.use_cache:
        info.update(status="disabled", rollouts="disabled", scores="disabled")
    return _pool_from(scored), {**info, "timing": timing}


def score_on_ranks(
    cfg: RejectionSamplingConfig,
    prompts: list[RSPrompt],
    completions: list[list[str]],
    system_prompt: str,
) -> dict[str, Any]:
    """:func:`pipeline.score_pool`, each rank scoring its part of the prompts (one process:
    all of them): scores, correct, predictions in prompt order, and score_s."""
    t0 = time.time()
    keys = ("scores", "correct", "predictions")
    index = list(range(len(prompts)))

    def score(mine: list[int]) -> list[tuple]:
        part = pipeline.score_pool(
            cfg, [prompts[i] for i in mine], [completions[i] for i in mine], system_prompt
        )
        return list(zip(*(part[k] for k in keys), strict=True))

    rows = split_work(index, score)
    out: dict[str, Any] = {k: [row[c] for row in rows] for c, k in enumerate(keys)}
    out["score_s"] = time.time() - t0
    return out


def _pool_from(scored: dict) -> dict[str, Any]:
    rows = scored["prompts"]
    nan = float("nan")
    return {
        "completions": [r["completions"] for r in rows],
        "lengths": [r["lengths"] for r in rows],
        "scores": [[nan if s is None else float(s) for s in r["scores"]] for r in rows],
        "correct": [[bool(c) for c in r["correct"]] for r in rows],
        "predictions": [r["predictions"] for r in rows],
    }


# ---------------------------------------------------------------------------------------------
# Stage 3a: selection
# ---------------------------------------------------------------------------------------------


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v == v]  # drop NaN
    return sum(finite) / len(finite) if finite else float("nan")


def selection_stats(picks: list[Pick], pool: dict[str, Any], prefix: str) -> dict[str, float]:
    correct = [float(pool["correct"][i][j]) for i, j in picks]
    scores = [pool["scores"][i][j] for i, j in picks]
    lengths = [float(pool["lengths"][i][j]) for i, j in picks]
    return {
        f"{prefix}size": float(len(picks)),
        f"{prefix}mean_correctness": _mean(correct),
        f"{prefix}mean_score": _mean(scores),
        f"{prefix}unique_prompts": float(len({i for i, _ in picks})),
        f"{prefix}response_length": _mean(lengths),
    }


def pool_stats(pool: dict[str, Any], max_new_tokens: int) -> dict[str, float]:
    flat_c = [float(c) for row in pool["correct"] for c in row]
    flat_s = [s for row in pool["scores"] for s in row]
    flat_l = [float(x) for row in pool["lengths"] for x in row]
    return {
        "pool/num_prompts": float(len(pool["correct"])),
        "pool/size": float(len(flat_c)),
        "pool/mean_correctness": _mean(flat_c),
        "pool/mean_score": _mean(flat_s),
        "pool/response_length": _mean(flat_l),
        "pool/clipped_frac": _mean([float(x >= max_new_tokens) for x in flat_l]),
    }


def write_selection(
    path: Path, picks: list[Pick], prompts: list[RSPrompt], pool: dict, system_prompt: str
) -> None:
    """The SFT data: one conversation (system + user + selected completion) per pick."""
    import json

    lines = []
    for i, j in picks:
        score = pool["scores"][i][j]
        row = {
            "messages": [
                *prompts[i].messages(system_prompt),
                {"role": "assistant", "content": pool["completions"][i][j]},
            ],
            "prompt_index": i,
            "completion_index": j,
            "score": None if score != score else float(score),
            "correct": bool(pool["correct"][i][j]),
        }
        lines.append(json.dumps(row) + "\n")
    atomic_write_text(path, "".join(lines))


def _drop_rows(path: Path, drop) -> None:
    import json

    if path.exists():
        kept = [r for r in read_jsonl(path) if not drop(r)]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))


# ---------------------------------------------------------------------------------------------
# Held-out exact match (stages 3b and 4)
# ---------------------------------------------------------------------------------------------


def planned_sft_steps(cfg: RejectionSamplingConfig, size: int) -> int:
    n = max(size - cfg.sft.eval_size, 0)
    per_step = cfg.sft.batch_size * cfg.sft.gradient_accumulation_steps * world().size
    steps = -(-n // per_step) * cfg.sft.num_epochs
    return min(steps, cfg.sft.max_steps) if cfg.sft.max_steps else steps


def evaluate_policy(cfg, model, tokenizer, prompts, system_prompt) -> tuple[dict, list[dict]]:
    t0 = time.time()
    completions = split_work(
        prompts,
        lambda mine: pipeline.greedy_completions(model, tokenizer, mine, system_prompt, cfg),
    )
    metrics, samples = pipeline.exact_match_metrics(tokenizer, prompts, completions, cfg)
    return {**metrics, "timing/eval_s": time.time() - t0}, samples


def baseline_eval(
    cfg, policy, tokenizer, prompts, system_prompt, runtime
) -> tuple[dict, list, str]:
    """The starting policy's held-out exact match, cached like the pool (same for all four
    strategies). Returns (metrics, samples, 'hit' | 'miss')."""
    fields = pipeline.eval_cache_fields(cfg, prompts, **runtime)
    path = pipeline.cache_dir() / f"{pipeline.cache_key(fields)}.eval.json"
    cached = read_on_main(lambda: pipeline.read_cache(path, fields) if cfg.use_cache else None)
    if cached is not None:
        metrics, samples = pipeline.exact_match_metrics(
            tokenizer, prompts, cached["completions"], cfg
        )
        return {**metrics, "timing/eval_s": 0.0}, samples, "hit"
    t0 = time.time()
    completions = split_work(
        prompts,
        lambda mine: pipeline.greedy_completions(policy.get(), tokenizer, mine, system_prompt, cfg),
    )
    if cfg.use_cache:
        write_on_main(lambda: pipeline.write_cache(path, fields, {"completions": completions}))
    metrics, samples = pipeline.exact_match_metrics(tokenizer, prompts, completions, cfg)
    return {**metrics, "timing/eval_s": time.time() - t0}, samples, "miss"


# ---------------------------------------------------------------------------------------------
# Logging the selection and the summary
# ---------------------------------------------------------------------------------------------


def earlier_rows(run: RunDir, resume: bool) -> tuple[bool, dict | None]:
    """What a resumed run already logged: whether the pool's rollout row, and the baseline's
    step-0 eval row (None when absent)."""
    earlier = read_jsonl(run.metrics_path) if resume else []
    rollout_logged = any(r.get("phase") == "rollout" for r in earlier)
    baseline_row = next(
        (
            r
            for r in earlier
            if r.get("phase") == "eval" and r.get("step") == 0 and "eval/exact_match" in r
        ),
        None,
    )
    return rollout_logged, baseline_row


def selection_metrics(cfg, pool, picks, control_picks, diag, cache_info) -> dict[str, float]:
    """The step-0 ``rollout`` row: the pool, the selection and its matched control, the
    diagnostics, the cache and the times of stages 1-2."""
    selected = selection_stats(picks, pool, "selection/")
    control = selection_stats(control_picks, pool, "selection/control_")
    return {
        **pool_stats(pool, cfg.generation.max_new_tokens),
        **selected,
        "selection/control_mean_correctness": control["selection/control_mean_correctness"],
        "selection/control_mean_score": control["selection/control_mean_score"],
        **diagnostic_metrics(diag),
        "cache/hit": float(cache_info["status"] == "hit"),
        "timing/generate_s": cache_info["timing"]["generate_s"],
        "timing/score_s": cache_info["timing"]["score_s"],
    }


def write_diagnostics(cfg: RejectionSamplingConfig, run: RunDir, diag: dict) -> list[str]:
    """diagnostics.json and, with ``diagnostics.plots``, plots/*.png (rank 0); the plots' names."""
    if not world().is_main:
        return []
    atomic_write_json(run.path / DIAGNOSTICS_FILE, summary_view(diag))
    if not cfg.diagnostics.plots:
        return []
    return [p.name for p in write_plots(diag, run.path / "plots", title=cfg.strategy)]


def selection_line(strategy: str, n_picks: int, metrics: dict, diag: dict) -> str:
    """The selection's line in train.log: pool, decidable share, selection vs its control."""
    return (
        f"pool correctness {metrics['pool/mean_correctness']:.3f}, decidable "
        f"{diag['decidable']['decidable_frac']}, selection ({strategy}, {n_picks}) "
        f"correctness {metrics['selection/mean_correctness']:.3f} vs control "
        f"{metrics['selection/control_mean_correctness']:.3f}"
    )


def selection_samples(cfg, picks: list[Pick], pool, prompts: list[RSPrompt]) -> list[dict]:
    """The first ``diagnostics.num_selection_samples`` selected completions, for samples.jsonl."""
    return [
        {
            "kind": "selection",
            "strategy": cfg.strategy,
            "prompt": prompts[i].question,
            "completion": pool["completions"][i][j],
            "gold": prompts[i].gold,
            "score": pool["scores"][i][j],
            "correct": pool["correct"][i][j],
        }
        for i, j in picks[: cfg.diagnostics.num_selection_samples]
    ]


def restart_sft_rows(run: RunDir, resume: bool) -> bool:
    """Whether the SFT stage resumes from a checkpoint; the rows it will write again are
    dropped first (all of SFT's when it starts over, the final evaluation's otherwise)."""
    resume_sft = resume and bool(list_checkpoints(run.checkpoints_dir))
    if resume and not resume_sft and world().is_main:  # stopped before SFT checkpointed
        _drop_rows(run.metrics_path, lambda r: r.get("step", 0) > 0)  # SFT starts over
        _drop_rows(run.samples_path, lambda r: r.get("step", 0) > 0)
    elif resume_sft and world().is_main:  # the final evaluation runs again after SFT
        _drop_rows(run.metrics_path, lambda r: r.get("step", 0) > 0 and "eval/exact_match" in r)
        _drop_rows(run.samples_path, lambda r: r.get("step", 0) > 0)
    return resume_sft


def evaluate_saved_model(cfg, folder: Path, prompts, system_prompt: str, runtime):
    """Held-out exact match of the model saved in ``folder`` (loaded, evaluated, freed)."""
    device, dtype, attn = runtime
    model = load_causal_lm(
        str(folder), device=device, dtype=dtype, attn_implementation=attn, trainable=False
    )
    metrics, samples = evaluate_policy(
        cfg, model, load_tokenizer(str(folder)), prompts, system_prompt
    )
    del model
    free_memory(device)
    return metrics, samples


def log_eval(run: RunDir, tracker, steps: tuple[int, int], metrics: dict, samples, stage: str):
    """An ``eval`` row at ``steps[0]`` (of ``steps[1]``), its samples tagged with ``stage``."""
    step, total = steps
    run.log_metrics(step, "eval", metrics)
    tracker.log(metrics, step)
    run.log_samples(step, [{**s, "stage": stage} for s in samples])
    print(eval_line(step, total, metrics), flush=True)


def exact_match_gain(baseline: dict, final_eval: dict) -> float | None:
    key = "eval/exact_match"
    return final_eval[key] - baseline[key] if key in final_eval and key in baseline else None


# ---------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------


def train(cfg: RejectionSamplingConfig, run: RunDir, resume: bool) -> SummaryFile:
    """The four stages (module doc); the SFT stage is trainers.sft's loop in this run folder."""
    seed_everything(cfg.seed)
    device, dtype, attn = pick_runtime(cfg.model)
    runtime = {"device": device.type, "dtype": str(dtype).replace("torch.", ""), "attn": attn}
    system_prompt = pipeline.system_prompt_for(cfg)
    run.update_phase("tokenizing")
    try:
        train_prompts, test_prompts = pipeline.load_prompts(cfg)
    except DataError as err:
        raise ConfigError(f"data: {err}") from None
    n = cfg.generation.num_completions_per_prompt
    size = selection_size(cfg.strategy, len(train_prompts), n, cfg.top_k)
    total_steps = planned_sft_steps(cfg, size)
    data_info = {"num_train_prompts": len(train_prompts), "num_test_prompts": len(test_prompts)}
    print(f"data: {data_info}", flush=True)

    run.update_phase("loading_model", total_steps)
    tokenizer = load_tokenizer(cfg.model.name)
    policy = PolicyHolder(cfg, device, dtype, attn)
    name = f"rs-{cfg.strategy}-{run.path.name}"
    config = cfg.model_dump(mode="json")
    tracker = Tracker(cfg.logging, run.path, config, name) if world().is_main else SilentTracker()
    rollout_logged, baseline_row = earlier_rows(run, resume)

    # ---- stages 1-2: generate and score (cached) ---------------------------------------------
    run.write_progress(0, total_steps, phase="generating", stage="generate")
    pool, cache_info = build_pool(
        cfg, run, policy, tokenizer, train_prompts, system_prompt, runtime, total_steps
    )
    diag = diagnose(pool["scores"], pool["correct"])

    # ---- stage 3a: select -------------------------------------------------------------------
    picks = select(cfg.strategy, pool["scores"], top_k=cfg.top_k, seed=cfg.seed)
    control_picks = select(cfg.matched_control, pool["scores"], top_k=cfg.top_k, seed=cfg.seed)
    if not picks:
        raise ConfigError("the selection is empty: no completions were generated")
    selection_path = run.path / SELECTION_FILE
    write_on_main(
        lambda: write_selection(selection_path, picks, train_prompts, pool, system_prompt)
    )
    rollout_metrics = selection_metrics(cfg, pool, picks, control_picks, diag, cache_info)
    plots = write_diagnostics(cfg, run, diag)
    print(selection_line(cfg.strategy, len(picks), rollout_metrics, diag), flush=True)
    if not rollout_logged:
        run.log_metrics(0, "rollout", rollout_metrics)
        tracker.log(rollout_metrics, 0)
        run.log_samples(0, selection_samples(cfg, picks, pool, train_prompts))

    # ---- stage 3b: the starting policy on held-out prompts ----------------------------------
    baseline: dict = {}
    baseline_cache = None
    if baseline_row is not None:
        baseline = {k: v for k, v in baseline_row.items() if k.startswith("eval/")}
    elif cfg.eval.baseline and test_prompts:
        run.write_progress(0, total_steps, phase="evaluating", stage="baseline_eval")
        baseline, samples, baseline_cache = baseline_eval(
            cfg, policy, tokenizer, test_prompts, system_prompt, runtime
        )
        log_eval(run, tracker, (0, total_steps), baseline, samples, "baseline")
    policy.release()

    # ---- stage 3c: SFT on the selection -----------------------------------------------------
    resume_sft = restart_sft_rows(run, resume)
    t0 = time.time()
    sft_summary = run_sft(cfg, run, selection_path, tracker, resume_sft)
    sft_s = time.time() - t0
    steps, total_steps = sft_summary.steps, sft_summary.total_steps

    # ---- stage 4: the SFT model on held-out prompts -----------------------------------------
    final_model = run.path / "final_model"
    final_eval: dict = {}
    if test_prompts:
        run.write_progress(steps, total_steps, phase="evaluating", stage="final_eval")
        final_eval, samples = evaluate_saved_model(
            cfg, final_model, test_prompts, system_prompt, (device, dtype, attn)
        )
        log_eval(run, tracker, (steps, total_steps), final_eval, samples, "final")
        print(
            f"exact match {baseline.get('eval/exact_match', float('nan')):.3f} -> "
            f"{final_eval['eval/exact_match']:.3f}",
            flush=True,
        )
    if not cfg.checkpoint.save_final_model:
        write_on_main(lambda: shutil.rmtree(final_model, ignore_errors=True))
    run.write_progress(
        steps, total_steps, phase="done", stage="done", tokens_seen=sft_summary.tokens_seen
    )
    tracker.finish()

    evals = [m["eval/exact_match"] for m in (baseline, final_eval) if "eval/exact_match" in m]
    fields: dict[str, Any] = {
        "algorithm": cfg.strategy,
        "strategy": cfg.strategy,
        "matched_control": MATCHED_CONTROL[cfg.strategy],
        "steps": steps,
        "total_steps": total_steps,
        "final_metrics": sft_summary.final_metrics,
        "final_eval": final_eval,
        "baseline_eval": baseline,
        "best_metrics": {"eval/exact_match": max(evals) if evals else None},
        "exact_match_gain": exact_match_gain(baseline, final_eval),
        "rollout_metrics": rollout_metrics,
        "diagnostics": summary_view(diag),
        "cache": {**cache_info, "baseline_eval": baseline_cache},
        "selection_file": str(selection_path),
        "plots": plots,
        "data": {**data_info, "sft": (sft_summary.model_extra or {}).get("data")},
        "timing": {**cache_info["timing"], "sft_s": sft_s},
        "peak_memory_gb": peak_memory_gb(device),
        "tokens_seen": sft_summary.tokens_seen,
        "final_model": str(final_model) if cfg.checkpoint.save_final_model else None,
        "wandb_url": tracker.url,
    }
    if world().distributed:
        seeds = [rank_seed(cfg.seed, r) for r in range(world().size)]
        fields["distributed"] = {**describe(), "sampling_seeds": seeds}
    return SummaryFile(outcome="succeeded", **fields)


main = trainer_main(__doc__, RejectionSamplingConfig, preflight, train)


if __name__ == "__main__":
    sys.exit(main())
