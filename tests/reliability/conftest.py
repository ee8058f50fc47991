"""Fixtures of the bad-input tests (test_bad_input_*.py ask for ``lab_root`` for all their tests
with ``pytestmark``). test_concurrency.py and test_faults.py define their own ``lab_root``."""

from __future__ import annotations

import pytest

from rlhf_lab.paths import LabError
from tests._lab_processes import kill_live_runs


@pytest.fixture
def lab_root(tmp_path, monkeypatch):
    """The lab writes under tmp_path/lab only; no trainer outlives the test."""
    root = tmp_path / "lab"
    root.mkdir()
    monkeypatch.setenv("RLHF_LAB_ROOT", str(root))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield root
    kill_live_runs(root)


@pytest.fixture
def no_trainer(supervise, no_queue_worker):
    """Launches get as far as starting the trainer, which is refused instead (and the queue
    worker is never spawned): fuzzing must not start training jobs."""

    def refuse(run_id: str):
        raise LabError(f"not started: trainers are disabled in this test ({run_id})")

    supervise(start_run=refuse)
