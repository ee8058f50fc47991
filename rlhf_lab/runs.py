"""Runs: create a run directory, launch the trainer detached, derive its state from disk, stop it,
list runs, keep one training job per device, and queue runs behind each other. Torch-free.

A run lives in ``experiments/<campaign>/runs/<run-id>/`` (DESIGN.md §3). The lab writes
``config.yaml`` and ``run.json``; the trainer writes the rest. Every state is derived from disk,
so a status query works from any process, long after the launcher is gone:

* the launcher starts ``python -m rlhf_lab._wrapper <run-dir> -- <trainer argv>`` in its own
  session (``start_new_session=True``), stdin from /dev/null, stdout+stderr appended to
  ``train.log``. The wrapper is the process-group leader; the trainer is its child in the same
  group. ``run.json`` records the **wrapper's** pid, pgid and psutil create time (the wrapper lives
  exactly as long as the run and is the process that writes ``exit.json``); the wrapper's
  ``process.json`` adds the trainer's pid and create time.
* a process counts as alive only if its pid exists, its create time matches the recorded one and
  it is not a zombie — a reused pid is never mistaken for a run.
* states: ``queued -> starting -> running -> succeeded | failed | stopped | died``. ``died`` means
  the processes are gone with no exit status (``exit.json`` missing: SIGKILL to the group, OOM
  killer, reboot) or the trainer was killed by SIGKILL while nobody asked it to stop.

Device exclusivity: :func:`launch` allows one training job per device (``cpu``, ``cuda:N``)
unless the caller's memory check says both fit (``fits_together=True``) or ``force=True``. The
check and the start happen under a file lock per device, so two racing launches never both start.
``queue=True`` writes the run as ``queued`` and makes sure the queue worker
(:mod:`rlhf_lab._queue`) is running; it starts queued runs one after another in creation order.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlhf_lab.catalog import FAMILIES as CATALOG_FAMILIES
from rlhf_lab.paths import (
    LabError,
    campaign_name,
    check_run_id,
    check_slug,
    experiments_dir,
    find_run,
    new_run_id,
)

__all__ = [
    "ACTIVE_STATES",
    "FAMILIES",
    "LaunchResult",
    "RunInfo",
    "RunState",
    "RunStatus",
    "STATES",
    "TERMINAL_STATES",
    "active_runs",
    "check_run_id",
    "ensure_queue_worker",
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
]

RunState = Literal["queued", "starting", "running", "succeeded", "failed", "stopped", "died"]
STATES: tuple[str, ...] = RunState.__args__
TERMINAL_STATES = frozenset({"succeeded", "failed", "stopped", "died"})
ACTIVE_STATES = frozenset({"starting", "running"})

# Families the lab may launch (each runs as `python -m trainers.<family>.train`).
FAMILIES: tuple[str, ...] = tuple(CATALOG_FAMILIES)

DEVICE_RE = re.compile(r"^(cpu|cuda:\d{1,3})$")
# A run stuck in "starting" with no process this long after creation lost its launcher.
STARTING_TIMEOUT_S = 120.0
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
# Models
# ---------------------------------------------------------------------------------------------


class RunInfo(BaseModel):
    """What ``run.json`` holds (plus the folder). Written by the lab only."""

    model_config = ConfigDict(extra="ignore")

    id: str
    run_dir: str = Field(description="absolute path of the run folder")
    family: str
    algorithm: str
    campaign: str
    device: str = "cpu"
    config_source: str | None = None
    overrides: list[str] = Field(default_factory=list)
    argv: list[str] = Field(default_factory=list, description="the trainer's command line")
    wrapper_argv: list[str] = Field(default_factory=list)
    cwd: str | None = None
    pid: int | None = Field(default=None, description="wrapper pid (the process-group leader)")
    pgid: int | None = None
    create_time: float | None = Field(default=None, description="psutil create time of pid")
    host: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    state: RunState = "starting"
    created_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    stop_requested_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    wandb_url: str | None = None
    resumes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="one entry per `rlhf-lab resume`: how the attempt before it ended",
    )


class RunStatus(BaseModel):
    """A run's state derived from its folder and the live process table."""

    id: str
    campaign: str
    family: str | None = None
    algorithm: str | None = None
    device: str | None = None
    state: RunState
    run_dir: str
    alive: bool = Field(description="the wrapper or trainer process is running now")
    pid: int | None = None
    pgid: int | None = None
    trainer_pid: int | None = None
    step: int | None = None
    total_steps: int | None = None
    elapsed_s: float | None = Field(default=None, description="trainer's elapsed time")
    eta_s: float | None = Field(
        default=None, description="seconds left: time per step (train rows) × steps left"
    )
    progress_updated_at: float | None = None
    last_train: dict[str, Any] = Field(default_factory=dict, description="last train row")
    last_eval: dict[str, Any] = Field(default_factory=dict, description="last eval row")
    outcome: str | None = Field(default=None, description="summary.json outcome")
    exit_code: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    error: str | None = None
    wandb_url: str | None = None
    created_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    stop_requested: bool = False

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class LaunchResult(BaseModel):
    run: RunInfo
    state: RunState
    queued: bool = False
    queue_position: int | None = Field(default=None, description="1 = next to start")
    device: str
    sharing_device_with: list[str] = Field(
        default_factory=list, description="runs already on the device (force / fits_together)"
    )
    message: str


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except (TypeError, ValueError):
        return None


