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
import time
from typing import Any

import torch

from trainers.core.config import ConfigError
from trainers.core.distributed import (
    any_rank,
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
from trainers.core.generation import end_of_turn_ids
from trainers.core.harness import raise_if_stopping, stop_requested, trainer_main
from trainers.core.loop import BestMetric, StepTimer, TrainingRun, pick_runtime
from trainers.core.lora import (
    add_adapters,
    checkpoint_state,
    load_checkpoint_state,
    needs_reference_copy,
)
from trainers.core.models import load_causal_lm, load_tokenizer
from trainers.core.onpolicy import greedy_rollouts
from trainers.core.prompts import PromptStream, check_specs, load_run_prompts
from trainers.core.reward_scorer import RewardScorer, inspect_reward_model
from trainers.core.rundir import RunDir
from trainers.core.runfolder import SummaryFile
from trainers.core.training import (
    StepMetrics,
    build_optimizer,
    epoch_order,
    optimizer_step,
    peak_memory_gb,
    seed_everything,
    use_gradient_checkpointing,
)
from trainers.core.verifier import compute_rewards
from trainers.policy_gradients.advantages import frac_zero_std
from trainers.policy_gradients.config import PolicyGradientConfig
from trainers.policy_gradients.losses import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossParams,
    aggregate,
    value_loss,
)
from trainers.policy_gradients.rewards import RunningMoments
from trainers.policy_gradients.rollout import (
    Experience,
    RewardModels,
    completion_token_stats,
    load_value_model,
    prepare_update,
    rollout_step,
    score_texts,
    sequence_kl,
    trim,
)

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
    for key, name in reward_model_names(cfg):
        inspect_reward_model(name, key)
    check_world(cfg, world_from_env().size)


def optimizer_steps_per_update(cfg: PolicyGradientConfig, size: int) -> int:
    """Optimizer steps in one pass over the rollout batch on ``size`` ranks: each rank's share
    of the step's sequences in micro-batches, an optimizer step every
    ``gradient_accumulation_steps`` of them (one process: the config's count)."""
    micro = cfg.sequences_per_step // size // cfg.train.batch_size
    return -(-micro // cfg.train.gradient_accumulation_steps)


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


def reward_model_names(cfg: PolicyGradientConfig) -> list[tuple[str, str]]:
    """(config key, name) of the reward models the run loads."""
    out = []
    if cfg.reward.model:
        out.append(("reward.model", cfg.reward.model))
    if cfg.reward.gold_model:
        out.append(("reward.gold_model", cfg.reward.gold_model))
    return out


def headline_metric(cfg: PolicyGradientConfig) -> str:
    """The held-out metric this run is judged on (summary.json's best value; the lab's rule in
    ``rlhf_lab/headline.py``): a run rewarded by a reward model is judged on its held-out gold
    reward when it has a gold signal, else on the optimised model's held-out score (a proxy);
    any other run on greedy held-out correctness, the family's headline."""
    if cfg.reward.model:
        return "eval/gold_reward" if cfg.gold_source else "eval/proxy_reward"
    return "eval/avg_correctness"


def planned_rollout_steps(cfg: PolicyGradientConfig) -> int:
    """The run's rollout steps, known from the config alone (for the first progress.json)."""
    return cfg.total_rollout_steps


def config_notes(cfg: PolicyGradientConfig) -> list[str]:
    """Things a reader of the run should know about this config (printed and in summary)."""
    notes = []
    if cfg.loss.beta > 0 and cfg.spec.kl == "none":
        notes.append(
            f"loss.beta={cfg.loss.beta} is ignored: {cfg.algorithm} has no KL term (as in the "
            "book's code); no reference model is loaded"
        )
    if cfg.reward.model and cfg.reward.gold_model == cfg.reward.model:
        notes.append(
            "reward.gold_model is the optimised reward model itself: gold_reward equals "
            "proxy_reward and cannot reveal overoptimisation"
        )
    if cfg.reward.model and not cfg.uses_kl:
        notes.append(
            "no KL leash to the reference (loss.beta=0"
            + ("" if cfg.spec.kl != "none" else f", {cfg.algorithm} has no KL term")
            + "): nothing holds the policy near its start while it maximises the reward model, "
            "and kl_ref is not logged"
        )
    if (
        cfg.spec.overlong_penalty
        and cfg.loss.l_max - cfg.loss.l_cache >= cfg.rollout.max_new_tokens
    ):
        notes.append(
            f"the overlong penalty never applies: rollout.max_new_tokens="
            f"{cfg.rollout.max_new_tokens} <= l_max - l_cache = {cfg.loss.l_max - cfg.loss.l_cache}"
        )
    return notes


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
    return out


def _token_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x.detach().float() * mask).sum() / mask.sum().clamp(min=1.0))


