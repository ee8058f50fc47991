"""Starting the queue's detached processes. Queued runs start in creation order, each once its
device (or set of devices) is free; a run whose GPU the lab picks starts on whichever GPU frees
up, so with several GPUs several queued runs train at once. Torch-free.

``launch(queue=True)`` writes the run as ``queued`` and calls :func:`ensure_queue_worker`, which
starts the detached worker (``python -m rlhf_lab._queue``, a thin entry point) unless one runs.
The worker holds ``experiments/.lab/queue.lock`` while it works and calls
:func:`rlhf_lab.runs.launcher._start_when_free` for each queued run; when a run it started ends
it records the run in its campaign ledger. A run started at once (not queued) gets the same
recording from :func:`record_when_ended`: a small detached process
(``python -m rlhf_lab._queue --record ID``) that waits for the run's end and calls the same
ledger hook. Both are the run supervisor's to replace (:mod:`rlhf_lab.runs.supervisor`).
"""

from __future__ import annotations

import os
import subprocess
import sys

from rlhf_lab.runs.process import _reap_in_background
from rlhf_lab.runs.records import _lab_dir, _source_dir
from rlhf_lab.runs.supervisor import supervisor

__all__ = ["ensure_queue_worker", "record_when_ended"]


def _worker_env() -> dict[str, str]:
    """The worker's environment: this checkout first on PYTHONPATH, unbuffered output."""
    src = str(_source_dir())
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != src]
    env["PYTHONPATH"] = os.pathsep.join([src, *parts])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def ensure_queue_worker() -> int | None:
    """Start the queue worker unless one is running; returns the new worker's pid or None."""
    from filelock import FileLock

    lock_path = _lab_dir() / "queue.lock"
    probe = FileLock(str(lock_path))
    try:
        probe.acquire(timeout=0)
    except Exception:
        return None  # a worker holds the lock; it re-checks the queue before it exits
    probe.release()
    return _start_detached()


def record_when_ended(run_id: str) -> int:
    """Start the detached recorder of a run started at once: it waits for the run's end and
    records it in its campaign ledger, as the queue worker does for the runs it starts. Returns
    the recorder's pid."""
    return _start_detached("--record", run_id)


def _start_detached(*args: str) -> int:
    """``python -m rlhf_lab._queue ARGS`` in its own session, its output appended to the lab's
    queue.log; returns its pid."""
    with (_lab_dir() / "queue.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlhf_lab._queue", *args],
            cwd=str(_source_dir()),
            env=_worker_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    (supervisor().reap or _reap_in_background)(proc)
    return proc.pid
