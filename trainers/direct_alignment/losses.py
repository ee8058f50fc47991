"""Direct-alignment losses as pure tensor functions.

Every loss takes a :class:`LossInputs` (per-response log-probabilities that the trainer has
already reduced over the response tokens) and a :class:`LossParams`, and returns

    (loss, metrics)

where ``loss`` is the mean over the batch of the per-pair loss (KTO: of the per-example loss,
over every desirable and undesirable example, so a pair counts as two examples) and ``metrics`` maps
names to detached 0-dim tensors. No model code lives here, so each function can be read next to
its paper and tested on hand-made numbers.

Notation (see the "Direct alignment" section of docs/algorithms.md):

* ``logπ(y)`` is the SUM of the policy's token log-probs over a response; the average
  log-prob is ``p̄ = logπ(y) / |y|``.
* ``Δc = logπ(y_c) − logπ_ref(y_c)``, ``Δr`` likewise, and ``x = Δc − Δr``.
* Rewards reported in the metrics are ``β·Δ`` (or ``β·p̄`` for the reference-free losses).

Losses that need a reference are listed in :data:`NEEDS_REFERENCE`; which losses work on average
rather than summed log-probs is answered by :func:`uses_average_logps`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from trainers.direct_alignment.config import DEFAULT_BETA  # noqa: F401
from trainers.direct_alignment.spec import FAMILY as DA_FAMILY

Metrics = dict[str, Tensor]


@dataclass
class LossInputs:
    """Per-response log-probabilities for one batch.

    ``*_logps`` are SUMS of token log-probs over each response; ``*_tokens`` are the response
    lengths, so the average log-prob is ``sum / tokens``. ``kl_tokens`` is carried for the
    trainer's logging only: the KTO reference point uses summed log-probs, as in the paper.
    """

    chosen_logps: Tensor
    rejected_logps: Tensor
    chosen_tokens: Tensor
    rejected_tokens: Tensor
    ref_chosen_logps: Tensor | None = None
    ref_rejected_logps: Tensor | None = None
    kl_logps: Tensor | None = None
    ref_kl_logps: Tensor | None = None
    kl_tokens: Tensor | None = None
    paired: bool = True


@dataclass
class LossParams:
    """Hyper-parameters shared by the losses (each loss reads only the ones it needs).

    ``beta`` is β for every loss except ORPO, where it is the paper's λ (weight of the
    odds-ratio term). ``gamma`` is SimPO's γ/β ratio, so the shift inside the sigmoid is β·γ.
    """

    beta: float = 0.1
    gamma: float = 0.5
    label_smoothing: float = 0.1
    lambda_d: float = 1.0
    lambda_u: float = 1.0
    ipo_sum: bool = False


LossFn = Callable[[LossInputs, LossParams], tuple[Tensor, Metrics]]

_LOG_HALF = -math.log(2.0)  # branch point of log1mexp
_ORPO_MAX_LOGP = -1e-6  # log1mexp(0) = -inf, so average log-probs are clamped below 0


# --------------------------------------------------------------------------- helpers


def _average(logps: Tensor, tokens: Tensor) -> Tensor:
    """Average log-prob per token; empty responses count as one token to avoid 0/0."""
    return logps / tokens.to(logps.dtype).clamp(min=1)


def _check_paired(inputs: LossInputs, name: str) -> None:
    if not inputs.paired:
        raise ValueError(f"{name}: paired=False is only supported by the kto loss")
    n = inputs.chosen_logps.shape
    shapes = {
        "rejected_logps": inputs.rejected_logps.shape,
        "chosen_tokens": inputs.chosen_tokens.shape,
        "rejected_tokens": inputs.rejected_tokens.shape,
    }
    for field, shape in shapes.items():
        if shape != n:
            raise ValueError(
                f"{name}: chosen_logps has shape {tuple(n)} but {field} has shape {tuple(shape)}; "
                "paired losses need one chosen and one rejected response per pair"
            )


def _check_reference(inputs: LossInputs, name: str) -> tuple[Tensor, Tensor]:
    if inputs.ref_chosen_logps is None or inputs.ref_rejected_logps is None:
        raise ValueError(
            f"{name} needs reference log-probs: ref_chosen_logps and ref_rejected_logps are required"
        )
    if inputs.ref_chosen_logps.shape != inputs.chosen_logps.shape:
        raise ValueError(f"{name}: ref_chosen_logps and chosen_logps have different shapes")
    if inputs.ref_rejected_logps.shape != inputs.rejected_logps.shape:
        raise ValueError(f"{name}: ref_rejected_logps and rejected_logps have different shapes")
    return inputs.ref_chosen_logps, inputs.ref_rejected_logps


def _policy_logps(inputs: LossInputs, average: bool) -> tuple[Tensor, Tensor]:
    """Policy log-probs of chosen and rejected responses, summed or averaged per token."""
    if not average:
        return inputs.chosen_logps, inputs.rejected_logps
    return (
        _average(inputs.chosen_logps, inputs.chosen_tokens),
        _average(inputs.rejected_logps, inputs.rejected_tokens),
    )


def _paired_logratios(
    inputs: LossInputs, name: str, average: bool = False
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Validate a paired reference batch and return (policy_c, policy_r, Δc, Δr).

    With ``average`` the policy and the reference log-probs are both divided by the response
    length before the difference is taken.
    """
    _check_paired(inputs, name)
    ref_c, ref_r = _check_reference(inputs, name)
    pc, pr = _policy_logps(inputs, average)
    if average:
        ref_c = _average(ref_c, inputs.chosen_tokens)
        ref_r = _average(ref_r, inputs.rejected_tokens)
    return pc, pr, pc - ref_c, pr - ref_r