def _source_dir() -> Path:
    """The checkout holding the `trainers` and `rlhf_lab` packages (the trainer's cwd)."""
    return Path(__file__).resolve().parents[1]


def _lab_dir() -> Path:
    path = experiments_dir() / ".lab"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _atomic_write_text(path: Path, text: str) -> None:
    from trainers.core.rundir import atomic_write_text

    atomic_write_text(path, text)


def _atomic_write_json(path: Path, obj: Any) -> None:
    from trainers.core.rundir import atomic_write_json

    atomic_write_json(path, obj)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _tail_lines(path: Path, max_bytes: int = 256 * 1024) -> list[bytes]:
    """The last ``max_bytes`` of a JSONL file split into lines (a line cut by the window's
    start is dropped)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            start = max(0, size - max_bytes)
            fh.seek(start)
            data = fh.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    return lines[1:] if start > 0 else lines


def _json_row(line: bytes) -> dict | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def _tail_rows(path: Path, max_bytes: int = 256 * 1024) -> list[dict]:
    """Whole JSON lines from the end of a JSONL file (a truncated last line is skipped)."""
    rows = (_json_row(line) for line in _tail_lines(path, max_bytes))
    return [row for row in rows if row is not None]


def _last_train_eval(path: Path) -> tuple[dict, dict]:
    """The last train row and the last eval row of the same window as :func:`_tail_rows`,
    decoding lines from the end only until both are found: a finished run's status needs no
    more, and listing many runs then parses a few lines of each instead of 256 KiB."""
    last: dict[str, dict] = {}
    for line in reversed(_tail_lines(path)):
        row = _json_row(line)
        phase = row.get("phase") if row is not None else None
        if phase in ("train", "eval") and phase not in last:
            last[phase] = row
            if len(last) == 2:
                break
    return last.get("train", {}), last.get("eval", {})


@contextmanager
def _run_lock(run_dir: Path):
    from filelock import FileLock  # imported here: reading commands never lock

    with FileLock(str(run_dir / ".run.lock"), timeout=30):
        yield


@contextmanager
def _device_lock(device: str):
    from filelock import FileLock

    name = device.replace(":", "-")
    with FileLock(str(_lab_dir() / f"launch-{name}.lock"), timeout=60):
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
# Ids, folders, devices
# ---------------------------------------------------------------------------------------------


def _check_family(family: str) -> str:
    if family not in FAMILIES:
        raise LabError(f"unknown family {family!r}; known families: {', '.join(FAMILIES)}")
    if not (_source_dir() / "trainers" / family / "train.py").is_file():
        raise LabError(
            f"family {family!r} has no trainer yet (trainers/{family}/train.py is missing)"
        )
    return family


def _visible_gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


def resolve_device(device: str | None, config_data: dict | None = None) -> str:
    """``auto`` -> ``cpu`` when the config pins the CPU or no GPU is visible, else ``cuda:0``;
    ``cuda`` -> ``cuda:0``. Returns ``cpu`` or ``cuda:N``."""
    device = (device or "auto").strip().lower()
    if device == "auto":
        model = (config_data or {}).get("model") if isinstance(config_data, dict) else None
        pinned = model.get("device") if isinstance(model, dict) else None
        if pinned == "cpu":
            return "cpu"
        return "cuda:0" if _visible_gpu_count() > 0 else "cpu"
    if device == "cuda":
        return "cuda:0"
    if not DEVICE_RE.fullmatch(device):
        raise LabError(f"bad device {device!r}: use auto, cpu, cuda or cuda:N (e.g. cuda:1)")
    return device


def trainer_argv(family: str, run_dir: Path, resume: bool = False) -> list[str]:
    """The trainer's command line: the resolved config.yaml already holds every override."""
    argv = [
        sys.executable,
        "-m",
        f"trainers.{family}.train",
        "--config",
        str(run_dir / "config.yaml"),
        "--run-dir",
        str(run_dir),
    ]
    return [*argv, "--resume"] if resume else argv


