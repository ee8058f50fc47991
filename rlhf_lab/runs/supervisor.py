"""The run supervisor: the few things the runs layer does to the world outside its folders, in
one frozen object read at call time. Torch-free; imports nothing of the lab.

:class:`Supervisor` says how a trainer's command line is built, how a run is started (or handed
to the runs layer, or queued), how the queue worker and a run's recorder are started, how a
process is checked for life and reaped, how long a run may stay ``starting`` without a process,
and which clock the run state reads. The lab runs under the real one (:func:`supervisor` when
nothing is replaced). A caller that needs another one for a block (a test: a stand-in trainer,
no queue worker, a short start timeout, a fixed clock) sets it with :func:`supervised_by`::

    with supervised_by(trainer_argv=stand_in, ensure_queue_worker=lambda: None):
        api.launch(request)

A field left ``None`` is the lab's own function, named in the field's comment: the modules that
read the seam hold those functions themselves, so this module imports none of them (no import
cycle). The replacement is held module-wide, not per context: threads a test starts (racing
launches, a queue worker thread) see it too. Blocks nest; the innermost wins.

Not to be confused with :mod:`rlhf_lab._wrapper`, the process that watches one trainer: this is
the lab-side choice of how such processes are started and watched.
"""

from __future__ import annotations

import dataclasses
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["STARTING_TIMEOUT_S", "Supervisor", "supervised_by", "supervisor"]

# A run stuck in "starting" with no process this long after creation lost its launcher.
STARTING_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Supervisor:
    """How the runs layer builds, starts, watches and reaps its processes (see the module)."""

    # (family, run_dir, resume=False, nproc=None) -> argv: runs.launcher.trainer_argv
    trainer_argv: Callable[..., list[str]] | None = None
    # (run_id) -> RunInfo, start a queued or starting run now: runs.launcher.start_run
    start_run: Callable[[str], Any] | None = None
    # (NewRun, force=, queue=, fits_together=) -> LaunchResult, what the lab API hands a new
    # run to: runs.launcher.start_or_queue
    start_or_queue: Callable[..., Any] | None = None
    # () -> pid or None, start the detached queue worker unless one runs:
    # runs.queue.ensure_queue_worker
    ensure_queue_worker: Callable[[], int | None] | None = None
    # (run_id) -> pid, start the detached recorder of a run started at once:
    # runs.queue.record_when_ended
    record_when_ended: Callable[[str], int] | None = None
    # (pid, create_time, marker=None) -> bool, the recorded process runs now:
    # runs.process._process_alive
    process_alive: Callable[..., bool] | None = None
    # (Popen) -> None, wait for a started child so it never lingers as a zombie:
    # runs.process._reap_in_background
    reap: Callable[[subprocess.Popen], None] | None = None
    # seconds a run may stay "starting" with no process before it counts as died
    starting_timeout_s: float = STARTING_TIMEOUT_S
    # () -> epoch seconds: "now" for the run state (the start timeout, a live run's elapsed
    # time and ETA)
    clock: Callable[[], float] = time.time


_REAL = Supervisor()
_replaced: list[Supervisor] = []  # innermost last; module-wide so threads see it
_lock = threading.Lock()


def supervisor() -> Supervisor:
    """The supervisor in force now: the innermost :func:`supervised_by` block's, else the real
    one."""
    with _lock:
        return _replaced[-1] if _replaced else _REAL


@contextmanager
def supervised_by(**changes: Any) -> Iterator[Supervisor]:
    """Run a block under the supervisor in force with ``changes`` (fields of
    :class:`Supervisor`); the one in force before comes back when the block ends."""
    replacement = dataclasses.replace(supervisor(), **changes)
    with _lock:
        _replaced.append(replacement)
    try:
        yield replacement
    finally:
        with _lock:
            _replaced.remove(replacement)
