"""Creating and starting runs: checks, the trainer's command line and environment, devices, the
run folder, the detached start, the one-job-per-device launch and resume. Torch-free.

The launcher starts ``python -m rlhf_lab._wrapper <run-dir> -- <trainer argv>`` in its own
session (``start_new_session=True``), stdin from /dev/null, stdout+stderr appended to
``train.log``. The wrapper is the process-group leader; the trainer is its child in the same
group. ``run.json`` records the **wrapper's** pid, pgid and psutil create time (the wrapper lives
exactly as long as the run and is the process that writes ``exit.json``); the wrapper's
``process.json`` adds the trainer's pid and create time.

Device exclusivity: :func:`launch` allows one training job per device (``cpu``, ``cuda:N``)
unless the caller's memory check says both fit (``fits_together=True``) or ``force=True``. The
check and the start happen under one lab-wide lock (``process._devices_hold``: launches, the queue
worker and resumes all take it), so two racing starts never both get a device.
``queue=True`` writes the run as ``queued`` and makes sure the queue worker runs.

Functions that tests replace (``start_run``, ``trainer_argv``, ``ensure_queue_worker``,
``_visible_gpu_count``, ``_cpu_cores``, ``_reap_in_background``) are called through the package
(:func:`patchable`).
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Literal

from rlhf_lab.errors import Conflict, InvalidArgument, NextStep, NotFound, NotReady, Unavailable
from rlhf_lab.paths import LabError, campaign_name, experiments_dir, find_run, new_run_id
from rlhf_lab.planning.families import FAMILIES as CATALOG_FAMILIES
from rlhf_lab.runs.devices import (
    Placement,
    cpu_threads_beside,
    freest_gpus,
    physical_gpu_ids,
    resolve_device,
    resolve_placement,
)
from rlhf_lab.runs.process import _devices_hold, _run_lock
from rlhf_lab.runs.records import (
    LaunchResult,
    RunInfo,
    _atomic_write_json,
    _atomic_write_text,
    _info,
    _now,
    _read_record,
    _read_run_json,
    _source_dir,
    patchable,
)
from rlhf_lab.runs.state import _describe, _status, active_runs, held_devices, queued_runs

__all__ = [
    "FAMILIES",
    "launch",
    "prepare_run",
    "resume_run",
    "start_run",
    "trainer_argv",
]

# Families the lab may launch (each runs as `python -m trainers.<family>.train`).
FAMILIES: tuple[str, ...] = tuple(CATALOG_FAMILIES)
# Jobs that are no training family but run like one: job -> its module (rlhf_lab.evaluation.jobs).
JOB_MODULES: dict[str, str] = {"evaluation": "trainers.evaluation.run"}

# Package versions recorded in run.json (importlib.metadata only; nothing is imported).
VERSION_PACKAGES = (
    "rlhf-lab",
    "torch",
    "transformers",
    "tokenizers",
    "datasets",
    "accelerate",
    "reasoning-gym",
    "pydantic",
    "trl",
    "wandb",
    "flash-attn",
)

RESUMABLE_STATES = ("died", "stopped", "killed", "failed")
_ATTEMPT_FILES = ("exit.json", "process.json", "summary.json")


# ---------------------------------------------------------------------------------------------
# Provenance
# ---------------------------------------------------------------------------------------------


def _git_info(cwd: Path) -> tuple[str | None, bool | None]:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=10,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = git("status", "--porcelain")
    return commit.strip() or None, (None if status is None else bool(status.strip()))


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for name in VERSION_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


# ---------------------------------------------------------------------------------------------
# Families, devices, command line, environment
# ---------------------------------------------------------------------------------------------


def _check_family(family: str) -> str:
    """``family`` when the lab can launch it (known, with a trainer); a typed error otherwise."""
    if family in JOB_MODULES:
        return family
    if family not in FAMILIES:
        raise InvalidArgument(
            f"unknown family {family!r}; known families: {', '.join(FAMILIES)}",
            next=NextStep("list_recipes"),
        )
    if not (_source_dir() / "trainers" / family / "train.py").is_file():
        raise Unavailable(
            f"family {family!r} has no trainer yet (trainers/{family}/train.py is missing)",
            next=NextStep("list_recipes"),
        )
    return family


def trainer_argv(
    family: str, run_dir: Path, resume: bool = False, nproc: int | None = None
) -> list[str]:
    """The trainer's command line: the resolved config.yaml already holds every override.
    With ``nproc`` the trainer runs under torchrun (one machine, ``--standalone``: a c10d
    rendezvous on a free local port) with that many ranks."""
    launcher = [sys.executable]
    if nproc is not None:
        launcher += ["-m", "torch.distributed.run", *torchrun_args(nproc)]
    argv = [
        *launcher,
        "-m",
        JOB_MODULES.get(family, f"trainers.{family}.train"),
        "--config",
        str(run_dir / "config.yaml"),
        "--run-dir",
        str(run_dir),
    ]
    return [*argv, "--resume"] if resume else argv


def torchrun_args(nproc: int, nnodes: int = 1, endpoint: str | None = None) -> list[str]:
    """torchrun's options: one machine standalone, or ``nnodes`` machines meeting at the c10d
    rendezvous ``endpoint`` (host:port of the first node)."""
    if nnodes == 1 and endpoint is None:
        return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc)]
    return [
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        str(endpoint),
    ]


def _trainer_env(
    device: str, sharing: int = 0, devices: list[str] | None = None, nproc: int = 1
) -> dict[str, str]:
    """The trainer's environment. A CPU trainer started beside ``sharing`` other CPU runs gets
    ``OMP_NUM_THREADS`` (torch's intra-op threads) set to its share of the cores, divided among
    its ``nproc`` ranks, unless the caller's environment already sets it. A GPU run sees exactly
    its ``devices`` (``CUDA_VISIBLE_DEVICES``, in nvidia-smi order)."""
    env = dict(os.environ)
    cpu_split = device == "cpu" and (sharing > 0 or nproc > 1)
    if cpu_split and "OMP_NUM_THREADS" not in os.environ:
        share = cpu_threads_beside(sharing, patchable()._cpu_cores())
        env["OMP_NUM_THREADS"] = str(max(1, share // max(nproc, 1)))
    env["PYTHONUNBUFFERED"] = "1"
    src = str(_source_dir())
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([src, *[p for p in parts if p != src]])
    gpus = [d for d in (devices or [device]) if d.startswith("cuda:")]
    if gpus:
        if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(physical_gpu_ids(gpus))
    return env


# ---------------------------------------------------------------------------------------------
# Create and start
# ---------------------------------------------------------------------------------------------


def _config_text(config_data: dict) -> str:
    """The resolved config as YAML, or a typed error when it cannot be one."""
    if not isinstance(config_data, dict) or not config_data:
        raise InvalidArgument("config_data must be the resolved config as a non-empty mapping")
    import yaml

    try:
        return yaml.safe_dump(config_data, sort_keys=False)
    except yaml.YAMLError as err:
        raise InvalidArgument(f"the config cannot be written as YAML: {err}") from None


def prepare_run(
    family: str,
    algorithm: str,
    config_data: dict,
    campaign: str,
    config_source: str,
    overrides: list[str],
    *,
    device: str = "auto",
    state: Literal["queued", "starting"] = "starting",
    after: list[str] | None = None,
    references: dict[str, str] | None = None,
    pipeline: str | None = None,
    stage: str | None = None,
    placement: Placement | None = None,
    slurm: dict | None = None,
    predicted_time: dict | None = None,
) -> RunInfo:
    """Create ``experiments/<campaign>/runs/<run-id>/`` with ``config.yaml`` (the resolved config)
    and ``run.json``. Every input is checked first: nothing is created for an invalid one.
    ``after``: upstream run ids (checked by the caller, :func:`rlhf_lab.runs.deps.check_after`);
    ``references``: config key -> upstream run id of each ``run:<id>`` value; ``pipeline`` and
    ``stage`` name the pipeline stage the run is. ``placement``: its devices and ranks (None:
    ``device``); ``slurm``: the Slurm job options of a cluster run (:mod:`rlhf_lab.runs.slurm`);
    ``predicted_time``: the wall-time prediction to keep in run.json."""
    _check_family(family)
    name = campaign_name(campaign)
    config_text = _config_text(config_data)
    if state not in ("queued", "starting"):
        raise InvalidArgument(f"a new run starts as queued or starting, not {state!r}")
    if placement is None:
        placement = Placement(devices=[resolve_device(device, config_data)])
    resolved = "slurm" if slurm else placement.device
    overrides = [str(o) for o in (overrides or [])]
    try:
        run_id = new_run_id(algorithm)
    except LabError:
        raise InvalidArgument(
            f"bad algorithm name {algorithm!r}: lowercase letters, digits, '_' or '-'",
            next=NextStep("list_recipes"),
        ) from None

    runs_dir = experiments_dir() / name / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    run_dir = runs_dir / run_id
    run_dir.mkdir()  # a fresh id: an existing folder is an error, never reused
    _atomic_write_text(run_dir / "config.yaml", config_text)
    record = {
        "id": run_id,
        "family": family,
        "algorithm": algorithm,
        "campaign": name,
        "device": resolved,
        "config_source": str(config_source) if config_source is not None else None,
        "overrides": overrides,
        "argv": _argv(family, run_dir, placement.nproc if placement.distributed else None),
        "cwd": str(_source_dir()),
        "state": state,
        "created_at": _now(),
    }
    if placement.devices:
        record["devices"] = list(placement.devices)
    if placement.gpus_wanted and not placement.devices:
        record["gpus_wanted"] = placement.gpus_wanted
    if placement.distributed:
        record["nproc"] = placement.nproc
    if slurm:
        record["slurm"] = dict(slurm)
    if after:
        record["after"] = list(after)
    if references:
        record["references"] = dict(references)
    if pipeline:
        record.update(pipeline=pipeline, stage=stage)
    if predicted_time:  # the lab's wall-time prediction (rlhf_lab.planning.time)
        record["predicted_time"] = dict(predicted_time)
    _atomic_write_json(run_dir / "run.json", record)
    return RunInfo(run_dir=str(run_dir), **record)


def _argv(family: str, run_dir: Path, nproc: int | None, resume: bool = False) -> list[str]:
    """:func:`trainer_argv` through the package (tests replace it), under torchrun with
    ``nproc`` ranks when given."""
    extra = {"nproc": nproc} if nproc is not None else {}
    return patchable().trainer_argv(family, run_dir, resume=resume, **extra)


def _held_devices(exclude: str | None = None) -> set[str]:
    """Every device a live run other than ``exclude`` holds."""
    return {d for s in active_runs() if s.id != exclude for d in s.devices}


def _pick_gpus(run_id: str, record: dict) -> list[str]:
    """The devices of a run whose GPUs the lab picks at start: the freest free ones."""
    wanted = int(record.get("gpus_wanted") or 1)
    picked = freest_gpus(wanted, _held_devices(exclude=run_id))
    if picked is None:
        raise NotReady(
            f"run {run_id} needs {wanted} free GPU(s) and fewer are free now",
            next=NextStep("launch_run", {"queue": True}, note="starts when they free up"),
        )
    return picked


def _spawn(wrapper: list[str], cwd: Path, env: dict[str, str], log) -> subprocess.Popen:  # noqa: ANN001
    """Start the wrapper detached in its own session, its output appended to ``log``."""
    try:
        return subprocess.Popen(
            wrapper,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as err:
        raise Unavailable(f"could not start {sys.executable}: {err}") from None


def _identity(pid: int) -> tuple[float | None, int]:
    """(psutil create time, process group) of a process just started."""
    import psutil

    try:
        create_time = psutil.Process(pid).create_time()
    except psutil.Error:
        create_time = None
    try:
        pgid = os.getpgid(pid)
    except OSError:
        pgid = pid  # start_new_session: the wrapper leads its own group
    return create_time, pgid


def start_run(run_id: str) -> RunInfo:
    """Start a queued or starting run detached and return at once (state ``running``)."""
    lab = patchable()
    run_dir = find_run(run_id)
    # other CPU runs, read before taking this run's lock (reading a status may take its lock)
    cpu_runs = [s.id for s in active_runs("cpu") if s.id != run_id]
    with _run_lock(run_dir):
        record = _read_record(run_dir)
        if record.get("state") not in ("queued", "starting") or record.get("pid"):
            raise NotReady(
                f"run {run_id} is {record.get('state')}; only a queued run can be started",
                next=NextStep("launch_run", note="a new run"),
            )
        family = _check_family(record.get("family", ""))
        if record.get("gpus_wanted") and not record.get("devices"):
            record["devices"] = _pick_gpus(run_id, record)
            record["device"] = record["devices"][0]
        devices = held_devices(record) or [resolve_device(record.get("device") or "auto")]
        device = devices[0]
        nproc = record.get("nproc") if isinstance(record.get("nproc"), int) else None
        argv = _argv(family, run_dir, nproc, resume=bool(record.get("resumes")))
        wrapper = [sys.executable, "-m", "rlhf_lab._wrapper", str(run_dir), "--", *argv]
        cwd = _source_dir()
        commit, dirty = _git_info(cwd)
        record.update(
            argv=argv,
            wrapper_argv=wrapper,
            cwd=str(cwd),
            host=socket.gethostname(),
            git_commit=commit,
            git_dirty=dirty,
            versions=_versions(),
        )
        sharing = cpu_runs if device == "cpu" else []
        env = _trainer_env(device, len(sharing), devices, nproc or 1)
        if "OMP_NUM_THREADS" in env:
            record["cpu_threads"] = int(env["OMP_NUM_THREADS"])
        started = _now()
        with (run_dir / "train.log").open("ab") as log:
            log.write(f"[rlhf-lab] {started} on {record['host']}: {shlex.join(argv)}\n".encode())
            if env.get("OMP_NUM_THREADS") != os.environ.get("OMP_NUM_THREADS"):  # set by us
                beside = f"sharing the CPU with {', '.join(sharing)}" if sharing else "the CPU"
                ranks = f", {nproc} ranks" if nproc else ""
                log.write(
                    f"[rlhf-lab] {beside}: {env['OMP_NUM_THREADS']} intra-op thread(s)"
                    f"{' per rank' if nproc else ''}{ranks}\n".encode()
                )
            if nproc and device != "cpu":
                log.write(
                    f"[rlhf-lab] devices {', '.join(devices)} (CUDA_VISIBLE_DEVICES="
                    f"{env.get('CUDA_VISIBLE_DEVICES')}), {nproc} ranks\n".encode()
                )
            log.flush()
            proc = _spawn(wrapper, cwd, env, log)
        create_time, pgid = _identity(proc.pid)
        lab._reap_in_background(proc)
        record.update(
            pid=proc.pid,
            pgid=pgid,
            create_time=create_time,
            state="running",
            started_at=started,
        )
        _atomic_write_json(run_dir / "run.json", record)
        return _info(run_dir, record)


def _mark_failed(run_dir: Path, error: str) -> None:
    """A run that never got a process (its start failed) ends as failed."""
    with _run_lock(run_dir):
        record = _read_run_json(run_dir) or {}
        if record.get("state") not in ("queued", "starting") or record.get("pid"):
            return
        record.update(state="failed", ended_at=_now(), error=error)
        _atomic_write_json(run_dir / "run.json", record)


# ---------------------------------------------------------------------------------------------
# Launch (one training job per device) and resume
# ---------------------------------------------------------------------------------------------


def _busy_error(dev: str, busy: list, why: str | None, *, resuming: str | None = None) -> Conflict:
    """The refusal of a start on a device another run trains on, with the ways forward."""
    first = busy[0]
    more = f" (and {len(busy) - 1} more)" if len(busy) > 1 else ""
    reason = f" ({why})" if why else ""
    if resuming is not None:
        steps = [
            NextStep("run_status", {"run_id": first.id}, note="wait for it to end"),
            NextStep("resume_run", {"run_id": resuming, "force": True}, note="resume anyway"),
        ]
        return Conflict(
            f"device {dev} is busy: run {_describe(first)} is training on it{more}; one training "
            f"job per device{reason}",
            next=steps,
        )
    steps = [
        NextStep("run_status", {"run_id": first.id}, note="wait for it to end"),
        NextStep("launch_run", {"queue": True}, note="start after it ends"),
        NextStep("launch_run", {"force": True}, note="start anyway"),
    ]
    return Conflict(
        f"device {dev} is busy: run {_describe(first)} is training on it{more}; one training "
        f"job per device{reason}",
        next=steps,
    )


def launch(
    family: str,
    algorithm: str,
    config_data: dict,
    campaign: str,
    config_source: str,
    overrides: list[str],
    *,
    device: str = "auto",
    force: bool = False,
    queue: bool = False,
    fits_together: bool | None = None,
    after: list[str] | None = None,
    references: dict[str, str] | None = None,
    pipeline: str | None = None,
    stage: str | None = None,
    placement: Placement | None = None,
    slurm: dict | None = None,
    predicted_time: dict | None = None,
) -> LaunchResult:
    """Create a run and start it detached, or queue it behind the device's current job.

    One training job per device: another job on the device is an error (naming it) unless
    ``fits_together`` (the caller's memory check said both fit) or ``force``. ``queue=True``
    writes the run as ``queued`` and makes sure the queue worker runs. ``after``: upstream run
    ids (checked by the caller); while one of them has not succeeded the run is queued and the
    queue worker starts it once they all have (or cancels it when one fails). ``placement``:
    its devices and ranks (:func:`~rlhf_lab.runs.devices.resolve_placement`; default: from
    ``device``); a run on several devices holds each, and a GPU left to the lab is the freest one
    no run holds (picked when it starts, for a queued run).
    """
    from rlhf_lab.runs.deps import waiting_for

    lab = patchable()
    _check_family(family)
    campaign_name(campaign)
    if placement is None:
        placement = resolve_placement(device, None, None, config_data)
    links = {"after": after, "references": references, "pipeline": pipeline, "stage": stage}
    made = {"placement": placement, "slurm": slurm, "predicted_time": predicted_time}
    upstream = waiting_for({"after": list(after or [])})
    if queue or upstream:
        info = prepare_run(
            family,
            algorithm,
            config_data,
            campaign,
            config_source,
            overrides,
            state="queued",
            **links,
            **made,
        )
        ahead = [s.id for s in queued_runs()]
        position = ahead.index(info.id) + 1 if info.id in ahead else None
        lab.ensure_queue_worker()
        where = _where(placement)
        busy = sorted({s.id for d in placement.devices for s in active_runs(d)} - set(upstream))
        msg = f"queued {info.id} on {where} (position {position})"
        if upstream:
            msg += f"; starts once {', '.join(upstream)} succeeded"
        if busy:
            msg += f"; waits for {', '.join(busy)}"
        return LaunchResult(
            run=info,
            state="queued",
            queued=True,
            queue_position=position,
            device=placement.device,
            devices=placement.devices,
            message=msg,
        )

    with _devices_hold():  # the check and the hold are one step (process._devices_hold)
        if not placement.devices:  # the freest GPUs no run holds, else the freest GPUs
            picked = freest_gpus(placement.gpus_wanted, _held_devices())
            chosen = picked or freest_gpus(placement.gpus_wanted, set()) or []
            placement = placement.model_copy(update={"devices": chosen, "gpus_wanted": 0})
            made["placement"] = placement
        busy = _busy_on(placement.devices)
        if busy and not force and not fits_together:
            why = (
                "the memory check said both do not fit"
                if fits_together is False
                else "no memory check said both fit"
            )
            raise _busy_error(_where(placement), busy, why)
        info = prepare_run(
            family, algorithm, config_data, campaign, config_source, overrides, **links, **made
        )
        try:
            info = lab.start_run(info.id)
        except Exception as err:
            _mark_failed(Path(info.run_dir), f"could not start: {err}")
            raise
    shared = [s.id for s in busy]
    msg = f"started {info.id} on {_where(placement)} (pid {info.pid})"
    if shared:
        msg += f", sharing the device with {', '.join(shared)}"
    return LaunchResult(
        run=info,
        state="running",
        device=placement.device,
        devices=placement.devices,
        sharing_device_with=shared,
        message=msg,
    )


def _where(placement: Placement) -> str:
    """``cuda:0``, ``cuda:0,cuda:1 (2 ranks)``, ``cpu (2 ranks)`` or ``the freest GPU``."""
    if not placement.devices:
        n = placement.gpus_wanted
        return "the freest free GPU" if n == 1 else f"the {n} freest free GPUs"
    where = ",".join(placement.devices)
    return where + (f" ({placement.nproc} ranks)" if placement.nproc > 1 else "")


def _busy_on(devices: list[str], exclude: str | None = None) -> list:
    """Live runs (other than ``exclude``) holding any of ``devices``, each once."""
    seen: dict[str, object] = {}
    for dev in devices:
        for status in active_runs(dev):
            if status.id != exclude:
                seen.setdefault(status.id, status)
    return list(seen.values())


def _checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints (``checkpoints/step-<N>``; temp folders are partial)."""
    steps = []
    for path in (run_dir / "checkpoints").glob("step-*"):
        tail = path.name.removeprefix("step-")
        if path.is_dir() and tail.isdigit() and (path / "state.pt").is_file():
            steps.append(int(tail))
    return sorted(steps)


def _check_resumable(run_id: str, state: str, run_dir: Path) -> list[int]:
    """The run's checkpoint steps, or a typed error when it cannot be resumed."""
    if state not in RESUMABLE_STATES:
        if state == "succeeded":
            raise Conflict(
                f"run {run_id} is succeeded; only a died, stopped or failed run can be resumed "
                "(it finished; launch a new run to train further)",
                next=NextStep("launch_run", note="a new run"),
            )
        if state == "queued":
            raise NotReady(
                f"run {run_id} is queued; only a died, stopped or failed run can be resumed "
                "(it has not started yet)",
                next=NextStep("run_status", {"run_id": run_id}),
            )
        raise NotReady(
            f"run {run_id} is {state}; only a died, stopped or failed run can be resumed "
            "(stop it first)",
            next=NextStep("stop_run", {"run_id": run_id}),
        )
    steps = _checkpoint_steps(run_dir)
    if not steps:
        raise NotFound(
            f"run {run_id} has no checkpoint in {run_dir / 'checkpoints'} (it ended before the "
            "first one; `checkpoint.save_every` sets how often they are written); launch it "
            "again instead",
            next=NextStep("launch_run", note="the same config, as a new run"),
        )
    return steps


def _archive_attempt(run_dir: Path, record: dict, from_step: int, devices: list[str]) -> dict:
    """Record how the previous attempt ended (run.json ``resumes``), move its exit/process/
    summary files to ``attempts/<n>/`` and mark the run ``starting`` again. Returns the record."""
    previous = {
        k: record.get(k)
        for k in ("state", "started_at", "ended_at", "exit_code", "signal", "error")
    }
    previous.update(from_step=from_step, resumed_at=_now())
    resumes = [*record.get("resumes", []), previous]
    keep = run_dir / "attempts" / str(len(resumes))
    keep.mkdir(parents=True, exist_ok=True)
    for name in _ATTEMPT_FILES:  # a stale exit/summary must not decide the new state
        if (run_dir / name).exists():
            os.replace(run_dir / name, keep / name)
    for key in (
        "pid",
        "pgid",
        "create_time",
        "ended_at",
        "exit_code",
        "signal",
        "error",
        "stop_requested_at",
        "killed_at",
        "started_at",
    ):
        record.pop(key, None)
    record.update(state="starting", starting_at=_now(), device=devices[0], resumes=resumes)
    if len(devices) > 1 or record.get("devices"):
        record["devices"] = list(devices)
    _atomic_write_json(run_dir / "run.json", record)
    return record


def _rearm_cancelled(run_id: str, run_dir: Path, dev: str) -> LaunchResult:
    """ "Resuming" a cancelled run (it never started): queue it again when none of its upstream
    runs is failed any more (each was resumed or is running), else say which to resume."""
    from rlhf_lab.runs.deps import failed_upstream, rearm

    record = _read_record(run_dir)
    failed = failed_upstream(record)
    if failed:
        up, state = failed
        raise NotReady(
            f"run {run_id} was cancelled because upstream run {up} is {state or 'gone'}; "
            f"resume {up} first (that re-arms {run_id})",
            next=NextStep("resume_run", {"run_id": up}),
        )
    if not rearm(run_dir):
        raise Conflict(
            f"run {run_id} is no longer cancelled; not re-armed",
            next=NextStep("run_status", {"run_id": run_id}),
        )
    patchable().ensure_queue_worker()
    info = _info(run_dir, _read_record(run_dir))
    return LaunchResult(
        run=info,
        state="queued",
        queued=True,
        device=dev,
        message=f"{run_id} never started (cancelled); queued again after {', '.join(info.after)}",
    )


def resume_run(
    run_id: str,
    *,
    device: str | None = None,
    force: bool = False,
    fits_together: bool | None = None,
) -> LaunchResult:
    """Start a died, stopped or failed run again from its last checkpoint, in the same folder.

    The trainer runs with ``--resume``: it loads the model, optimizer, scheduler, RNG and data
    position of the last checkpoint and drops the metrics rows logged after it, so the run ends
    where an uninterrupted one would. How the previous attempt ended is kept in run.json
    (``resumes``) and its exit/process/summary files are moved to ``attempts/<n>/``.
    The device rule of :func:`launch` applies.
    """
    lab = patchable()
    run_dir = find_run(run_id)
    status = _status(run_dir)
    if status.state == "cancelled":
        return _rearm_cancelled(run_id, run_dir, status.device or "cpu")
    steps = _check_resumable(run_id, status.state, run_dir)
    record = _read_record(run_dir)
    if record.get("slurm"):
        raise Conflict(
            f"run {run_id} is a Slurm job: it resumes as a new job (rlhf_lab.api.resume_run)",
            next=NextStep("resume_run", {"run_id": run_id}),
        )
    devices = held_devices(record) if device is None else []
    if len(devices) <= 1:  # a run on several devices resumes on the same set (same world size)
        devices = [resolve_device(device or status.device or "auto")]
    dev = ",".join(devices)
    with _devices_hold():
        busy = _busy_on(devices, exclude=run_id)
        if busy and not force and not fits_together:
            raise _busy_error(dev, busy, None, resuming=run_id)
        with _run_lock(run_dir):
            record = _read_record(run_dir)
            if record.get("state") not in RESUMABLE_STATES:
                raise Conflict(
                    f"run {run_id} became {record.get('state')} meanwhile; not resumed",
                    next=NextStep("run_status", {"run_id": run_id}),
                )
            _archive_attempt(run_dir, record, steps[-1], devices)
        try:
            info = lab.start_run(run_id)
        except Exception as err:
            _mark_failed(run_dir, f"could not start: {err}")
            raise
    msg = f"resumed {run_id} from checkpoint step {steps[-1]} on {dev} (pid {info.pid})"
    from rlhf_lab.runs.deps import rearm_dependents

    rearmed = rearm_dependents(run_id)
    if rearmed:
        lab.ensure_queue_worker()
        msg += f"; its dependents {', '.join(rearmed)} are queued again and wait for it"
    return LaunchResult(
        run=info,
        state="running",
        device=devices[0],
        devices=devices,
        sharing_device_with=[s.id for s in busy],
        message=msg,
        rearmed=rearmed,
    )
