"""Tests for trainers/direct_alignment/losses.py.

Three groups:

1. hand-computed values: expected numbers come from plain ``math`` on Python floats;
2. gradients: finite, with the sign each preference loss should have, and KTO's reference
   point z detached;
3. ``TestAgainstTRL``: agreement with the independent implementation in trl==1.16.0 (the dev
   pin). trl is imported lazily through the ``trl`` fixture, which skips the class when trl is
   missing or another version, so groups 1-2 never depend on trl importing; deselect it with
   ``-k "not TRL"``.

Convention differences with trl==1.16.0 found while writing group 3:

* DPO-family losses live inside ``DPOTrainer._compute_loss(self, model, inputs, ...)``, which
  runs the model itself. We call it unbound with a SimpleNamespace stand-in for ``self`` and a
  fake model returning per-token log-probs whose row sums are our summed log-probs.
* cDPO: trl 1.16 ``loss_type="sigmoid"`` ignores ``label_smoothing`` (cDPO was removed;
  ``"robust"`` is a different, unbiased loss). ``loss_type="aot"`` applies exactly the cDPO
  formula to the difference of the *sorted* policy and reference log-ratios; when the reference
  log-ratio is the same for every pair, the sort only permutes pairs and the batch mean equals
  cDPO's, so we compare on such a batch.
* IPO: trl's ``"ipo"`` divides the summed log-ratios by the completion length (the average form,
  our default). trl logs rewards/logps on SUMMED log-probs for every DPO loss type, while our
  ipo and dpo_norm metrics use the averages the loss uses, so only the loss is compared there.
* dpo_norm is trl's ``loss_type="sigmoid_norm"``.
* SimPO: ``CPOTrainer.cpo_loss`` with ``loss_type="simpo"`` takes an ABSOLUTE margin
  ``simpo_gamma`` (it computes ``logits - simpo_gamma / beta``); ours is the γ/β ratio, so trl's
  ``simpo_gamma = beta * gamma``. trl is fed average log-probs (its CPO averages for simpo).
* ORPO: ``ORPOTrainer.odds_ratio_loss`` returns ``beta * logsigmoid(L)`` (to be subtracted) and
  its metric ``log_odds_ratio`` is mean(logsigmoid(L)) while ``log_odds_chosen`` is mean(L); our
  ``or_loss`` is mean(-λ·logsigmoid(L)) and our ``log_odds_ratio`` is mean(L). trl does not clamp
  p̄ below 0 (log1mexp(0) = -inf there), and its NLL is the token-pooled cross-entropy over the
  batch rather than our mean of per-example means (equal when chosen lengths are equal).
* KTO: ``KTOTrainer._compute_loss`` returns the mean over the concatenated weighted per-example
  losses, (λ_D·Σ_D + λ_U·Σ_U) / (N_D + N_U); ours is λ_D·mean_D + λ_U·mean_U. With N_D = N_U
  ours is exactly twice trl's; in general we compare trl·(N_D + N_U) with
  λ_D·N_D·mean_D + λ_U·N_U·mean_U, taking mean_D and mean_U from our loss with one weight zeroed.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from types import MethodType, SimpleNamespace

import pytest
import torch

from tests._helpers.algorithms import DIRECT_ALIGNMENT_LOSSES
from tests._helpers.trl_reference import trl_fixture  # noqa: F401  (the ``trl`` fixture)
from trainers.direct_alignment.losses import (
    DEFAULT_BETA,
    LOSSES,
    NEEDS_REFERENCE,
    LossInputs,
    LossParams,
    uses_average_logps,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# A batch of four pairs: summed log-probs, response lengths and reference sums.
# Summed:   Δc = [1, -1, 0, 0],  Δr = [-0.5, 1, -1, 0]  (pair 4 is a tie).
C = [-10.0, -20.0, -6.0, -8.0]
R = [-12.0, -18.0, -9.0, -8.0]
TC = [5, 10, 3, 2]
TR = [4, 6, 3, 4]
RC = [-11.0, -19.0, -6.0, -8.0]
RR = [-11.5, -19.0, -8.0, -8.0]

PREFERENCE_LOSSES = sorted(LOSSES)


# --------------------------------------------------------------------------- plain-math helpers


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs)


def sig(v):
    return 1.0 / (1.0 + math.exp(-v))


def logsig(v):
    return -math.log1p(math.exp(-v)) if v >= 0 else v - math.log1p(math.exp(v))


def log_odds(p):
    p = min(p, -1e-6)
    log1mexp = math.log(-math.expm1(p)) if p > -math.log(2) else math.log1p(-math.exp(p))
    return p - log1mexp


def sub(a, b):
    return [x - y for x, y in zip(a, b, strict=True)]


def avg(sums, tokens):
    return [s / n for s, n in zip(sums, tokens, strict=True)]


def t(xs, dtype=torch.float64, grad=False):
    return torch.tensor(xs, dtype=dtype, requires_grad=grad)


def make_inputs(c=C, r=R, tc=TC, tr=TR, rc=RC, rr=RR, grad=False, **kw):
    return LossInputs(
        chosen_logps=t(c, grad=grad),
        rejected_logps=t(r, grad=grad),
        chosen_tokens=torch.tensor(tc),
        rejected_tokens=torch.tensor(tr),
        ref_chosen_logps=None if rc is None else t(rc),
        ref_rejected_logps=None if rr is None else t(rr),
        **kw,
    )


def reference_free_inputs(pc, pr, tc, tr):
    """A batch without reference log-probs whose per-token average log-probs are ``pc`` (chosen)
    and ``pr`` (rejected) over ``tc`` and ``tr`` tokens (the sums are average x length)."""
    return make_inputs(
        c=[a * n for a, n in zip(pc, tc, strict=True)],
        r=[b * n for b, n in zip(pr, tr, strict=True)],
        tc=tc,
        tr=tr,
        rc=None,
        rr=None,
    )


def paired_metrics(beta, pc, pr, sc, sr, loss):
    """Expected shared metrics; sc/sr are the scores (Δ or p̄) that rewards are β times."""
    return {
        "loss": loss,
        "accuracy": mean(float(a > b) for a, b in zip(sc, sr, strict=True)),
        "margins": mean(beta * (a - b) for a, b in zip(sc, sr, strict=True)),
        "chosen_rewards": mean(beta * a for a in sc),
        "rejected_rewards": mean(beta * b for b in sr),
        "chosen_logps": mean(pc),
        "rejected_logps": mean(pr),
    }


def assert_metrics(metrics, expected, rel=1e-9, abs_=1e-12):
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        got = metrics[key]
        assert got.dim() == 0 and not got.requires_grad, key
        assert got.item() == pytest.approx(value, rel=rel, abs=abs_), key


# --------------------------------------------------------------------------- 1. hand-computed values


def test_registry_and_defaults():
    assert set(LOSSES) == DIRECT_ALIGNMENT_LOSSES
    assert set(LOSSES) - NEEDS_REFERENCE == {"simpo", "orpo"}
    # online_dpo is a sampling loop around one of these losses, with its own default β
    assert set(DEFAULT_BETA) == set(LOSSES) | {"online_dpo"}
    assert DEFAULT_BETA["dpo_norm"] == DEFAULT_BETA["simpo"] == 2.0
    assert all(DEFAULT_BETA[k] == 0.1 for k in LOSSES if k not in {"dpo_norm", "simpo"})
    averaged = {name for name in LOSSES if uses_average_logps(name, LossParams())}
    assert averaged == {"dpo_norm", "simpo", "orpo", "ipo"}
    assert not uses_average_logps("ipo", LossParams(ipo_sum=True))
    with pytest.raises(ValueError, match="unknown loss"):
        uses_average_logps("nope", LossParams())


def test_dpo_values():
    beta = 0.1
    dc, dr = sub(C, RC), sub(R, RR)
    expected = mean(-logsig(beta * (a - b)) for a, b in zip(dc, dr, strict=True))
    loss, metrics = LOSSES["dpo"](make_inputs(), LossParams(beta=beta))
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert_metrics(metrics, paired_metrics(beta, C, R, dc, dr, expected))
    assert metrics["accuracy"].item() == 0.5  # x = [1.5, -2, 1, 0]: the tie counts as wrong


def test_dpo_anchor_at_zero_margin():
    inputs = make_inputs(c=[-3.0], r=[-4.0], tc=[1], tr=[1], rc=[-3.0], rr=[-4.0])
    loss, _ = LOSSES["dpo"](inputs, LossParams())
    assert loss.item() == pytest.approx(math.log(2.0))


def test_cdpo_values():
    beta, eps = 0.5, 0.2
    dc, dr = sub(C, RC), sub(R, RR)
    expected = mean(
        -(1 - eps) * logsig(beta * (a - b)) - eps * logsig(-beta * (a - b))
        for a, b in zip(dc, dr, strict=True)
    )
    loss, metrics = LOSSES["cdpo"](make_inputs(), LossParams(beta=beta, label_smoothing=eps))
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert_metrics(metrics, paired_metrics(beta, C, R, dc, dr, expected))


def test_dpo_norm_values():
    beta = 2.0
    pc, pr = avg(C, TC), avg(R, TR)
    dc, dr = sub(pc, avg(RC, TC)), sub(pr, avg(RR, TR))
    expected = mean(-logsig(beta * (a - b)) for a, b in zip(dc, dr, strict=True))
    loss, metrics = LOSSES["dpo_norm"](make_inputs(), LossParams(beta=beta))
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert_metrics(metrics, paired_metrics(beta, pc, pr, dc, dr, expected))
    assert metrics["chosen_rewards"].item() == pytest.approx(2.0 * (0.2 - 0.1) / 4)


@pytest.mark.parametrize("ipo_sum", [False, True])
def test_ipo_values(ipo_sum):
    beta = 0.1
    if ipo_sum:
        pc, pr, rc, rr = C, R, RC, RR
    else:
        pc, pr, rc, rr = avg(C, TC), avg(R, TR), avg(RC, TC), avg(RR, TR)
    dc, dr = sub(pc, rc), sub(pr, rr)
    expected = mean((a - b - 1 / (2 * beta)) ** 2 for a, b in zip(dc, dr, strict=True))
    loss, metrics = LOSSES["ipo"](make_inputs(), LossParams(beta=beta, ipo_sum=ipo_sum))
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert_metrics(metrics, paired_metrics(beta, pc, pr, dc, dr, expected))


def test_ipo_anchor_at_zero_margin():
    inputs = make_inputs(c=[-3.0], r=[-4.0], tc=[2], tr=[2], rc=[-3.0], rr=[-4.0])
    loss, _ = LOSSES["ipo"](inputs, LossParams(beta=0.1))
    assert loss.item() == pytest.approx(25.0)  # (0 - 1/(2·0.1))²


def test_simpo_values():
    beta, gamma = 2.0, 0.5
    pc, pr = avg(C, TC), avg(R, TR)
    # gamma is the γ/β ratio: the shift inside the sigmoid is β·γ.
    expected = mean(-logsig(beta * (a - b) - beta * gamma) for a, b in zip(pc, pr, strict=True))
    inputs = make_inputs(rc=None, rr=None)
    loss, metrics = LOSSES["simpo"](inputs, LossParams(beta=beta, gamma=gamma))
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert_metrics(metrics, paired_metrics(beta, pc, pr, pc, pr, expected))


def orpo_expected(lam, pc, pr):
    ratios = [log_odds(a) - log_odds(b) for a, b in zip(pc, pr, strict=True)]
    sft = mean(-a for a in pc)
    or_loss = mean(-lam * logsig(x) for x in ratios)
    expected = paired_metrics(lam, pc, pr, pc, pr, sft + or_loss)
    expected.update(
        sft_loss=sft,
        or_loss=or_loss,
        log_odds_ratio=mean(ratios),
        log_odds_accuracy=mean(float(x > 0) for x in ratios),
    )
    return expected


def test_orpo_values():
    lam = 0.1
    pc, pr = avg(C, TC), avg(R, TR)
    loss, metrics = LOSSES["orpo"](make_inputs(rc=None, rr=None), LossParams(beta=lam))
    expected = orpo_expected(lam, pc, pr)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(expected["loss"], rel=1e-6)
    assert_metrics(metrics, expected, rel=1e-6, abs_=1e-7)


def test_orpo_both_log1mexp_branches_and_clamp():
    # Pair 1: p̄c = -1e-8 (clamped to -1e-6, expm1 branch) vs p̄r = -0.7 (log1p branch).
    # Pair 2: p̄c = -0.6 (expm1 branch, just above -ln 2) vs p̄r = -2.0 (log1p branch).
    lam = 0.1
    tc, tr = [4, 2], [3, 5]
    pc, pr = [-1e-8, -0.6], [-0.7, -2.0]
    inputs = reference_free_inputs(pc, pr, tc, tr)
    loss, metrics = LOSSES["orpo"](inputs, LossParams(beta=lam))
    expected = orpo_expected(lam, pc, pr)
    assert math.isfinite(loss.item())
    assert all(math.isfinite(v.item()) for v in metrics.values())
    assert_metrics(metrics, expected, rel=1e-5, abs_=1e-7)
    assert log_odds(-1e-8) == pytest.approx(-1e-6 - math.log(1e-6), rel=1e-6)


@pytest.mark.parametrize("p", [0.0, -1e-30, -1e-12])
def test_orpo_finite_at_zero_logp(p):
    inputs = make_inputs(c=[p], r=[-1.0], tc=[3], tr=[3], rc=None, rr=None, grad=True)
    loss, metrics = LOSSES["orpo"](inputs, LossParams())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(v) for v in metrics.values())
    assert torch.isfinite(inputs.chosen_logps.grad).all()
    assert torch.isfinite(inputs.rejected_logps.grad).all()


@pytest.mark.parametrize("name", ["apo_zero", "apo_down"])
def test_apo_values(name):
    beta = 0.3
    dc, dr = sub(C, RC), sub(R, RR)
    if name == "apo_zero":
        per_pair = [1 - sig(beta * a) + sig(beta * b) for a, b in zip(dc, dr, strict=True)]
    else:
        per_pair = [sig(beta * a) + 1 - sig(beta * (a - b)) for a, b in zip(dc, dr, strict=True)]
    loss, metrics = LOSSES[name](make_inputs(), LossParams(beta=beta))
    assert loss.item() == pytest.approx(mean(per_pair), rel=1e-12)
    assert_metrics(metrics, paired_metrics(beta, C, R, dc, dr, mean(per_pair)))


KL = [-5.0, -7.0, -4.0]
REF_KL = [-5.5, -6.0, -5.0]  # mean(KL - REF_KL) = (0.5 - 1 + 1) / 3 = 1/6 > 0


def kto_expected(beta, ld, lu, c, rc, r, rr, kl, ref_kl, paired):
    z = max(0.0, mean(sub(kl, ref_kl)))
    dc, dr = sub(c, rc), sub(r, rr)
    des = [1 - sig(beta * (a - z)) for a in dc]
    und = [1 - sig(beta * (z - b)) for b in dr]
    loss = (ld * sum(des) + lu * sum(und)) / (len(des) + len(und))  # mean over all examples
    if paired:
        accuracy = mean(float(a > b) for a, b in zip(dc, dr, strict=True))
    else:
        accuracy = mean([float(a > z) for a in dc] + [float(b < z) for b in dr])
    out = {"loss": loss, "accuracy": accuracy, "kl": z}
    if dc:
        out.update(chosen_rewards=mean(beta * a for a in dc), chosen_logps=mean(c))
    if dr:
        out.update(rejected_rewards=mean(beta * b for b in dr), rejected_logps=mean(r))
    if dc and dr:
        out["margins"] = out["chosen_rewards"] - out["rejected_rewards"]
    return out


def kto_inputs(c, r, rc, rr, kl=KL, ref_kl=REF_KL, paired=True, grad=False):
    return LossInputs(
        chosen_logps=t(c, grad=grad),
        rejected_logps=t(r, grad=grad),
        chosen_tokens=torch.ones(len(c)),
        rejected_tokens=torch.ones(len(r)),
        ref_chosen_logps=t(rc),
        ref_rejected_logps=t(rr),
        kl_logps=t(kl, grad=grad),
        ref_kl_logps=t(ref_kl),
        kl_tokens=torch.ones(len(kl)),
        paired=paired,
    )


def test_kto_paired_values():
    beta, ld, lu = 0.1, 1.0, 1.0
    loss, metrics = LOSSES["kto"](kto_inputs(C, R, RC, RR), LossParams(beta=beta))
    expected = kto_expected(beta, ld, lu, C, RC, R, RR, KL, REF_KL, paired=True)
    assert loss.item() == pytest.approx(expected["loss"], rel=1e-12)
    assert_metrics(metrics, expected)
    assert metrics["kl"].item() == pytest.approx(1 / 6)


def test_kto_unpaired_values_and_weights():
    beta, ld, lu = 0.5, 1.33, 0.8
    c, rc = [-4.0, -6.0, -9.0], [-4.5, -5.0, -9.0]
    r, rr = [-7.0, -3.0], [-6.0, -3.5]
    params = LossParams(beta=beta, lambda_d=ld, lambda_u=lu)
    loss, metrics = LOSSES["kto"](kto_inputs(c, r, rc, rr, paired=False), params)
    expected = kto_expected(beta, ld, lu, c, rc, r, rr, KL, REF_KL, paired=False)
    assert loss.item() == pytest.approx(expected["loss"], rel=1e-12)
    assert_metrics(metrics, expected)
    # Δc = [0.5, -1, 0], Δr = [-1, 0.5], z = 1/6: only Δc=0.5 and Δr=-1 sit on the right side.
    assert metrics["accuracy"].item() == pytest.approx(2 / 5)


def test_kto_is_the_mean_over_all_examples_on_an_unbalanced_batch():
    """The paper's (and TRL's) aggregation, by hand: 3 desirable and 1 undesirable examples,
    β = 1, λ_D = 1, λ_U = 2, z = 0 (mismatched log-probs equal the reference's)."""
    c, rc = [1.0, 0.0, -1.0], [0.0, 0.0, 0.0]  # Δc = 1, 0, −1
    r, rr = [0.0], [2.0]  # Δr = −2
    params = LossParams(beta=1.0, lambda_d=1.0, lambda_u=2.0)
    inputs = kto_inputs(c, r, rc, rr, kl=[-3.0], ref_kl=[-3.0], paired=False)
    loss, metrics = LOSSES["kto"](inputs, params)
    # 1 − σ(1) = 0.2689414214, 1 − σ(0) = 0.5, 1 − σ(−1) = 0.7310585786; undesirable
    # 1 − σ(z − Δr) = 1 − σ(2) = 0.1192029220, weighted by λ_U = 2
    desirable = 0.2689414213699951 + 0.5 + 0.7310585786300049
    undesirable = 2.0 * 0.11920292202211769
    assert loss.item() == pytest.approx((desirable + undesirable) / 4, rel=1e-12)  # 0.434601...
    # the old aggregation λ_D·mean_D + λ_U·mean_U would give 0.5 + 0.2384 = 0.7384
    assert loss.item() == pytest.approx(0.43460146101105884, rel=1e-12)
    assert metrics["kl"].item() == 0.0


def test_kto_paired_is_half_the_sum_of_the_class_means():
    """On paired data (n_D = n_U) the mean over all examples is (mean_D + mean_U) / 2 with
    λ = 1: half the value of the pre-fix aggregation, which summed the class means."""
    loss, _ = LOSSES["kto"](kto_inputs(C, R, RC, RR), LossParams(beta=0.1))
    z = max(0.0, mean(sub(KL, REF_KL)))
    des = mean(1 - sig(0.1 * (a - z)) for a in sub(C, RC))
    und = mean(1 - sig(0.1 * (z - b)) for b in sub(R, RR))
    assert loss.item() == pytest.approx((des + und) / 2, rel=1e-12)


def test_kto_negative_kl_clamped_to_zero():
    loss, metrics = LOSSES["kto"](
        kto_inputs(C, R, RC, RR, kl=[-5.0], ref_kl=[-4.0]), LossParams(beta=0.1)
    )
    expected = kto_expected(0.1, 1.0, 1.0, C, RC, R, RR, [-5.0], [-4.0], paired=True)
    assert metrics["kl"].item() == 0.0
    assert loss.item() == pytest.approx(expected["loss"], rel=1e-12)


@pytest.mark.parametrize("empty", ["desirable", "undesirable"])
def test_kto_empty_set(empty):
    c, rc = ([], []) if empty == "desirable" else ([-4.0, -6.0], [-4.5, -5.0])
    r, rr = ([], []) if empty == "undesirable" else ([-7.0], [-6.0])
    params = LossParams(beta=0.1, lambda_d=2.0, lambda_u=3.0)
    loss, metrics = LOSSES["kto"](kto_inputs(c, r, rc, rr, paired=False), params)
    expected = kto_expected(0.1, 2.0, 3.0, c, rc, r, rr, KL, REF_KL, paired=False)
    assert "margins" not in metrics
    assert ("chosen_rewards" in metrics) == (empty == "undesirable")
    assert ("rejected_rewards" in metrics) == (empty == "desirable")
    assert all(torch.isfinite(v) for v in metrics.values())
    assert loss.item() == pytest.approx(expected["loss"], rel=1e-12)
    assert_metrics(metrics, expected)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("name", sorted(NEEDS_REFERENCE))
def test_missing_reference_raises(name):
    inputs = make_inputs(rc=None, rr=None)
    inputs.kl_logps, inputs.ref_kl_logps = t(KL), t(REF_KL)
    with pytest.raises(ValueError, match="reference"):
        LOSSES[name](inputs, LossParams())


def test_kto_without_kl_raises():
    inputs = make_inputs()
    with pytest.raises(ValueError, match="kl_logps"):
        LOSSES["kto"](inputs, LossParams())


@pytest.mark.parametrize("name", [n for n in PREFERENCE_LOSSES if n != "kto"])
def test_unpaired_or_mismatched_raises(name):
    with pytest.raises(ValueError, match="paired=False"):
        LOSSES[name](make_inputs(paired=False), LossParams())
    mismatched = make_inputs(r=R[:3], tr=TR[:3], rr=RR[:3])
    with pytest.raises(ValueError, match="shape"):
        LOSSES[name](mismatched, LossParams())


def test_kto_paired_mismatched_raises():
    with pytest.raises(ValueError, match="shape"):
        LOSSES["kto"](kto_inputs(C, R[:3], RC, RR[:3], paired=True), LossParams())


# --------------------------------------------------------------------------- 2. gradients


def grad_inputs(name):
    if name == "kto":
        return kto_inputs(C, R, RC, RR, grad=True)
    return make_inputs(grad=True)


@pytest.mark.parametrize(
    ("name", "ipo_sum"), [(n, False) for n in PREFERENCE_LOSSES] + [("ipo", True)]
)
def test_gradients_finite_and_signed(name, ipo_sum):
    inputs = grad_inputs(name)
    loss, metrics = LOSSES[name](inputs, LossParams(beta=DEFAULT_BETA[name], ipo_sum=ipo_sum))
    assert loss.dim() == 0 and loss.requires_grad
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())
    loss.backward()
    g_c, g_r = inputs.chosen_logps.grad, inputs.rejected_logps.grad
    assert torch.isfinite(g_c).all() and torch.isfinite(g_r).all()
    # Raising a rejected log-prob never helps any of these losses.
    assert (g_r >= 0).all(), g_r
    # apo_down is built to push chosen DOWN while the policy's chosen log-ratio is above zero
    # (σ(βΔc) term), so its chosen gradient has no fixed sign. IPO would push chosen down once
    # x > 1/(2β); the batch here has x well below that.
    if name != "apo_down":
        assert (g_c <= 0).all(), g_c
    assert g_c.abs().sum() > 0 and g_r.abs().sum() > 0


