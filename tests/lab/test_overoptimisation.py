"""Overoptimisation made visible, on synthetic run folders with the real row schema: the
rollout rows of a policy-gradient run that optimises a learned reward model log proxy_reward,
gold_reward and kl_ref (eval rows: eval/proxy_reward, eval/gold_reward). The rule of the alert,
its advice and the ledger's Next commands, the reward-against-KL plot and its embedding, the
held-out-gold headline of status/ledger/compare, and the proxy/gold/KL comparison columns."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shlex
from pathlib import Path

import pytest
import yaml

from rlhf_lab import api, ledger
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.results import headline
from rlhf_lab.results.compare import compare_runs
from rlhf_lab.results.diagnosis import diagnose
from rlhf_lab.results.headline import headline_for, headline_line
from rlhf_lab.results.overoptimisation import overoptimisation, overoptimisation_advice
from rlhf_lab.results.plots import plot_reward_vs_kl, reward_kl_points
from tests._helpers.run_folders import write_jsonl, write_run_json
from tests._helpers.shipped_configs import set_dotted, shipped_config
from trainers.core.config import read_yaml
from trainers.core.spec import family_spec


def pg(data: dict) -> TrainerConfig:
    """A policy-gradient config's data as the view the headline reads."""
    return TrainerConfig("policy_gradients", data)


REPO = Path(__file__).resolve().parents[2]
CAMP = "2026-03-02-rlhf"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RM_CONFIG = (
    "model.name=tiny",
    "data.source=preference",
    "data.dataset=builtin",
    "reward.model=/runs/rm/final_model",
    "reward.gold_model=/runs/gold/final_model",
    "loss.beta=0.04",
    "train.max_steps=40",
)


pytestmark = pytest.mark.usefixtures("lab_root")


def make_run(
    run_id: str,
    rows: list[dict],
    *,
    recipe: str = "grpo",
    overrides: tuple[str, ...] = RM_CONFIG,
    state: str = "succeeded",
) -> Path:
    """A policy-gradient run folder as the launcher and the trainer write it."""
    path = ledger.experiments_dir() / CAMP / "runs" / run_id
    source, cfg = shipped_config("policy_gradients", recipe, overrides)
    write_run_json(
        path,
        "policy_gradients",
        recipe,
        config_source=source,
        overrides=list(overrides),
        cwd=str(REPO),
        state=state,
        started_at="2026-03-02T10:00:00.000+00:00",
    )
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    write_jsonl(path / "metrics.jsonl", rows)
    steps = max(r["step"] for r in rows) if rows else 0
    (path / "summary.json").write_text(json.dumps({"outcome": state, "steps": steps}))
    return path


def rlhf_rows(
    gold_of,
    steps: int = 40,
    noise: float = 0.03,
    seed: int = 0,
    eval_every: int = 10,
    proxy_of=lambda d: 0.2 + 0.5 * d,
) -> list[dict]:
    """Rows of a run against a learned RM: √KL grows 0.15 per step, the proxy follows
    ``proxy_of(√KL)`` (rising linearly by default), the gold ``gold_of(√KL)``; seeded noise on
    both; eval rows every ``eval_every`` steps (step 0 first, as the trainer does)."""
    rng = random.Random(seed)
    rows: list[dict] = []

    def add_eval(step: int) -> None:
        d = 0.15 * step
        rows.append(
            {
                "step": step,
                "time_s": float(step),
                "phase": "eval",
                "eval/proxy_reward": round(proxy_of(d), 4),
                "eval/gold_reward": round(gold_of(d), 4),
            }
        )

    add_eval(0)
    for step in range(1, steps + 1):
        d = 0.15 * (step - 1)  # rollouts of step s come from the policy after s-1 updates
        rows.append(
            {
                "step": step,
                "time_s": float(step),
                "phase": "rollout",
                "avg_total": 0.1,
                "proxy_reward": round(proxy_of(d) + rng.gauss(0, noise), 4),
                "gold_reward": round(gold_of(d) + rng.gauss(0, noise), 4),
                "kl_ref": round(d * d, 4),
                "frac_reward_zero_std": 0.1,
                "response_length/mean": 20.0,
            }
        )
        rows.append({"step": step, "time_s": float(step), "phase": "train", "loss": 0.01})
        if step % eval_every == 0:
            add_eval(step)
    return rows


