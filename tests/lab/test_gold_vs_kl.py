"""Gold against √KL for a DPO-overoptimisation campaign (rlhf_lab/results/gold_vs_kl.py), on
synthetic runs whose answers are known: a hump, a monotone rise, a flat line and a fall, 3 seeds
of 32 prompts each; the intervals and verdicts worked out by hand; the seed-level fallback; the
figure; reading a run folder."""

from __future__ import annotations

import json
import math

import pytest

from rlhf_lab.results.gold_vs_kl import (
    RunGold,
    gold_vs_kl,
    paired_difference,
    plot_gold_vs_kl,
    read_run_gold,
)
from rlhf_lab.results.stats import t_quantile, wilson_interval

STEPS = [0, 10, 20, 30]
PROMPTS = 32


def flags(n_right: int) -> list[float]:
    """Prompts 0 … n_right−1 right: nested sets, so step-to-step pairs are concordant or move."""
    return [1.0 if i < n_right else 0.0 for i in range(PROMPTS)]


def make_run(arm: str, rights: list[int], seed: int, with_prompts: bool = True) -> RunGold:
    evals = [
        {
            "step": s,
            "phase": "eval",
            "eval/gold_correctness": n / PROMPTS,
            "eval/sqrt_kl": math.sqrt(s / 10) + 0.1 * seed,  # 0, 1, 1.41, 1.73 (+ the seed)
        }
        for s, n in zip(STEPS, rights, strict=True)
    ]
    right = {s: flags(n) for s, n in zip(STEPS, rights, strict=True)} if with_prompts else None
    return RunGold(arm, evals, right, f"run-{arm}-{seed}")


def arm(name: str, rights: list[int], seeds: int = 3) -> list[RunGold]:
    return [make_run(name, rights, s) for s in range(seeds)]


