"""Policy-gradient RL on verifiable reasoning tasks or against a learned reward model: REINFORCE,
RLOO, PPO, GRPO, Dr. GRPO, GSPO, CISPO, SAPO, DAPO, MaxRL, REINFORCE++ (and its group-baseline
variant), ReMax and GMPO, one loop for all fourteen.

    python -m trainers.policy_gradients.train --config configs/grpo.yaml --run-dir DIR \
        [--set model.name=tiny] [--set train.max_steps=20] [--resume]

One rollout step, as in the algorithm box:
  1. sample ``prompts_per_step`` prompts (DAPO: keep sampling until enough groups show contrast);
  2. roll out ``num_rollouts`` completions per prompt with the current policy (= π_old);
     ReMax also one greedy completion per prompt (its baseline);
  3. score them (verifier_weight·correctness + format_weight·format (+ DAPO overlong penalty)
     + model_weight·normalised reward-model score − missing-EOS penalty, clipped; README.md
     "Rewards");
  4. advantages (group baselines, GAE on a learned value model for PPO, or returns-to-go for
     REINFORCE++ / ReMax; KL shaping of the reward where the spec puts the KL there, β > 0);
  5. for each of ``updates_per_rollout`` passes: shuffle, micro-batches, per-token losses,
     aggregate over the whole optimizer step (``loss_agg``), backward; clip and step every
     ``gradient_accumulation_steps`` micro-batches;
  6. log: reward statistics (phase ``rollout``), optimisation statistics (phase ``train``),
     greedy held-out correctness (phase ``eval``) every ``eval.eval_every`` steps.

Under ``torchrun --nproc-per-node N`` the policy, the reference and the value model are sharded
with FSDP2; each rank rolls out its share of the step's prompts by whole groups, sampling with
seed + rank, and updates on it; ``prompts_per_step`` is global, ``train.batch_size`` a rank's
micro-batch, so an optimizer step holds batch_size × accumulation × N sequences; every logged
number is a statistic of the whole step (README "Several processes"; :mod:`.ranks`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from trainers.core.config import ConfigError
from trainers.core.distributed import (
    check_divisible,
    describe,
    gather_objects,
    gather_sum,
    rank_block,
    rank_seed,
    shard_model,
    sum_over_ranks,
    world,
    world_from_env,
)
from trainers.core.flops import StageClock
from trainers.core.generation import end_of_turn_ids
from trainers.core.harness import trainer_main
from trainers.core.loop import BestMetric, TrainingRun
from trainers.core.lora import (
    add_adapters,
    checkpoint_state,
    load_checkpoint_state,
    needs_reference_copy,
)
from trainers.core.models import load_causal_lm, load_reference, load_tokenizer, pick_runtime
from trainers.core.multiturn import check_tool_format, trajectory_stats
from trainers.core.onpolicy import greedy_rollouts
from trainers.core.prompts import PromptStream, check_specs, load_run_prompts
from trainers.core.reward_scorer import RewardScorer, inspect_reward_model
from trainers.core.rundir import RunDir
from trainers.core.runfolder import SummaryFile
from trainers.core.training import (
    build_optimizer,
    peak_memory_gb,
    seed_everything,
    use_gradient_checkpointing,
)
from trainers.core.verifier import Verifier, compute_rewards
from trainers.policy_gradients.advantages import frac_zero_std
from trainers.policy_gradients.config import PolicyGradientConfig
from trainers.policy_gradients.experience import Experience
from trainers.policy_gradients.generation import generate_trajectory_batch
from trainers.policy_gradients.rewards import RunningMoments
from trainers.policy_gradients.rollout import (
    RewardModels,
    prepare_update,
    rollout_step,
    score_greedy,
)
from trainers.policy_gradients.stages import prepare_seconds, stage_metrics, step_shapes
from trainers.policy_gradients.token_passes import load_value_model
from trainers.policy_gradients.update import optimizer_steps_per_update, update

# ---------------------------------------------------------------------------------------------
# Checks before anything is written
# ---------------------------------------------------------------------------------------------


def preflight(cfg: PolicyGradientConfig) -> None:
    """Checks before anything is written: the task specs exist and parse, a local prompt
    dataset exists, and each reward model is a scalar reward model whose config and tokenizer
    load here (ConfigError naming the key otherwise)."""
    from pathlib import Path

    from trainers.core.datasets import looks_like_path

    d = cfg.data
    if d.source == "reasoning_gym":
        check_specs(d.specs)
    elif d.dataset and not d.has_verifier and looks_like_path(d.dataset):
        if not Path(d.dataset).expanduser().exists():
            raise ConfigError(
                f"data.dataset: file not found: {d.dataset}. Use an existing "
                ".jsonl/.json/.parquet/.csv file or folder, a hub id, or builtin (offline)"
            )
    for key, name in cfg.reward_model_names():
        inspect_reward_model(name, key)
    check_world(cfg, world_from_env().size)
    if cfg.multi_turn:
        check_tool_tokenizer(cfg)


def check_tool_tokenizer(cfg: PolicyGradientConfig) -> None:
    """The model's tokenizer can write the tool-call format and its chat template a tool reply
    (ConfigError naming env.name otherwise)."""
    try:
        check_tool_format(load_tokenizer(cfg.model.name))
    except ValueError as err:
        raise ConfigError(f"env.name={cfg.env.name!r} with model {cfg.model.name}: {err}") from None


def check_world(cfg: PolicyGradientConfig, size: int) -> None:
    """The step's prompts split over ``size`` ranks by whole groups, and each rank's share
    into whole micro-batches (ConfigError otherwise)."""
    P, G, bs = cfg.rollout.prompts_per_step, cfg.rollout.num_rollouts, cfg.train.batch_size
    check_divisible(P, "rollout.prompts_per_step", size, " prompts")
    if size > 1 and (P // size * G) % bs:
        raise ConfigError(
            f"each of {size} processes rolls out {P // size} prompts × {G} = {P // size * G} "
            f"sequences, which train.batch_size={bs} (a rank's micro-batch) does not divide: "
            "pick a micro-batch that divides it"
        )


def planned_rollout_steps(cfg: PolicyGradientConfig) -> int:
    """The run's rollout steps, known from the config alone (for the first progress.json)."""
    return cfg.total_rollout_steps