def _cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_threads_beside(sharing: int, cores: int) -> int:
    """Intra-op threads for a CPU trainer that starts beside ``sharing`` other CPU runs: the
    cores split evenly, at least one. (torch's default, one thread per core in every process,
    oversubscribes a shared CPU and runs many times slower.)"""
    return max(1, cores // (sharing + 1))


def _trainer_env(device: str, sharing: int = 0) -> dict[str, str]:
    """The trainer's environment. A CPU trainer started beside ``sharing`` other CPU runs gets
    ``OMP_NUM_THREADS`` (torch's intra-op threads) set to its share of the cores, unless the
    caller's environment already sets it."""
    env = dict(os.environ)
    if device == "cpu" and sharing > 0 and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(cpu_threads_beside(sharing, _cpu_cores()))
    env["PYTHONUNBUFFERED"] = "1"
    src = str(_source_dir())
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([src, *[p for p in parts if p != src]])
    if device.startswith("cuda:"):
        index = int(device.split(":", 1)[1])
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            env["CUDA_VISIBLE_DEVICES"] = str(index)
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        else:
            ids = [v.strip() for v in visible.split(",") if v.strip()]
            if index < len(ids):
                env["CUDA_VISIBLE_DEVICES"] = ids[index]
    return env


# ---------------------------------------------------------------------------------------------
# Create and start
# ---------------------------------------------------------------------------------------------


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
) -> RunInfo:
    """Create ``experiments/<campaign>/runs/<run-id>/`` with ``config.yaml`` (the resolved config)
    and ``run.json``. Every input is checked first: nothing is created for an invalid one."""
    _check_family(family)
    name = campaign_name(campaign)
    if not isinstance(config_data, dict) or not config_data:
        raise LabError("config_data must be the resolved config as a non-empty mapping")
    import yaml

    try:
        config_text = yaml.safe_dump(config_data, sort_keys=False)
    except yaml.YAMLError as err:
        raise LabError(f"the config cannot be written as YAML: {err}") from None
    if state not in ("queued", "starting"):
        raise LabError(f"a new run starts as queued or starting, not {state!r}")
    resolved = resolve_device(device, config_data)
    overrides = [str(o) for o in (overrides or [])]
    try:
        run_id = new_run_id(algorithm)
    except LabError:
        raise LabError(
            f"bad algorithm name {algorithm!r}: lowercase letters, digits, '_' or '-'"
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
        "argv": trainer_argv(family, run_dir),
        "cwd": str(_source_dir()),
        "state": state,
        "created_at": _now(),
    }
    _atomic_write_json(run_dir / "run.json", record)
    return RunInfo(run_dir=str(run_dir), **record)


def _read_record(run_dir: Path) -> dict:
    record = _read_json(run_dir / "run.json")
    if record is None:
        raise LabError(
            f"{run_dir / 'run.json'} is missing or unreadable; this folder was not created by "
            "the lab (use `rlhf-lab launch`)"
        )
    return record


def _info(run_dir: Path, record: dict) -> RunInfo:
    data = {
        "id": run_dir.name,
        "family": "?",
        "algorithm": "?",
        "campaign": run_dir.parent.parent.name,
    }
    data.update({k: v for k, v in record.items() if v is not None})
    data["run_dir"] = str(run_dir)
    if data.get("state") not in STATES:
        data["state"] = "died"
    return RunInfo.model_validate(data)