def gao(d: float) -> float:
    """Gold rises, peaks at √KL = 2 (step ≈ 14), then falls (Gao et al.'s shape)."""
    return 0.3 + 0.4 * d - 0.1 * d * d


def rising(d: float) -> float:
    return 0.3 + 0.2 * d


# ---------------------------------------------------------------------------------------------
# The rule
# ---------------------------------------------------------------------------------------------


def test_rising_proxy_with_falling_gold_is_overoptimisation():
    found = overoptimisation(rlhf_rows(gao))
    assert found is not None and found.source == "rollout"
    assert found.proxy_change > 0 and found.gold_change < 0
    assert found.first_step == 21 and found.last_step == 40  # the last half of the rows
    assert 11 <= found.gold_peak_step <= 17  # gold's true peak is at step 14.3
    assert found.kl_ref == pytest.approx((0.15 * 39) ** 2, abs=1e-3)
    assert "proxy_reward rose" in found.message and "gold_reward fell" in found.message


def test_both_rising_is_not_overoptimisation():
    assert overoptimisation(rlhf_rows(rising)) is None


def test_noise_level_wiggles_are_not_overoptimisation():
    # flat rewards with noise, and a rising proxy with a flat noisy gold, over many seeds
    for seed in range(20):
        flat = rlhf_rows(lambda d: 0.5, seed=seed, noise=0.05, proxy_of=lambda d: 1.0)
        assert overoptimisation(flat) is None
        assert overoptimisation(rlhf_rows(lambda d: 0.5, seed=seed, noise=0.05)) is None
    # a real but tiny trend (a proxy +0.01 and a gold −0.01 over the window) in noise 0.05
    rng = random.Random(3)
    rows = [
        {
            "step": s,
            "phase": "rollout",
            "proxy_reward": 1.0 + 0.0005 * s + rng.gauss(0, 0.05),
            "gold_reward": 0.5 - 0.0005 * s + rng.gauss(0, 0.05),
        }
        for s in range(1, 41)
    ]
    assert overoptimisation(rows) is None


def test_a_gold_that_collapses_early_and_stays_down_is_overoptimisation():
    """The last half's trend is flat here (gold already at its floor), so only the comparison
    with the gold's best earlier window catches it; the same shape with the proxy flat does not
    fire."""
    rng = random.Random(5)

    def rows(proxy_slope: float) -> list[dict]:
        return [
            {
                "step": s,
                "phase": "rollout",
                "proxy_reward": 1.0 + proxy_slope * s + rng.gauss(0, 0.03),
                "gold_reward": (0.6 if s <= 6 else 0.1) + rng.gauss(0, 0.03),
            }
            for s in range(1, 25)
        ]

    found = overoptimisation(rows(0.05))
    assert found is not None and found.gold_change < -0.4 and found.proxy_change > 0.5
    assert found.first_step == 19 and found.last_step == 24  # the last quarter
    assert found.gold_peak_step <= 6
    assert overoptimisation(rows(0.0)) is None


def test_flat_proxy_or_too_few_rows_is_not_overoptimisation():
    falling_gold_flat_proxy = [
        {"step": s, "phase": "rollout", "proxy_reward": 1.0 + 0.01 * (-1) ** s,
         "gold_reward": 1.0 - 0.05 * s}
        for s in range(1, 21)
    ]  # fmt: skip
    assert overoptimisation(falling_gold_flat_proxy) is None
    assert overoptimisation(rlhf_rows(gao)[:12]) is None  # 5 rollout rows
    # no gold at all (a run with only its proxy): nothing to judge
    no_gold = [{k: v for k, v in r.items() if "gold" not in k} for r in rlhf_rows(gao)]
    assert overoptimisation(no_gold) is None


def test_eval_rows_are_judged_when_rollout_rows_carry_no_gold():
    rows = [r for r in rlhf_rows(gao, steps=80, eval_every=5) if r["phase"] == "eval"]
    found = overoptimisation(rows)
    assert found is not None and found.source == "eval"
    assert found.gold_key == "eval/gold_reward"


def _two_evals(gold: tuple[float, float], proxy: tuple[float, float], n: int) -> list[dict]:
    return [
        {"step": step, "phase": "eval", "eval/proxy_reward": p, "eval/gold_reward": g,
         "eval/num_prompts": n}
        for step, p, g in zip((0, 10), proxy, gold, strict=True)
    ]  # fmt: skip


