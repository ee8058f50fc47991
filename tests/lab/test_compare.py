"""Comparison tables by family rules on synthetic run folders: direct alignment, policy gradients,
reward models, the rejection-sampling pairing rule, mixing families, recording into a campaign."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlhf_lab import ledger
from rlhf_lab.paths import LabError
from rlhf_lab.results.compare import compare_runs
from tests._helpers.run_folders import write_jsonl, write_run_json

pytestmark = pytest.mark.usefixtures("lab_root")


CAMPAIGN = "2026-03-01-cmp"


def make_run(
    run_id: str,
    family: str,
    algorithm: str,
    rows: list[dict],
    *,
    config: dict | None = None,
    state: str = "succeeded",
    final_eval: dict | None = None,
    samples: list[dict] | None = None,
    campaign: str = CAMPAIGN,
) -> Path:
    path = ledger.experiments_dir() / campaign / "runs" / run_id
    write_run_json(path, family, algorithm, state=state)
    cfg = config or {"model": {"name": "tiny"}, "seed": 42}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    write_jsonl(path / "metrics.jsonl", rows)
    write_jsonl(path / "samples.jsonl", samples or [])
    if state != "running":
        summary = {"outcome": state, "final_eval": final_eval or {}, "wall_time_s": 1.0}
        (path / "summary.json").write_text(json.dumps(summary))
    return path


def da_run(run_id: str, algorithm: str, acc: float, margin: float, completion: str) -> None:
    rows = [
        {"step": 1, "phase": "train", "accuracy": 0.5, "margins": 0.0},
        {"step": 2, "phase": "eval", "eval/accuracy": 0.5, "eval/margins": 0.0},
        {"step": 4, "phase": "train", "accuracy": acc + 0.1, "margins": margin * 2},
        {
            "step": 4,
            "phase": "eval",
            "eval/accuracy": acc,
            "eval/margins": margin,
            "eval/chosen_rewards": margin / 2,
            "eval/rejected_rewards": -margin / 2,
        },
    ]
    samples = [{"step": 4, "prompt": "Reverse 'abc'", "completion": completion}]
    make_run(run_id, "direct_alignment", algorithm, rows, samples=samples)


def test_direct_alignment_table_has_held_out_metrics_and_a_sample_per_run():
    da_run("dpo-20260301-000000-0001", "dpo", 0.75, 0.42, "<answer>cba</answer>")
    da_run("simpo-20260301-000000-0002", "simpo", 0.6, 1.5, "cba cba cba")
    cmp = compare_runs(["dpo-20260301-000000-0001", "simpo-20260301-000000-0002"])
    assert cmp.family == "direct_alignment"
    assert cmp.columns == [
        "eval/accuracy",
        "eval/margins",
        "eval/chosen_rewards",
        "eval/rejected_rewards",
    ]
    dpo, simpo = cmp.rows
    assert dpo.values == {
        "eval/accuracy": 0.75,
        "eval/margins": 0.42,
        "eval/chosen_rewards": 0.21,
        "eval/rejected_rewards": -0.21,
    }
    assert simpo.values["eval/accuracy"] == 0.6 and simpo.algorithm == "simpo"
    assert "<answer>cba</answer>" in dpo.sample and "cba cba cba" in simpo.sample
    lines = cmp.table.splitlines()
    assert lines[0] == (
        "| run | algorithm | state | seed | **eval/accuracy** (held-out headline) | eval/margins | "
        "eval/chosen_rewards | eval/rejected_rewards |"
    )
    assert (
        lines[2]
        == "| `dpo-20260301-000000-0001` | dpo | succeeded | 42 | 0.75 | 0.42 | 0.21 | -0.21 |"
    )
    assert (
        "Samples (latest step)" in cmp.markdown and "`Reverse 'abc' → cba cba cba`" in cmp.markdown
    )
    assert any("own scale" in n for n in cmp.notes)  # two losses: margins are not comparable
    assert cmp.recorded_in is None


def test_policy_gradient_table_uses_window_means_and_reward_contrast():
    def pg_rows(correct_start: float, correct_end: float, zero_std: float) -> list[dict]:
        rows = []
        for s in range(1, 11):
            c = correct_start if s <= 5 else correct_end
            rows.append(
                {
                    "step": s,
                    "phase": "rollout" if s % 2 else "train",
                    "avg_correctness": c,
                    "avg_format": 0.5,
                    "avg_binary": c / 2,
                    "loss": 0.01,
                    "frac_reward_zero_std": zero_std,
                }
            )
        rows.append({"step": 10, "phase": "eval", "eval/avg_correctness": correct_end})
        return rows

    make_run("grpo-20260301-000000-0001", "policy_gradients", "grpo", pg_rows(0.1, 0.5, 0.25))
    make_run("rloo-20260301-000000-0002", "policy_gradients", "rloo", pg_rows(0.2, 0.2, 1.0))
    cmp = compare_runs(["grpo-20260301-000000-0001", "rloo-20260301-000000-0002"])
    assert cmp.family == "policy_gradients"
    grpo, rloo = cmp.rows
    assert grpo.values["avg_correctness"] == pytest.approx(0.5)  # mean of the last 5 steps
    assert grpo.values["avg_correctness_change"] == pytest.approx(0.4)
    assert grpo.values["reward_contrast"] == pytest.approx(0.75)
    assert grpo.values["avg_binary"] == pytest.approx(0.25)
    assert grpo.values["eval/avg_correctness"] == pytest.approx(0.5)
    assert rloo.values["reward_contrast"] == 0.0 and rloo.values["avg_correctness_change"] == 0.0
    # held-out first: the greedy held-out headline leads, training columns follow, labelled
    assert cmp.columns[:6] == [
        "eval/avg_correctness",
        "avg_correctness",
        "avg_format",
        "avg_binary",
        "loss",
        "reward_contrast",
    ]
    header = cmp.table.splitlines()[0]
    assert (
        "| **eval/avg_correctness** (held-out headline) | avg_correctness (training signal) |"
        in (header)
    )
    assert "reward contrast (1 − frac_reward_zero_std) (training signal)" in header
    assert "| +0.4 |" in cmp.table.splitlines()[2]
    assert any("rloo-20260301-000000-0002: almost no reward contrast" in n for n in cmp.notes)


def test_reward_models_compare_held_out_metrics_and_step_accuracy_over_baseline():
    make_run(
        "prm-20260301-000000-0001",
        "reward_models",
        "prm",
        [{"step": 1, "phase": "train", "loss": 0.1}],
        final_eval={"eval/step_accuracy": 0.8, "eval/majority_baseline": 0.7},
    )
    make_run(
        "prm-20260301-000000-0002",
        "reward_models",
        "prm",
        [{"step": 3, "phase": "eval", "eval/step_accuracy": 0.65, "eval/majority_baseline": 0.7}],
    )
    cmp = compare_runs(["prm-20260301-000000-0001", "prm-20260301-000000-0002"])
    assert cmp.columns == [
        "eval/step_accuracy",
        "eval/majority_baseline",
        "step_accuracy_over_baseline",
    ]
    assert cmp.rows[0].values["step_accuracy_over_baseline"] == pytest.approx(0.1)
    assert cmp.rows[1].values["step_accuracy_over_baseline"] == pytest.approx(-0.05)
    assert "loss" not in cmp.table


def rs_run(run_id: str, strategy: str, exact: float | None, seed: int = 42, top_k: int = 500):
    rows = [{"step": 1, "phase": "train", "loss": 1.2}]
    if exact is not None:
        rows.append({"step": 2, "phase": "eval", "eval/exact_match": exact})
    cfg = {
        "model": {"name": "tiny"},
        "seed": seed,
        "selection": {"strategy": strategy, "top_k": top_k},
    }
    make_run(run_id, "rejection_sampling", strategy.replace("_", "-"), rows, config=cfg)


def test_rejection_sampling_pairs_each_strategy_with_its_random_control():
    rs_run("top-per-prompt-20260301-000000-0001", "top_per_prompt", 0.40)
    rs_run("random-k-overall-20260301-000000-0002", "random_k_overall", 0.30)
    rs_run("random-per-prompt-20260301-000000-0003", "random_per_prompt", 0.38)
    rs_run("top-k-overall-20260301-000000-0004", "top_k_overall", 0.45, top_k=1000)
    ids = [
        "top-per-prompt-20260301-000000-0001",
        "random-k-overall-20260301-000000-0002",
        "random-per-prompt-20260301-000000-0003",
        "top-k-overall-20260301-000000-0004",
    ]
    cmp = compare_runs(ids)
    assert cmp.family == "rejection_sampling"
    assert [(r.strategy, r.control_strategy, r.role) for r in cmp.rows] == [
        ("top_per_prompt", "random_per_prompt", "selected"),
        ("top_k_overall", "random_k_overall", "selected"),
    ]
    per_prompt, k_overall = cmp.rows
    assert per_prompt.control_run_id == "random-per-prompt-20260301-000000-0003"
    assert per_prompt.difference == pytest.approx(0.02)
    assert k_overall.control_run_id == "random-k-overall-20260301-000000-0002"
    assert k_overall.score == 0.45 and k_overall.control_score == 0.30
    assert k_overall.difference == pytest.approx(0.15)
    assert cmp.table.splitlines()[0] == (
        "| strategy | run | state | **held-out exact match** (headline) | matched control | "
        "control run | control held-out exact match | difference |"
    )
    assert (
        "| top_k_overall | `top-k-overall-20260301-000000-0004` | succeeded | 0.45 | "
        "random_k_overall | `random-k-overall-20260301-000000-0002` | 0.3 | +0.15 |"
    ) in cmp.table
    assert any("top_k differs (1000 vs 500)" in w for w in cmp.warnings)


def test_rejection_sampling_pairs_by_seed_and_flags_missing_controls():
    rs_run("top-per-prompt-20260301-000000-0s01", "top_per_prompt", 0.5, seed=1)
    rs_run("top-per-prompt-20260301-000000-0s02", "top_per_prompt", 0.6, seed=2)
    rs_run("random-per-prompt-20260301-000000-0s02", "random_per_prompt", 0.55, seed=2)
    rs_run("random-per-prompt-20260301-000000-0s01", "random_per_prompt", 0.45, seed=1)
    rs_run("top-k-overall-20260301-000000-0s01", "top_k_overall", 0.7, seed=1)
    rs_run("random-k-overall-20260301-000000-0s03", "random_k_overall", None, seed=3)
    cmp = compare_runs(
        [
            "top-per-prompt-20260301-000000-0s01",
            "top-per-prompt-20260301-000000-0s02",
            "random-per-prompt-20260301-000000-0s02",
            "random-per-prompt-20260301-000000-0s01",
            "top-k-overall-20260301-000000-0s01",
        ]
    )
    pairs = {r.run_id: r.control_run_id for r in cmp.rows if r.role == "selected"}
    assert pairs == {
        "top-per-prompt-20260301-000000-0s01": "random-per-prompt-20260301-000000-0s01",
        "top-per-prompt-20260301-000000-0s02": "random-per-prompt-20260301-000000-0s02",
        "top-k-overall-20260301-000000-0s01": None,
    }
    assert all(r.difference == pytest.approx(0.05) for r in cmp.rows[:2])
    assert any(
        "top-k-overall-20260301-000000-0s01 (top_k_overall) has no matched random control" in n
        and "random_k_overall" in n
        for n in cmp.notes
    )
    # a control alone, with a different seed and no score
    cmp = compare_runs(
        ["top-k-overall-20260301-000000-0s01", "random-k-overall-20260301-000000-0s03"]
    )
    row = cmp.rows[0]
    assert row.control_run_id == "random-k-overall-20260301-000000-0s03"
    assert row.control_score is None and row.difference is None
    assert any("seed differs (1 vs 3)" in w for w in cmp.warnings)
    cmp = compare_runs(["random-k-overall-20260301-000000-0s03"])
    assert cmp.rows[0].role == "control"
    assert any("random control with no reward-selected run" in n for n in cmp.notes)


def test_mixing_families_is_rejected_with_a_clear_message():
    da_run("dpo-20260301-000000-0001", "dpo", 0.7, 0.3, "x")
    make_run("grpo-20260301-000000-0002", "policy_gradients", "grpo", [])
    with pytest.raises(LabError) as err:
        compare_runs(["dpo-20260301-000000-0001", "grpo-20260301-000000-0002"])
    message = str(err.value)
    assert "different families" in message
    assert "direct_alignment: dpo-20260301-000000-0001" in message
    assert "policy_gradients: grpo-20260301-000000-0002" in message


def test_unknown_family_and_empty_input_are_errors():
    path = make_run("dpo-20260301-000000-0bad", "direct_alignment", "dpo", [])
    (path / "run.json").write_text("{not json")
    with pytest.raises(LabError, match="cannot tell the family"):
        compare_runs(["dpo-20260301-000000-0bad"])
    with pytest.raises(LabError, match="at least one run"):
        compare_runs([])
    with pytest.raises(LabError, match="no run"):
        compare_runs(["dpo-20990101-000000-0000"])


def test_comparison_is_recorded_into_the_campaign_and_replaced_on_repeat(lab_root):
    camp = ledger.create_campaign("2026-03-01-cmp", "DPO or SimPO on tiny?")
    da_run("dpo-20260301-000000-0001", "dpo", 0.75, 0.42, "a")
    da_run("simpo-20260301-000000-0002", "simpo", 0.6, 1.5, "b")
    ids = ["dpo-20260301-000000-0001", "simpo-20260301-000000-0002"]
    cmp = compare_runs(ids, record_in="2026-03-01-cmp")
    assert cmp.recorded_in == camp.id
    md = Path(camp.path)
    text = md.read_text()
    block = text.split("<!-- rlhf-lab:begin comparison -->")[1].split("<!-- rlhf-lab:end")[0]
    assert cmp.table in block and "### direct alignment: 2 run(s) (dpo, simpo)" in block
    # the same set again (any order) replaces the entry; a new set adds one
    compare_runs(list(reversed(ids)), record_in="cmp")
    compare_runs(ids[:1], record_in="cmp")
    view = ledger.show_campaign("cmp")
    assert len(view.comparisons) == 2
    assert view.markdown.count("### direct alignment:") == 2

    with pytest.raises(LabError, match="no campaign with slug 'elsewhere'"):
        compare_runs(ids, record_in="elsewhere")
    assert not (lab_root / "experiments" / "elsewhere").exists()
