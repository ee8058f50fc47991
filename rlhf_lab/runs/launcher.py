"""Creating and starting runs: checks, the trainer's command line and environment, devices, the
run folder, the detached start, the one-job-per-device launch and resume. Torch-free.

The launcher starts ``python -m rlhf_lab._wrapper <run-dir> -- <trainer argv>`` in its own
session (``start_new_session=True``), stdin from /dev/null, stdout+stderr appended to
``train.log``. The wrapper is the process-group leader; the trainer is its child in the same
group. ``run.json`` records the **wrapper's** pid, pgid and psutil create time (the wrapper lives
exactly as long as the run and is the process that writes ``exit.json``); the wrapper's
``process.json`` adds the trainer's pid and create time.

A run to create is a :class:`NewRun` (the resolved config and where it goes; built by
:func:`rlhf_lab.api.launch` from a request, or by an evaluation job). Its steps:
:func:`prepare_run` writes the folder (``config.yaml`` and ``run.json``, once), :func:`start_run`
starts its process, and :func:`start_or_queue` does both or queues it. Resuming is
:mod:`rlhf_lab.runs.resume`.

Device exclusivity: :func:`start_or_queue` allows one training job per device (``cpu``,
``cuda:N``) unless the caller's memory check says both fit (``fits_together=True``) or
``force=True``. The check and the start happen under one lab-wide lock
(``process._devices_hold``: launches, the queue worker and resumes all take it), so two racing
starts never both get a device. ``queue=True`` writes the run as ``queued`` and makes sure the
queue worker runs; the worker starts each queued run with :func:`_start_when_free`.

The trainer's command line, the start of a run, the queue worker and the reaping of a started
process are the run supervisor's (:mod:`rlhf_lab.runs.supervisor`), read at call time, so a
caller can run the launcher with a stand-in trainer or without a queue worker.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rlhf_lab.errors import Conflict, InvalidArgument, NextStep, NotReady, Unavailable
from rlhf_lab.paths import LabError, campaign_name, experiments_dir, find_run, new_run_id
from rlhf_lab.planning.families import FAMILIES as CATALOG_FAMILIES
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.runs.devices import (
    Placement,
    cpu_threads_beside,
    freest_gpus,
    physical_gpu_ids,
    resolve_device,
    resolve_placement,
)
from rlhf_lab.runs.machine import this_machine
from rlhf_lab.runs.process import _devices_hold, _reap_in_background, _run_lock
from rlhf_lab.runs.queue import ensure_queue_worker
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
)
from rlhf_lab.runs.state import active_runs, describe_run, held_devices, queued_runs, run_state
from rlhf_lab.runs.supervisor import supervisor

__all__ = [
    "FAMILIES",
    "NewRun",
    "prepare_run",
    "start_or_queue",
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
        share = cpu_threads_beside(sharing, this_machine().cpu_cores())
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


def _config_text(config: TrainerConfig) -> str:
    """The resolved config as YAML, or a typed error when it cannot be one."""
    if not config.to_data():  # an empty config
        raise InvalidArgument("config_data must be the resolved config as a non-empty mapping")
    import yaml

    try:
        return config.to_yaml()
    except yaml.YAMLError as err:
        raise InvalidArgument(f"the config cannot be written as YAML: {err}") from None


class NewRun(BaseModel):
    """A run to create: the resolved config the trainer runs and where the run goes. What
    :func:`prepare_run` writes, once, as the run's ``config.yaml`` and ``run.json``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    family: str
    algorithm: str
    config: TrainerConfig = Field(description="the resolved config (config.yaml)")
    campaign: str
    source: str = Field(description="the YAML file the config starts from")
    overrides: list[str] = Field(default_factory=list, description="the overrides applied")
    device: str = Field(default="auto", description="where it trains when placement is None")
    placement: Placement | None = Field(default=None, description="its devices and ranks")
    after: list[str] = Field(default_factory=list, description="upstream runs it waits for")
    references: dict[str, str] = Field(
        default_factory=dict, description="config key -> the run:<id> it names"
    )
    pipeline: str | None = None
    stage: str | None = None
    slurm: dict[str, Any] | None = Field(default=None, description="a Slurm job's run.json block")
    predicted_time: dict[str, Any] | None = Field(
        default=None, description="the wall-time prediction kept in run.json"
    )


