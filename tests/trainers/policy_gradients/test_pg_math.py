"""Tests for the policy-gradient math: trainers/policy_gradients/{advantages,losses,rewards}.py.

Expected numbers come from plain ``math`` on Python floats (small hand cases, or a hand-rolled
loop over random values). The last class compares with trl==1.16.0; trl is imported lazily
through the ``trl`` fixture (skipped when missing or another version); deselect it with
``-k "not TRL"``.

What trl 1.16.0 exposes, found while writing the comparison:

* GRPO advantages are computed inside ``GRPOTrainer._generate_and_score_completions``, which
  generates with the model and calls reward functions, so that method is NOT called. We compare
  the formula against trl's standalone ``trl.trainer.utils.nanstd`` (unbiased group std) with
  trl's ε = 1e-4 (ours defaults to 1e-8).
* The losses live in ``GRPOTrainer._compute_loss(self, model, inputs)``, which only needs the
  model to get per-token log-probs through ``self._get_per_token_logps_and_entropies``; we call
  it unbound with a SimpleNamespace ``self`` whose method returns our log-probs, and compare
  loss, gradient and the logged ``kl`` / ``clip_ratio/region_mean``. trl's CISPO clips only
  above, at ``epsilon_high`` itself (ρ ≤ ε_high); ours clips to [1 − ε_lo, 1 + ε_hi], so trl's
  ε_high = 5 is our (ε_lo, ε_hi) = (1, 4). trl's GSPO is ``importance_sampling_level="sequence"``.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from trainers.core.spec import spec_for
from trainers.core.tasks import TASK_CONFIGS, format_response, import_reasoning_gym
from trainers.core.verifier import (
    compute_rewards,
    correctness_score,
    format_score,
    overlong_penalty,
)
from trainers.policy_gradients.advantages import (
    ADVANTAGES,
    drgrpo_advantages,
    frac_zero_std,
    gae,
    grpo_advantages,
    maxrl_advantages,
    reinforce_advantages,
    rloo_advantages,
    sequence_advantage_for,
    sequence_reward_to_tokens,
)
from trainers.policy_gradients.losses import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossParams,
    aggregate,
    kl_estimate,
    masked_mean,
    value_loss,
)
from trainers.policy_gradients.rewards import dapo_keep_groups
from trainers.policy_gradients.spec import FAMILY as PG_FAMILY

# each algorithm's default aggregation, as its spec declares it
DEFAULT_LOSS_AGG = {spec.name: spec.loss_agg for spec in PG_FAMILY.algorithms}

ALGOS = ["reinforce", "rloo", "ppo", "grpo", "drgrpo", "gspo", "cispo", "sapo", "dapo", "maxrl"]
CLIPPED_SURROGATE = ["ppo", "grpo", "drgrpo", "dapo"]


def register_graded_task(graded: float) -> str:
    """The name of a reasoning-gym task, registered in reasoning-gym's own registry (which the
    verifier reads), whose scorer gives every answer ``graded``."""
    from reasoning_gym.dataset import ProceduralDataset
    from reasoning_gym.factory import DATASETS, register_dataset

    name = f"test_graded_{graded}".replace(".", "_")
    if name not in DATASETS:

        @dataclass
        class Config:
            score: float = graded

        class Graded(ProceduralDataset):
            def __getitem__(self, idx: int) -> dict:
                return {"question": "", "answer": "", "metadata": {}}

            def score_answer(self, answer, entry) -> float:
                return self.config.score

        register_dataset(name, Graded, Config)
    return name


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float32, **kw)


def approx_list(values, rel=1e-6, abs=1e-6):
    return pytest.approx(values, rel=rel, abs=abs)


# =========================================================================== advantages


def py_mean(xs):
    return sum(xs) / len(xs)


def py_std(xs):  # unbiased
    m = py_mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


# two groups of G=4: one with ties, one all equal (0.1 is not exact in binary: mean ≠ 0.1)
R = [1.0, 0.0, 0.5, 0.5, 0.1, 0.1, 0.1, 0.1]


class TestAdvantages:
    def test_reinforce_is_the_reward(self):
        assert reinforce_advantages(t(R), 4).tolist() == approx_list(R)
        assert reinforce_advantages(t([0.3]), 1).tolist() == approx_list([0.3])

    def test_grpo_hand_values_ties_and_constant_group(self):
        a = grpo_advantages(t(R), 4)
        g = R[:4]
        m, s = py_mean(g), py_std(g)
        expected = [(x - m) / (s + 1e-8) for x in g] + [0.0] * 4
        assert a.tolist() == approx_list(expected)
        assert a[4:].tolist() == [0.0] * 4  # exactly 0, not round-off / 1e-8
        assert torch.isfinite(a).all()
        assert a[2] == a[3]  # ties get equal advantages

    @pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
    def test_single_rollout_is_an_error(self, fn):
        with pytest.raises(ValueError, match="G >= 2"):
            fn(t([1.0, 0.0]), 1)

    def test_shape_errors(self):
        with pytest.raises(ValueError):
            grpo_advantages(t(R[:7]), 4)
        with pytest.raises(ValueError):
            drgrpo_advantages(t([[1.0, 2.0]]), 2)

    def test_rloo_is_leave_one_out(self):
        rng = random.Random(0)
        G = 5
        r = [rng.choice([0.0, 0.25, 1.0, 1.5]) for _ in range(3 * G)] + [0.7] * G
        a = rloo_advantages(t(r), G).tolist()
        expected = []
        for g in range(len(r) // G):
            grp = r[g * G : (g + 1) * G]
            for i, x in enumerate(grp):
                others = grp[:i] + grp[i + 1 :]
                expected.append(x - py_mean(others))
        assert a == approx_list(expected, rel=1e-5, abs=1e-6)
        assert a[-G:] == [0.0] * G

    def test_drgrpo_centres_without_std(self):
        a = drgrpo_advantages(t(R), 4).tolist()
        m = py_mean(R[:4])
        assert a == approx_list([x - m for x in R[:4]] + [0.0] * 4)

    def test_maxrl(self):
        b = [1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
        a = maxrl_advantages(t(b), 4).tolist()
        expected = [3.0, -1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0] + [0.0] * 8
        assert a == approx_list(expected)
        assert all(math.isfinite(x) for x in a)

    def test_dispatch_table(self):
        # Every algorithm but PPO (token-level GAE) resolves to a sequence estimator by its spec.
        for algo in set(ALGOS) - {"ppo"}:
            assert sequence_advantage_for(algo) is ADVANTAGES[spec_for(algo).advantage]
        with pytest.raises(KeyError):
            sequence_advantage_for("ppo")
        adv = sequence_advantage_for
        rewards = {"total": t(R), "binary": t([1, 0, 0, 0, 1, 1, 1, 1])}
        for algo in ("grpo", "gspo", "cispo", "sapo", "dapo"):
            assert torch.equal(adv(algo)(rewards, 4), grpo_advantages(t(R), 4))
        assert torch.equal(adv("rloo")(rewards, 4), rloo_advantages(t(R), 4))
        assert torch.equal(adv("drgrpo")(rewards, 4), drgrpo_advantages(t(R), 4))
        assert torch.equal(adv("reinforce")(rewards, 4), t(R))
        assert adv("maxrl")(rewards, 4).tolist() == approx_list([3, -1, -1, -1, 0, 0, 0, 0])

    def test_frac_zero_std(self):
        assert frac_zero_std(t(R + [2.0, 2.0, 2.0, 2.0]), 4) == pytest.approx(2 / 3)
        assert frac_zero_std(t([0.0, 1.0]), 2) == 0.0

    def test_sequence_reward_to_tokens(self):
        mask = t([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
        out = sequence_reward_to_tokens(t([2.0, -1.0, 5.0, 0.5]), mask)
        assert out.tolist() == [[0, 0, 2.0, 0], [-1.0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0.5]]


def gae_by_hand(rewards, values, lengths, gamma, lam):
    """Plain-Python GAE on the first ``length`` positions of each row; zeros after."""
    advs, rets = [], []
    for r, v, n in zip(rewards, values, lengths, strict=True):
        a = [0.0] * len(r)
        nxt = 0.0
        for i in reversed(range(n)):
            v_next = v[i + 1] if i + 1 < n else 0.0
            delta = r[i] + gamma * v_next - v[i]
            nxt = delta + gamma * lam * nxt
            a[i] = nxt
        advs.append(a)
        rets.append([a[i] + v[i] if i < n else 0.0 for i in range(len(r))])
    return advs, rets


class TestGAE:
    @pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.98), (0.9, 0.95)])
    def test_against_python_loop_with_right_padding(self, gamma, lam):
        rng = random.Random(1)
        B, T = 4, 7
        lengths = [7, 3, 1, 5]
        rewards = [[rng.uniform(-1, 1) for _ in range(T)] for _ in range(B)]
        values = [[rng.uniform(-2, 2) for _ in range(T)] for _ in range(B)]
        mask = [[1.0 if i < n else 0.0 for i in range(T)] for n in lengths]
        # garbage on padding must be ignored
        for row, n in zip(rewards, lengths, strict=True):
            for i in range(n, T):
                row[i] = 1e3
        adv, ret = gae(t(rewards), t(values), t(mask), gamma, lam)
        exp_adv, exp_ret = gae_by_hand(rewards, values, lengths, gamma, lam)
        for b in range(B):
            assert adv[b].tolist() == approx_list(exp_adv[b], rel=1e-5, abs=1e-5)
            assert ret[b].tolist() == approx_list(exp_ret[b], rel=1e-5, abs=1e-5)

    def test_tiny_hand_case(self):
        # γ = λ = 1: A_t = (sum of future rewards) − V_t; reward only at the last token
        r = sequence_reward_to_tokens(t([1.0]), t([[1, 1, 0]]))
        adv, ret = gae(r, t([[0.25, 0.5, 9.0]]), t([[1, 1, 0]]), 1.0, 1.0)
        assert adv.tolist() == [approx_list([0.75, 0.5, 0.0])]
        assert ret.tolist() == [approx_list([1.0, 1.0, 0.0])]

    def test_no_gradient(self):
        v = t([[0.1, 0.2]], requires_grad=True)
        adv, ret = gae(t([[0.0, 1.0]]), v, t([[1, 1]]), 1.0, 0.9)
        assert not adv.requires_grad and not ret.requires_grad


# =========================================================================== KL


class TestKL:
    D = [-3.0, -0.6, -0.2, 0.0, 0.3, 0.49, 0.51, 1.0, 4.0]

    def test_values(self):
        logp, ref = t(self.D), torch.zeros(len(self.D))
        assert kl_estimate(logp, ref, "k1").tolist() == approx_list(self.D)
        assert kl_estimate(logp, ref, "k2").tolist() == approx_list([d * d / 2 for d in self.D])
        k3 = [math.exp(-d) - 1 + d for d in self.D]
        assert kl_estimate(logp, ref, "k3").tolist() == approx_list(k3, rel=2e-6, abs=1e-7)
        # d = logp − ref: a shifted pair gives the same numbers, and the sign of k1 is +d
        assert kl_estimate(t([-1.0]), t([-1.5]), "k1").item() == pytest.approx(0.5)

    def test_k3_nonnegative_on_a_grid(self):
        for dtype in (torch.float32, torch.float64):
            d = torch.linspace(-15, 15, 30001, dtype=dtype)
            assert (kl_estimate(d, torch.zeros_like(d), "k3") >= 0).all()

    @pytest.mark.parametrize("d", [1e-3, -1e-3, 2e-5, 1e-8, -1e-8, 3e-12])
    def test_k3_near_zero_no_cancellation(self, d):
        exact = d * d / 2 - d**3 / 6 + d**4 / 24
        got = kl_estimate(t([d]), t([0.0]), "k3").item()
        assert got == pytest.approx(exact, rel=1e-5)
        assert got == pytest.approx(d * d / 2, rel=1e-3)

    def test_naive_expm1_form_does_cancel_in_float32(self):
        # why k3 uses a series near 0: this is what a one-line expm1(−d) + d returns
        d = t([1e-8])
        naive = (torch.expm1(-d) + d).item()
        assert abs(naive - 5e-17) / 5e-17 > 0.5

    def test_k3_gradient(self):
        d = t(self.D + [1e-6, -1e-4], requires_grad=True)
        kl_estimate(d, torch.zeros_like(d), "k3").sum().backward()
        expected = [1 - math.exp(-x) for x in d.tolist()]
        assert d.grad.tolist() == approx_list(expected, rel=1e-5, abs=1e-9)

    def test_mask_and_unknown_kind(self):
        logp, ref = t([[-1.0, -300.0]]), t([[-1.2, 0.0]])
        mask = t([[1, 0]])
        k3 = kl_estimate(logp, ref, "k3", mask)
        assert k3.tolist() == [approx_list([math.exp(-0.2) - 1 + 0.2, 0.0])]
        with pytest.raises(ValueError, match="k1, k2 or k3"):
            kl_estimate(logp, ref, "kl3")


# =========================================================================== policy losses

MASK = [[1, 1, 1, 0], [1, 1, 0, 0]]
LOGP = [[-0.7, -1.2, -0.3, 40.0], [-2.0, -0.1, -60.0, 7.0]]  # garbage on padding
OLD = [[-0.9, -1.0, -0.3, -80.0], [-1.5, -0.4, 0.0, 0.0]]
REF = [[-0.8, -1.0, -0.5, 90.0], [-1.8, -0.2, 33.0, -1.0]]
SEQ_ADV = [1.5, -0.5]
NAN = float("nan")
ADV = [[1.5, 1.5, 1.5, NAN], [-0.5, -0.5, NAN, NAN]]  # NaN on padding must not leak


def inputs(logp=LOGP, old=OLD, adv=ADV, mask=MASK, ref=REF):
    return PolicyLossInputs(
        logp=t(logp, requires_grad=True),
        old_logp=t(old),
        advantages=t(adv),
        mask=t(mask),
        ref_logp=None if ref is None else t(ref),
    )


def clip(x, lo, hi):
    return min(max(x, lo), hi)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def expected_tokens(algo, p: PolicyLossParams, logp=LOGP, old=OLD, mask=MASK, seq_adv=SEQ_ADV):
    """Per-token policy loss by hand (plain math), 0 on padding."""
    lo, hi = 1 - p.clip_eps_lo, 1 + p.clip_eps_hi
    out = []
    for lp, ol, m, a in zip(logp, old, mask, seq_adv, strict=True):
        n = sum(m)
        s = math.exp(sum((x - y) for x, y, k in zip(lp, ol, m, strict=True) if k) / n)
        row = []
        for x, y, k in zip(lp, ol, m, strict=True):
            if not k:
                row.append(0.0)
                continue
            rho = math.exp(x - y)
            if algo in ("reinforce", "rloo", "maxrl"):
                row.append(-x * a)
            elif algo in CLIPPED_SURROGATE:
                row.append(-min(rho * a, clip(rho, lo, hi) * a))
            elif algo == "gspo":
                row.append(-min(s * a, clip(s, lo, hi) * a))
            elif algo == "cispo":
                row.append(-clip(rho, lo, hi) * a * x)
            elif algo == "sapo":
                tau = p.sapo_tau_pos if a > 0 else p.sapo_tau_neg
                row.append(-(4 / tau) * sigmoid(tau * (rho - 1)) * a)
        out.append(row)
    return out


def expected_k3(logp=LOGP, ref=REF, mask=MASK):
    return [
        [math.exp(r - x) - 1 + (x - r) if k else 0.0 for x, r, k in zip(a, b, m, strict=True)]
        for a, b, m in zip(logp, ref, mask, strict=True)
    ]


class TestPolicyLosses:
    def test_table_keys(self):
        issue_17 = {"reinforce_pp", "reinforce_pp_baseline", "remax", "gmpo"}  # own test file
        assert set(POLICY_LOSSES) == set(ALGOS) | issue_17
        assert set(DEFAULT_LOSS_AGG) == set(ALGOS) | issue_17
        assert DEFAULT_LOSS_AGG["drgrpo"] == "seq_mean_token_sum_norm"
        assert DEFAULT_LOSS_AGG["dapo"] == DEFAULT_LOSS_AGG["cispo"] == "token_mean"
        assert DEFAULT_LOSS_AGG["grpo"] == "seq_mean_token_mean"

    @pytest.mark.parametrize("algo", ALGOS)
    def test_values_with_padding(self, algo):
        params = PolicyLossParams(clip_eps_lo=0.2, clip_eps_hi=0.28 if algo == "dapo" else 0.2)
        inp = inputs()
        loss, stats = POLICY_LOSSES[algo](inp, params)
        expected = expected_tokens(algo, params)
        for b in range(2):
            assert loss[b].tolist() == approx_list(expected[b], rel=1e-5)
        assert stats["pg_loss"].tolist() == loss.tolist()  # β = 0: no KL in the loss
        for b in range(2):
            assert stats["kl"][b].tolist() == approx_list(expected_k3()[b], rel=1e-5)
        assert {"ratio", "clipped", "kl", "pg_loss"} <= set(stats)
        assert all(not v.requires_grad for v in stats.values())
        loss.sum().backward()
        grad = inp.logp.grad
        assert torch.isfinite(grad).all()
        assert grad[0, 3] == 0 and (grad[1, 2:] == 0).all()  # nothing flows into padding

    @pytest.mark.parametrize("algo", ALGOS)
    @pytest.mark.parametrize("a", [0.8, -0.8])
    def test_gradient_sign_on_policy(self, algo, a):
        # ρ = 1: a positive advantage makes the loss fall as logπ rises, a negative one rise
        lp = [[-1.0, -0.5, 0.0]]
        inp = inputs(logp=lp, old=lp, adv=[[a, a, NAN]], mask=[[1, 1, 0]], ref=None)
        loss, _ = POLICY_LOSSES[algo](inp, PolicyLossParams())
        agg = aggregate(
            loss,
            inp.mask,
            DEFAULT_LOSS_AGG[algo],
            step_num_seqs=1,
            step_num_tokens=2,
            max_new_tokens=4,
        )
        agg.backward()
        g = inp.logp.grad[0]
        assert (g[:2] < 0).all() if a > 0 else (g[:2] > 0).all()
        assert g[2] == 0

    @pytest.mark.parametrize("algo", CLIPPED_SURROGATE)
    def test_clipping_zeroes_the_gradient(self, algo):
        # ρ: e^0.5 (A>0: clipped), e^0.1 (in range), e^0.5 with A<0 (not clipped: the unclipped
        # branch is the smaller objective), e^-0.5 with A<0 (clipped), e^-0.5 with A>0 (not)
        lp = [[0.5, 0.1, 0.5, -0.5, -0.5]]
        adv = [[1.0, 1.0, -1.0, -1.0, 1.0]]
        inp = inputs(logp=lp, old=[[0.0] * 5], adv=adv, mask=[[1] * 5], ref=None)
        loss, stats = POLICY_LOSSES[algo](inp, PolicyLossParams())
        loss.sum().backward()
        rho = [math.exp(x) for x in lp[0]]
        expected_grad = [0.0, -rho[1], rho[2], 0.0, -rho[4]]  # d(−ρA)/dlogπ = −ρA
        assert inp.logp.grad[0].tolist() == approx_list(expected_grad, rel=1e-5)
        assert stats["clipped"][0].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
        assert stats["ratio"][0].tolist() == approx_list(rho)

    def test_dapo_clip_higher(self):
        # ρ = 1.25, A > 0: clipped at ε_hi = 0.2, free at DAPO's ε_hi = 0.28
        lp = [[math.log(1.25)]]
        for hi, grad, clipped in [(0.2, 0.0, 1.0), (0.28, -1.25, 0.0)]:
            inp = inputs(logp=lp, old=[[0.0]], adv=[[1.0]], mask=[[1]], ref=None)
            loss, stats = POLICY_LOSSES["dapo"](inp, PolicyLossParams(clip_eps_hi=hi))
            loss.sum().backward()
            assert inp.logp.grad.item() == pytest.approx(grad, rel=1e-5, abs=1e-7)
            assert stats["clipped"].item() == clipped

    def test_cispo_keeps_the_clipped_weight_as_gradient(self):
        lp = [[0.5, 0.1, -0.5, -1.0]]
        adv = [[2.0, 2.0, -1.0, 3.0]]
        inp = inputs(logp=lp, old=[[0.0] * 4], adv=adv, mask=[[1, 1, 1, 0]], ref=None)
        params = PolicyLossParams(clip_eps_lo=0.2, clip_eps_hi=0.28)
        loss, stats = POLICY_LOSSES["cispo"](inp, params)
        loss.sum().backward()
        # gradient = −clip(ρ)·A: non-zero even where PPO's clip would zero it
        expected = [-1.28 * 2.0, -math.exp(0.1) * 2.0, 0.8 * 1.0, 0.0]
        assert inp.logp.grad[0].tolist() == approx_list(expected, rel=1e-5)
        assert stats["clipped"][0].tolist() == [1.0, 0.0, 1.0, 0.0]

    def test_gspo_one_sequence(self):
        lp, old = [[-1.0, -2.0, -0.5, 3.0]], [[-1.1, -1.8, -0.9, 0.0]]
        mask, a = [[1, 1, 1, 0]], 0.7
        s = math.exp((0.1 - 0.2 + 0.4) / 3)
        for eps, value, grad in [
            (0.2, -s * a, -a * s / 3),  # in range: gradient through s, 1/n per token
            (4e-4, -(1 + 4e-4) * a, 0.0),  # the paper's tiny ε: clipped, no gradient
        ]:
            inp = inputs(logp=lp, old=old, adv=[[a] * 4], mask=mask, ref=None)
            params = PolicyLossParams(clip_eps_lo=eps, clip_eps_hi=eps)
            loss, stats = POLICY_LOSSES["gspo"](inp, params)
            agg = aggregate(
                loss,
                inp.mask,
                "seq_mean_token_mean",
                step_num_seqs=1,
                step_num_tokens=3,
                max_new_tokens=8,
            )
            assert agg.item() == pytest.approx(value, rel=1e-6)
            assert stats["ratio"][0, :3].tolist() == approx_list([s] * 3)
            agg.backward()
            assert inp.logp.grad[0].tolist() == approx_list([grad] * 3 + [0.0], abs=1e-7)

    @pytest.mark.parametrize("a", [1.3, -0.6])
    def test_sapo_slope_one_at_ratio_one(self, a):
        lp = [[-0.4, -1.1]]
        inp = inputs(logp=lp, old=lp, adv=[[a, a]], mask=[[1, 1]], ref=None)
        params = PolicyLossParams()
        loss, stats = POLICY_LOSSES["sapo"](inp, params)
        tau = params.sapo_tau_pos if a > 0 else params.sapo_tau_neg
        assert loss[0].tolist() == approx_list([-2 * a / tau] * 2)
        loss.sum().backward()
        # at ρ = 1, dℓ/dlogπ = dℓ/dρ·ρ = dℓ/dρ = −A, whatever τ
        assert inp.logp.grad[0].tolist() == approx_list([-a, -a], rel=1e-6)
        assert (stats["clipped"] == 0).all()

    @pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
    def test_kl_term_in_the_loss(self, kind):
        params = PolicyLossParams(beta=0.1, kl_estimator=kind)
        loss, stats = POLICY_LOSSES["grpo"](inputs(), params)
        kl = kl_estimate(t(LOGP), t(REF), kind, t(MASK))
        assert torch.allclose(loss, stats["pg_loss"] + 0.1 * kl, atol=1e-6)
        assert torch.allclose(stats["kl"], kl)
        off, _ = POLICY_LOSSES["grpo"](inputs(), PolicyLossParams(beta=0.1, kl_in_loss=False))
        assert torch.allclose(off, stats["pg_loss"])
        with pytest.raises(ValueError, match="ref_logp"):
            POLICY_LOSSES["grpo"](inputs(ref=None), params)


class TestValueLoss:
    def test_hand_values_and_gradient(self):
        values = t([[1.0, 0.6, 0.0, 5.0]], requires_grad=True)
        old = t([[0.5, 0.5, 0.5, 0.0]])
        returns = t([[2.0, 0.0, 1.0, 0.0]])
        loss = value_loss(values, old, returns, t([[1, 1, 1, 0]]), 0.2)
        # 1: V clipped to 0.7 and the clipped error is larger → ½·1.3²; 2: in range → ½·0.6²;
        # 3: clipped to 0.3 but the unclipped error is larger → ½·1²; 4: padding
        assert loss[0].tolist() == approx_list([0.5 * 1.69, 0.5 * 0.36, 0.5, 0.0])
        loss.sum().backward()
        assert values.grad[0].tolist() == approx_list([0.0, 0.6, -1.0, 0.0])


# =========================================================================== aggregation


class TestAggregate:
    @pytest.mark.parametrize(
        "mode", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]
    )
    def test_microbatches_sum_to_the_step_value(self, mode):
        rng = random.Random(3)
        lengths = [5, 1, 3, 7, 2, 4]
        per_seq = [[rng.uniform(-2, 2) for _ in range(n)] for n in lengths]
        max_new = 8
        S, N = len(lengths), sum(lengths)
        if mode == "seq_mean_token_mean":
            expected = sum(sum(x) / len(x) for x in per_seq) / S
        elif mode == "token_mean":
            expected = sum(sum(x) for x in per_seq) / N
        else:
            expected = sum(sum(x) / max_new for x in per_seq) / S
        total = 0.0
        for lo, hi in [(0, 1), (1, 4), (4, 6)]:  # unequal micro-batches, each its own width
            width = max(lengths[lo:hi]) + 1
            vals = [x + [1e4] * (width - len(x)) for x in per_seq[lo:hi]]  # garbage padding
            mask = [[1] * len(x) + [0] * (width - len(x)) for x in per_seq[lo:hi]]
            total += aggregate(
                t(vals),
                t(mask),
                mode,
                step_num_seqs=S,
                step_num_tokens=N,
                max_new_tokens=max_new,
            ).item()
        assert total == pytest.approx(expected, rel=1e-5)

    def test_errors_and_masked_mean(self):
        x, m = t([[1.0, 2.0]]), t([[1, 0]])
        with pytest.raises(ValueError, match="loss_agg"):
            aggregate(x, m, "sum", step_num_seqs=1, step_num_tokens=1, max_new_tokens=1)
        with pytest.raises(ValueError):
            aggregate(x, m, "token_mean", step_num_seqs=1, step_num_tokens=0, max_new_tokens=1)
        assert masked_mean(x, m).item() == 1.0
        assert masked_mean(x, t([[0, 0]])).item() == 0.0


# =========================================================================== rewards


@pytest.fixture(scope="module")
def spell_entries():
    rg = import_reasoning_gym()
    cfg = TASK_CONFIGS["spell_backward"]
    entries = list(rg.create_dataset("spell_backward", size=8, seed=7, **cfg))
    # keep non-palindromes of length ≥ 4 so the "forgot to reverse" answer is graded, not 1
    return [e for e in entries if e["answer"] != e["metadata"]["word"] and len(e["answer"]) >= 4]


def positional_share(answer, expected):
    """reasoning-gym 0.1.25 spell_backward grading, by hand: share of matching positions."""
    hits = sum(1 for a, b in zip(answer.lower(), expected.lower(), strict=False) if a == b)
    return 1.0 if answer.lower() == expected.lower() else hits / len(expected)


class TestRewards:
    def test_format_score(self):
        assert format_score("") == 0.0
        assert format_score("just text") == 0.0
        assert format_score("<think>a</think>") == 0.5
        assert format_score("<answer>x</answer>") == 0.5
        assert format_score("<think><think>") == 0.25
        assert format_score("<think>a</think>\n<answer>b</answer>") == 1.0
        assert format_score("<think>a\n<answer>b</answer>") == 0.75

    def test_correctness_on_spell_backward(self, spell_entries):
        assert len(spell_entries) >= 2
        for e in spell_entries:
            meta = {"task": "spell_backward", "entry": e}
            right, word = e["answer"], e["metadata"]["word"]
            assert correctness_score(format_response("r", right), meta) == 1.0
            assert correctness_score(format_response("r", right.upper()), meta) == 1.0
            wrong = correctness_score(format_response("r", word), meta)
            assert wrong == pytest.approx(positional_share(word, right))
            assert 0.0 <= wrong < 1.0
            assert correctness_score(f"<think>r</think> {right}", meta) == 0.0  # no tags
            assert correctness_score(f"<answer>{right}", meta) == 0.0  # unclosed
            last = f"<answer>{word}</answer> on second thought <answer>{right}</answer>"
            assert correctness_score(last, meta) == 1.0

    def test_compute_rewards_binary_is_truly_binary(self, spell_entries):
        e = spell_entries[0]
        meta = {"task": "spell_backward", "entry": e}
        right = e["answer"]
        graded = right[:-1] + ("a" if right[-1] != "a" else "b")  # all letters but the last
        texts = [
            format_response("r", right),
            format_response("r", graded),
            f"<answer>{right}</answer>",  # correct, half the format
            "no tags at all",
        ]
        out = compute_rewards(texts, [meta] * 4, [10, 20, 30, 40])
        L = len(right)
        assert out["correctness"].tolist() == approx_list([1.0, (L - 1) / L, 1.0, 0.0])
        assert out["format"].tolist() == [1.0, 1.0, 0.5, 0.0]
        assert out["binary"].tolist() == [1.0, 0.0, 0.0, 0.0]  # the book's code: (L−1)/L
        assert out["penalty"].tolist() == [0.0] * 4
        total = [1.0 + 0.5, (L - 1) / L + 0.5, 1.0 + 0.25, 0.0]
        assert out["total"].tolist() == approx_list(total)
        assert all(v.dtype == torch.float32 for v in out.values())
        assert set(out) == {"total", "correctness", "format", "penalty", "binary"}

    def test_binary_with_a_small_graded_score(self):
        task = register_graded_task(0.05)  # a reasoning-gym task whose scorer answers 0.05
        out = compute_rewards([format_response("r", "x")], [{"task": task, "entry": {}}], [3])
        assert out["correctness"].item() == pytest.approx(0.05)
        assert out["binary"].item() == 0.0

    def test_overlong_penalty_boundaries(self):
        cases = {0: 0.0, 384: 0.0, 385: -1 / 128, 448: -0.5, 511: -127 / 128, 512: -1.0, 513: -1.0}
        for n, v in cases.items():
            assert overlong_penalty(n, 512, 128) == pytest.approx(v), n
        assert overlong_penalty(512, 512, 0) == 0.0
        assert overlong_penalty(513, 512, 0) == -1.0
        with pytest.raises(ValueError):
            overlong_penalty(10, 100, 200)
        out = compute_rewards(["a", "b"], [{"task": "x"}] * 2, [100, 448], penalty=(512, 128))
        assert out["penalty"].tolist() == [0.0, -0.5]
        assert out["total"].tolist() == [0.0, -0.5]

    def test_dapo_keep_groups(self):
        c = t([0, 0, 0, 1, 1, 1, 0, 1, 0, 0.05, 0.05, 0.05, 1, 1, 0.8])
        assert dapo_keep_groups(c, 3).tolist() == [False, False, True, True, True]
        assert dapo_keep_groups(c, 3, min_reward=0.05).tolist() == [True, False, True, False, True]
        with pytest.raises(ValueError):
            dapo_keep_groups(c, 4)


# =========================================================================== against trl==1.16.0


@pytest.fixture(scope="module")
def trl():
    trl = pytest.importorskip("trl")
    if trl.__version__ != "1.16.0":
        pytest.skip(f"comparisons are written against trl==1.16.0, found {trl.__version__}")
    return trl


def trl_grpo_loss(loss_type, inp: PolicyLossInputs, seq_adv, *, eps_lo, eps_hi, beta, level):
    """Run trl's GRPOTrainer._compute_loss on our per-token log-probs; (loss, grad, metrics)."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    logp = inp.logp.detach().clone().requires_grad_(True)
    B, T = logp.shape
    accelerator = SimpleNamespace(
        num_processes=1,
        sync_gradients=True,
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
    )
    stand_in = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        loss_type=loss_type,
        epsilon_low=eps_lo,
        epsilon_high=eps_hi,
        beta=beta,
        args=SimpleNamespace(
            use_bias_correction_kl=False,
            delta=None,
            sapo_temperature_pos=1.0,
            sapo_temperature_neg=1.05,
            steps_per_generation=1,
        ),
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=T,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        accelerator=accelerator,
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    batch = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": inp.mask.long(),
        "advantages": t(seq_adv),
        "old_per_token_logps": inp.old_logp,
        "ref_per_token_logps": inp.ref_logp,
        "num_items_in_batch": inp.mask.sum(),
    }
    loss = GRPOTrainer._compute_loss(stand_in, None, batch)
    loss.backward()
    return loss.item(), logp.grad, {k: v[-1] for k, v in stand_in._metrics["train"].items()}


