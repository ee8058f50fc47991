"""The ledger and the comparison tables of multi-turn tool runs (issue #28), on fabricated run
folders: sample trajectories turn by turn (model turns and tool replies told apart) and the
per-trajectory tool metrics (turns, calls, errors, share that called, share that used a result)
in the run's section, the campaign's runs table and the comparison table; a single-turn run's
ledger is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlhf_lab import ledger
from rlhf_lab.ledger.metrics import TOOL_LEGEND
from rlhf_lab.results.compare import compare_runs
from tests._helpers.run_folders import write_jsonl, write_run_json

CAMPAIGN = "2026-11-29-grpo-with-calculator-vs-grpo"
TOOLS_RUN = "grpo-20261129-000000-0001"
PLAIN_RUN = "grpo-20261129-000000-0002"

TRAJECTORY = [
    {"role": "model", "text": 'Let me compute. <tool name="calc">1234*5678</tool>'},
    {"role": "tool", "text": "7006652"},
    {"role": "model", "text": "So the product is\n<answer>7006652</answer>"},
]


pytestmark = pytest.mark.usefixtures("lab_root")


def pg_rows(tools: bool) -> list[dict]:
    """Rollout rows over 10 steps and held-out rows at 0, 5 and 10; a tools run's rows carry
    the trainer's tools/* means (the share that called rising from 0.25 to 0.75)."""
    rows = []
    for s in range(1, 11):
        row = {"step": s, "phase": "rollout", "avg_correctness": 0.1 * s / 2, "loss": 0.01}
        row["frac_reward_zero_std"] = 0.5
        if tools:
            called = 0.25 if s <= 5 else 0.75
            row |= {
                "tools/turns": 1 + called,
                "tools/calls": called,
                "tools/errors": 0.125,
                "tools/called": called,
                "tools/used_result": called / 2,
                "tools/observation_tokens": 12.0 * called,
            }
        rows.append(row)
    for s in (0, 5, 10):
        row = {"step": s, "phase": "eval", "eval/avg_correctness": 0.2 + 0.02 * s}
        if tools:
            row |= {"eval/tools/called": 0.05 * s, "eval/tools/used_result": 0.04 * s}
            row |= {"eval/tools/turns": 1.5, "eval/tools/calls": 0.5, "eval/tools/errors": 0.0}
        rows.append(row)
    return rows


def samples(tools: bool, turns: list[dict] | None = None) -> list[dict]:
    row = {
        "step": 10,
        "kind": "eval",
        "question": "What is 1234 * 5678?",
        "answer": "7006652",
        "completion": "So the product is\n<answer>7006652</answer>",
        "correctness": 1.0,
    }
    if tools:
        row["turns"] = TRAJECTORY if turns is None else turns
    return [row]


def make_run(run_id: str, tools: bool, sample_rows: list[dict] | None = None) -> Path:
    """A policy-gradient run folder as the launcher and the trainer write it."""
    path = ledger.experiments_dir() / CAMPAIGN / "runs" / run_id
    write_run_json(path, "policy_gradients", "grpo", state="succeeded")
    env = {"name": "calculator" if tools else None, "max_turns": 3}
    config = {"algorithm": "grpo", "model": {"name": "tiny"}, "env": env, "seed": 42}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = pg_rows(tools)
    write_jsonl(path / "metrics.jsonl", rows)
    sample_rows = samples(tools) if sample_rows is None else sample_rows
    write_jsonl(path / "samples.jsonl", sample_rows)
    summary = {"outcome": "succeeded", "steps": 10, "total_steps": 10, "wall_time_s": 2.0}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def campaign_text() -> str:
    return (ledger.experiments_dir() / f"{CAMPAIGN}.md").read_text()


def test_a_sample_trajectory_is_recorded_and_shown_turn_by_turn():
    make_run(TOOLS_RUN, tools=True)
    rec = ledger.record_run(TOOLS_RUN, plot=False)
    (sample,) = rec.samples
    assert [(t.role, t.text) for t in sample.turns] == [(t["role"], t["text"]) for t in TRAJECTORY]
    text = campaign_text()
    block = (
        "```\n"
        'model: Let me compute. <tool name="calc">1234*5678</tool>\n'
        "tool:  7006652\n"
        "model: So the product is\n"
        "       <answer>7006652</answer>\n"
        "```"
    )
    assert block in text
    assert "> **prompt:** What is 1234 * 5678?" in text