def _run_record(run: NewRun, run_id: str, run_dir: Path, placement: Placement, state: str) -> dict:
    """The run.json of a new run (its keys as the contract names them)."""
    record = {
        "id": run_id,
        "family": run.family,
        "algorithm": run.algorithm,
        "campaign": campaign_name(run.campaign),
        "device": "slurm" if run.slurm else placement.device,
        "config_source": str(run.source) if run.source is not None else None,
        "overrides": [str(o) for o in run.overrides],
        "argv": _argv(run.family, run_dir, placement.nproc if placement.distributed else None),
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
    if run.slurm:
        record["slurm"] = dict(run.slurm)
    if run.after:
        record["after"] = list(run.after)
    if run.references:
        record["references"] = dict(run.references)
    if run.pipeline:
        record.update(pipeline=run.pipeline, stage=run.stage)
    if run.predicted_time:  # the lab's wall-time prediction (rlhf_lab.planning.time)
        record["predicted_time"] = dict(run.predicted_time)
    return record


def prepare_run(run: NewRun, state: Literal["queued", "starting"] = "starting") -> RunInfo:
    """Create ``experiments/<campaign>/runs/<run-id>/`` with ``config.yaml`` (the resolved config)
    and ``run.json``. Every input is checked first: nothing is created for an invalid one.
    ``run.after`` holds upstream run ids (checked by the caller,
    :func:`rlhf_lab.runs.deps.check_after`); ``run.placement`` its devices and ranks (None:
    ``run.device``); ``run.slurm`` the Slurm job block of a cluster run
    (:mod:`rlhf_lab.runs.slurm`)."""
    _check_family(run.family)
    name = campaign_name(run.campaign)
    config_text = _config_text(run.config)
    if state not in ("queued", "starting"):
        raise InvalidArgument(f"a new run starts as queued or starting, not {state!r}")
    placement = run.placement or Placement(devices=[resolve_device(run.device, run.config)])
    try:
        run_id = new_run_id(run.algorithm)
    except LabError:
        raise InvalidArgument(
            f"bad algorithm name {run.algorithm!r}: lowercase letters, digits, '_' or '-'",
            next=NextStep("list_recipes"),
        ) from None

    runs_dir = experiments_dir() / name / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    run_dir = runs_dir / run_id
    run_dir.mkdir()  # a fresh id: an existing folder is an error, never reused
    _atomic_write_text(run_dir / "config.yaml", config_text)
    record = _run_record(run, run_id, run_dir, placement, state)
    _atomic_write_json(run_dir / "run.json", record)
    return RunInfo(run_dir=str(run_dir), **record)


def _argv(family: str, run_dir: Path, nproc: int | None, resume: bool = False) -> list[str]:
    """The supervisor's trainer command line (:func:`trainer_argv` unless replaced), under
    torchrun with ``nproc`` ranks when given."""
    extra = {"nproc": nproc} if nproc is not None else {}
    build = supervisor().trainer_argv or trainer_argv
    return build(family, run_dir, resume=resume, **extra)


def _start(run_id: str) -> RunInfo:
    """Start the run the supervisor's way (:func:`start_run` unless replaced)."""
    return (supervisor().start_run or start_run)(run_id)


def _ensure_queue_worker() -> None:
    """Make sure the supervisor's queue worker runs (a detached one unless replaced)."""
    (supervisor().ensure_queue_worker or ensure_queue_worker)()


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
        (supervisor().reap or _reap_in_background)(proc)
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
# Start or queue (one training job per device)
# ---------------------------------------------------------------------------------------------


def busy_conflict(dev: str, busy: list, rule: str, ways_on: list[NextStep]) -> Conflict:
    """The refusal of a start on a device another run trains on: names the run holding it (and
    how many more), the ``rule`` that refuses, and the ways forward: wait for it, then ``ways_on``."""
    more = f" (and {len(busy) - 1} more)" if len(busy) > 1 else ""
    wait = NextStep("run_status", {"run_id": busy[0].id}, note="wait for it to end")
    return Conflict(
        f"device {dev} is busy: run {describe_run(busy[0])} is training on it{more}; {rule}",
        next=[wait, *ways_on],
    )


def _busy_error(dev: str, busy: list, why: str | None, *, resuming: str | None = None) -> Conflict:
    """The lab's own refusal (one training job per device), with the ways forward."""
    if resuming is not None:
        ways_on = [
            NextStep("resume_run", {"run_id": resuming, "force": True}, note="resume anyway")
        ]
    else:
        ways_on = [
            NextStep("launch_run", {"queue": True}, note="start after it ends"),
            NextStep("launch_run", {"force": True}, note="start anyway"),
        ]
    reason = f" ({why})" if why else ""
    return busy_conflict(dev, busy, f"one training job per device{reason}", ways_on)


def _queue(run: NewRun, placement: Placement, upstream: list[str]) -> LaunchResult:
    """Write the run as ``queued`` and make sure the queue worker runs."""
    info = prepare_run(run, state="queued")
    ahead = [s.id for s in queued_runs()]
    position = ahead.index(info.id) + 1 if info.id in ahead else None
    _ensure_queue_worker()
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


def start_or_queue(
    run: NewRun, *, force: bool = False, queue: bool = False, fits_together: bool | None = None
) -> LaunchResult:
    """Create a run and start it detached, or queue it behind the device's current job.

    One training job per device: another job on the device is an error (naming it) unless
    ``fits_together`` (the caller's memory check said both fit) or ``force``. ``queue=True``
    writes the run as ``queued`` and makes sure the queue worker runs. ``run.after``: upstream
    run ids (checked by the caller); while one of them has not succeeded the run is queued and
    the queue worker starts it once they all have (or cancels it when one fails).
    ``run.placement``: its devices and ranks (:func:`~rlhf_lab.runs.devices.resolve_placement`;
    default: from ``run.device``); a run on several devices holds each, and a GPU left to the lab
    is the freest one no run holds (picked when it starts, for a queued run).
    """
    from rlhf_lab.runs.deps import waiting_for

    _check_family(run.family)
    campaign_name(run.campaign)
    placement = run.placement or resolve_placement(run.device, None, None, run.config)
    upstream = waiting_for({"after": list(run.after)})
    if queue or upstream:
        return _queue(run.model_copy(update={"placement": placement}), placement, upstream)

    with _devices_hold():  # the check and the hold are one step (process._devices_hold)
        if not placement.devices:  # the freest GPUs no run holds, else the freest GPUs
            picked = freest_gpus(placement.gpus_wanted, _held_devices())
            chosen = picked or freest_gpus(placement.gpus_wanted, set()) or []
            placement = placement.model_copy(update={"devices": chosen, "gpus_wanted": 0})
        busy = _busy_on(placement.devices)
        if busy and not force and not fits_together:
            why = (
                "the memory check said both do not fit"
                if fits_together is False
                else "no memory check said both fit"
            )
            raise _busy_error(_where(placement), busy, why)
        info = prepare_run(run.model_copy(update={"placement": placement}))
        try:
            info = _start(info.id)
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


def _start_when_free(run_id: str, poll_s: float = 1.0) -> RunInfo | None:
    """Queue worker: start ``run_id`` once every device it names is free, or, when the lab picks
    its GPUs, once enough GPUs are free (it gets the freest). None if it left the queue."""
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
                return _start(run_id)
        time.sleep(poll_s)
