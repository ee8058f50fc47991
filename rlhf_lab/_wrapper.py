"""Supervisor for one training process: records how it ended even when the launcher is gone.

    python -m rlhf_lab._wrapper <run-dir> -- <trainer argv...>

The lab starts this module detached (its own session and process group, stdout/stderr already
pointing at ``<run-dir>/train.log``). It starts the trainer as its child in the same process
group, forwards SIGTERM / SIGINT / SIGHUP to it, waits, and writes ``<run-dir>/exit.json``
(``exit_code``, ``signal``, ``signal_name``, ``ended_at``, ``trainer_pid``) atomically. While the
trainer runs, ``<run-dir>/process.json`` names both processes (pid + create time) so the lab can
tell a live run from a reused pid.

``exit.json`` is missing only when this wrapper itself could not finish (SIGKILL to the whole
group, OOM killer, reboot): the lab reports such a run as ``died`` (``killed`` when it was its own
stop that gave up waiting and sent SIGKILL). Before starting the trainer it writes
``progress.json`` with phase ``starting``, so a status shows something from the first moment.

In a Slurm job (``RLHF_LAB_SLURM=1``, set by the job script of :mod:`rlhf_lab.runs.slurm`) the
child is ``srun`` and SIGTERM is not forwarded: srun would kill its tasks at once, and Slurm
signals the tasks themselves.

Standard library only (plus psutil when present): never imports torch.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _atomic_json(path: Path, obj: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _create_time(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def _say(text: str) -> None:
    print(f"[rlhf-lab] {text}", file=sys.stderr, flush=True)


def _starting_progress(run_dir: Path) -> None:
    """progress.json from the first moment (phase ``starting``: the trainer imports its
    libraries, seconds before it writes its own): a new run shows step 0, a resumed one keeps
    the step and total its last attempt reached."""
    try:
        previous = json.loads((run_dir / "progress.json").read_text())
    except (OSError, ValueError):
        previous = None
    if not isinstance(previous, dict):
        previous = {}
    fields = {**previous, "phase": "starting", "updated_at": time.time()}
    fields["step"] = previous.get("step") if isinstance(previous.get("step"), int) else 0
    fields.setdefault("total_steps", None)
    try:
        _atomic_json(run_dir / "progress.json", fields)
    except OSError:
        pass  # the trainer writes it soon anyway


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        _say("usage: python -m rlhf_lab._wrapper <run-dir> -- <command...>")
        return 2
    run_dir, cmd = Path(args[0]), args[2:]

    child: subprocess.Popen | None = None
    pending: list[int] = []

    in_slurm_job = os.environ.get("RLHF_LAB_SLURM") == "1"
    if in_slurm_job:
        import rlhf_lab.runs.slurm  # noqa: F401  imported now, not in the signal handler
    time_limit_signal: list[bool] = []

    def forward(signum, frame) -> None:  # noqa: ARG001
        if in_slurm_job and signum == signal.SIGTERM:
            # the child is srun, which kills its tasks at once on a SIGTERM. A lab stop signals
            # the tasks themselves (scancel --signal=TERM); a SIGTERM reaching this batch step
            # is Slurm's warning before the time limit (#SBATCH --signal=B:TERM@s): pass it to
            # the tasks the same way, so the trainer checkpoints, and record it
            time_limit_signal.append(True)
            _say("SIGTERM to the batch step (Slurm's time limit is near): passed to the tasks")
            _signal_job_tasks()
            return
        if child is not None and child.poll() is None:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass
        else:
            pending.append(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)

    t0 = time.time()
    _starting_progress(run_dir)
    try:
        child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    except OSError as err:
        _say(f"could not start the trainer: {err}")
        _atomic_json(
            run_dir / "exit.json",
            {
                "exit_code": 127,
                "signal": None,
                "signal_name": None,
                "ended_at": _now(),
                "trainer_pid": None,
                "error": str(err),
            },
        )
        return 127
    _atomic_json(
        run_dir / "process.json",
        {
            "wrapper_pid": os.getpid(),
            "wrapper_create_time": _create_time(os.getpid()),
            "trainer_pid": child.pid,
            "trainer_create_time": _create_time(child.pid),
            "started_at": _now(),
        },
    )
    for signum in pending:  # a stop that arrived while the trainer was being started
        child.send_signal(signum)

    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - wait() retries on EINTR itself
            continue

    sig = -code if code < 0 else None
    name = signal.Signals(sig).name if sig else None
    exit_code = None if sig else code
    if sig:
        _say(f"trainer ended by signal {sig} ({name}) after {time.time() - t0:.1f}s")
    else:
        _say(f"trainer exited with code {code} after {time.time() - t0:.1f}s")
    _atomic_json(
        run_dir / "exit.json",
        {
            "exit_code": exit_code,
            "signal": sig,
            "signal_name": name,
            "ended_at": _now(),
            "trainer_pid": child.pid,
            **({"slurm_time_limit_signal": True} if time_limit_signal else {}),
        },
    )
    return 128 + sig if sig else code


def _signal_job_tasks() -> None:
    """SIGTERM to every step of this Slurm job but the batch step (where this wrapper runs)."""
    from rlhf_lab.runs.slurm import SIGNAL_TASKS

    job = os.environ.get("SLURM_JOB_ID")
    if job:
        try:
            subprocess.Popen(
                [*SIGNAL_TASKS, job],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError as err:
            _say(f"could not pass the SIGTERM on: {err}")


if __name__ == "__main__":
    sys.exit(main())