def test_a_short_run_whose_held_out_correctness_collapses_is_overoptimisation():
    """Two evaluations are too few for a trend; a verifier gold is a proportion over known
    prompts, so its fall is judged on them (seen: GRPO against a tiny RM from the SFT warm start,
    held-out proxy −1.36 → 0.05 while correctness 0.406 → 0 on 32 prompts, which the trend tests
    let pass)."""
    found = overoptimisation(_two_evals((0.40625, 0.0), (-1.36, 0.05), 32))
    assert found is not None and found.source == "eval"
    assert found.gold_change == pytest.approx(-0.40625) and found.gold_peak_step == 0
    assert (found.first_step, found.last_step) == (0, 10)
    assert "95% interval" in found.message and "nan" not in found.message
    # the same rates on 4 prompts are within noise (Newcombe's interval reaches 0)
    assert overoptimisation(_two_evals((0.5, 0.0), (-1.36, 0.05), 4)) is None
    # the proxy fell too: the policy got worse at both, not gaming the reward model
    assert overoptimisation(_two_evals((0.40625, 0.0), (0.05, -1.36), 32)) is None
    # a gold that is not a proportion (a gold reward model's score) is left to the trend tests
    assert overoptimisation(_two_evals((5.2, 3.8), (-1.4, 3.2), 32)) is None
    # without the number of prompts nothing can be said
    no_n = [{k: v for k, v in r.items() if k != "eval/num_prompts"} for r in _two_evals(
        (0.40625, 0.0), (-1.36, 0.05), 32)]  # fmt: skip
    assert overoptimisation(no_n) is None


def test_advice_names_the_kl_knob_and_the_gold_peak():
    advice = overoptimisation_advice("policy_gradients", "grpo", 0.04, 14, 40)
    assert [a.override for a in advice] == ["train.max_steps=14", "loss.beta=0.08"]
    assert family_spec("policy_gradients").kl_key == "loss.beta"
    # no KL yet: the usual strength; no peak: half the steps
    advice = overoptimisation_advice("policy_gradients", "ppo", 0.0, None, 40)
    assert [a.override for a in advice] == ["train.max_steps=20", "loss.beta=0.04"]
    # an algorithm without a KL term (DAPO): fewer steps only
    advice = overoptimisation_advice("policy_gradients", "dapo", 0.0, 14, 40)
    assert [a.override for a in advice] == ["train.max_steps=14"]


# ---------------------------------------------------------------------------------------------
# Diagnosis, ledger and Next
# ---------------------------------------------------------------------------------------------

GAMED = "grpo-20260302-000000-0001"
HONEST = "grpo-20260302-000000-0002"
VERIFIER = "grpo-20260302-000000-0003"


def test_diagnose_raises_the_alert_with_exact_overrides():
    make_run(GAMED, rlhf_rows(gao))
    make_run(HONEST, rlhf_rows(rising))
    alerts = {a.kind: a for a in diagnose(GAMED)}
    alert = alerts["overoptimisation"]
    assert alert.severity == "warning" and alert.step == 40
    assert "gold_reward fell" in alert.message
    peak = overoptimisation(rlhf_rows(gao)).gold_peak_step
    assert f"override train.max_steps={peak} " in alert.hint
    assert "override loss.beta=0.08 " in alert.hint
    assert "overoptimisation" not in [a.kind for a in diagnose(HONEST)]