def test_apo_down_lowers_chosen_when_already_above_reference():
    beta = 0.1
    inputs = make_inputs(c=[-5.0], r=[-30.0], tc=[1], tr=[1], rc=[-10.0], rr=[-10.0], grad=True)
    loss, _ = LOSSES["apo_down"](inputs, LossParams(beta=beta))
    loss.backward()
    assert inputs.chosen_logps.grad.item() > 0  # Δc = 5, x = 25: the σ(βΔc) term dominates


def test_kto_reference_point_is_detached():
    inputs = kto_inputs(C, R, RC, RR, grad=True)
    loss, _ = LOSSES["kto"](inputs, LossParams())
    (g_kl,) = torch.autograd.grad(loss, [inputs.kl_logps], allow_unused=True)
    assert g_kl is None


# --------------------------------------------------------------------------- 3. against trl==1.16.0


class _FakeLM:
    """Stands in for a causal LM called with ``fused_lm_head=True``.

    ``tables`` maps the first input id of a batch to its per-token log-probs (rows, L - 1); each
    row holds the whole summed log-prob on the first completion position and zeros elsewhere,
    so trl's row sums reproduce our sums exactly.
    """

    training = True

    def __init__(self, tables):
        self.tables = tables

    def __call__(self, input_ids, **kwargs):
        log_probs = self.tables[int(input_ids[0, 0])]
        zeros = torch.zeros_like(log_probs)
        return SimpleNamespace(
            log_probs=log_probs,
            entropy=zeros,
            mean_logits=zeros,
            is_top1=torch.zeros(log_probs.shape, dtype=torch.bool),
        )