# ---------------------------------------------------------------------------------------------
# The update phase
# ---------------------------------------------------------------------------------------------


def loss_params(cfg: PolicyGradientConfig) -> PolicyLossParams:
    """The loss function's parameters from the config (β only where the algorithm uses KL)."""
    loss = cfg.loss
    return PolicyLossParams(
        clip_eps_lo=loss.clip_eps_lo,
        clip_eps_hi=loss.clip_eps_hi,
        beta=loss.beta if cfg.uses_kl else 0.0,
        kl_estimator=loss.kl_estimator,
        kl_in_loss=cfg.spec.kl == "loss" and cfg.uses_kl,
        sapo_tau_pos=loss.sapo_tau_pos,
        sapo_tau_neg=loss.sapo_tau_neg,
    )


def _rows(
    t: torch.Tensor | None, idx: torch.Tensor, width_t: int, device: torch.device
) -> torch.Tensor | None:
    return None if t is None else t[idx, :width_t].to(device)


def micro_batch_loss(
    cfg: PolicyGradientConfig,
    policy: torch.nn.Module,
    value_model: torch.nn.Module | None,
    exp: Experience,
    rows: list[int],
    step_seqs: int,
    step_tokens: float,
    device: torch.device,
    kl_ref: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float, dict[str, float], float]:
    """The loss contribution of ``rows`` to its optimizer step, and its metrics. ``kl_ref``
    (N,), when given, receives each row's Σ_t k3 to the reference (π = π_old here)."""
    idx = torch.tensor(rows, dtype=torch.long)
    ids, attn, width_t, width_p = trim(
        exp.input_ids[idx],
        exp.attention_mask[idx],
        exp.prompt_lens[idx],
        exp.completion_mask[idx],
        exp.prompt_width,
    )
    ids, attn = ids.to(device), attn.to(device)
    mask = exp.completion_mask[idx, :width_t].to(device)
    logp, entropy = completion_token_stats(policy, ids, attn, width_p, with_entropy=True)
    old = _rows(exp.old_logps, idx, width_t, device)
    params = loss_params(cfg)
    inputs = PolicyLossInputs(
        logp=logp,
        old_logp=old if old is not None and cfg.needs_old_logps else logp.detach(),
        advantages=_rows(exp.advantages, idx, width_t, device),
        mask=mask,
        ref_logp=_rows(exp.ref_logps, idx, width_t, device),
    )
    per_token, stats = POLICY_LOSSES[cfg.algorithm](inputs, params)
    if kl_ref is not None and inputs.ref_logp is not None:
        kl_ref[idx] = sequence_kl(logp.detach(), inputs.ref_logp, mask).cpu()
    agg = dict(
        mode=cfg.loss.loss_agg,
        step_num_seqs=step_seqs,
        step_num_tokens=step_tokens,
        max_new_tokens=cfg.rollout.max_new_tokens,
    )
    pg_contrib = aggregate(stats["pg_loss"], mask, **agg)  # the policy term without β·KL
    total = per_token
    metrics = {"entropy": _token_mean(entropy, mask)}
    if "kl" in stats:
        metrics["kl"] = _token_mean(stats["kl"], mask)
    if "clipped" in stats:
        metrics["clip_frac"] = _token_mean(stats["clipped"].float(), mask)
    if "ratio" in stats:
        metrics["ratio/mean"] = _token_mean(stats["ratio"], mask)
    if value_model is not None:
        values = value_model(ids, attn, width_p)
        vl = value_loss(
            values,
            _rows(exp.values, idx, width_t, device),
            _rows(exp.returns, idx, width_t, device),
            mask,
            cfg.loss.clip_eps_val,
        )
        total = total + cfg.loss.vf_coef * vl
        metrics["value_loss"] = _token_mean(vl, mask)
    contrib = aggregate(total, mask, **agg)
    return contrib, float(pg_contrib.detach()), metrics, float(mask.sum())