def test_a_long_trajectory_is_cut_and_says_how_many_turns_it_leaves_out():
    turns = [{"role": "model" if i % 2 == 0 else "tool", "text": f"t{i}"} for i in range(11)]
    make_run(TOOLS_RUN, tools=True, sample_rows=samples(True, turns))
    (sample,) = ledger.record_run(TOOLS_RUN, plot=False).samples
    assert [t.text for t in sample.turns[:8]] == [f"t{i}" for i in range(8)]
    assert (sample.turns[-1].role, sample.turns[-1].text) == ("more", "3 more turns")
    assert "tool:  t7\n(3 more turns)\n```" in campaign_text()


def test_malformed_turns_fall_back_to_the_completion():
    bad = samples(True, [{"role": "narrator", "text": "?"}])
    make_run(TOOLS_RUN, tools=True, sample_rows=bad)
    (sample,) = ledger.record_run(TOOLS_RUN, plot=False).samples
    assert sample.turns == []
    assert "```\nSo the product is\n<answer>7006652</answer>\n```" in campaign_text()


def test_the_tool_metrics_are_in_the_run_section_and_the_runs_table():
    make_run(TOOLS_RUN, tools=True)
    make_run(PLAIN_RUN, tools=False)
    tools = ledger.record_run(TOOLS_RUN, plot=False)
    plain = ledger.record_run(PLAIN_RUN, plot=False)
    assert tools.metric("tools/called").final == pytest.approx(0.75)
    assert tools.metric("eval/tools/used_result").final == pytest.approx(0.4)
    for name in ("tools/turns", "tools/calls", "tools/errors", "eval/tools/called"):
        assert tools.metric(name) is not None, name
    assert plain.metric("tools/called") is None and plain.samples[0].turns == []
    text = campaign_text()
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| run |") and "wall time" in line)
    for column in ("eval/tools/called", "tools/called (training signal)", "eval/tools/errors"):
        assert f" {column} |" in header, column
    row = next(line for line in lines if line.startswith(f"| `{TOOLS_RUN}` | grpo | 42"))
    cells = [c.strip() for c in row.split("|")]
    names = [c.strip() for c in header.split("|")]
    assert cells[names.index("eval/tools/called")] == "0.5"
    plain_row = next(line for line in lines if line.startswith(f"| `{PLAIN_RUN}` | grpo | 42"))
    assert [c.strip() for c in plain_row.split("|")][names.index("eval/tools/called")] == "—"
    assert TOOL_LEGEND in text
    assert "| `tools/used_result` | 0.375 | 10 |" in text  # the run's section


def test_a_single_turn_campaign_shows_no_tool_columns():
    make_run(PLAIN_RUN, tools=False)
    ledger.record_run(PLAIN_RUN, plot=False)
    text = campaign_text()
    assert "tools/" not in text and TOOL_LEGEND not in text
    assert "```\nSo the product is\n<answer>7006652</answer>\n```" in text


def test_the_comparison_table_shows_the_tool_use_of_each_run():
    make_run(TOOLS_RUN, tools=True)
    make_run(PLAIN_RUN, tools=False)
    cmp = compare_runs([TOOLS_RUN, PLAIN_RUN])
    for column in ("eval/tools/called", "eval/tools/used_result", "tools/called", "tools/turns"):
        assert column in cmp.columns, column
    tools, plain = cmp.rows
    assert tools.values["tools/called"] == pytest.approx(0.75)  # the mean of the last 5 steps
    assert tools.values["eval/tools/called"] == pytest.approx(0.5)
    assert tools.values["tools/errors"] == pytest.approx(0.125)
    assert all(plain.values[c] is None for c in cmp.columns if "tools/" in c)
    assert any(TOOL_LEGEND in n for n in cmp.notes)
    other = PLAIN_RUN.replace("0002", "0003")
    make_run(other, tools=False)
    alone = compare_runs([PLAIN_RUN, other])
    assert not any("tools/" in c for c in alone.columns)
    assert not any(TOOL_LEGEND in n for n in alone.notes)
