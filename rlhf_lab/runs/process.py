"""A run's processes: identity (pid + psutil create time), liveness, signals, locks and reaping.
Torch-free; psutil and filelock are imported where used, so listing finished runs needs neither.

A process counts as alive only if its pid exists, its create time matches the recorded one and it
is not a zombie: a reused pid is never mistaken for a run. With no recorded create time the run
folder's path must appear in the process's command line instead.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rlhf_lab.runs.records import _lab_dir
from rlhf_lab.runs.supervisor import supervisor
from trainers.core.runfolder import ProcessFile


@contextmanager
def _run_lock(run_dir: Path) -> Iterator[None]:
    """The run's own lock: every read-modify-write of its run.json holds it."""
    from filelock import FileLock  # imported here: reading commands never lock

    with FileLock(str(run_dir / ".run.lock"), timeout=30):
        yield


@contextmanager
def _device_lock(device: str) -> Iterator[None]:
    """A named launch lock of the lab (``launch-<name>.lock``)."""
    from filelock import FileLock

    name = device.replace(":", "-")
    with FileLock(str(_lab_dir() / f"launch-{name}.lock"), timeout=60):
        yield


@contextmanager
def _devices_hold() -> Iterator[None]:
    """THE lock under which every start checks that the devices it will use are free and takes
    them: a launch (named devices or picked ones), the queue worker starting a queued run, a
    resume. One lab-wide lock, not one per device: a GPU the lab picks for a queued run is not
    known before the pick, so a per-device lock could not keep a launch that names that GPU
    from taking it at the same moment."""
    with _device_lock("placement"):
        yield


def _process_alive(pid: int | None, create_time: float | None, marker: str | None = None) -> bool:
    """True if ``pid`` runs now and is the same process (same create time, not a zombie).
    With no recorded create time, ``marker`` must appear in the command line instead."""
    if not pid:
        return False
    import psutil  # imported where used (here and below): listing finished runs needs none

    try:
        proc = psutil.Process(int(pid))
        if create_time is not None:
            if abs(proc.create_time() - float(create_time)) > 0.05:
                return False
        elif marker is None or marker not in " ".join(proc.cmdline()):
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ValueError, TypeError):
        return False


def _reap_in_background(proc: subprocess.Popen) -> None:
    """Wait for a child we started so it never lingers as a zombie (daemon: never blocks exit)."""
    threading.Thread(target=proc.wait, daemon=True, name=f"reap-{proc.pid}").start()


def _liveness() -> Callable[..., bool]:
    """The supervisor's liveness check (:func:`_process_alive` unless replaced)."""
    return supervisor().process_alive or _process_alive


def _marker(run_dir: Path) -> str:
    """What a run's process carries in its command line: the run folder's path."""
    return str(run_dir)


def _alive(run_dir: Path, record: dict, proc_info: ProcessFile | None) -> bool:
    """The run's wrapper (run.json) or trainer (process.json) is the live process it was."""
    marker = _marker(run_dir)
    alive = _liveness()
    if alive(record.get("pid"), record.get("create_time"), marker):
        return True
    if proc_info and alive(proc_info.trainer_pid, proc_info.trainer_create_time, marker):
        return True
    return False


def _signal_run(run_dir: Path, record: dict, proc_info: ProcessFile | None, sig: int) -> None:
    """Send ``sig`` to the run's process group, only to processes whose identity matches."""
    marker = _marker(run_dir)
    alive = _liveness()
    pgid = record.get("pgid") or record.get("pid")
    if alive(record.get("pid"), record.get("create_time"), marker) and pgid:
        try:
            os.killpg(int(pgid), sig)
        except (ProcessLookupError, PermissionError):
            pass
    trainer = proc_info.trainer_pid if proc_info else None
    if trainer and alive(trainer, proc_info.trainer_create_time, marker):
        try:
            os.kill(int(trainer), sig)
        except (ProcessLookupError, PermissionError):
            pass
        import psutil

        try:  # children the trainer started (data workers) that left the group
            for child in psutil.Process(int(trainer)).children(recursive=True):
                child.send_signal(sig)
        except psutil.Error:
            pass