def _share(mask: Tensor, like: Tensor) -> Tensor:
    """Fraction of True entries, in at least float32 (float64 stays float64)."""
    return mask.to(torch.promote_types(like.dtype, torch.float32)).mean()


def _metrics(loss: Tensor, beta: float, sc: Tensor, sr: Tensor, pc: Tensor, pr: Tensor) -> Metrics:
    """Metrics shared by the paired losses; rewards are β·score and accuracy is the share of
    pairs with chosen score strictly above rejected (ties count as wrong)."""
    out = {
        "loss": loss,
        "accuracy": _share(sc > sr, sc),
        "margins": (beta * (sc - sr)).mean(),
        "chosen_rewards": (beta * sc).mean(),
        "rejected_rewards": (beta * sr).mean(),
        "chosen_logps": pc.mean(),
        "rejected_logps": pr.mean(),
    }
    return {k: v.detach() for k, v in out.items()}


def _reference_result(
    losses: Tensor, beta: float, pc: Tensor, pr: Tensor, dc: Tensor, dr: Tensor
) -> tuple[Tensor, Metrics]:
    loss = losses.mean()
    return loss, _metrics(loss, beta, dc, dr, pc, pr)


def _log1mexp(p: Tensor) -> Tensor:
    """log(1 − e^p) for p < 0, choosing the accurate formula on each side of −ln 2."""
    return torch.where(p > _LOG_HALF, torch.log(-torch.expm1(p)), torch.log1p(-torch.exp(p)))


def _log_odds(p: Tensor) -> Tensor:
    """log(P / (1 − P)) for P = e^p, with p clamped to at most −1e-6 (float32)."""
    p = p.float().clamp(max=_ORPO_MAX_LOGP)
    return p - _log1mexp(p)


# --------------------------------------------------------------------------- losses


def dpo_loss(inputs: LossInputs, params: LossParams) -> tuple[Tensor, Metrics]:
    """DPO (Rafailov et al. 2023, "Direct Preference Optimization").

    loss = −log σ(β·x),  x = Δc − Δr on summed log-probs.
    """
    pc, pr, dc, dr = _paired_logratios(inputs, "dpo")
    losses = -F.logsigmoid(params.beta * (dc - dr))
    return _reference_result(losses, params.beta, pc, pr, dc, dr)


def cdpo_loss(inputs: LossInputs, params: LossParams) -> tuple[Tensor, Metrics]:
    """Conservative DPO (Mitchell 2023, "A note on DPO with noisy preferences & relationship to IPO").

    loss = −(1−ε)·log σ(β·x) − ε·log σ(−β·x),  ε = label_smoothing.
    """
    pc, pr, dc, dr = _paired_logratios(inputs, "cdpo")
    eps, z = params.label_smoothing, params.beta * (dc - dr)
    losses = -(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)
    return _reference_result(losses, params.beta, pc, pr, dc, dr)


