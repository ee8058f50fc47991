"""The lab's composed flow with real tiny trainers: a sweep queues matched runs that run one after
another and land in the ledger on their own; `launch --foreground` streams a run to the end."""

from __future__ import annotations

import datetime as dt
import time

import pytest
import yaml
from typer.testing import CliRunner

from rlhf_lab import api
from rlhf_lab.cli import app
from rlhf_lab.runs import wait_for_end

SMALL = [
    "data.max_samples=48",
    "data.eval_size=16",
    "train.max_steps=2",
    "eval.eval_every=2",
    "eval.num_samples=0",
]


pytestmark = pytest.mark.usefixtures("lab_root")


def _ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.slow
def test_sweep_runs_matched_runs_in_order_and_records_them(lab_root):
    result = api.sweep(
        api.SweepRequest(
            recipes=["dpo", "ipo"], overrides=SMALL, model="tiny", campaign="flow-check"
        )
    )
    ids = [launch.run.id for launch in result.launches]
    assert all(launch.queued for launch in result.launches)
    finals = [wait_for_end(run_id, poll_s=0.5, timeout_s=600) for run_id in ids]
    assert [f.state for f in finals] == ["succeeded", "succeeded"], finals
    # one job at a time: the second started only after the first ended
    assert _ts(finals[1].started_at) >= _ts(finals[0].ended_at)
    # matched settings: the two configs differ only in the loss (and its β default)
    configs = [yaml.safe_load(open(f"{f.run_dir}/config.yaml")) for f in finals]
    for cfg in configs:
        cfg.pop("loss"), cfg.pop("beta")
    assert configs[0] == configs[1]
    # the queue worker recorded both runs in the campaign's ledger
    view = None
    for _ in range(60):
        view = api.show_campaign("flow-check")
        if {r.run_id for r in view.runs if r.state == "succeeded"} == set(ids):
            break
        time.sleep(1)
    assert {r.run_id for r in view.runs} == set(ids)
    for run_id in ids:
        assert run_id in view.markdown
    assert all(r.metric("eval/accuracy") is not None for r in view.runs)


def test_launch_foreground_streams_to_the_end(lab_root):
    argv = ["launch", "dpo", "--model", "tiny", "--campaign", "fg-check", "--foreground"]
    for item in SMALL:
        argv += ["--set", item]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert "succeeded" in result.output
    assert "step 2/2" in result.output  # the trainer's own log lines were streamed


@pytest.mark.slow
def test_the_readme_demo_runs_to_a_ledger_with_both_runs(lab_root):
    """`uv run rlhf-lab demo` (README's first command) end to end: two tiny runs queued, watched,
    recorded and compared in one campaign."""
    result = CliRunner().invoke(app, ["demo", "--campaign", "demo-check"])
    assert result.exit_code == 0, result.output
    assert "== compare" in result.output
    ledgers = list((lab_root / "experiments").glob("*-demo-check.md"))
    assert len(ledgers) == 1, ledgers
    text = ledgers[0].read_text()
    states = [r.state for r in api.list_runs(campaign=ledgers[0].stem)]
    assert sorted(states) == ["succeeded", "succeeded"], states
    assert "dpo" in text and "simpo" in text and "eval/accuracy" in text
