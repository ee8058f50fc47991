"""Helpers for the tests that start real lab processes (trainers, stand-in trainers, the queue
worker): wait for something they do, and never leave one behind."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.25):
    """Poll ``predicate`` until it returns something truthy (returned) or fail naming ``what``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def kill_live_runs(root: Path) -> None:
    """SIGKILL the process group of every run under ``root`` whose recorded process still runs
    (same pid and create time: a reused pid is left alone)."""
    from rlhf_lab.runs import _process_alive

    for path in root.glob("experiments/*/runs/*/run.json"):
        record = json.loads(path.read_text())
        if record.get("pgid") and _process_alive(record.get("pid"), record.get("create_time")):
            try:
                os.killpg(record["pgid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