def update(
    cfg: PolicyGradientConfig,
    policy: torch.nn.Module,
    value_model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    params: list[torch.nn.Parameter],
    exp: Experience,
    step: int,
    device: torch.device,
) -> dict[str, float]:
    """``updates_per_rollout`` passes over the rollout batch; returns the phase's metrics.
    Under torchrun ``exp`` is this rank's share and each optimizer step takes
    ``batch_size × gradient_accumulation_steps`` of its rows (each rank shuffles its own); the
    aggregation is normalised by the step's sequences and tokens over every rank, each rank
    back-propagates its part and FSDP sums the gradients, so the update is the global one."""
    n = exp.num_sequences
    bs, acc = cfg.train.batch_size, cfg.train.gradient_accumulation_steps
    per_opt = bs * acc
    token_stats = StepMetrics()
    step_losses, step_pg, grad_norms, lrs = [], [], [], []
    skipped = 0
    # the sequences' KL to the reference, from the first pass before any optimizer step (π is
    # π_old there), when prepare_update had no π_old log-probs to take it from
    kl_buf = None
    if exp.kl_ref is None and exp.ref_logps is not None:
        kl_buf = torch.full((n,), float("nan"))
    for epoch in range(cfg.loss.updates_per_rollout):
        order = epoch_order(n, cfg.seed, step * cfg.loss.updates_per_rollout + epoch)
        for start in range(0, n, per_opt):
            step_rows = order[start : start + per_opt]
            step_seqs, step_tokens = gather_sum(  # the step's, over every rank
                [len(step_rows), float(exp.completion_mask[step_rows].sum())]
            )
            step_seqs = int(step_seqs)
            loss_sum = pg_sum = 0.0
            for m in range(0, len(step_rows), bs):
                if not grad_norms:  # a stop drops the step only before its first update
                    raise_if_stopping("micro_batch")
                rows = step_rows[m : m + bs]
                contrib, pg, metrics, n_tok = micro_batch_loss(
                    cfg,
                    policy,
                    value_model,
                    exp,
                    rows,
                    step_seqs,
                    step_tokens,
                    device,
                    kl_ref=kl_buf if not grad_norms else None,
                )
                if any_rank(not bool(torch.isfinite(contrib))):  # every rank skips it together
                    skipped += 1  # as the book's loop: a non-finite micro-batch is skipped
                    continue
                contrib.backward()
                loss_sum += float(contrib.detach())
                pg_sum += pg
                token_stats.add(metrics, weight=n_tok)
            grad_norm, lr = optimizer_step(params, optimizer, scheduler, cfg.train.max_grad_norm)
            grad_norms.append(grad_norm)
            lrs.append(lr)
            loss_sum, pg_sum = gather_sum([loss_sum, pg_sum])  # the ranks' parts of the step
            step_losses.append(loss_sum)
            step_pg.append(pg_sum)
    out = {
        "loss": sum(step_losses) / len(step_losses),
        "pg_loss": sum(step_pg) / len(step_pg),
        **token_stats.mean(),
        "grad_norm": sum(grad_norms) / len(grad_norms),
        "learning_rate": lrs[-1],
        "optimizer_steps": len(grad_norms),
    }
    if skipped:
        out["nonfinite_micro_batches"] = skipped
    if kl_buf is not None and not any_rank(bool(kl_buf.isnan().any())):
        exp.kl_ref = kl_buf
    return out


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
    out = greedy_rollouts(policy, tokenizer, mine, max_new, cfg.eval.eval_batch_size)
    r = score_texts(
        cfg,
        mine,
        out["texts"],
        out["lengths"],
        torch.tensor(out["truncated"], dtype=torch.bool),
        models,
        prompt_ids=out["prompt_ids"],
        completion_ids=out["completion_ids"],
        update_moments=False,
        verifier=compute_rewards,
    )
    out, r = held_out_share(block, out, r, len(held_out))
    texts, lengths = out["texts"], out["lengths"]
    parts = ("correctness", "format", "binary", "total")
    metrics = {f"eval/avg_{k}": _mean(r[k]) for k in parts if k in r}
    metrics.update(gold_and_proxy(r, cfg, prefix="eval/"))
    metrics["eval/num_prompts"] = len(held_out)
    metrics["eval/response_length/mean"] = sum(lengths) / max(1, len(lengths))
    truncated = out["truncated"]
    metrics["eval/response_length/clipped_frac"] = sum(truncated) / max(1, len(truncated))
    shown = [k for k in ("correctness", "format", "binary", "model", "gold") if k in r]
    samples = [
        {
            "kind": "eval",
            "question": p.question,
            "answer": p.answer,
            "completion": t,
            **{k: float(r[k][i]) for k in shown},
        }
        for i, (p, t) in enumerate(zip(held_out, texts, strict=True))
    ][: cfg.eval.num_samples]
    return metrics, samples


