"""The run supervisor seam (rlhf_lab/runs/supervisor.py) and the conftest fixtures built on it:
a replacement holds for its block only, nests, and is seen by threads the block starts."""

from __future__ import annotations

import json
import threading
import time

import pytest

from rlhf_lab.runs.supervisor import STARTING_TIMEOUT_S, Supervisor, supervised_by, supervisor


def test_the_real_supervisor_is_the_labs_own():
    real = supervisor()
    assert real == Supervisor()
    assert real.trainer_argv is None and real.start_run is None  # None: the lab's own function
    assert real.starting_timeout_s == STARTING_TIMEOUT_S and real.clock is time.time


def test_a_replacement_holds_for_its_block_nests_and_reaches_threads():
    real = supervisor()
    with supervised_by(starting_timeout_s=1.0) as outer:
        assert supervisor() is outer and outer.clock is time.time  # other fields kept
        with supervised_by(clock=lambda: 5.0):
            inner = supervisor()
            assert inner.starting_timeout_s == 1.0 and inner.clock() == 5.0
            seen = []
            thread = threading.Thread(target=lambda: seen.append(supervisor().clock()))
            thread.start()
            thread.join()
            assert seen == [5.0]
        assert supervisor() is outer
    assert supervisor() is real
    with pytest.raises(TypeError):
        with supervised_by(no_such_field=1):
            pass
    assert supervisor() is real


def test_supervise_fixture_later_calls_win(supervise, no_queue_worker):
    supervise(starting_timeout_s=3.0)
    assert supervisor().ensure_queue_worker() is None and supervisor().starting_timeout_s == 3.0
    supervise(starting_timeout_s=4.0)
    assert supervisor().starting_timeout_s == 4.0


def test_run_json_reads_sees_reads_only(tmp_path, run_json_reads):
    run_dir = tmp_path / "dpo-20260101-000000-abcd"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"state": "queued"}))  # a write: not counted
    assert run_json_reads == []
    json.loads((run_dir / "run.json").read_text())
    assert run_json_reads == [run_dir.name]
