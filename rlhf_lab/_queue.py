"""The queue worker: starts queued runs in creation order, each once its devices are free (with
several GPUs, several at once).

    python -m rlhf_lab._queue                 # the worker
    python -m rlhf_lab._queue --record RUN_ID # the recorder of one run started at once

The recorder (started detached by :func:`rlhf_lab.runs.queue.record_when_ended` when a run is
launched or resumed without the queue) waits for that run's end and calls the same ledger hook as
the worker, so every run is recorded the same way whichever path started it.

A queued run launched ``after`` other runs (:mod:`rlhf_lab.runs.deps`) is started only once
they have all succeeded; while it waits the worker keeps looking (it starts other queued runs
meanwhile), and when one of them ends any other way the run is ``cancelled`` and recorded. Both
the worker and the recorder cancel a run's queued dependents as soon as it ends unsuccessfully.

The worker is started detached by :func:`rlhf_lab.runs.queue.ensure_queue_worker`. Only one
worker runs at a time: it holds ``experiments/.lab/queue.lock`` for its whole life (a second worker finds the lock taken
and exits at once). For each queued run it waits until the run's devices have no active job (or
enough GPUs are free, for a run whose GPU the lab picks), starts it, and goes on to the next;
a thread per started run waits for its end and calls the ledger hook
``rlhf_lab.ledger.record_run(run_id)``. When the queue is empty it releases the lock, looks once more (a launch may have
queued a run while it held the lock) and exits. Output goes to ``experiments/.lab/queue.log``.
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
import time
import traceback

from filelock import FileLock, Timeout

POLL_S = 1.0


def _say(text: str) -> None:
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    print(f"[rlhf-lab queue {stamp}] {text}", flush=True)


def record_hook(run_id: str) -> None:
    """Record a finished run in its campaign ledger, if the ledger module offers it."""
    try:
        from rlhf_lab import ledger
    except ImportError:
        return
    fn = getattr(ledger, "record_run", None)
    if not callable(fn):
        return
    try:
        fn(run_id)
    except Exception:  # the ledger must never stop the queue
        _say(f"ledger hook failed for {run_id}:")
        traceback.print_exc()


def _next_queued(tried: set[str]) -> tuple[str | None, bool]:
    """(the oldest queued run this worker has not tried yet whose upstream runs have all
    succeeded, whether queued runs wait for upstream runs). A run it could not start is never
    retried, so a broken run.json cannot spin the worker. A queued run whose upstream run ended
    without succeeding is cancelled here (and recorded) and never started."""
    from rlhf_lab.runs import find_run, queued_runs
    from rlhf_lab.runs.deps import dependency_verdict, queued_cycles
    from rlhf_lab.runs.records import _read_run_json

    waiting: list[str] = []
    for status in queued_runs():
        if status.id in tried or status.slurm_job:  # Slurm queues its own jobs
            continue
        run_dir = find_run(status.id)
        verdict, reason = dependency_verdict(_read_run_json(run_dir) or {})
        if verdict == "ready":
            return status.id, bool(waiting)
        if verdict == "waiting":
            waiting.append(status.id)
            continue
        _cancel(run_dir, reason or "an upstream run did not succeed")
    for run_id, reason in queued_cycles(waiting).items():  # they would wait forever
        _cancel(find_run(run_id), reason)
        waiting.remove(run_id)
    return None, bool(waiting)


def _cancel(run_dir, reason: str) -> None:  # noqa: ANN001
    from rlhf_lab.runs.deps import cancel

    if cancel(run_dir, reason):
        _say(f"{run_dir.name} cancelled: {reason}")
        record_hook(run_dir.name)


def settle_dependents(run_id: str) -> None:
    """A run ended: cancel its queued dependents now if it did not succeed (and record them)."""
    from rlhf_lab.runs.deps import cancel_dependents_of

    try:
        cancelled = cancel_dependents_of(run_id)
    except Exception:  # the queue must never stop over a dependent
        _say(f"could not settle the dependents of {run_id}:")
        traceback.print_exc()
        return
    for dependent in cancelled:
        _say(f"{dependent} cancelled: upstream run {run_id} did not succeed")
        record_hook(dependent)


def run_one(run_id: str) -> None:
    from rlhf_lab.paths import LabError
    from rlhf_lab.runs.launcher import _start_when_free

    try:
        info = _start_when_free(run_id, poll_s=POLL_S)
    except LabError as err:  # e.g. its family's trainer is gone; a stopped run is left alone
        _say(f"could not start {run_id}: {err}")
        from rlhf_lab.runs import _mark_failed, find_run

        try:
            _mark_failed(find_run(run_id), f"queue worker could not start it: {err}")
        except LabError:
            pass
        return
    if info is None:
        _say(f"{run_id} left the queue before it started")
        return
    _say(f"started {run_id} (pid {info.pid}) on {','.join(info.devices) or info.device}")
    # Wait for its end in the background, so the next queued run can start on another free
    # device at once; the thread is not a daemon, so the worker records every run it started
    # before it exits.
    threading.Thread(target=_see_to_the_end, args=(run_id,), name=f"watch-{run_id}").start()


def _see_to_the_end(run_id: str) -> None:
    """Wait until a run the worker started ends, settle its dependents, record it."""
    from rlhf_lab.runs import wait_for_end

    status = wait_for_end(run_id, poll_s=POLL_S)
    _say(f"{run_id} ended: {status.state}")
    settle_dependents(run_id)
    record_hook(run_id)


def record_after_end(run_id: str) -> int:
    """The recorder: wait until ``run_id`` ends, then record it (as :func:`run_one` does)."""
    from rlhf_lab.paths import LabError
    from rlhf_lab.runs import wait_for_end

    try:
        status = wait_for_end(run_id, poll_s=POLL_S)
    except LabError as err:  # the run folder went away: nothing to record
        _say(f"recorder for {run_id} stops: {err}")
        return 0
    _say(f"{run_id} ended: {status.state}; recording it")
    settle_dependents(run_id)
    record_hook(run_id)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--record"] and len(args) == 2:
        return record_after_end(args[1])
    from rlhf_lab.runs import _lab_dir

    lock = FileLock(str(_lab_dir() / "queue.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return 0  # another worker is running
    _say("worker started")
    tried: set[str] = set()
    try:
        while True:
            run_id, waiting = _next_queued(tried)
            if run_id is None and waiting:  # dependents wait for upstream runs: look again
                time.sleep(POLL_S)
                continue
            if run_id is None:
                lock.release()
                if _next_queued(tried) == (None, False):
                    _say("queue empty; worker exits")
                    return 0
                try:
                    lock.acquire(timeout=0)
                except Timeout:
                    return 0  # a newer worker took over
                continue
            tried.add(run_id)
            run_one(run_id)
            time.sleep(0.05)
    finally:
        if lock.is_locked:
            lock.release()


if __name__ == "__main__":
    sys.exit(main())