def _sequences(sums, tokens, marker):
    """input_ids/attention_mask/completion_mask for one prompt token then ``tokens`` tokens."""
    n = len(sums)
    width = max(tokens, default=0) + 2
    completion_mask = torch.zeros(n, width, dtype=torch.long)
    for i, k in enumerate(tokens):
        completion_mask[i, 1 : 1 + k] = 1
    log_probs = torch.zeros(n, width - 1, dtype=torch.float64)
    log_probs[:, 0] = torch.tensor(sums, dtype=torch.float64)
    input_ids = torch.full((n, width), marker, dtype=torch.long)
    return input_ids, torch.ones_like(input_ids), completion_mask, log_probs


def _stand_in(model, **attrs):
    accelerator = SimpleNamespace(
        device=torch.device("cpu"), gather=lambda x: x, gather_for_metrics=lambda x: x
    )
    return SimpleNamespace(
        model=model,
        accelerator=accelerator,
        aux_loss_enabled=False,
        precompute_ref_logps=True,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0,
        _tp_size=1,
        args=SimpleNamespace(gradient_checkpointing_kwargs=None),
        **attrs,
    )


def trl_dpo(loss_type, beta, inputs, label_smoothing=0.0):
    """Run trl's DPOTrainer._compute_loss on our summed log-probs; returns (loss, metrics)."""
    from trl.trainer.dpo_trainer import DPOTrainer

    sums = torch.cat([inputs.chosen_logps, inputs.rejected_logps]).tolist()
    tokens = torch.cat([inputs.chosen_tokens, inputs.rejected_tokens]).tolist()
    input_ids, attention_mask, completion_mask, log_probs = _sequences(sums, tokens, marker=1)
    model = _FakeLM({1: log_probs})
    trainer = _stand_in(
        model,
        beta=beta,
        label_smoothing=label_smoothing,
        loss_types=[loss_type],
        loss_weights=[1.0],
        ld_alpha=None,
        f_divergence_type="reverse_kl",
        use_weighting=False,
    )
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "completion_mask": completion_mask,
        "ref_chosen_logps": inputs.ref_chosen_logps,
        "ref_rejected_logps": inputs.ref_rejected_logps,
    }
    loss = DPOTrainer._compute_loss(trainer, model, batch, return_outputs=False)
    return loss, {k: v[-1] for k, v in trainer._metrics["train"].items()}