def dpo_norm_loss(inputs: LossInputs, params: LossParams) -> tuple[Tensor, Metrics]:
    """Length-normalised DPO: the DPO loss with Δ taken on average log-probs.

    loss = −log σ(β·(Δ̄c − Δ̄r)),  Δ̄ = p̄ − p̄_ref (policy and reference both averaged).
    """
    pc, pr, dc, dr = _paired_logratios(inputs, "dpo_norm", average=True)
    losses = -F.logsigmoid(params.beta * (dc - dr))
    return _reference_result(losses, params.beta, pc, pr, dc, dr)


def ipo_loss(inputs: LossInputs, params: LossParams) -> tuple[Tensor, Metrics]:
    """IPO (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from
    Human Preferences"), Eq. 17 with τ = β.

    loss = (x − 1/(2β))²,  x on average log-probs (summed when ``ipo_sum``).
    """
    average = uses_average_logps("ipo", params)
    pc, pr, dc, dr = _paired_logratios(inputs, "ipo", average=average)
    losses = (dc - dr - 1 / (2 * params.beta)) ** 2
    return _reference_result(losses, params.beta, pc, pr, dc, dr)


def simpo_loss(inputs: LossInputs, params: LossParams) -> tuple[Tensor, Metrics]:
    """SimPO (Meng et al. 2024, "SimPO: Simple Preference Optimization with a Reference-Free
    Reward"), no reference model.

    loss = −log σ(β·(p̄c − p̄r − γ)),  γ the γ/β ratio (absolute margin β·γ).
    """
    _check_paired(inputs, "simpo")
    pc, pr = _policy_logps(inputs, average=True)
    losses = -F.logsigmoid(params.beta * (pc - pr - params.gamma))
    loss = losses.mean()
    return loss, _metrics(loss, params.beta, pc, pr, pc, pr)


def orpo_loss(inputs: LossInputs, params: LossParams) -> tuple[Tensor, Metrics]:
    """ORPO (Hong et al. 2024, "ORPO: Monolithic Preference Optimization without Reference
    Model"), Eq. 6-7 with λ = ``params.beta``; computed in float32.

    loss = −p̄c − λ·log σ(L),  L = logodds(p̄c) − logodds(p̄r),  logodds(p) = p − log(1 − e^p).
    −p̄c is the mean token NLL of the chosen response.
    """
    _check_paired(inputs, "orpo")
    pc = _average(inputs.chosen_logps.float(), inputs.chosen_tokens)
    pr = _average(inputs.rejected_logps.float(), inputs.rejected_tokens)
    lam = params.beta
    log_odds_ratio = _log_odds(pc) - _log_odds(pr)
    sft = -pc
    odds_ratio_term = -lam * F.logsigmoid(log_odds_ratio)
    loss = (sft + odds_ratio_term).mean()
    metrics = _metrics(loss, lam, pc, pr, pc, pr)
    extra = {
        "sft_loss": sft.mean(),
        "or_loss": odds_ratio_term.mean(),
        "log_odds_ratio": log_odds_ratio.mean(),
        "log_odds_accuracy": _share(log_odds_ratio > 0, log_odds_ratio),
    }
    metrics.update({k: v.detach() for k, v in extra.items()})
    return loss, metrics


