"""Runs: create a run folder, launch the trainer detached, derive its state from disk, stop it,
list runs, keep one training job per device, and queue runs behind each other. Torch-free.

A run lives in ``experiments/<campaign>/runs/<run-id>/``. The lab writes ``config.yaml`` and
``run.json``; the wrapper writes ``process.json`` and ``exit.json``; the trainer writes the rest.
The package is split by job:

* :mod:`~rlhf_lab.runs.records` the models (RunInfo, RunStatus, LaunchResult), states, run.json;
* :mod:`~rlhf_lab.runs.process` process identity (pid + create time), liveness, signals, locks;
* :mod:`~rlhf_lab.runs.devices` device resolution, GPU count, the CPU share of a trainer;
* :mod:`~rlhf_lab.runs.launcher` a new run (:class:`NewRun`): checks, argv, environment, prepare /
  start / start-or-queue; :mod:`~rlhf_lab.runs.resume` resuming a run;
* :mod:`~rlhf_lab.runs.state` derived state, status, listing, stop, waiting, following;
* :mod:`~rlhf_lab.runs.queue` starting the detached queue worker and a run's recorder;
* :mod:`~rlhf_lab.runs.supervisor` the run supervisor: how a trainer's command line is built,
  how runs, the queue worker and the recorder are started, how a process is checked for life
  and reaped, the start timeout and the clock of the run state; read at call time, replaced for
  a block with :func:`~rlhf_lab.runs.supervisor.supervised_by`.

Every name other modules and tests use is importable from ``rlhf_lab.runs``. Nothing is replaced
here: the lab's two seams are :mod:`~rlhf_lab.runs.supervisor` (how runs are started and
watched) and :mod:`~rlhf_lab.runs.machine` (what the machine has: GPUs, cores, RAM).

Names are loaded on first use (PEP 562 ``__getattr__``), so importing one module of the package
(``rlhf_lab.runs.folder``, the run-folder reader the index and the ledger use) does not load the
launcher. The package also holds the run-side modules moved here from the lab's top level:
:mod:`~rlhf_lab.runs.folder` (reading a run folder), :mod:`~rlhf_lab.runs.log` (train.log),
:mod:`~rlhf_lab.runs.lineage` (``run:<id>`` references), :mod:`~rlhf_lab.runs.machine` (what the
machine has, one seam) over :mod:`~rlhf_lab.runs.resources` (its real queries),
:mod:`~rlhf_lab.runs.pipelines` (chains of runs), :mod:`~rlhf_lab.runs.slurm` and
:mod:`~rlhf_lab.runs.slurm_runs` (cluster runs).
"""

from __future__ import annotations

from rlhf_lab._lazy import lazy_attributes

# name -> module it is loaded from on first use
_LAZY: dict[str, str] = {
    "check_run_id": "rlhf_lab.paths",
    "find_run": "rlhf_lab.paths",
    "DEVICE_RE": "rlhf_lab.runs.devices",
    "Placement": "rlhf_lab.runs.devices",
    "cpu_threads_beside": "rlhf_lab.runs.devices",
    "freest_gpus": "rlhf_lab.runs.devices",
    "parse_gpus": "rlhf_lab.runs.devices",
    "resolve_device": "rlhf_lab.runs.devices",
    "resolve_placement": "rlhf_lab.runs.devices",
    "visible_gpus": "rlhf_lab.runs.devices",
    "FAMILIES": "rlhf_lab.runs.launcher",
    "NewRun": "rlhf_lab.runs.launcher",
    "VERSION_PACKAGES": "rlhf_lab.runs.launcher",
    "_check_family": "rlhf_lab.runs.launcher",
    "_git_info": "rlhf_lab.runs.launcher",
    "_mark_failed": "rlhf_lab.runs.launcher",
    "_trainer_env": "rlhf_lab.runs.launcher",
    "_versions": "rlhf_lab.runs.launcher",
    "prepare_run": "rlhf_lab.runs.launcher",
    "start_or_queue": "rlhf_lab.runs.launcher",
    "start_run": "rlhf_lab.runs.launcher",
    "torchrun_args": "rlhf_lab.runs.launcher",
    "_ATTEMPT_FILES": "rlhf_lab.runs.resume",
    "RESUMABLE_STATES": "rlhf_lab.runs.resume",
    "_checkpoint_steps": "rlhf_lab.runs.resume",
    "resume_run": "rlhf_lab.runs.resume",
    "_alive": "rlhf_lab.runs.process",
    "_device_lock": "rlhf_lab.runs.process",
    "_devices_hold": "rlhf_lab.runs.process",
    "_marker": "rlhf_lab.runs.process",
    "_process_alive": "rlhf_lab.runs.process",
    "_run_lock": "rlhf_lab.runs.process",
    "_signal_run": "rlhf_lab.runs.process",
    "_start_when_free": "rlhf_lab.runs.launcher",
    "ACTIVE_STATES": "rlhf_lab.runs.records",
    "LIVE_STATES": "rlhf_lab.runs.records",
    "STATES": "rlhf_lab.runs.records",
    "TERMINAL_STATES": "rlhf_lab.runs.records",
    "UNFINISHED_STATES": "rlhf_lab.runs.records",
    "LaunchResult": "rlhf_lab.runs.records",
    "RunInfo": "rlhf_lab.runs.records",
    "RunState": "rlhf_lab.runs.records",
    "RunStatus": "rlhf_lab.runs.records",
    "_atomic_write_json": "rlhf_lab.runs.records",
    "_atomic_write_text": "rlhf_lab.runs.records",
    "_info": "rlhf_lab.runs.records",
    "_lab_dir": "rlhf_lab.runs.records",
    "_now": "rlhf_lab.runs.records",
    "_parse_time": "rlhf_lab.runs.records",
    "_read_record": "rlhf_lab.runs.records",
    "_source_dir": "rlhf_lab.runs.records",
    "STOP_GRACE_S": "rlhf_lab.runs.stopping",
    "StopResult": "rlhf_lab.runs.stopping",
    "_all_run_dirs": "rlhf_lab.runs.state",
    "_build_status": "rlhf_lab.runs.state",
    "_collect": "rlhf_lab.runs.state",
    "_derive_state": "rlhf_lab.runs.state",
    "_eta": "rlhf_lab.runs.state",
    "_status": "rlhf_lab.runs.state",
    "_unreadable_run": "rlhf_lab.runs.state",
    "_update_record": "rlhf_lab.runs.state",
    "active_runs": "rlhf_lab.runs.state",
    "follow_run": "rlhf_lab.runs.state",
    "list_runs": "rlhf_lab.runs.state",
    "queued_runs": "rlhf_lab.runs.state",
    "run_state": "rlhf_lab.runs.state",
    "stop_run": "rlhf_lab.runs.stopping",
    "unfinished_runs": "rlhf_lab.runs.state",
    "wait_for_end": "rlhf_lab.runs.state",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