def half_mean_interval(share_moved: float, n: int) -> tuple[float, float]:
    """The t interval of n pairs of which a share of ``share_moved`` moved by ±1, the rest 0."""
    k = round(share_moved * n)
    mean = k / n
    sd = math.sqrt((k * (1 - mean) ** 2 + (n - k) * mean**2) / (n - 1))
    half = t_quantile(n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def test_hump_rise_flat_and_fall_get_their_verdicts_with_hand_intervals():
    runs = (
        arm("beta=0.01", [8, 16, 24, 8])  # hump, peak at step 20
        + arm("beta=0.1", [8, 16, 24, 28])  # monotone rise
        + arm("beta=0.5", [10, 10, 10, 10])  # flat
        + arm("beta=1.0", [24, 16, 8, 8])  # falls from the start
    )
    res = gold_vs_kl(runs)
    by = {a.arm: a for a in res.arms}
    assert [a.arm for a in res.arms] == ["beta=0.01", "beta=0.1", "beta=0.5", "beta=1.0"]
    hump = by["beta=0.01"]
    assert hump.verdict == "rises then falls" and hump.peak_step == 20
    # rise: per seed prompts 8-23 go 0 → 1 (16 of 32): 48 of the 96 pooled pairs are +1
    low, high = half_mean_interval(0.5, 96)
    assert hump.rise.estimate == pytest.approx(0.5)
    assert (hump.rise.low, hump.rise.high) == pytest.approx((low, high))
    assert (hump.fall.low, hump.fall.high) == pytest.approx((-high, -low))
    assert hump.gold == pytest.approx([0.25, 0.5, 0.75, 0.25])
    assert hump.sqrt_kl == pytest.approx([0.1, 1.1, math.sqrt(2) + 0.1, math.sqrt(3) + 0.1])
    rise = by["beta=0.1"]
    assert rise.verdict == "rises and holds" and rise.peak_step == 30
    bound = wilson_interval(0.0, 96).high  # last == peak: no discordant pair
    assert (rise.fall.estimate, rise.fall.low, rise.fall.high) == pytest.approx((0, -bound, bound))
    flat = by["beta=0.5"]
    assert flat.verdict == "never rises" and flat.peak_step == 0  # a tie: the first point
    assert flat.rise.low == pytest.approx(-bound) and flat.rise.high == pytest.approx(bound)
    fall = by["beta=1.0"]
    assert fall.verdict == "falls from the start" and fall.peak_step == 0
    assert fall.change.estimate == pytest.approx(-0.5)
    assert "beta=0.01: rises then falls (peak at step 20" in res.verdict
    assert "paired interval over prompts" in res.method
    assert any("peak − start +0.500" in line for line in res.lines())


def test_a_small_rise_inside_the_noise_is_not_a_rise():
    # 1 prompt of 32 more right at step 10, per seed: 3 of 96 pairs, t interval includes 0
    res = gold_vs_kl(arm("beta=0.1", [10, 11, 10, 10]))
    a = res.arms[0]
    low, high = half_mean_interval(3 / 96, 96)
    assert (a.rise.low, a.rise.high) == pytest.approx((low, high)) and low < 0
    assert a.verdict == "never rises"


def test_seed_level_fallback_without_per_prompt_flags():
    # gold per seed at steps 0, 10, 20, 30; rise differences 0.3, 0.35, 0.25 (peak at 10)
    golds = [[0.2, 0.5, 0.3, 0.2], [0.25, 0.6, 0.4, 0.3], [0.3, 0.55, 0.35, 0.25]]
    runs = []
    for seed, g in enumerate(golds):
        r = make_run("beta=0.1", [0, 0, 0, 0], seed, with_prompts=False)
        for row, v in zip(r.evals, g, strict=True):
            row["eval/gold_correctness"] = v
        runs.append(r)
    res = gold_vs_kl(runs)
    a = res.arms[0]
    half = t_quantile(2) * 0.05 / math.sqrt(3)  # sd of (0.3, 0.35, 0.25) is 0.05
    assert a.peak_step == 10
    assert (a.rise.estimate, a.rise.low, a.rise.high) == pytest.approx(
        (0.3, 0.3 - half, 0.3 + half)
    )
    # fall: 0.2 − 0.5, 0.3 − 0.6, 0.25 − 0.55 = −0.3 each: every seed moved the same way
    assert a.fall.estimate == pytest.approx(-0.3) and a.fall.high < 0
    assert a.verdict == "rises then falls"
    assert "over seeds" in res.method


def test_paired_difference_refuses_unpaired_input_and_an_arm_without_step0_is_noted():
    with pytest.raises(ValueError):
        paired_difference([1.0], [1.0, 0.0])
    late = make_run("beta=0.1", [8, 16, 24, 8], 0)
    late = RunGold(late.arm, late.evals[1:], late.right, late.run_id)
    res = gold_vs_kl([late])
    assert res.arms == [] and "no gold curve" in res.notes[0] and res.verdict == "no gold curve"


def test_the_figure_is_a_png(tmp_path):
    res = gold_vs_kl(arm("beta=0.01", [8, 16, 24, 8]) + arm("beta=0.1", [8, 16, 24, 28]))
    path = plot_gold_vs_kl(res.arms, tmp_path / "plots" / "gold-vs-kl.png", title="t")
    assert path is not None and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert plot_gold_vs_kl([], tmp_path / "none.png") is None


def test_read_run_gold_takes_the_arm_from_the_config_and_the_flags_from_eval_gold(tmp_path):
    run = tmp_path / "dpo-1"
    run.mkdir()
    (run / "config.yaml").write_text("loss: dpo\nbeta: 0.05\n")
    rows = [
        {"step": 0, "phase": "eval", "eval/gold_correctness": 0.5, "eval/sqrt_kl": 0.0},
        {"step": 5, "phase": "train", "loss": 0.6},
        {"step": 5, "phase": "eval", "eval/gold_correctness": 1.0, "eval/sqrt_kl": 1.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    gold = [{"step": 0, "right": [1.0, 0.0]}, {"step": 5, "right": [1.0, 1.0]}]
    (run / "eval_gold.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gold) + "{cut")
    got = read_run_gold(run)
    assert got.arm == "beta=0.05" and len(got.evals) == 2
    assert got.right == {0: [1.0, 0.0], 5: [1.0, 1.0]}
    (run / "metrics.jsonl").write_text(json.dumps(rows[1]) + "\n")
    assert read_run_gold(run) is None  # no gold evaluation logged