def test_ledger_plots_reward_against_kl_and_next_proposes_the_commands():
    make_run(GAMED, rlhf_rows(gao))
    rec = ledger.record_run(GAMED)
    png = ledger.experiments_dir() / CAMP / "plots" / f"{GAMED}-reward-kl.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert rec.reward_kl_plot == f"{CAMP}/plots/{GAMED}-reward-kl.png"
    assert "overoptimisation" in rec.flags
    assert any("gold_reward fell" in d for d in rec.diagnostics)
    peak = overoptimisation(rlhf_rows(gao)).gold_peak_step
    assert rec.gold_peak_step == peak
    # the ledger row leads with the held-out gold reward and shows proxy, gold and KL
    assert rec.headline.metric == "eval/gold_reward" and rec.headline.value == round(gao(6.0), 4)
    assert rec.headline.training_signal == "gold_reward"
    assert {"proxy_reward", "gold_reward", "kl_ref", "eval/gold_reward"} <= {
        m.name for m in rec.metrics
    }
    text = Path(ledger.show_campaign(CAMP).campaign.path).read_text()
    plots = text.split("<!-- rlhf-lab:begin plots -->")[1].split("<!-- rlhf-lab:end plots -->")[0]
    assert f"]({CAMP}/plots/{GAMED}-reward-kl.png)" in plots
    assert f"]({CAMP}/plots/{GAMED}.png)" in plots
    nxt = text.split("<!-- rlhf-lab:begin next -->")[1].split("<!-- rlhf-lab:end next -->")[0]
    assert "overoptimisation" in nxt
    commands = [line.strip() for line in nxt.splitlines() if line.strip().startswith("uv run")]
    sets = [shlex.split(c) for c in commands]
    assert any(f"train.max_steps={peak}" in c for c in sets)
    assert any("loss.beta=0.08" in c and "train.max_steps=40" in c for c in sets)
    assert all(c[:4] == ["uv", "run", "rlhf-lab", "launch"] and "grpo" in c for c in sets)
    # one item for the run (its held-out gold regression too, but overoptimisation says more)
    assert len(sets) == 2 and "regressed while training went on" not in nxt
    # recording again without plots keeps the plot
    rec = ledger.record_run(GAMED, plot=False)
    assert rec.reward_kl_plot == f"{CAMP}/plots/{GAMED}-reward-kl.png"


def test_no_reward_against_kl_plot_for_runs_without_these_metrics():
    rows = [{"step": 0, "phase": "eval", "eval/avg_correctness": 0.2}]
    for s in range(1, 9):
        rows.append({"step": s, "phase": "rollout", "avg_correctness": 0.1 * s, "kl": 0.01})
    rows.append({"step": 8, "phase": "eval", "eval/avg_correctness": 0.4})
    make_run(VERIFIER, rows, overrides=("model.name=tiny", "train.max_steps=8"))
    rec = ledger.record_run(VERIFIER)
    assert rec.reward_kl_plot is None and rec.plot is not None
    plots = sorted(p.name for p in (ledger.experiments_dir() / CAMP / "plots").iterdir())
    assert plots == [f"{VERIFIER}.png"]
    text = Path(ledger.show_campaign(CAMP).campaign.path).read_text()
    assert "reward-kl" not in text and "proxy_reward" not in text
    assert rec.headline.metric == "eval/avg_correctness" and rec.flags == []


def test_reward_against_kl_points_and_plot(tmp_path):
    rows = rlhf_rows(gao, steps=20)
    pts = reward_kl_points(rows)
    assert len(pts.x) == 20 and pts.x[0] == 0.0
    assert pts.x[-1] == pytest.approx(0.15 * 19, abs=1e-3)  # √kl_ref
    # evaluation at step s sits at the KL of the rollouts sampled next (row s+1), the last
    # evaluation at the last rollout's
    assert pts.eval_x == pytest.approx([0.0, 0.15 * 10, 0.15 * 19], abs=1e-3)
    assert pts.eval_gold == [round(gao(0.15 * s), 4) for s in (0, 10, 20)]
    result = plot_reward_vs_kl(rows, tmp_path / "a.png", title="t")
    assert result.path and result.panels == ["proxy_reward", "gold_reward"]
    assert result.series == 4  # proxy, held-out proxy, gold, held-out gold
    # proxy only (no gold signal): still drawn; a negative KL estimate counts as 0
    proxy_only = [
        {"step": 1, "phase": "rollout", "proxy_reward": 0.1, "kl_ref": -0.02},
        {"step": 2, "phase": "rollout", "proxy_reward": 0.3, "kl_ref": 0.25},
    ]
    result = plot_reward_vs_kl(proxy_only, tmp_path / "b.png")
    assert result.panels == ["proxy_reward"] and (tmp_path / "b.png").is_file()
    assert reward_kl_points(proxy_only).x == [0.0, 0.5]
    # fewer than two points, or no KL: nothing written
    assert plot_reward_vs_kl(proxy_only[:1], tmp_path / "c.png").path is None
    no_kl = [{k: v for k, v in r.items() if k != "kl_ref"} for r in rows]
    assert plot_reward_vs_kl(no_kl, tmp_path / "d.png").path is None
    assert not (tmp_path / "c.png").exists() and not (tmp_path / "d.png").exists()