# same layout as above, padding benign (trl multiplies by the mask instead of masking first)
TRL_LOGP = [[-0.7, -1.2, -0.3, -0.5], [-2.0, -0.1, -0.4, 0.0]]
TRL_OLD = [[-0.9, -1.0, -0.3, -0.5], [-1.5, -0.4, -0.4, 0.0]]
TRL_REF = [[-0.8, -1.0, -0.5, -0.5], [-1.8, -0.2, -0.4, 0.0]]


class TestAgainstTRL:
    def test_grpo_advantages_against_trl_nanstd(self, trl):
        from trl.trainer.utils import nanstd

        r = t([1.0, 0.0, 0.5, 0.5, 0.2, 0.9, 0.9, 0.0, 1.0, 1.0, 1.0, 1.0])
        grouped = r.view(-1, 4)
        mean = grouped.mean(1).repeat_interleave(4)
        std = nanstd(grouped, dim=1).repeat_interleave(4)
        theirs = (r - mean) / (std + 1e-4)
        assert torch.allclose(grpo_advantages(r, 4, eps=1e-4), theirs, atol=1e-6)

    @pytest.mark.parametrize(
        ("algo", "trl_type", "level", "eps", "agg"),
        [
            ("grpo", "grpo", "token", (0.2, 0.2), "seq_mean_token_mean"),
            ("drgrpo", "dr_grpo", "token", (0.2, 0.2), "seq_mean_token_sum_norm"),
            ("dapo", "dapo", "token", (0.2, 0.28), "token_mean"),
            ("sapo", "sapo", "token", (0.2, 0.2), "seq_mean_token_mean"),
            ("gspo", "grpo", "sequence", (0.05, 0.05), "seq_mean_token_mean"),
            ("cispo", "cispo", "token", (1.0, 0.15), "token_mean"),
        ],
    )
    def test_loss_gradient_and_metrics(self, trl, algo, trl_type, level, eps, agg):
        beta = 0.04
        inp = inputs(logp=TRL_LOGP, old=TRL_OLD, ref=TRL_REF)
        params = PolicyLossParams(clip_eps_lo=eps[0], clip_eps_hi=eps[1], beta=beta)
        per_token, stats = POLICY_LOSSES[algo](inp, params)
        ours = aggregate(
            per_token,
            inp.mask,
            agg,
            step_num_seqs=2,
            step_num_tokens=inp.mask.sum(),
            max_new_tokens=4,
        )
        ours.backward()
        # trl's cispo bound is ρ ≤ epsilon_high itself; its lower eps is unused there
        trl_hi = 1 + eps[1] if algo == "cispo" else eps[1]
        loss, grad, metrics = trl_grpo_loss(
            trl_type, inp, SEQ_ADV, eps_lo=eps[0], eps_hi=trl_hi, beta=beta, level=level
        )
        assert ours.item() == pytest.approx(loss, rel=1e-5)
        assert torch.allclose(inp.logp.grad, grad, atol=1e-6)
        assert masked_mean(stats["kl"], inp.mask).item() == pytest.approx(metrics["kl"], rel=1e-4)
        if algo in ("grpo", "drgrpo", "dapo"):
            clip_frac = masked_mean(stats["clipped"], inp.mask).item()
            assert clip_frac == pytest.approx(metrics["clip_ratio/region_mean"])
            assert clip_frac > 0  # the case exercises the clip
        if algo == "gspo":  # trl reports sequence-level clipping per sequence
            assert stats["clipped"][:, 0].mean().item() == pytest.approx(
                metrics["clip_ratio/region_mean"]
            )