def assert_trl_dpo_metrics(ours, theirs):
    pairs = {
        "chosen_rewards": "rewards/chosen",
        "rejected_rewards": "rewards/rejected",
        "margins": "rewards/margins",
        "accuracy": "rewards/accuracies",
        "chosen_logps": "logps/chosen",
        "rejected_logps": "logps/rejected",
    }
    for mine, name in pairs.items():
        assert ours[mine].item() == pytest.approx(theirs[name], rel=1e-9, abs=1e-12), mine


class TestAgainstTRL:
    @pytest.mark.parametrize(
        ("ours", "trl_type"),
        [("dpo", "sigmoid"), ("apo_zero", "apo_zero"), ("apo_down", "apo_down")],
    )
    def test_summed_losses_and_metrics(self, trl, ours, trl_type):
        inputs, beta = make_inputs(), 0.3
        loss, metrics = LOSSES[ours](inputs, LossParams(beta=beta))
        trl_loss, trl_metrics = trl_dpo(trl_type, beta, inputs)
        assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-9)
        assert_trl_dpo_metrics(metrics, trl_metrics)

    def test_cdpo_against_aot(self, trl):
        # trl 1.16 "sigmoid" ignores label_smoothing; "aot" is the cDPO formula on sorted
        # log-ratios, which equals cDPO's batch mean when the reference log-ratio is constant.
        beta, eps = 0.4, 0.15
        rc = [-9.0, -25.0, -7.0, -3.0]
        rr = [a - 0.7 for a in rc]
        inputs = make_inputs(rc=rc, rr=rr)
        loss, metrics = LOSSES["cdpo"](inputs, LossParams(beta=beta, label_smoothing=eps))
        trl_loss, trl_metrics = trl_dpo("aot", beta, inputs, label_smoothing=eps)
        assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-9)
        assert_trl_dpo_metrics(metrics, trl_metrics)
        # and trl's plain sigmoid is DPO, i.e. no smoothing
        dpo, _ = LOSSES["dpo"](inputs, LossParams(beta=beta))
        assert trl_dpo("sigmoid", beta, inputs, label_smoothing=eps)[0].item() == pytest.approx(
            dpo.item(), rel=1e-9
        )

    @pytest.mark.parametrize(("ours", "trl_type"), [("ipo", "ipo"), ("dpo_norm", "sigmoid_norm")])
    def test_average_losses(self, trl, ours, trl_type):
        # trl divides the summed log-ratios by the completion-mask length itself, so it gets our
        # sums and token counts; its logged rewards stay on sums, so only the loss is compared.
        inputs, beta = make_inputs(), 0.7
        loss, _ = LOSSES[ours](inputs, LossParams(beta=beta))
        trl_loss, _ = trl_dpo(trl_type, beta, inputs)
        assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-9)

    def test_simpo_against_cpo(self, trl):
        from trl.experimental.cpo.cpo_trainer import CPOTrainer

        beta, gamma = 2.0, 0.5
        inputs = make_inputs(rc=None, rr=None)
        loss, metrics = LOSSES["simpo"](inputs, LossParams(beta=beta, gamma=gamma))
        pc, pr = avg(C, TC), avg(R, TR)
        stand_in = _stand_in(
            None,
            alpha=0.0,
            beta=beta,
            loss_type="simpo",
            simpo_gamma=beta * gamma,  # trl's absolute margin = our β·γ
            label_smoothing=0.0,
        )
        losses, chosen_rewards, rejected_rewards = CPOTrainer.cpo_loss(stand_in, t(pc), t(pr))
        assert loss.item() == pytest.approx(losses.mean().item(), rel=1e-9)
        assert metrics["chosen_rewards"].item() == pytest.approx(chosen_rewards.mean().item())
        assert metrics["rejected_rewards"].item() == pytest.approx(rejected_rewards.mean().item())

    def test_orpo_odds_ratio_term(self, trl):
        from trl.experimental.orpo.orpo_trainer import ORPOTrainer

        lam = 0.25
        # Away from p̄ = 0, where we clamp and trl does not; both log1mexp branches appear.
        tc, tr = [4, 2, 5], [3, 5, 2]
        pc, pr = [-0.3, -0.6, -2.5], [-0.7, -2.0, -0.1]
        inputs = reference_free_inputs(pc, pr, tc, tr)
        loss, metrics = LOSSES["orpo"](inputs, LossParams(beta=lam))
        stand_in = _stand_in(None, beta=lam)
        losses, chosen_rewards, rejected_rewards, mean_logsig, mean_log_odds = (
            ORPOTrainer.odds_ratio_loss(stand_in, t(pc), t(pr))
        )
        assert metrics["or_loss"].item() == pytest.approx(-losses.mean().item(), rel=1e-6)
        assert metrics["log_odds_ratio"].item() == pytest.approx(mean_log_odds.item(), rel=1e-6)
        assert metrics["chosen_rewards"].item() == pytest.approx(chosen_rewards.mean().item())
        assert metrics["rejected_rewards"].item() == pytest.approx(rejected_rewards.mean().item())
        # trl: loss = nll - losses.mean(); with our per-example NLL (mean of -p̄c):
        trl_total = mean(-a for a in pc) - losses.mean().item()
        assert loss.item() == pytest.approx(trl_total, rel=1e-6)
        assert mean_logsig.item() == pytest.approx(-metrics["or_loss"].item() / lam, rel=1e-6)

    @staticmethod
    def _trl_kto(beta, ld, lu, c, r, rc, rr, kl, ref_kl):
        from trl.trainer.kto_trainer import KTOTrainer

        # Interleave desirable and undesirable examples as an unpaired batch would.
        order = [("d", i) for i in range(len(c))] + [("u", i) for i in range(len(r))]
        order.sort(key=lambda item: (item[1], item[0]))
        sums = [c[i] if s == "d" else r[i] for s, i in order]
        refs = [rc[i] if s == "d" else rr[i] for s, i in order]
        labels = torch.tensor([s == "d" for s, _ in order])
        input_ids, attention_mask, completion_mask, log_probs = _sequences(sums, [3] * len(sums), 1)
        kl_ids, kl_attention, kl_completion, kl_log_probs = _sequences(kl, [2] * len(kl), 2)
        model = _FakeLM({1: log_probs, 2: kl_log_probs})
        stand_in = _stand_in(
            model,
            beta=beta,
            desirable_weight=ld,
            undesirable_weight=lu,
            loss_type="kto",
            calculate_KL=True,
        )
        stand_in._compute_kl_logps = MethodType(KTOTrainer._compute_kl_logps, stand_in)
        batch = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "completion_mask": completion_mask,
            "KL_input_ids": kl_ids,
            "KL_attention_mask": kl_attention,
            "KL_completion_mask": kl_completion,
            "label": labels,
            "ref_logps": t(refs),
            "ref_KL_logps": t(ref_kl),
        }
        loss = KTOTrainer._compute_loss(stand_in, model, batch, return_outputs=False)
        return loss, {k: v[-1] for k, v in stand_in._metrics["train"].items()}

    def test_kto_paired_equals_trl(self, trl):
        beta = 0.1
        loss, metrics = LOSSES["kto"](kto_inputs(C, R, RC, RR), LossParams(beta=beta))
        trl_loss, trl_metrics = self._trl_kto(beta, 1.0, 1.0, C, R, RC, RR, KL, REF_KL)
        assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-9)
        assert metrics["kl"].item() == pytest.approx(trl_metrics["kl"])
        for mine, name in [
            ("chosen_rewards", "rewards/chosen"),
            ("rejected_rewards", "rewards/rejected"),
            ("margins", "rewards/margins"),
            ("chosen_logps", "logps/chosen"),
            ("rejected_logps", "logps/rejected"),
        ]:
            assert metrics[mine].item() == pytest.approx(trl_metrics[name], rel=1e-9), mine

    def test_kto_unpaired_weighted(self, trl):
        beta, ld, lu = 0.5, 1.33, 0.8
        c, rc = [-4.0, -6.0, -9.0], [-4.5, -5.0, -9.0]
        r, rr = [-7.0, -3.0], [-6.0, -3.5]
        kl, ref_kl = [-5.0, -7.0, -4.0, -2.0, -8.0], [-5.5, -6.0, -5.0, -2.5, -8.1]

        def ours(ld_, lu_):
            inputs = kto_inputs(c, r, rc, rr, kl=kl, ref_kl=ref_kl, paired=False)
            return LOSSES["kto"](inputs, LossParams(beta=beta, lambda_d=ld_, lambda_u=lu_))

        loss, metrics = ours(ld, lu)
        trl_loss, trl_metrics = self._trl_kto(beta, ld, lu, c, r, rc, rr, kl, ref_kl)
        assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-9)
        # the class sums add up: λ_D·Σ_D + λ_U·Σ_U over the n_D + n_U examples
        n = len(c) + len(r)
        sum_d, sum_u = n * ours(1.0, 0.0)[0].item(), n * ours(0.0, 1.0)[0].item()
        assert loss.item() == pytest.approx((ld * sum_d + lu * sum_u) / n, rel=1e-12)
        assert metrics["kl"].item() == pytest.approx(trl_metrics["kl"])
        assert metrics["margins"].item() == pytest.approx(trl_metrics["rewards/margins"])
