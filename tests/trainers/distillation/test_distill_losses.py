"""The per-token divergences of on-policy distillation on small distributions worked by hand
(natural logs), GKD's β convention at the limits, and the token mean over a masked batch."""

from __future__ import annotations

import math

import pytest
import torch

from trainers.distillation.losses import (
    DIVERGENCES,
    distillation_loss,
    forward_kl,
    generalized_jsd,
    reverse_kl,
)

# teacher P = (1/2, 1/2), student Q = (1/4, 3/4)
P = torch.tensor([0.5, 0.5]).log()
Q = torch.tensor([0.25, 0.75]).log()
LN2, LN3_2, LN4_3, LN6_5 = math.log(2), math.log(1.5), math.log(4 / 3), math.log(1.2)


def test_reverse_kl_by_hand():
    # KL(Q‖P) = 1/4·ln(1/2) + 3/4·ln(3/2)
    expected = 0.25 * -LN2 + 0.75 * LN3_2  # 0.130812
    assert float(reverse_kl(Q, P)) == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(0.130812, abs=1e-6)


def test_forward_kl_by_hand():
    # KL(P‖Q) = 1/2·ln(2) + 1/2·ln(2/3)
    expected = 0.5 * LN2 - 0.5 * LN3_2  # 0.143841
    assert float(forward_kl(Q, P)) == pytest.approx(expected, abs=1e-6)


def test_generalized_jsd_half_by_hand():
    # M = (3/8, 5/8); KL(P‖M) = 1/2·ln(4/3) + 1/2·ln(4/5); KL(Q‖M) = 1/4·ln(2/3) + 3/4·ln(6/5)
    kl_pm = 0.5 * LN4_3 + 0.5 * math.log(0.8)
    kl_qm = 0.25 * -LN3_2 + 0.75 * LN6_5
    expected = 0.5 * kl_pm + 0.5 * kl_qm  # 0.033822
    assert float(generalized_jsd(Q, P, 0.5)) == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(0.033822, abs=1e-6)


def test_generalized_jsd_beta_0_9_by_hand():
    # M = 0.9·P + 0.1·Q = (0.475, 0.525)
    kl_pm = 0.5 * math.log(0.5 / 0.475) + 0.5 * math.log(0.5 / 0.525)
    kl_qm = 0.25 * math.log(0.25 / 0.475) + 0.75 * math.log(0.75 / 0.525)
    expected = 0.9 * kl_pm + 0.1 * kl_qm  # 0.011831
    assert float(generalized_jsd(Q, P, 0.9)) == pytest.approx(expected, abs=1e-6)


def test_beta_limits_follow_gkd_convention():
    """β = 0 is forward KL and β = 1 reverse KL exactly; near the limits JSD(β)/β tends to
    forward KL and JSD(β)/(1 − β) to reverse KL (the value itself vanishes)."""
    assert float(generalized_jsd(Q, P, 0.0)) == pytest.approx(float(forward_kl(Q, P)))
    assert float(generalized_jsd(Q, P, 1.0)) == pytest.approx(float(reverse_kl(Q, P)))
    eps = 1e-4
    assert float(generalized_jsd(Q, P, eps)) / eps == pytest.approx(
        float(forward_kl(Q, P)), rel=1e-2
    )
    assert float(generalized_jsd(Q, P, 1 - eps)) / eps == pytest.approx(
        float(reverse_kl(Q, P)), rel=1e-2
    )
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(Q, P, 1.5)


def test_identical_distributions_give_zero_and_zero_probabilities_are_safe():
    p = torch.tensor([1.0, 0.0, 0.0]).clamp_min(1e-45).log()
    p[1:] = float("-inf")
    for name, fn in DIVERGENCES.items():
        assert float(fn(p, p, 0.5)) == pytest.approx(0.0, abs=1e-7), name
    q = torch.tensor([0.5, 0.5, 0.0]).log()
    assert math.isfinite(float(reverse_kl(p, q)))  # Σ over p's support only


def test_distillation_loss_is_the_token_mean_over_the_mask_and_trains_the_student_only():
    # two rows of two positions; row 1's second position is padding
    student = torch.stack([Q, Q, Q, torch.tensor([0.9, 0.1]).log()]).view(2, 2, 2)
    teacher = torch.stack([P, P, P, P]).view(2, 2, 2)
    student.requires_grad_(True)
    teacher.requires_grad_(True)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, metrics = distillation_loss(student, teacher, mask)  # logits = log-probs here
    per_token = 0.25 * -LN2 + 0.75 * LN3_2
    assert float(loss.detach()) == pytest.approx(
        per_token, abs=1e-6
    )  # 3 equal tokens, padding ignored
    assert metrics["loss"] == pytest.approx(per_token, abs=1e-6)
    assert metrics["reverse_kl"] == pytest.approx(per_token, abs=1e-6)
    # the step's token count divides: two micro-batches of a 6-token step sum to the mean
    half, _ = distillation_loss(student, teacher, mask, n_tokens=6)
    assert float(half.detach()) == pytest.approx(per_token / 2, abs=1e-6)
    loss.backward()
    assert student.grad is not None and float(student.grad[1, 1].abs().sum()) == 0.0
    assert teacher.grad is None
    # jsd with its β reports the reverse KL beside its own value
    _, m = distillation_loss(student.detach(), teacher.detach(), mask, divergence="jsd", beta=0.5)
    assert m["loss"] == pytest.approx(0.033822, abs=1e-6)
    assert m["reverse_kl"] == pytest.approx(per_token, abs=1e-6)