# ---------------------------------------------------------------------------------------------
# Metrics helpers
# ---------------------------------------------------------------------------------------------


def _mean(x: torch.Tensor) -> float:
    return float(x.float().mean()) if x.numel() else float("nan")


def _global_mean(x: torch.Tensor) -> float:
    """The mean over every rank's elements (a statistic of the whole step; collective)."""
    total, n = gather_sum([float(x.double().sum()), x.numel()])
    return total / n if n else float("nan")


REWARD_PARTS = ("total", "correctness", "format", "binary", "penalty", "greedy")


def gold_and_proxy(
    r: dict[str, torch.Tensor], cfg: PolicyGradientConfig, prefix: str = "", mean=_mean
):
    """``proxy_reward`` (mean raw reward-model score) and ``gold_reward`` (the gold reward
    model's mean score, else mean verifier correctness) when they exist."""
    out = {}
    if "model" in r:
        out[f"{prefix}proxy_reward"] = mean(r["model"])
    if "gold" in r:
        out[f"{prefix}gold_reward"] = mean(r["gold"])
    elif cfg.gold_source == "verifier" and "correctness" in r:
        out[f"{prefix}gold_reward"] = mean(r["correctness"])
    return out


def reward_metrics(drawn: Experience, cfg: PolicyGradientConfig) -> dict[str, float]:
    """Reward statistics of every rollout the step sampled (DAPO: before filtering), over
    every rank's rollouts."""
    r = drawn.rewards
    out = {f"avg_{k}": _global_mean(r[k].float()) for k in REWARD_PARTS if k in r}
    out.update(gold_and_proxy(r, cfg, mean=lambda x: _global_mean(x.float())))
    G = cfg.rollout.num_rollouts
    if G >= 2:
        signal = r["binary"] if cfg.spec.reward_signal == "binary" else r["total"]
        groups = len(signal) // G
        zero, n = gather_sum([frac_zero_std(signal, G) * groups, groups])
        out["frac_reward_zero_std"] = zero / n if n else float("nan")
    out["response_length/mean"] = _global_mean(drawn.lengths.float())
    out["response_length/clipped_frac"] = _global_mean(drawn.truncated.float())
    if drawn.trajectories is not None:  # multi-turn: turns, tool calls, errors, use of results
        stats = trajectory_stats(drawn.trajectories)
        out.update({f"tools/{k}": _global_mean(v) for k, v in stats.items()})
    return out


