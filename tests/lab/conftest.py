"""Fixtures the lab's tests share. None is autouse: a file asks for them by name, usually for
all its tests at once with ``pytestmark = pytest.mark.usefixtures("lab_root")``."""

from __future__ import annotations

import pytest


@pytest.fixture
def lab_root(tmp_path, monkeypatch):
    """The test's own empty lab: ``RLHF_LAB_ROOT`` points at ``tmp_path`` for the test."""
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    return tmp_path


@pytest.fixture
def stop_leftover_runs(lab_root):
    """After the test, every run of its lab still queued or active is stopped (a failed
    end-to-end test must not leave trainers running)."""
    yield
    from rlhf_lab import runs

    for status in [*runs.queued_runs(), *runs.active_runs()]:
        runs.stop_run(status.id, grace_s=5)


@pytest.fixture
def anyio_backend():
    """The lab's async tests run on asyncio only."""
    return "asyncio"