def start_run(run_id: str) -> RunInfo:
    """Start a queued or starting run detached and return at once (state ``running``)."""
    run_dir = find_run(run_id)
    # other CPU runs, read before taking this run's lock (reading a status may take its lock)
    cpu_runs = [s.id for s in active_runs("cpu") if s.id != run_id]
    with _run_lock(run_dir):
        record = _read_record(run_dir)
        if record.get("state") not in ("queued", "starting") or record.get("pid"):
            raise LabError(
                f"run {run_id} is {record.get('state')}; only a queued run can be started. "
                "Launch a new run instead"
            )
        family = _check_family(record.get("family", ""))
        device = resolve_device(record.get("device") or "auto")
        argv = trainer_argv(family, run_dir, resume=bool(record.get("resumes")))
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
        env = _trainer_env(device, len(sharing))
        if "OMP_NUM_THREADS" in env:
            record["cpu_threads"] = int(env["OMP_NUM_THREADS"])
        started = _now()
        with (run_dir / "train.log").open("ab") as log:
            log.write(f"[rlhf-lab] {started} on {record['host']}: {shlex.join(argv)}\n".encode())
            if env.get("OMP_NUM_THREADS") != os.environ.get("OMP_NUM_THREADS"):  # set by us
                log.write(
                    f"[rlhf-lab] sharing the CPU with {', '.join(sharing)}: "
                    f"{env['OMP_NUM_THREADS']} intra-op thread(s)\n".encode()
                )
            log.flush()
            try:
                proc = subprocess.Popen(
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
                raise LabError(f"could not start {sys.executable}: {err}") from None
        import psutil

        try:
            create_time = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            create_time = None
        try:
            pgid = os.getpgid(proc.pid)
        except OSError:
            pgid = proc.pid  # start_new_session: the wrapper leads its own group
        _reap_in_background(proc)
        record.update(
            pid=proc.pid,
            pgid=pgid,
            create_time=create_time,
            state="running",
            started_at=started,
        )
        _atomic_write_json(run_dir / "run.json", record)
        return _info(run_dir, record)


# ---------------------------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------------------------


def _marker(run_dir: Path) -> str:
    return str(run_dir)


def _alive(run_dir: Path, record: dict, proc_info: dict | None) -> bool:
    marker = _marker(run_dir)
    if _process_alive(record.get("pid"), record.get("create_time"), marker):
        return True
    if proc_info and _process_alive(
        proc_info.get("trainer_pid"), proc_info.get("trainer_create_time"), marker
    ):
        return True
    return False


def _derive_state(
    record: dict,
    alive: bool,
    exit_info: dict | None,
    summary: dict | None,
    proc_info: dict | None = None,
) -> tuple[str, str | None]:
    """(state, error) from what is on disk and whether the processes live. A ``starting`` run
    with no pid whose wrapper wrote process.json or exit.json was started (its launcher died
    before recording the pid): those files decide, not the start timeout."""
    state = record.get("state")
    if state not in STATES:
        state = "died"
    if state in TERMINAL_STATES or state == "queued":
        return state, None
    if alive:
        return "running", None
    if state == "starting" and not record.get("pid") and proc_info is None and exit_info is None:
        created = _parse_time(record.get("starting_at") or record.get("created_at"))
        if created is not None and time.time() - created > STARTING_TIMEOUT_S:
            return "died", "the launcher exited before it started the process"
        return "starting", None

    outcome = (summary or {}).get("outcome")
    stop = bool(record.get("stop_requested_at"))
    if exit_info is not None:
        sig = exit_info.get("signal")
        code = exit_info.get("exit_code")
        if sig == signal.SIGKILL and not stop:
            return "died", "the trainer was killed by SIGKILL (signal 9; the OOM killer does this)"
        if outcome == "stopped" or (stop and (sig or code not in (0, None))):
            return "stopped", None
        if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            return "stopped", f"ended by signal {sig}"
        if code == 0 and not sig:
            return "succeeded", None
        if sig:
            return "failed", f"the trainer ended by signal {sig}"
        return "failed", None
    if outcome in ("succeeded", "failed", "stopped"):
        return outcome, None
    if stop:
        return "stopped", None
    return "died", "the process ended without an exit status (SIGKILL, OOM killer or reboot)"


def run_state(run_id: str) -> RunStatus:
    """The run's state derived from run.json, exit.json, summary.json and the process table;
    run.json's state is updated (atomically) when it changed."""
    run_dir = find_run(run_id)
    return _status(run_dir)


def _status(run_dir: Path) -> RunStatus:
    record = _read_json(run_dir / "run.json")
    if record is None:
        raise LabError(f"{run_dir / 'run.json'} is missing or unreadable")
    proc_info = _read_json(run_dir / "process.json")
    alive = record.get("state") in ACTIVE_STATES and _alive(run_dir, record, proc_info)
    # Read exit.json / summary.json only after the liveness check: the wrapper writes exit.json
    # before it exits, so "gone and no exit.json" really means no exit status.
    exit_info = _read_json(run_dir / "exit.json")
    summary = _read_json(run_dir / "summary.json")
    state, error = _derive_state(record, alive, exit_info, summary, proc_info)
    if state != record.get("state"):
        record, state, error = _update_record(run_dir, alive, exit_info, summary, proc_info)
    progress = _read_json(run_dir / "progress.json") or {}
    try:
        return _build_status(
            run_dir, record, state, alive, proc_info, exit_info, summary, progress, error
        )
    except ValidationError as err:  # valid JSON holding a value of the wrong type (hand-edited)
        where = ".".join(str(part) for part in err.errors()[0]["loc"])
        raise LabError(
            f"{run_dir}: a run file holds a value of the wrong type for {where!r} "
            f"({err.errors()[0]['msg']}); fix run.json, progress.json, exit.json or summary.json"
        ) from None


def _update_record(
    run_dir: Path,
    alive: bool,
    exit_info: dict | None,
    summary: dict | None,
    proc_info: dict | None = None,
) -> tuple[dict, str, str | None]:
    """Re-derive the state from a fresh run.json under the run's lock (a stop may have been
    requested since it was read) and write it when it changed."""
    with _run_lock(run_dir):
        record = _read_json(run_dir / "run.json") or {}
        state, error = _derive_state(record, alive, exit_info, summary, proc_info)
        if state == record.get("state"):
            return record, state, error
        record["state"] = state
        if state in TERMINAL_STATES:
            ended = (exit_info or {}).get("ended_at")
            if not ended:
                try:
                    ended = dt.datetime.fromtimestamp(
                        (run_dir / "train.log").stat().st_mtime, dt.UTC
                    ).isoformat(timespec="milliseconds")
                except OSError:
                    ended = _now()
            record["ended_at"] = ended
            if exit_info is not None:
                record["exit_code"] = exit_info.get("exit_code")
                record["signal"] = exit_info.get("signal")
            url = (summary or {}).get("wandb_url")
            if url:
                record["wandb_url"] = url
            if error and not record.get("error"):
                record["error"] = error
        try:
            _atomic_write_json(run_dir / "run.json", record)
        except OSError:
            pass  # a read-only view still answers
        return record, state, error


def _eta(step: Any, total: Any, elapsed: Any, rows: list[dict]) -> float | None:
    """Seconds left: the time per step measured between logged train rows when there are two
    (it leaves out start-up), else progress.json's elapsed_s / step."""
    if not (isinstance(step, int | float) and isinstance(total, int | float)) or step <= 0:
        return None
    timed = [
        (r["step"], r["time_s"])
        for r in rows
        if r.get("phase") == "train"
        and isinstance(r.get("step"), int | float)
        and isinstance(r.get("time_s"), int | float)
    ]
    per_step = None
    if len(timed) >= 2 and timed[-1][0] > timed[0][0]:
        per_step = (timed[-1][1] - timed[0][1]) / (timed[-1][0] - timed[0][0])
    elif isinstance(elapsed, int | float):
        per_step = elapsed / step
    if per_step is None:
        return None
    return round(max(per_step, 0.0) * max(total - step, 0), 1)


def _build_status(
    run_dir, record, state, alive, proc_info, exit_info, summary, progress, error
) -> RunStatus:
    summary = summary or {}
    step = progress.get("step")
    total = progress.get("total_steps")
    elapsed = progress.get("elapsed_s")
    eta = None
    if state in ACTIVE_STATES:  # the ETA needs every timed row of the window
        rows = _tail_rows(run_dir / "metrics.jsonl")
        last_train = next((r for r in reversed(rows) if r.get("phase") == "train"), {})
        last_eval = next((r for r in reversed(rows) if r.get("phase") == "eval"), {})
        eta = _eta(step, total, elapsed, rows)
    else:
        last_train, last_eval = _last_train_eval(run_dir / "metrics.jsonl")
    sig = (exit_info or {}).get("signal")
    error = error or record.get("error")
    if summary.get("error"):
        error = str(summary["error"])
    elif exit_info and exit_info.get("error"):
        error = str(exit_info["error"])
    return RunStatus(
        id=record.get("id") or run_dir.name,
        campaign=record.get("campaign") or run_dir.parent.parent.name,
        family=record.get("family"),
        algorithm=record.get("algorithm"),
        device=record.get("device"),
        state=state,
        run_dir=str(run_dir),
        alive=alive,
        pid=record.get("pid"),
        pgid=record.get("pgid"),
        trainer_pid=(proc_info or {}).get("trainer_pid"),
        step=step if isinstance(step, int) else None,
        total_steps=total if isinstance(total, int) else None,
        elapsed_s=elapsed if isinstance(elapsed, int | float) else None,
        eta_s=eta,
        progress_updated_at=progress.get("updated_at"),
        last_train=last_train,
        last_eval=last_eval,
        outcome=summary.get("outcome"),
        exit_code=(exit_info or {}).get("exit_code", record.get("exit_code")),
        signal=sig if sig is not None else record.get("signal"),
        signal_name=(exit_info or {}).get("signal_name"),
        error=error,
        wandb_url=summary.get("wandb_url") or record.get("wandb_url"),
        created_at=record.get("created_at"),
        started_at=record.get("started_at"),
        ended_at=record.get("ended_at"),
        stop_requested=bool(record.get("stop_requested_at")),
    )


# ---------------------------------------------------------------------------------------------
# Stop
# ---------------------------------------------------------------------------------------------


def _signal_run(run_dir: Path, record: dict, proc_info: dict | None, sig: int) -> None:
    """Send ``sig`` to the run's process group, only to processes whose identity matches."""
    marker = _marker(run_dir)
    pgid = record.get("pgid") or record.get("pid")
    if _process_alive(record.get("pid"), record.get("create_time"), marker) and pgid:
        try:
            os.killpg(int(pgid), sig)
        except (ProcessLookupError, PermissionError):
            pass
    trainer = (proc_info or {}).get("trainer_pid")
    if trainer and _process_alive(trainer, (proc_info or {}).get("trainer_create_time"), marker):
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


def stop_run(run_id: str, grace_s: float = 10.0) -> RunStatus:
    """SIGTERM to the run's process group (the trainer checkpoints and writes outcome
    ``stopped``), wait up to ``grace_s``, then SIGKILL. A queued run is just marked stopped."""
    run_dir = find_run(run_id)
    if _status(run_dir).terminal:  # already over (this also notices a run that just ended)
        return _status(run_dir)
    with _run_lock(run_dir):
        record = _read_record(run_dir)
        if record.get("state") in TERMINAL_STATES:
            return _status(run_dir)
        record["stop_requested_at"] = _now()
        if record.get("state") == "queued" or (
            record.get("state") == "starting" and not record.get("pid")
        ):
            record.update(state="stopped", ended_at=record["stop_requested_at"])
        _atomic_write_json(run_dir / "run.json", record)
    if record.get("state") == "stopped":
        return _status(run_dir)

    proc_info = _read_json(run_dir / "process.json")
    _signal_run(run_dir, record, proc_info, signal.SIGTERM)
    deadline = time.time() + max(grace_s, 0.0)
    while time.time() < deadline and _alive(run_dir, record, proc_info):
        time.sleep(0.1)
    if _alive(run_dir, record, _read_json(run_dir / "process.json")):
        _signal_run(run_dir, record, _read_json(run_dir / "process.json"), signal.SIGKILL)
        end = time.time() + 5.0
        while time.time() < end and _alive(run_dir, record, proc_info):
            time.sleep(0.05)
    return _status(run_dir)


# ---------------------------------------------------------------------------------------------
# Listing, devices, launch, queue
# ---------------------------------------------------------------------------------------------


def _all_run_dirs(recorded: frozenset[str] | None = None) -> list[Path]:
    """Run folders; with ``recorded``, only those whose run.json holds one of these states
    (a cheap first pass: only their full status is computed)."""
    root = experiments_dir()
    if not root.is_dir():
        return []
    dirs = [p for p in root.glob("*/runs/*") if p.is_dir() and (p / "run.json").is_file()]
    if recorded is not None:
        dirs = [p for p in dirs if (_read_json(p / "run.json") or {}).get("state") in recorded]
    return dirs


def _created_key(status: RunStatus) -> tuple:
    return (status.created_at or "", status.id)


def list_runs(campaign: str | None = None, state: str | None = None) -> list[RunStatus]:
    """Every run (oldest first), optionally of one campaign (its dated name or its slug) and/or
    in one state."""
    if state is not None and state not in STATES:
        raise LabError(f"unknown state {state!r}; states: {', '.join(STATES)}")
    return _collect(_all_run_dirs(), campaign, state)


def _collect(dirs: list[Path], campaign: str | None, state: str | None) -> list[RunStatus]:
    if campaign is not None:
        check_slug(campaign)
        dirs = [
            p
            for p in dirs
            if p.parent.parent.name == campaign
            or re.sub(r"^\d{4}-\d{2}-\d{2}-", "", p.parent.parent.name) == campaign
        ]
    out = []
    for path in dirs:
        try:
            status = _status(path)
        except LabError as err:
            status = _unreadable_run(path, str(err))
        if state is None or status.state == state:
            out.append(status)
    return sorted(out, key=_created_key)


def _unreadable_run(run_dir: Path, error: str) -> RunStatus:
    """A run folder whose run.json cannot be read is listed as died with the reason, so a
    damaged run never silently drops out of `rlhf-lab runs`."""
    return RunStatus(
        id=run_dir.name,
        campaign=run_dir.parent.parent.name,
        state="died",
        run_dir=str(run_dir),
        alive=False,
        error=error,
    )


def active_runs(device: str | None = None) -> list[RunStatus]:
    """Runs starting or running now (on ``device`` when given)."""
    dev = None if device is None else resolve_device(device)
    out = []
    for status in _collect(_all_run_dirs(ACTIVE_STATES), None, None):
        if status.state in ACTIVE_STATES and (dev is None or status.device == dev):
            out.append(status)
    return out


def queued_runs() -> list[RunStatus]:
    """Queued runs in the order the worker will start them (creation order)."""
    return _collect(_all_run_dirs(frozenset({"queued"})), None, "queued")


def unfinished_runs() -> list[RunStatus]:
    """Queued, starting and running runs, oldest first: what ``list_runs()`` filtered to those
    states returns, but only runs whose run.json records one of them are examined (a recorded
    finished state never changes back), so `rlhf-lab status` does not read every finished run."""
    found = _collect(_all_run_dirs(ACTIVE_STATES | {"queued"}), None, None)
    return [s for s in found if s.state in ACTIVE_STATES or s.state == "queued"]


def _describe(status: RunStatus) -> str:
    step = "?" if status.step is None else status.step
    total = "?" if status.total_steps is None else status.total_steps
    eta = "" if status.eta_s is None else f", ETA {status.eta_s:.0f}s"
    return f"{status.id} (pid {status.pid}, step {step}/{total}{eta}, campaign {status.campaign})"


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
) -> LaunchResult:
    """Create a run and start it detached, or queue it behind the device's current job.

    One training job per device: another job on the device is an error (naming it) unless
    ``fits_together`` (the caller's memory check said both fit) or ``force``. ``queue=True``
    writes the run as ``queued`` and makes sure the queue worker runs.
    """
    _check_family(family)
    campaign_name(campaign)
    dev = resolve_device(device, config_data)
    if queue:
        info = prepare_run(
            family,
            algorithm,
            config_data,
            campaign,
            config_source,
            overrides,
            device=dev,
            state="queued",
        )
        ahead = [s.id for s in queued_runs()]
        position = ahead.index(info.id) + 1 if info.id in ahead else None
        ensure_queue_worker()
        busy = [s.id for s in active_runs(dev)]
        msg = f"queued {info.id} on {dev} (position {position})"
        if busy:
            msg += f"; waits for {', '.join(busy)}"
        return LaunchResult(
            run=info, state="queued", queued=True, queue_position=position, device=dev, message=msg
        )

    with _device_lock(dev):
        busy = active_runs(dev)
        if busy and not force and not fits_together:
            first = busy[0]
            why = (
                "the memory check said both do not fit"
                if fits_together is False
                else "no memory check said both fit"
            )
            raise LabError(
                f"device {dev} is busy: run {_describe(first)} is training on it"
                + (f" (and {len(busy) - 1} more)" if len(busy) > 1 else "")
                + f"; one training job per device ({why}). Wait for it, pass --queue to start "
                "after it ends, or --force to start anyway"
            )
        info = prepare_run(
            family, algorithm, config_data, campaign, config_source, overrides, device=dev
        )
        try:
            info = start_run(info.id)
        except Exception as err:
            _mark_failed(Path(info.run_dir), f"could not start: {err}")
            raise
    shared = [s.id for s in busy]
    msg = f"started {info.id} on {dev} (pid {info.pid})"
    if shared:
        msg += f", sharing the device with {', '.join(shared)}"
    return LaunchResult(
        run=info, state="running", device=dev, sharing_device_with=shared, message=msg
    )


