"""Runs: create a run folder, launch the trainer detached, derive its state from disk, stop it,
list runs, keep one training job per device, and queue runs behind each other. Torch-free.

A run lives in ``experiments/<campaign>/runs/<run-id>/``. The lab writes ``config.yaml`` and
``run.json``; the wrapper writes ``process.json`` and ``exit.json``; the trainer writes the rest.
The package is split by job:

* :mod:`~rlhf_lab.runs.records` the models (RunInfo, RunStatus, LaunchResult), states, run.json;
* :mod:`~rlhf_lab.runs.process` process identity (pid + create time), liveness, signals, locks;
* :mod:`~rlhf_lab.runs.devices` device resolution, GPU count, the CPU share of a trainer;
* :mod:`~rlhf_lab.runs.launch` checks, argv, environment, prepare / start / launch / resume;
* :mod:`~rlhf_lab.runs.state` derived state, status, listing, stop, waiting, following;
* :mod:`~rlhf_lab.runs.queue` the queue worker and start-when-free.

Every name other modules and tests use is importable from ``rlhf_lab.runs``. The names tests
replace here (``start_run``, ``trainer_argv``, ``ensure_queue_worker``, ``_visible_gpu_count``,
``_cpu_cores``, ``_reap_in_background``, ``_process_alive``, ``STARTING_TIMEOUT_S``) are looked
up through this package at call time, so a replacement here reaches every submodule.
"""

from __future__ import annotations

from rlhf_lab.paths import check_run_id, find_run
from rlhf_lab.runs.devices import (
    DEVICE_RE,
    _cpu_cores,
    _visible_gpu_count,
    cpu_threads_beside,
    resolve_device,
)
from rlhf_lab.runs.launch import (
    _ATTEMPT_FILES,
    FAMILIES,
    RESUMABLE_STATES,
    VERSION_PACKAGES,
    _check_family,
    _checkpoint_steps,
    _git_info,
    _mark_failed,
    _trainer_env,
    _versions,
    launch,
    prepare_run,
    resume_run,
    start_run,
    trainer_argv,
)
from rlhf_lab.runs.process import (
    _alive,
    _device_lock,
    _marker,
    _process_alive,
    _reap_in_background,
    _run_lock,
    _signal_run,
)
from rlhf_lab.runs.queue import _start_when_free, ensure_queue_worker, record_when_ended
from rlhf_lab.runs.records import (
    ACTIVE_STATES,
    LIVE_STATES,
    STATES,
    TERMINAL_STATES,
    UNFINISHED_STATES,
    LaunchResult,
    RunInfo,
    RunState,
    RunStatus,
    _atomic_write_json,
    _atomic_write_text,
    _info,
    _lab_dir,
    _now,
    _parse_time,
    _read_record,
    _source_dir,
)
from rlhf_lab.runs.state import (
    STARTING_TIMEOUT_S,
    STOP_GRACE_S,
    StopResult,
    _all_run_dirs,
    _build_status,
    _collect,
    _derive_state,
    _describe,
    _eta,
    _status,
    _unreadable_run,
    _update_record,
    active_runs,
    follow_run,
    list_runs,
    queued_runs,
    run_state,
    stop_run,
    unfinished_runs,
    wait_for_end,
)

__all__ = [
    "ACTIVE_STATES",
    "DEVICE_RE",
    "FAMILIES",
    "LIVE_STATES",
    "LaunchResult",
    "RESUMABLE_STATES",
    "RunInfo",
    "RunState",
    "RunStatus",
    "STARTING_TIMEOUT_S",
    "STATES",
    "STOP_GRACE_S",
    "StopResult",
    "TERMINAL_STATES",
    "UNFINISHED_STATES",
    "VERSION_PACKAGES",
    "_ATTEMPT_FILES",
    "_alive",
    "_all_run_dirs",
    "_atomic_write_json",
    "_atomic_write_text",
    "_build_status",
    "_check_family",
    "_checkpoint_steps",
    "_collect",
    "_cpu_cores",
    "_derive_state",
    "_describe",
    "_device_lock",
    "_eta",
    "_git_info",
    "_info",
    "_lab_dir",
    "_mark_failed",
    "_marker",
    "_now",
    "_parse_time",
    "_process_alive",
    "_read_record",
    "_reap_in_background",
    "_run_lock",
    "_signal_run",
    "_source_dir",
    "_start_when_free",
    "_status",
    "_trainer_env",
    "_unreadable_run",
    "_update_record",
    "_versions",
    "_visible_gpu_count",
    "active_runs",
    "check_run_id",
    "cpu_threads_beside",
    "ensure_queue_worker",
    "record_when_ended",
    "find_run",
    "follow_run",
    "launch",
    "list_runs",
    "prepare_run",
    "queued_runs",
    "resolve_device",
    "resume_run",
    "run_state",
    "start_run",
    "stop_run",
    "trainer_argv",
    "unfinished_runs",
    "wait_for_end",
]
