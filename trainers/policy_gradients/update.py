"""The update phase of a policy-gradient step: ``loss.updates_per_rollout`` passes over the
rollout batch in a shuffled order, micro-batches of ``train.batch_size`` sequences, each one's
per-token loss (the algorithm's :data:`~.losses.POLICY_LOSSES` entry, plus PPO's value loss)
reduced by ``loss.loss_agg`` over the whole optimizer step, backward; an optimizer step every
``gradient_accumulation_steps`` micro-batches. A non-finite micro-batch is skipped (on every
rank together). Under torchrun the reductions count every rank's sequences and tokens.
"""

from __future__ import annotations

import torch

from trainers.core.distributed import any_rank, gather_sum
from trainers.core.harness import raise_if_stopping
from trainers.core.training import StepMetrics, epoch_order, optimizer_step
from trainers.policy_gradients.config import PolicyGradientConfig
from trainers.policy_gradients.experience import Experience
from trainers.policy_gradients.losses import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossParams,
    aggregate,
    value_loss,
)
from trainers.policy_gradients.rollout import sequence_kl
from trainers.policy_gradients.token_passes import completion_token_stats, trim


def optimizer_steps_per_update(cfg: PolicyGradientConfig, size: int) -> int:
    """Optimizer steps in one pass over the rollout batch on ``size`` ranks: each rank's share
    of the step's sequences in micro-batches, an optimizer step every
    ``gradient_accumulation_steps`` of them (one process: the config's count)."""
    micro = cfg.sequences_per_step // size // cfg.train.batch_size
    return -(-micro // cfg.train.gradient_accumulation_steps)


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


def _token_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x.detach().float() * mask).sum() / mask.sum().clamp(min=1.0))


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
