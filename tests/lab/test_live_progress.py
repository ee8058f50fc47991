"""status keeps moving through long phases (issue #25, item 7): the elapsed time of a live run is
computed at read time from the trainer's start, a counted phase has an ETA and a count
("reference log-probs 120/640"), before the first step."""

from __future__ import annotations

import pytest

from rlhf_lab.runs import state
from rlhf_lab.runs.folder import LiveClock, live_clock, phase_count_text
from trainers.core.runfolder import ProgressFile


def test_live_clock_by_hand():
    p = ProgressFile(
        step=0,
        phase="reference_logprobs",
        started_at=1000.0,
        phase_started_at=1100.0,
        elapsed_s=100.0,
        updated_at=1100.0,
        phase_done=120,
        phase_total=640,
    )
    clock = live_clock(p, now=1130.0)
    assert clock.elapsed_s == 130.0  # not the 100 s progress.json was written with
    assert clock.phase_eta_s == pytest.approx(30.0 / 120 * 520)  # 130.0
    # an older trainer (no started_at): the start is updated_at − elapsed_s
    old = ProgressFile(step=0, elapsed_s=50.0, updated_at=2000.0)
    assert live_clock(old, now=2030.0) == LiveClock(80.0, None)
    assert live_clock(None, now=1.0).elapsed_s is None


def test_phase_count_text():
    assert phase_count_text("reference_logprobs", 120, 640) == "reference log-probs 120/640"
    assert phase_count_text("evaluating", 8, 32) == "evaluating 8/32"
    assert phase_count_text("training", None, None) is None


def test_live_times_prefer_the_step_eta_then_the_phase_eta(supervise):
    supervise(clock=lambda: 1130.0)  # "now" for the run state
    p = ProgressFile(
        step=3,
        total_steps=10,
        phase="training",
        started_at=1000.0,
        updated_at=1120.0,
        elapsed_s=120.0,
    )
    assert state._live_times(p, 70.0) == (130.0, 70.0, "steps")
    counted = p.model_copy(
        update={"step": 0, "phase": "reference_logprobs", "phase_started_at": 1100.0,
                "phase_done": 120, "phase_total": 640}
    )  # fmt: skip
    assert state._live_times(counted, None) == (130.0, 130.0, "phase")
    assert state._live_times(p, None) == (130.0, None, None)


def test_run_status_of_a_live_run_in_a_long_phase(tmp_path, monkeypatch):
    """A live run computing reference log-probs: elapsed from its start, the count, the
    phase's ETA (the run's own process stands in for the trainer)."""
    import json
    import os
    import time

    import psutil

    from rlhf_lab import runs
    from tests.lab.test_runs import QUICK, config, new_run

    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    info = runs.prepare_run(new_run(config(QUICK), "live"))
    run_dir = tmp_path / "experiments" / info.run_dir.split("/experiments/", 1)[1]
    record = json.loads((run_dir / "run.json").read_text())
    record.update(state="running", pid=os.getpid(), create_time=psutil.Process().create_time())
    (run_dir / "run.json").write_text(json.dumps(record))
    now = time.time()
    (run_dir / "progress.json").write_text(
        json.dumps(
            {"step": 0, "total_steps": 40, "phase": "reference_logprobs", "elapsed_s": 5.0,
             "updated_at": now - 60, "started_at": now - 65, "phase_started_at": now - 45,
             "phase_done": 120, "phase_total": 640}
        )
    )  # fmt: skip
    status = runs.run_state(info.id)
    assert status.alive and status.phase_progress == "reference log-probs 120/640"
    assert status.elapsed_s >= 65.0  # not the 5 s written a minute ago
    assert status.eta_basis == "phase" and status.eta_s >= 45.0 / 120 * 520
    from typer.testing import CliRunner

    from rlhf_lab.cli import app

    out = CliRunner().invoke(app, ["status", info.id])
    assert out.exit_code == 0, out.output
    first = out.output.splitlines()[0]
    assert "step 0/40 (reference log-probs 120/640)  elapsed " in first
    assert "(this phase)" in first
