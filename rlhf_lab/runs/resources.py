"""The real queries behind :mod:`rlhf_lab.runs.machine`: the GPUs through NVML
(``nvidia-ml-py``, import name ``pynvml``; no CUDA context is created and torch is not imported),
the report's models (:class:`Resources`), and which lab runs hold which device. The report
itself, :func:`rlhf_lab.runs.machine.check_resources`, reads the GPUs, CPU and RAM through the
:class:`~rlhf_lab.runs.machine.Machine` seam.

"No GPU" is an answer, not a crash: without the NVML library, a driver or a device the result
has ``gpus=[]`` and a note saying why.

Lab runs are found by reading (never writing) ``experiments/*/runs/*/run.json``: runs in state
``starting`` or ``running`` with their pid and, when the launcher recorded it, their ``device``.
A run is matched to a GPU by that field or by its process (or a child of it) appearing in the
GPU's process list.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, Field

from rlhf_lab.paths import experiments_dir
from rlhf_lab.runs.folder import read_record
from trainers.core.runfolder import LIVE_STATES

__all__ = [
    "GpuInfo",
    "GpuProcess",
    "LabRunHold",
    "Resources",
    "gpu_index",
    "query_gpus",
]

GIB = 2**30
# Runs that hold a device: a process exists or is coming up (the contract's live states).
ACTIVE_STATES: frozenset[str] = LIVE_STATES


class GpuProcess(BaseModel):
    pid: int
    used_memory_gb: float | None = Field(description="None where the driver does not report it")
    name: str | None = None
    lab_run: str | None = Field(default=None, description="the lab run this process belongs to")


class GpuInfo(BaseModel):
    index: int = Field(description="the lab's number (cuda:N)")
    nvml_index: int | None = Field(
        default=None,
        description="NVML's (nvidia-smi's) number where CUDA_VISIBLE_DEVICES renumbers",
    )
    name: str
    uuid: str | None = None
    total_gb: float
    used_gb: float
    free_gb: float
    utilization_pct: int | None = None
    processes: list[GpuProcess] = Field(default_factory=list)
    lab_runs: list[str] = Field(default_factory=list, description="lab runs holding this GPU")


class LabRunHold(BaseModel):
    run_id: str
    campaign: str
    state: str
    pid: int | None = None
    device: str | None = None
    devices: list[str] = Field(default_factory=list)
    alive: bool = Field(
        description="the process exists (and, when recorded, has the same create time)"
    )
    gpu_indices: list[int] = Field(default_factory=list)


class Resources(BaseModel):
    host: str
    gpus: list[GpuInfo] = Field(default_factory=list)
    driver_version: str | None = None
    cpu_count: int
    cpu_load: list[float] = Field(description="1, 5 and 15 minute load averages")
    ram_total_gb: float
    ram_available_gb: float
    lab_runs: list[LabRunHold] = Field(default_factory=list)
    slurm: bool = False
    notes: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Lab runs (read only)
# ---------------------------------------------------------------------------------------------


def gpu_index(device: Any) -> int | None:
    """GPU index named by a run's ``device`` field: ``cuda:1`` / ``1`` / ``"1"`` -> 1; ``cuda``
    -> 0; ``cpu`` / None -> None."""
    if device is None or isinstance(device, bool):
        return None
    if isinstance(device, int):
        return device if device >= 0 else None
    text = str(device).strip().lower()
    if text in ("cuda", "gpu", "auto"):
        return 0 if text != "auto" else None
    for prefix in ("cuda:", "gpu:"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return int(text) if text.isdigit() else None


def _alive(pid: int | None, create_time: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    import psutil

    try:
        proc = psutil.Process(pid)
        if isinstance(create_time, (int, float)) and abs(proc.create_time() - create_time) > 1.0:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def _family_pids(pid: int | None) -> set[int]:
    """The run's pid and its children's (a launcher wrapper may own the CUDA process)."""
    if not isinstance(pid, int) or pid <= 0:
        return set()
    import psutil

    pids = {pid}
    try:
        pids.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    except (psutil.Error, OSError):
        pass
    return pids


def active_lab_runs(root: Path | None = None) -> list[LabRunHold]:
    """Runs whose run.json says starting or running (read only)."""
    base = Path(root) if root is not None else experiments_dir()
    out: list[LabRunHold] = []
    if not base.is_dir():
        return out
    for path in sorted(base.glob("*/runs/*/run.json")):
        info = read_record(path.parent).data
        if info is None or info.get("state") not in ACTIVE_STATES or info.get("slurm"):
            continue  # a Slurm job holds the cluster's devices, not this machine's
        pid = info.get("pid") if isinstance(info.get("pid"), int) else None
        device = info.get("device")
        held = info.get("devices") if isinstance(info.get("devices"), list) else [device]
        indices = [i for i in (gpu_index(d) for d in held) if i is not None]
        out.append(
            LabRunHold(
                run_id=str(info.get("id") or path.parent.name),
                campaign=str(info.get("campaign") or path.parent.parent.parent.name),
                state=str(info["state"]),
                pid=pid,
                device=None if device is None else str(device),
                devices=[str(d) for d in held if d is not None],
                alive=_alive(pid, info.get("create_time")),
                gpu_indices=indices,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def query_gpus() -> tuple[list[GpuInfo], str | None, list[str]]:
    """THE device query: every GPU NVML shows (memory, utilisation, processes) in NVML order
    (nvidia-smi's, by PCI bus id), the driver version, and notes on why there is none. Every
    other part of the lab (placement, ``--device auto``, the memory checks, ``gpu``) reads the
    GPUs through this one function, as the real GPU inventory of
    :class:`rlhf_lab.runs.machine.Machine` (where tests set a fake one)."""
    notes: list[str] = []
    gpus, driver = _nvml_gpus(notes)
    return gpus, driver, notes


def lab_numbered(gpus: list[GpuInfo]) -> list[GpuInfo]:
    """``gpus`` (NVML order) as the lab numbers them (``cuda:N``): all of them when
    ``CUDA_VISIBLE_DEVICES`` is unset, else the listed ones in its order, renumbered from 0 as
    CUDA does (entries are NVML indices or UUIDs; CUDA stops at the first unknown entry)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [g.model_copy(update={"nvml_index": g.index}) for g in gpus]
    out = []
    for position, entry in enumerate(v.strip() for v in visible.split(",") if v.strip()):
        match = next((g for g in gpus if str(g.index) == entry or g.uuid == entry), None)
        if match is None:
            break
        out.append(match.model_copy(update={"index": position, "nvml_index": match.index}))
    return out


def _nvml_gpus(notes: list[str]) -> tuple[list[GpuInfo], str | None]:
    try:
        import pynvml
    except ImportError:
        notes.append("no GPU: nvidia-ml-py (pynvml) is not installed")
        return [], None
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        notes.append(f"no GPU: NVML is not available ({_text(err) or type(err).__name__})")
        return [], None
    gpus: list[GpuInfo] = []
    driver = None
    try:
        try:
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
        except Exception:
            driver = None
        count = pynvml.nvmlDeviceGetCount()
        for index in range(count):
            try:
                gpus.append(_one_gpu(pynvml, index))
            except Exception as err:
                notes.append(f"GPU {index}: could not be queried ({_text(err)})")
    except Exception as err:
        notes.append(f"no GPU: NVML query failed ({_text(err)})")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    if not gpus and not any(n.startswith("no GPU") for n in notes):
        notes.append("no GPU: NVML reports no devices")
    return gpus, driver


def _one_gpu(pynvml: ModuleType, index: int) -> GpuInfo:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    name = _text(pynvml.nvmlDeviceGetName(handle))
    try:
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
    except Exception:
        uuid = None
    try:
        util = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:
        util = None
    procs: dict[int, GpuProcess] = {}
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        fn = getattr(pynvml, getter, None)
        if fn is None:
            continue
        try:
            items = fn(handle) or []
        except Exception:
            continue
        for p in items:
            pid = int(getattr(p, "pid", 0) or 0)
            used = getattr(p, "usedGpuMemory", None)
            if pid and pid not in procs:
                procs[pid] = GpuProcess(
                    pid=pid,
                    used_memory_gb=round(used / GIB, 3) if isinstance(used, int) else None,
                    name=_process_name(pid),
                )
    return GpuInfo(
        index=index,
        name=name,
        uuid=uuid,
        total_gb=round(mem.total / GIB, 3),
        used_gb=round(mem.used / GIB, 3),
        free_gb=round(mem.free / GIB, 3),
        utilization_pct=util,
        processes=list(procs.values()),
    )


def _process_name(pid: int) -> str | None:
    import psutil

    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return None