# ---------------------------------------------------------------------------------------------
# Headline: held-out gold when present, else proxy
# ---------------------------------------------------------------------------------------------


def test_run_status_headline_leads_with_held_out_gold():
    make_run(GAMED, rlhf_rows(gao))
    line = api.run_status(GAMED).headline
    gold_last = round(gao(6.0), 4)
    assert line.startswith(f"held-out eval/gold_reward {gold_last:.4g} (step 40; step 0: ")
    # the training signal comes from the last rollout row (not the train row)
    last_gold = [r for r in rlhf_rows(gao) if r["phase"] == "rollout"][-1]["gold_reward"]
    assert line.endswith(f"training signal gold_reward {last_gold:.4g}")


def test_headline_falls_back_to_proxy_then_to_what_the_rows_log():
    cfg = read_yaml(REPO / "trainers/policy_gradients/configs/grpo.yaml")
    pref = json.loads(json.dumps(cfg))
    set_dotted(pref, "data.source", "preference")
    set_dotted(pref, "reward.model", "/rm")
    # preference prompts, no gold model: the proxy, labelled as the optimised model's own score
    head = headline_for("policy_gradients", "grpo", pg(pref), [])
    assert head.metric == "eval/proxy_reward" and "not an independent judge" in head.label
    line = headline_line("policy_gradients", "grpo", {}, {}, pg(pref))
    assert (
        line
        == "held-out eval/proxy_reward: not evaluated yet [judged by its own reward model (proxy)]"
    )
    line = headline_line(
        "policy_gradients", "grpo", {"step": 5, "phase": "eval", "eval/proxy_reward": 1.5}, {}, pref
    )
    assert line.startswith("held-out eval/proxy_reward 1.5 (step 5)")
    # a gold model configured but not evaluated yet: the gold is the headline to come
    set_dotted(pref, "reward.gold_model", "/gold")
    assert headline_for("policy_gradients", "grpo", pg(pref), []).metric == "eval/gold_reward"
    assert not headline_for("policy_gradients", "grpo", pg(pref), []).share  # an RM score
    # reasoning-gym prompts scored by an RM: gold = verifier correctness, a share with noise
    rg = json.loads(json.dumps(cfg))
    set_dotted(rg, "reward.model", "/rm")
    set_dotted(rg, "data.eval_size", 64)
    head = headline_for("policy_gradients", "grpo", pg(rg), [])
    assert head.metric == "eval/gold_reward" and head.share
    line = headline_line("policy_gradients", "grpo", {"eval/gold_reward": 0.5}, {}, pg(rg))
    assert "95% " in line and "n=64" in line
    # ... but when its eval rows log correctness and no gold, the spec's headline it is
    rows = [{"step": 3, "phase": "eval", "eval/avg_correctness": 0.4}]
    assert headline_for("policy_gradients", "grpo", pg(rg), rows).metric == "eval/avg_correctness"
    # a verifier-only run keeps the spec's headline
    assert headline_for("policy_gradients", "grpo", pg(cfg), rows).metric == "eval/avg_correctness"
    # an RM-rewarded run whose gold (and correctness) stayed 0 at every evaluation: the gold
    # carries no signal, the held-out proxy leads (seen on the tiny rlhf pipeline's PPO stage)
    flat = [
        {"step": s, "phase": "eval", "eval/avg_correctness": 0.0, "eval/gold_reward": 0.0,
         "eval/proxy_reward": p}
        for s, p in ((0, -1.9), (5, 3.9), (10, -4.1))
    ]  # fmt: skip
    assert headline_for("policy_gradients", "ppo", pg(rg), flat).metric == "eval/proxy_reward"
    assert headline_for("policy_gradients", "ppo", pg(rg), flat[:1]).metric == "eval/gold_reward"
    # a verifier-only run (no reward model, no proxy) keeps its headline even when it is 0
    no_proxy = [{k: v for k, v in r.items() if "proxy" not in k} for r in flat]
    assert (
        headline_for("policy_gradients", "ppo", pg(cfg), no_proxy).metric == "eval/avg_correctness"
    )