def kto_loss(inputs: LossInputs, params: LossParams) -> tuple[Tensor, Metrics]:
    """KTO (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization").

    loss = (Σ_D λ_D·(1 − σ(β(Δc − z))) + Σ_U λ_U·(1 − σ(β(z − Δr)))) / (n_D + n_U),

    the paper's mean over every example of the batch of λ_y·(1 − v(x, y)) (as TRL), with
    z = max(0, mean(kl_logps − ref_kl_logps)), detached. On paired data each pair is one
    desirable and one undesirable example; with unbalanced unpaired data the class counts weigh
    in, which the paper's λ_D·n_D / (λ_U·n_U) ∈ [1, 4/3] guidance assumes. (Before: λ_D·mean_D +
    λ_U·mean_U, twice this on paired data and blind to the counts.)
    ``chosen_*`` are the desirable and ``rejected_*`` the undesirable examples.
    """
    if inputs.paired:
        _check_paired(inputs, "kto")
    ref_c, ref_r = _check_reference(inputs, "kto")
    if inputs.kl_logps is None or inputs.ref_kl_logps is None:
        raise ValueError("kto needs kl_logps and ref_kl_logps (log-probs on mismatched pairs)")
    if inputs.kl_logps.numel() == 0 or inputs.kl_logps.shape != inputs.ref_kl_logps.shape:
        raise ValueError("kto: kl_logps and ref_kl_logps must be non-empty and of equal shape")
    nc, nr = inputs.chosen_logps.numel(), inputs.rejected_logps.numel()
    if nc + nr == 0:
        raise ValueError("kto: the batch has no desirable and no undesirable examples")

    beta = params.beta
    z = (inputs.kl_logps - inputs.ref_kl_logps).mean().clamp(min=0).detach()
    dc, dr = inputs.chosen_logps - ref_c, inputs.rejected_logps - ref_r
    desirable = 1 - torch.sigmoid(beta * (dc - z))
    undesirable = 1 - torch.sigmoid(beta * (z - dr))
    weighted = params.lambda_d * desirable.sum() + params.lambda_u * undesirable.sum()
    loss = weighted / (nc + nr)

    if inputs.paired:
        accuracy = _share(dc > dr, dc)
    else:  # share of examples on the correct side of the reference point
        accuracy = _share(torch.cat([dc > z, dr < z]), dc)
    metrics = {"loss": loss, "accuracy": accuracy, "kl": z}
    if nc > 0:
        metrics["chosen_rewards"] = (beta * dc).mean()
        metrics["chosen_logps"] = inputs.chosen_logps.mean()
    if nr > 0:
        metrics["rejected_rewards"] = (beta * dr).mean()
        metrics["rejected_logps"] = inputs.rejected_logps.mean()
    if nc > 0 and nr > 0:
        metrics["margins"] = metrics["chosen_rewards"] - metrics["rejected_rewards"]
    return loss, {k: v.detach() for k, v in metrics.items()}


def apo_zero_loss(inputs: LossInputs, params: LossParams) -> tuple[Tensor, Metrics]:
    """APO-zero (D'Oosterlinck et al. 2024, "Anchored Preference Optimization and Contrastive
    Revisions"), Eq. 7: push chosen up and rejected down in absolute terms.

    loss = 1 − σ(β·Δc) + σ(β·Δr).
    """
    pc, pr, dc, dr = _paired_logratios(inputs, "apo_zero")
    b = params.beta
    losses = 1 - torch.sigmoid(b * dc) + torch.sigmoid(b * dr)
    return _reference_result(losses, b, pc, pr, dc, dr)


def apo_down_loss(inputs: LossInputs, params: LossParams) -> tuple[Tensor, Metrics]:
    """APO-down (D'Oosterlinck et al. 2024, "Anchored Preference Optimization and Contrastive
    Revisions"), Eq. 8: push both down, rejected more than chosen.

    loss = σ(β·Δc) + 1 − σ(β·(Δc − Δr)).
    """
    pc, pr, dc, dr = _paired_logratios(inputs, "apo_down")
    b = params.beta
    losses = torch.sigmoid(b * dc) + 1 - torch.sigmoid(b * (dc - dr))
    return _reference_result(losses, b, pc, pr, dc, dr)


# --------------------------------------------------------------------------- registry

LOSSES: dict[str, LossFn] = {
    "dpo": dpo_loss,
    "cdpo": cdpo_loss,
    "dpo_norm": dpo_norm_loss,
    "ipo": ipo_loss,
    "simpo": simpo_loss,
    "orpo": orpo_loss,
    "kto": kto_loss,
    "apo_zero": apo_zero_loss,
    "apo_down": apo_down_loss,
}

"""Loss functions by name; each algorithm's spec (``trainers/direct_alignment/spec.py``) names
the one it uses, with its default β and whether it needs a reference model."""

# Derived from the specs; kept for callers that import it. Losses only: online_dpo needs a
# reference too, but it is a sampling loop around one of these losses, not a loss.
NEEDS_REFERENCE: frozenset[str] = frozenset(
    a.name for a in DA_FAMILY.algorithms if a.needs_reference and a.name in LOSSES
)


def loss_for(algorithm: str) -> LossFn:
    """The loss function ``algorithm``'s spec names."""
    return LOSSES[DA_FAMILY.algorithm(algorithm).loss]


def uses_average_logps(name: str, params: LossParams | None = None) -> bool:
    """Whether loss ``name`` works on average (per-token) rather than summed log-probs."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {sorted(LOSSES)}")
    if name == "ipo":
        return not (params or LossParams()).ipo_sum
    return name in {"dpo_norm", "simpo", "orpo"}