RESUMABLE_STATES = ("died", "stopped", "failed")
_ATTEMPT_FILES = ("exit.json", "process.json", "summary.json")


def _checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints (``checkpoints/step-<N>``; temp folders are partial)."""
    steps = []
    for path in (run_dir / "checkpoints").glob("step-*"):
        tail = path.name.removeprefix("step-")
        if path.is_dir() and tail.isdigit() and (path / "state.pt").is_file():
            steps.append(int(tail))
    return sorted(steps)


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
    run_dir = find_run(run_id)
    status = _status(run_dir)
    if status.state not in RESUMABLE_STATES:
        hint = {
            "succeeded": "it finished; launch a new run to train further",
            "queued": "it has not started yet",
        }.get(status.state, "stop it first with `rlhf-lab stop`")
        raise LabError(
            f"run {run_id} is {status.state}; only a died, stopped or failed run can "
            f"be resumed ({hint})"
        )
    steps = _checkpoint_steps(run_dir)
    if not steps:
        raise LabError(
            f"run {run_id} has no checkpoint in {run_dir / 'checkpoints'} (it ended before the "
            "first one; `checkpoint.save_every` sets how often they are written); launch it "
            "again instead"
        )
    dev = resolve_device(device or status.device or "auto")
    with _device_lock(dev):
        busy = [s for s in active_runs(dev) if s.id != run_id]
        if busy and not force and not fits_together:
            raise LabError(
                f"device {dev} is busy: run {_describe(busy[0])} is training on it; one training "
                "job per device. Wait for it, or pass --force to resume anyway"
            )
        with _run_lock(run_dir):
            record = _read_record(run_dir)
            if record.get("state") not in RESUMABLE_STATES:
                raise LabError(f"run {run_id} became {record.get('state')} meanwhile; not resumed")
            previous = {
                k: record.get(k)
                for k in ("state", "started_at", "ended_at", "exit_code", "signal", "error")
            }
            previous.update(from_step=steps[-1], resumed_at=_now())
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
                "started_at",
            ):
                record.pop(key, None)
            record.update(state="starting", starting_at=_now(), device=dev, resumes=resumes)
            _atomic_write_json(run_dir / "run.json", record)
        try:
            info = start_run(run_id)
        except Exception as err:
            _mark_failed(run_dir, f"could not start: {err}")
            raise
    msg = f"resumed {run_id} from checkpoint step {steps[-1]} on {dev} (pid {info.pid})"
    return LaunchResult(
        run=info,
        state="running",
        device=dev,
        sharing_device_with=[s.id for s in busy],
        message=msg,
    )


def _mark_failed(run_dir: Path, error: str) -> None:
    """A run that never got a process (its start failed) ends as failed."""
    with _run_lock(run_dir):
        record = _read_json(run_dir / "run.json") or {}
        if record.get("state") not in ("queued", "starting") or record.get("pid"):
            return
        record.update(state="failed", ended_at=_now(), error=error)
        _atomic_write_json(run_dir / "run.json", record)


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
    src = str(_source_dir())
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != src]
    env["PYTHONPATH"] = os.pathsep.join([src, *parts])
    env["PYTHONUNBUFFERED"] = "1"
    with (_lab_dir() / "queue.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlhf_lab._queue"],
            cwd=src,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    _reap_in_background(proc)
    return proc.pid


def _start_when_free(run_id: str, poll_s: float = 1.0) -> RunInfo | None:
    """Queue worker: start ``run_id`` once its device is free. None if it left the queue."""
    while True:
        status = run_state(run_id)
        if status.state != "queued":
            return None
        dev = status.device or "cpu"
        with _device_lock(dev):
            if not active_runs(dev):
                if run_state(run_id).state != "queued":
                    return None
                return start_run(run_id)
        time.sleep(poll_s)


def wait_for_end(run_id: str, poll_s: float = 1.0, timeout_s: float | None = None) -> RunStatus:
    """Poll until the run reaches a terminal state (or ``timeout_s`` passes)."""
    deadline = None if timeout_s is None else time.time() + timeout_s
    while True:
        status = run_state(run_id)
        if status.terminal or (deadline is not None and time.time() > deadline):
            return status
        time.sleep(poll_s)


# ---------------------------------------------------------------------------------------------
# Foreground
# ---------------------------------------------------------------------------------------------


def follow_run(
    run_id: str,
    on_progress: Callable[[RunStatus], None],
    on_log: Callable[[str], None] | None = None,
    *,
    poll_s: float = 0.5,
    timeout_s: float | None = None,
) -> RunStatus:
    """Block until the run ends: ``on_log(text)`` gets each new piece of train.log (folded
    progress bars), ``on_progress(status)`` fires whenever progress.json or the state changes.
    Returns the final status (or the current one after ``timeout_s``). No UI here."""
    from rlhf_lab.logs import tail_log

    cursor = 0
    seen: tuple = ()
    deadline = None if timeout_s is None else time.time() + timeout_s
    while True:
        status = run_state(run_id)
        if on_log is not None:
            while True:
                chunk = tail_log(run_id, cursor=cursor, max_bytes=64_000)
                if chunk.text:
                    on_log(chunk.text)
                moved = chunk.cursor != cursor
                cursor = chunk.cursor
                if chunk.eof or not moved:
                    break
        key = (status.state, status.step, status.progress_updated_at)
        if key != seen:
            seen = key
            on_progress(status)
        if status.terminal:
            if on_log is not None:  # the wrapper's last line lands after the state changes
                chunk = tail_log(run_id, cursor=cursor, max_bytes=64_000, final=True)
                if chunk.text:
                    on_log(chunk.text)
            return status
        if deadline is not None and time.time() > deadline:
            return status
        time.sleep(poll_s)