# ---------------------------------------------------------------------------------------------
# The update phase
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Held-out evaluation and samples
# ---------------------------------------------------------------------------------------------


def evaluate(
    cfg: PolicyGradientConfig,
    policy: torch.nn.Module,
    tokenizer: Any,
    held_out: list[Any],
    models: RewardModels | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy completions on the held-out prompts: eval/avg_correctness, eval/avg_format, ...
    (verifier prompts), eval/proxy_reward and eval/gold_reward (reward models), eval/avg_total
    (the weighted reward with the reward model's raw score: no whitening). Under torchrun each
    rank completes and scores an equal block of the prompts (:func:`held_out_share`)."""
    max_new = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    block = rank_block(len(held_out))
    mine = [held_out[i] for i in block]
    if cfg.multi_turn:
        out = greedy_trajectories(cfg, policy, tokenizer, mine, max_new)
    else:
        out = greedy_rollouts(policy, tokenizer, mine, max_new, cfg.eval.eval_batch_size)
    r = score_greedy(cfg, mine, out, models)
    out, r = held_out_share(block, out, r, len(held_out))
    texts, lengths = out["texts"], out["lengths"]
    parts = ("correctness", "format", "binary", "total")
    metrics = {f"eval/avg_{k}": _mean(r[k]) for k in parts if k in r}
    metrics.update(gold_and_proxy(r, cfg, prefix="eval/"))
    metrics["eval/num_prompts"] = len(held_out)
    metrics["eval/response_length/mean"] = sum(lengths) / max(1, len(lengths))
    truncated = out["truncated"]
    metrics["eval/response_length/clipped_frac"] = sum(truncated) / max(1, len(truncated))
    if cfg.multi_turn:
        stats = {k: torch.tensor(v) for k, v in out["tools"].items()}
        metrics.update({f"eval/tools/{k}": _mean(v) for k, v in stats.items()})
    shown = [k for k in ("correctness", "format", "binary", "model", "gold") if k in r]
    samples = [
        {
            "kind": "eval",
            "question": p.question,
            "answer": p.answer,
            "completion": t,
            **{k: float(r[k][i]) for k in shown},
            **({"turns": out["turns"][i]} if cfg.multi_turn else {}),
        }
        for i, (p, t) in enumerate(zip(held_out, texts, strict=True))
    ][: cfg.eval.num_samples]
    return metrics, samples


def greedy_trajectories(
    cfg: PolicyGradientConfig, policy: torch.nn.Module, tokenizer: Any, prompts: list, max_new: int
) -> dict[str, Any]:
    """Multi-turn held-out rollouts, greedy, in :func:`greedy_rollouts`' layout plus each
    trajectory's ``turns`` (transcript), ``tools`` figures and ``env_rewards``."""
    exp = generate_trajectory_batch(
        policy, tokenizer, prompts, cfg, greedy=True, max_new_tokens=max_new
    )
    prompt_ids, completion_ids = exp.token_ids()
    trajectories = exp.trajectories or []
    stats = trajectory_stats(trajectories)
    return {
        "texts": exp.texts,
        "lengths": [int(n) for n in exp.lengths.tolist()],
        "truncated": [bool(x) for x in exp.truncated.tolist()],
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "turns": [t.transcript() for t in trajectories],
        "tools": {k: v.tolist() for k, v in stats.items()},
        "env_rewards": exp.turn_rewards.sum(-1) if exp.turn_rewards is not None else None,
    }


def held_out_share(
    block: list[int], out: dict[str, list], rewards: dict[str, torch.Tensor], n: int
) -> tuple[dict[str, list], dict[str, torch.Tensor]]:
    """Every rank's greedy completions (``texts``, ``lengths``, ``truncated``) and reward
    parts, in the held-out order: ``block`` is this rank's :func:`rank_block` of the ``n``
    prompts (padded with repeats of its last prompt, which are dropped here); collective."""
    keys = ("texts", "lengths", "truncated")
    if "turns" in out:  # multi-turn: the transcripts and tool figures travel with the rows
        return _held_out_share_turns(block, out, rewards, n)
    mine = [
        (i, *(out[k][j] for k in keys), {k: float(v[j]) for k, v in rewards.items()})
        for j, i in enumerate(block)
    ]
    by_index = {row[0]: row for part in gather_objects(mine) for row in part}
    rows = [by_index[i] for i in range(n)]
    merged = {k: [row[1 + c] for row in rows] for c, k in enumerate(keys)}
    parts = {k: torch.tensor([row[4][k] for row in rows]) for k in rewards}
    return merged, parts


def _held_out_share_turns(
    block: list[int], out: dict[str, Any], rewards: dict[str, torch.Tensor], n: int
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """:func:`held_out_share` for multi-turn rows: ``turns`` and each ``tools`` figure too."""
    tools = out["tools"]
    mine = [
        (
            i,
            {k: out[k][j] for k in ("texts", "lengths", "truncated", "turns")},
            {k: v[j] for k, v in tools.items()},
            {k: float(v[j]) for k, v in rewards.items()},
        )
        for j, i in enumerate(block)
    ]
    by_index = {row[0]: row for part in gather_objects(mine) for row in part}
    rows = [by_index[i] for i in range(n)]
    merged: dict[str, Any] = {k: [row[1][k] for row in rows] for k in rows[0][1]}
    merged["tools"] = {k: [row[2][k] for row in rows] for k in tools}
    parts = {k: torch.tensor([row[3][k] for row in rows]) for k in rewards}
    return merged, parts


def rollout_samples(cfg: PolicyGradientConfig, exp: Experience) -> list[dict[str, Any]]:
    """The first rollout of each of the first ``eval.num_samples`` groups, with its reward."""
    G = cfg.rollout.num_rollouts
    n_groups = exp.num_sequences // G
    out = []
    for g in range(min(cfg.eval.num_samples, n_groups)):
        i = g * G
        row = {
            "kind": "rollout",
            "question": exp.prompts[i].question,
            "answer": exp.prompts[i].answer,
            "completion": exp.texts[i],
            **{k: float(v[i]) for k, v in exp.rewards.items()},
        }
        if exp.trajectories is not None:
            row["turns"] = exp.trajectories[i].transcript()
        if not cfg.spec.needs_value_model and exp.advantages is not None:
            row["advantage"] = float(exp.advantages[i, 0])
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------
# Setting up: prompts, the models, the reward models
# ---------------------------------------------------------------------------------------------


def load_prompt_sets(cfg: PolicyGradientConfig, notes: list[str]) -> tuple[list, list, dict]:
    """(training prompts, held-out prompts, their statistics); a shortfall of distinct prompts
    is a note (or, below one step's prompts, a ConfigError)."""
    train_prompts, held_out, load_stats = load_run_prompts(cfg.data, cfg.seed)
    if len(held_out) < cfg.data.eval_size:
        notes.append(
            f"only {len(held_out)} of data.eval_size={cfg.data.eval_size} held-out prompts: the "
            "data has few distinct prompts beyond the training ones"
        )
        print(f"note: {notes[-1]}", flush=True)
    if len(train_prompts) < cfg.rollout.prompts_per_step:
        raise ConfigError(
            f"only {len(train_prompts)} distinct training prompt(s) in data.dataset, fewer than "
            f"rollout.prompts_per_step={cfg.rollout.prompts_per_step}"
        )
    if len(train_prompts) < cfg.data.size:
        notes.append(
            f"only {len(train_prompts)} of data.size={cfg.data.size} training prompts (the "
            "data has no more distinct prompts)"
        )
        print(f"note: {notes[-1]}", flush=True)
    stats = {"n_train": len(train_prompts), "n_eval": len(held_out), **load_stats}
    return train_prompts, held_out, stats


@dataclass
class Models:
    """The trained policy, its frozen reference (None: no KL term, or LoRA's adapters-off base)
    and PPO's value model, with every trainable parameter the optimizer steps."""

    policy: torch.nn.Module
    ref_model: torch.nn.Module | None
    value_model: torch.nn.Module | None
    params: list[torch.nn.Parameter]


def load_models(cfg: PolicyGradientConfig, device, dtype, attn) -> Models:
    """The policy (LoRA adapters when asked), the reference when the KL term needs a copy, the
    value model for PPO; each sharded with FSDP2 under torchrun (one process: as is)."""
    load = dict(device=device, dtype=dtype, attn_implementation=attn)
    policy = add_adapters(load_causal_lm(cfg.model.name, trainable=True, **load), cfg.model.lora)
    use_gradient_checkpointing(policy, cfg.model.gradient_checkpointing)
    shard_model(policy)  # one unit per decoder layer
    ref_model = None  # with LoRA: the policy's base, adapters off (lora.reference_view)
    if cfg.uses_kl and needs_reference_copy(cfg.model):
        ref_model = load_reference(cfg.model, device, dtype, attn)
        shard_model(ref_model)  # each rank scores its own share of the rollouts with it
    value_model = None
    params = [p for p in policy.parameters() if p.requires_grad]
    if cfg.spec.needs_value_model:
        value_model = load_value_model(cfg.model.name, lora=cfg.model.lora, **load)
        use_gradient_checkpointing(value_model.body, cfg.model.gradient_checkpointing)
        shard_model(value_model)
        value_model.train()
        params += [p for p in value_model.parameters() if p.requires_grad]
    return Models(policy, ref_model, value_model, params)


def load_reward_models(
    cfg: PolicyGradientConfig, tokenizer, runtime, info: dict, verifier: Verifier
) -> RewardModels:
    """The optimised reward model (``reward.model``) and the held-out gold one, each scoring
    the policy's own token ids when it shares the policy's tokenizer; ``verifier`` scores the
    verifier prompts."""
    device, dtype, attn = runtime
    models = RewardModels(stop_ids=set(end_of_turn_ids(tokenizer)), verifier=verifier)
    for key, name in cfg.reward_model_names():
        scorer = RewardScorer.load(
            inspect_reward_model(name, key),
            device=device,
            dtype=dtype,
            attn_implementation=attn,
            batch_size=cfg.reward.score_batch_size,
            policy_tokenizer=tokenizer,
        )
        if key == "reward.model":
            models.proxy = scorer
        else:
            models.gold = scorer
        tokens = "policy ids reused" if scorer.reuse_ids else "re-tokenised from text"
        info.setdefault("reward_models", {})[key] = {
            "name": name,
            "kind": scorer.kind,
            "tokens": tokens,
        }
        print(f"{key}: {name} ({scorer.kind}; {tokens})", flush=True)
    return models


def seed_the_ranks(cfg: PolicyGradientConfig, info: dict) -> None:
    """Under torchrun every rank built the same weights; each then samples its own rollouts
    (seed + rank). One process: nothing to do."""
    if world().distributed:
        torch.manual_seed(rank_seed(cfg.seed))
        seeds = [rank_seed(cfg.seed, r) for r in range(world().size)]
        info["distributed"] = {**describe(), "sampling_seeds": seeds}


def checkpointed_modules(m: Models) -> tuple[torch.nn.Module, bool]:
    """What a checkpoint holds as its model, and whether the value model is in it: under
    torchrun the value model's shards go with the policy's (torch.distributed.checkpoint); on
    one process the policy alone, the value model's state riding in the family state."""
    if m.value_model is not None and world().distributed:
        return torch.nn.ModuleDict({"policy": m.policy, "value_model": m.value_model}), True
    return m.policy, False


# ---------------------------------------------------------------------------------------------
# What a step logs
# ---------------------------------------------------------------------------------------------


def rollout_log(cfg, ri, exp: Experience, prep_info: dict, clock: StageClock, models) -> dict:
    """The ``rollout`` row: reward statistics of everything the step sampled, the KL to the
    reference, the reward model's running normalisation, DAPO's filter, the phases' times."""
    row = {
        **reward_metrics(ri.drawn, cfg),
        **prep_info,
        "timing/generate_s": clock.seconds.get("generate", 0.0),
        "timing/score_s": clock.seconds.get("score", 0.0),
        "timing/prepare_s": prepare_seconds(clock),
    }
    if exp.kl_ref is not None:
        row["kl_ref"] = _global_mean(exp.kl_ref)
    if cfg.reward.normalize == "running":
        row["reward_norm/mean"] = models.moments.mean
        row["reward_norm/std"] = models.moments.std
    if cfg.spec.dynamic_sampling:
        row["dynamic_sampling/kept_frac"] = ri.groups_kept / ri.groups_drawn
        row["dynamic_sampling/prompts_drawn"] = ri.prompts_drawn
    return row


def step_line(step: int, total: int, rollout: dict, train: dict) -> str:
    """The step's line in train.log."""
    shown = [
        f"{label} {rollout[key]:.3f}"
        for label, key in (
            ("proxy", "proxy_reward"),
            ("gold", "gold_reward"),
            ("correctness", "avg_correctness"),
            ("format", "avg_format"),
            ("kl_ref", "kl_ref"),
        )
        if key in rollout
    ]
    return (
        f"step {step}/{total} " + " ".join(shown) + f" loss {train['loss']:.4f} "
        f"gen {rollout['timing/generate_s']:.1f}s train {train['timing/train_s']:.1f}s"
    )


# ---------------------------------------------------------------------------------------------
# The training loop
# ---------------------------------------------------------------------------------------------


def train(
    cfg: PolicyGradientConfig, run: RunDir, resume: bool, *, verifier: Verifier = compute_rewards
) -> SummaryFile:
    """Load prompts and models, then the rollout-score-update loop; see the module doc.
    ``verifier`` scores the completions of verifier prompts, in the rollouts and the held-out
    evaluation (reasoning-gym's answer check and the tag format; a test may pass a stand-in,
    ``main.with_options(verifier=...)``)."""
    seed_everything(cfg.seed)
    device, dtype, attn = pick_runtime(cfg.model)
    notes = cfg.notes()
    for note in notes:
        print(f"note: {note}", flush=True)
    total_steps = cfg.total_rollout_steps
    loop = TrainingRun(run, cfg.checkpoint, total_steps)

    tokenizer = load_tokenizer(cfg.model.name)
    run.update_phase("tokenizing")
    train_prompts, held_out, data_stats = load_prompt_sets(cfg, notes)
    info: dict[str, Any] = {"data": data_stats}
    print(f"data: {info['data']}", flush=True)

    run.update_phase("loading_model")
    m = load_models(cfg, device, dtype, attn)
    policy, value_model = m.policy, m.value_model
    seed_the_ranks(cfg, info)
    models = load_reward_models(cfg, tokenizer, (device, dtype, attn), info, verifier)
    shapes = step_shapes(policy, value_model, models, device, dtype)  # FLOPs and the peak

    opt_steps = total_steps * cfg.loss.updates_per_rollout
    opt_steps *= optimizer_steps_per_update(cfg, world().size)
    optimizer, scheduler = build_optimizer(m.params, cfg.train, opt_steps)
    stream = PromptStream(len(train_prompts), cfg.seed)
    best = BestMetric(cfg.headline_metric)
    held, sharded_value = checkpointed_modules(m)
    if resume:
        state = loop.resume(held, optimizer, scheduler)
        stream = PromptStream.from_state(len(train_prompts), cfg.seed, state["data_position"])
        if value_model is not None and not sharded_value:
            load_checkpoint_state(value_model, state["extra"]["value_model"])
        best.value = state["extra"].get("best_eval")
        models.moments = RunningMoments.from_state(state["extra"].get("reward_moments"))
    loop.start_tracker(cfg.logging, cfg.model_dump(mode="json"), f"{cfg.algorithm}-{run.path.name}")
    last_rollout: dict[str, Any] = {}

    def run_eval() -> None:
        if not held_out:
            return
        loop.progress("evaluating")
        loop.last_eval, samples = evaluate(cfg, policy, tokenizer, held_out, models)
        loop.log("eval", loop.last_eval)
        loop.log_samples(samples)
        best.update(loop.last_eval)

    def checkpoint_extra() -> dict[str, Any]:
        extra: dict[str, Any] = {"best_eval": best.value, "reward_moments": models.moments.state()}
        if value_model is not None and not sharded_value:
            extra["value_model"] = checkpoint_state(value_model)  # LoRA: adapters + head
        return extra

    loop.checkpoint_with(
        held, optimizer, scheduler, position=lambda: stream.state(), extra=checkpoint_extra
    )
    if not resume and cfg.eval.eval_every > 0:
        run_eval()  # the starting point (e.g. the warm start's level), for contrast
    if loop.redo_events and loop.every(cfg.eval.eval_every):
        run_eval()  # stopped during the evaluation after the checkpoint's step

    while not loop.done:
        clock = StageClock(device)  # each stage's seconds (README "Where the time goes")
        # 1-3. sample prompts, roll out, score (on CPU afterwards)
        loop.progress("generating", data=stream.state())
        exp, ri = rollout_step(policy, tokenizer, stream, train_prompts, cfg, models, clock=clock)
        # 4. log-probs / values / advantages
        exp, prep_info = prepare_update(exp, cfg, policy, m.ref_model, value_model, device, clock)
        # 5. update
        loop.progress("training", data=stream.state())
        with clock.stage("update"):
            train_metrics = update(
                cfg, policy, value_model, optimizer, scheduler, m.params, exp, loop.step, device
            )
        step_tokens = int(sum_over_ranks(int(exp.attention_mask.sum())))  # every rank's
        loop.advance(step_tokens)
        stages = stage_metrics(clock, ri.drawn, exp, shapes, cfg)  # seconds, tokens/s, MFU
        dt = clock.dt

        # 6. log
        last_rollout = rollout_log(cfg, ri, exp, prep_info, clock, models)
        loop.last_train = {
            **train_metrics,
            "timing/train_s": clock.seconds["update"],
            "timing/step_s": dt,
            "throughput/tokens_per_s": step_tokens / max(dt, 1e-9),
            "memory/peak_gb": peak_memory_gb(device),
            **stages,
        }
        if loop.should_log(cfg.logging.log_every):
            loop.log("rollout", last_rollout)
            loop.log("train", loop.last_train)
        if loop.every(cfg.eval.sample_every, at_end=bool(cfg.eval.sample_every)):
            loop.log_samples(rollout_samples(cfg, exp))
        print(step_line(loop.step, total_steps, last_rollout, loop.last_train), flush=True)
        if loop.every(cfg.eval.eval_every):
            run_eval()
        loop.progress("training", data=stream.state())
        loop.checkpoint_or_stop()

    loop.save_final_model(policy, tokenizer)
    loop.finish(data=stream.state())
    final_metrics = {**last_rollout, **loop.last_train}
    return loop.summary(
        cfg.algorithm, best, device, final_metrics=final_metrics, notes=notes, **info
    )


main = trainer_main(
    __doc__,
    PolicyGradientConfig,
    preflight,
    train,
    planned_steps=planned_rollout_steps,
)


if __name__ == "__main__":
    sys.exit(main())
