"""The run queue: queued runs start in creation order, each once its device (or set of devices)
is free; a run whose GPU the lab picks starts on whichever GPU frees up, so with several GPUs
several queued runs train at once. Torch-free.

``launch(queue=True)`` writes the run as ``queued`` and calls :func:`ensure_queue_worker`, which
starts the detached worker (``python -m rlhf_lab._queue``, a thin entry point) unless one runs.
The worker holds ``experiments/.lab/queue.lock`` while it works and calls
:func:`_start_when_free` for each queued run; when a run it started ends it records the run in
its campaign ledger. A run started at once (not queued) gets the same recording from
:func:`record_when_ended`: a small detached process (``python -m rlhf_lab._queue --record ID``)
that waits for the run's end and calls the same ledger hook.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rlhf_lab.paths import find_run
from rlhf_lab.runs.process import _devices_hold
from rlhf_lab.runs.records import RunInfo, _lab_dir, _read_run_json, _source_dir, patchable
from rlhf_lab.runs.state import run_state

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
    patchable()._reap_in_background(proc)
    return proc.pid


def _start_when_free(run_id: str, poll_s: float = 1.0) -> RunInfo | None:
    """Queue worker: start ``run_id`` once every device it names is free, or, when the lab picks
    its GPUs, once enough GPUs are free (it gets the freest). None if it left the queue."""
    from rlhf_lab.runs.devices import freest_gpus
    from rlhf_lab.runs.launcher import _busy_on, _held_devices
    from rlhf_lab.runs.state import held_devices

    while True:
        status = run_state(run_id)
        if status.state != "queued":
            return None
        record = _read_run_json(find_run(run_id)) or {}
        devices = held_devices(record)
        with _devices_hold():
            if devices:
                free = not _busy_on(devices)
            else:
                wanted = int(record.get("gpus_wanted") or 1)
                free = freest_gpus(wanted, _held_devices(exclude=run_id)) is not None
            if free:
                if run_state(run_id).state != "queued":
                    return None
                return patchable().start_run(run_id)
        time.sleep(poll_s)