def test_a_spec_headline_the_rows_do_not_log_falls_back(monkeypatch):
    # a family whose spec names the gold reward as its headline (algorithm None: the family's)
    spec = dataclasses.replace(
        family_spec("policy_gradients"), headline_metric="eval/gold_reward", headline_label="gold"
    )
    monkeypatch.setattr(headline, "_spec", lambda family: spec)
    cfg = read_yaml(REPO / "trainers/policy_gradients/configs/grpo.yaml")
    assert headline_for("policy_gradients").metric == "eval/gold_reward"
    # a verifier-only run logs no gold, its correctness (the first rising key metric) it does
    rows = [{"step": 3, "phase": "eval", "eval/avg_correctness": 0.4}]
    head = headline_for("policy_gradients", None, pg(cfg), rows)
    assert head.metric == "eval/avg_correctness" and head.training_signal == "avg_correctness"
    line = headline_line("policy_gradients", None, rows[0], {}, pg(cfg))
    assert line.startswith("held-out eval/avg_correctness 0.4 (step 3")
    # when the gold is logged, the spec's own headline and label
    rows = [{"step": 3, "phase": "eval", "eval/gold_reward": 0.4}]
    head = headline_for("policy_gradients", None, pg(cfg), rows)
    assert head.metric == "eval/gold_reward" and head.label == "gold"


# ---------------------------------------------------------------------------------------------
# Compare and the flat check on rollout rows
# ---------------------------------------------------------------------------------------------


def test_compare_shows_gold_proxy_and_kl_for_runs_that_log_them():
    make_run(GAMED, rlhf_rows(gao))
    make_run(HONEST, rlhf_rows(rising, seed=1))
    cmp = compare_runs([GAMED, HONEST])
    assert cmp.headline == "eval/gold_reward" and cmp.columns[0] == "eval/gold_reward"
    assert {"eval/proxy_reward", "proxy_reward", "gold_reward", "kl_ref"} <= set(cmp.columns)
    header = cmp.table.splitlines()[0]
    assert "**eval/gold_reward** (held-out headline)" in header
    assert "kl_ref (training signal)" in header
    values = {r.run_id: r.values for r in cmp.rows}
    assert values[HONEST]["eval/gold_reward"] > values[GAMED]["eval/gold_reward"]
    assert math.isclose(
        values[GAMED]["kl_ref"],
        sum((0.15 * (s - 1)) ** 2 for s in range(36, 41)) / 5,
        abs_tol=1e-3,
    )
    assert any("overoptimisation" in n for n in cmp.notes)


def test_compare_leads_with_the_runs_headline_column():
    # reasoning-gym prompts scored by an RM whose eval rows log correctness and the proxy, no
    # gold: the spec's correctness is the headline and the first column
    rows = [
        {"step": s, "phase": "rollout", "proxy_reward": 0.1 * s, "kl_ref": 0.01 * s}
        for s in range(1, 6)
    ]
    rows.append({"step": 5, "phase": "eval", "eval/avg_correctness": 0.3, "eval/proxy_reward": 1})
    make_run(GAMED, rows, overrides=("model.name=tiny", "reward.model=/rm"))
    cmp = compare_runs([GAMED])
    assert cmp.headline == "eval/avg_correctness"
    assert cmp.columns[:2] == ["eval/avg_correctness", "eval/proxy_reward"]


def test_compare_of_verifier_runs_has_no_reward_model_columns():
    rows = [{"step": s, "phase": "rollout", "avg_correctness": 0.1 * s} for s in range(1, 6)]
    rows.append({"step": 5, "phase": "eval", "eval/avg_correctness": 0.4})
    make_run(VERIFIER, rows, overrides=("model.name=tiny",))
    cmp = compare_runs([VERIFIER])
    assert cmp.headline == "eval/avg_correctness"
    assert not {"proxy_reward", "gold_reward", "kl_ref", "eval/gold_reward"} & set(cmp.columns)


def test_flat_check_reads_the_policy_gradient_rollout_rows():
    rows = [
        {"step": s, "phase": "rollout", "avg_correctness": 0.2, "frac_reward_zero_std": 0.5}
        for s in range(1, 9)
    ]
    make_run(VERIFIER, rows, overrides=("model.name=tiny",))
    flat = [a for a in diagnose(VERIFIER) if a.kind == "flat_learning"]
    assert flat and "avg_correctness" in flat[0].message
    # an RM run is judged on the proxy it optimises: a rising proxy is not flat
    rows = [{**r, "proxy_reward": 0.1 * r["step"]} for r in rows]
    (ledger.experiments_dir() / CAMP / "runs" / VERIFIER / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    assert "flat_learning" not in [a.kind for a in diagnose(VERIFIER)]