def held_out_share(
    block: list[int], out: dict[str, list], rewards: dict[str, torch.Tensor], n: int
) -> tuple[dict[str, list], dict[str, torch.Tensor]]:
    """Every rank's greedy completions (``texts``, ``lengths``, ``truncated``) and reward
    parts, in the held-out order: ``block`` is this rank's :func:`rank_block` of the ``n``
    prompts (padded with repeats of its last prompt, which are dropped here); collective."""
    keys = ("texts", "lengths", "truncated")
    mine = [
        (i, *(out[k][j] for k in keys), {k: float(v[j]) for k, v in rewards.items()})
        for j, i in enumerate(block)
    ]
    by_index = {row[0]: row for part in gather_objects(mine) for row in part}
    rows = [by_index[i] for i in range(n)]
    merged = {k: [row[1 + c] for row in rows] for c, k in enumerate(keys)}
    parts = {k: torch.tensor([row[4][k] for row in rows]) for k in rewards}
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
        if not cfg.spec.needs_value_model and exp.advantages is not None:
            row["advantage"] = float(exp.advantages[i, 0])
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------
# The training loop
# ---------------------------------------------------------------------------------------------


def train(cfg: PolicyGradientConfig, run: RunDir, resume: bool) -> SummaryFile:
    """Load prompts and models, then the rollout-score-update loop; see the module doc."""
    seed_everything(cfg.seed)
    device, dtype, attn = pick_runtime(cfg.model)
    notes = config_notes(cfg)
    for note in notes:
        print(f"note: {note}", flush=True)
    total_steps = cfg.total_rollout_steps
    loop = TrainingRun(run, cfg.checkpoint, total_steps)

    tokenizer = load_tokenizer(cfg.model.name)
    run.update_phase("tokenizing")
    train_prompts, held_out, load_stats = load_run_prompts(cfg.data, cfg.seed)
    info: dict[str, Any] = {
        "data": {"n_train": len(train_prompts), "n_eval": len(held_out), **load_stats}
    }
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
    print(f"data: {info['data']}", flush=True)

    load = dict(device=device, dtype=dtype, attn_implementation=attn)
    run.update_phase("loading_model")
    policy = add_adapters(load_causal_lm(cfg.model.name, trainable=True, **load), cfg.model.lora)
    use_gradient_checkpointing(policy, cfg.model.gradient_checkpointing)
    shard_model(policy)  # FSDP2 under torchrun (one unit per decoder layer); one process: as is
    ref_model = None  # with LoRA: the policy's base, adapters off (lora.reference_view)
    if cfg.uses_kl and needs_reference_copy(cfg.model):
        ref_model = load_causal_lm(cfg.model.ref_name or cfg.model.name, trainable=False, **load)
        shard_model(ref_model)  # each rank scores its own share of the rollouts with it
    value_model = None
    params = [p for p in policy.parameters() if p.requires_grad]
    if cfg.spec.needs_value_model:
        value_model = load_value_model(cfg.model.name, lora=cfg.model.lora, **load)
        use_gradient_checkpointing(value_model.body, cfg.model.gradient_checkpointing)
        shard_model(value_model)
        value_model.train()
        params += [p for p in value_model.parameters() if p.requires_grad]
    if world().distributed:  # every rank built the same weights; each samples its own rollouts
        torch.manual_seed(rank_seed(cfg.seed))
        seeds = [rank_seed(cfg.seed, r) for r in range(world().size)]
        info["distributed"] = {**describe(), "sampling_seeds": seeds}

    models = RewardModels(stop_ids=set(end_of_turn_ids(tokenizer)))
    rm_load = dict(
        device=device,
        dtype=dtype,
        attn_implementation=attn,
        batch_size=cfg.reward.score_batch_size,
        policy_tokenizer=tokenizer,
    )
    for key, name in reward_model_names(cfg):
        scorer = RewardScorer.load(inspect_reward_model(name, key), **rm_load)
        if key == "reward.model":
            models.proxy = scorer
        else:
            models.gold = scorer
        info.setdefault("reward_models", {})[key] = {
            "name": name,
            "kind": scorer.kind,
            "tokens": "policy ids reused" if scorer.reuse_ids else "re-tokenised from text",
        }
        print(f"{key}: {name} ({scorer.kind}; {info['reward_models'][key]['tokens']})", flush=True)

    per_update = optimizer_steps_per_update(cfg, world().size)
    opt_steps = total_steps * cfg.loss.updates_per_rollout * per_update
    optimizer, scheduler = build_optimizer(params, cfg.train, opt_steps)
    stream = PromptStream(len(train_prompts), cfg.seed)
    best = BestMetric(headline_metric(cfg))
    # what a checkpoint holds: under torchrun the value model's shards go with the policy's
    # (torch.distributed.checkpoint); on one process its state rides in the family state
    sharded_value = value_model is not None and world().distributed
    held = (
        torch.nn.ModuleDict({"policy": policy, "value_model": value_model})
        if sharded_value
        else policy
    )
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
        timer = StepTimer()
        # 1-3. sample prompts, roll out, score (on CPU afterwards)
        loop.progress("generating", data=stream.state())
        exp, ri = rollout_step(policy, tokenizer, stream, train_prompts, cfg, models)
        # 4. log-probs / values / advantages
        t_prep = time.time()
        exp, prep_info = prepare_update(exp, cfg, policy, ref_model, value_model, device)
        prepare_s = time.time() - t_prep
        # 5. update
        loop.progress("training", data=stream.state())
        t_train = time.time()
        train_metrics = update(
            cfg, policy, value_model, optimizer, scheduler, params, exp, loop.step, device
        )
        train_s = time.time() - t_train
        step_tokens = int(sum_over_ranks(int(exp.attention_mask.sum())))  # every rank's
        loop.advance(step_tokens)
        dt = timer.dt

        # 6. log
        last_rollout = {
            **reward_metrics(ri.drawn, cfg),
            **prep_info,
            "timing/generate_s": ri.generate_s,
            "timing/score_s": ri.score_s,
            "timing/prepare_s": prepare_s,
        }
        if exp.kl_ref is not None:
            last_rollout["kl_ref"] = _global_mean(exp.kl_ref)
        if cfg.reward.normalize == "running":
            last_rollout["reward_norm/mean"] = models.moments.mean
            last_rollout["reward_norm/std"] = models.moments.std
        if cfg.spec.dynamic_sampling:
            last_rollout["dynamic_sampling/kept_frac"] = ri.groups_kept / ri.groups_drawn
            last_rollout["dynamic_sampling/prompts_drawn"] = ri.prompts_drawn
        loop.last_train = {
            **train_metrics,
            "timing/train_s": train_s,
            "timing/step_s": dt,
            "throughput/tokens_per_s": step_tokens / max(dt, 1e-9),
            "memory/peak_gb": peak_memory_gb(device),
        }
        if loop.should_log(cfg.logging.log_every):
            loop.log("rollout", last_rollout)
            loop.log("train", loop.last_train)
        if loop.every(cfg.eval.sample_every, at_end=bool(cfg.eval.sample_every)):
            loop.log_samples(rollout_samples(cfg, exp))
        shown = [
            (label, last_rollout[key])
            for label, key in (
                ("proxy", "proxy_reward"),
                ("gold", "gold_reward"),
                ("correctness", "avg_correctness"),
                ("format", "avg_format"),
                ("kl_ref", "kl_ref"),
            )
            if key in last_rollout
        ]
        print(
            f"step {loop.step}/{total_steps} "
            + " ".join(f"{label} {value:.3f}" for label, value in shown)
            + f" loss {loop.last_train['loss']:.4f} "
            f"gen {ri.generate_s:.1f}s train {train_s:.1f}s",
            flush=True,
        )
        if loop.every(cfg.eval.eval_every):
            run_eval()
        loop.progress("training", data=stream.state())
        loop.checkpoint_or_stop(stopping=stop_requested())

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
