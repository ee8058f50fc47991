"""What this machine has, as the lab reads it: ONE seam object, :class:`Machine` (the GPU
inventory, the CPU cores this process may use, free and total RAM), and the report built from it,
:func:`check_resources`. Torch-free.

Every part of the lab that asks about the machine (device resolution and placement, the launch's
memory and busy-device checks, the shrink's CPU/GPU rules, the plan's device fit, the CPU share of
a trainer, ``rlhf-lab gpu``) asks :func:`this_machine` at call time. The real answers come from
:mod:`rlhf_lab.runs.resources` (NVML: the one device query) and ``os``/``psutil``.

Tests describe another machine for a block with :func:`using_machine` (tests/conftest.py's
``machine`` fixture): a plain module-level holder, not a context variable, so threads the block
starts (a queue worker, racing launches, the MCP server's tool calls) see the same machine.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rlhf_lab.runs.resources import (
    GIB,
    GpuInfo,
    Resources,
    _family_pids,
    active_lab_runs,
    lab_numbered,
    query_gpus,
)

__all__ = [
    "GpuQuery",
    "Machine",
    "check_resources",
    "this_machine",
    "usable_cores",
    "using_machine",
]

GpuQuery = tuple[list[GpuInfo], str | None, list[str]]
"""(every GPU in NVML order, the driver version, notes on why there is none)."""


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity on Linux, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_ram_gb() -> float:
    """RAM available to a new process now (GiB, psutil's ``available``)."""
    import psutil

    return psutil.virtual_memory().available / GIB


def installed_ram_gb() -> float:
    """All the RAM of this machine (GiB)."""
    import psutil

    return psutil.virtual_memory().total / GIB


@dataclass(frozen=True)
class Machine:
    """The facts of a machine the lab reads, each a function asked at the moment it is needed
    (memory frees up, runs come and go). The defaults are this machine's."""

    gpu_query: Callable[[], GpuQuery] = field(default=query_gpus)
    """Every GPU (memory, processes) in NVML order, the driver, notes: :func:`query_gpus`."""
    cpu_cores: Callable[[], int] = field(default=usable_cores)
    """The cores a trainer started here may use."""
    free_ram_gb: Callable[[], float] = field(default=available_ram_gb)
    """RAM available now (GiB)."""
    total_ram_gb: Callable[[], float] = field(default=installed_ram_gb)
    """All the RAM (GiB)."""

    def gpus(self) -> list[GpuInfo]:
        """Every GPU in NVML order (nvidia-smi's), ``CUDA_VISIBLE_DEVICES`` not applied."""
        return self.gpu_query()[0]

    def visible_gpus(self) -> list[GpuInfo]:
        """The GPUs the lab may use, numbered as ``cuda:N``: narrowed and renumbered by
        ``CUDA_VISIBLE_DEVICES`` when it is set (:func:`rlhf_lab.runs.resources.lab_numbered`)."""
        return lab_numbered(self.gpus())

    def visible_gpu_count(self) -> int:
        return len(self.visible_gpus())

    def device_free_gb(self, device: str) -> float | None:
        """Memory free now on ``device`` (GiB): available RAM for ``cpu``, the GPU's free memory
        for ``cuda``/``cuda:N``; None for a GPU this machine does not show."""
        return self._device_gb(device, free=True)

    def device_total_gb(self, device: str) -> float | None:
        """All the memory of ``device`` (GiB): the RAM for ``cpu``, the GPU's for
        ``cuda``/``cuda:N``; None for a GPU this machine does not show."""
        return self._device_gb(device, free=False)

    def _device_gb(self, device: str, *, free: bool) -> float | None:
        if device == "cpu":
            return round((self.free_ram_gb if free else self.total_ram_gb)(), 3)
        for gpu in self.gpus():  # cuda:N read as NVML's N, as the launch checks always have
            if device in (f"cuda:{gpu.index}", "cuda"):
                return gpu.free_gb if free else gpu.total_gb
        return None


_REAL = Machine()
_current: Machine | None = None


def this_machine() -> Machine:
    """The machine the lab reads now: this one, or the one a :func:`using_machine` block set."""
    return _current or _REAL


@contextmanager
def using_machine(machine: Machine) -> Iterator[Machine]:
    """Inside the block the whole lab (every thread) reads ``machine``; the previous one is
    back afterwards. Blocks nest."""
    global _current
    before = _current
    _current = machine
    try:
        yield machine
    finally:
        _current = before


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def _cpu_load() -> list[float]:
    import psutil

    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return [round(psutil.cpu_percent(interval=None) / 100 * (psutil.cpu_count() or 1), 2)]


def check_resources(include_runs: bool = True) -> Resources:
    """GPUs (memory, processes), CPU count and load, RAM, and the lab runs holding devices."""
    import psutil

    machine = this_machine()
    gpus, driver, found = machine.gpu_query()
    notes = list(found)
    runs = active_lab_runs() if include_runs else []

    to_nvml = {g.index: g.nvml_index for g in lab_numbered(gpus)}
    for run in runs:  # a run's cuda:N is the lab's number; the GPUs below are in NVML's
        run.gpu_indices = [to_nvml.get(i, i) for i in run.gpu_indices]
        pids = _family_pids(run.pid) if run.alive else set()
        for gpu in gpus:
            for proc in gpu.processes:
                if proc.pid in pids:
                    proc.lab_run = run.run_id
                    if gpu.index not in run.gpu_indices:
                        run.gpu_indices.append(gpu.index)
        for idx in run.gpu_indices:
            for gpu in gpus:
                if gpu.index == idx and run.run_id not in gpu.lab_runs:
                    gpu.lab_runs.append(run.run_id)
        if not run.alive:
            notes.append(
                f"run {run.run_id} is marked {run.state} but its process is gone "
                "(reading its status will mark it died)"
            )
    if gpus and os.environ.get("CUDA_VISIBLE_DEVICES"):
        notes.append(
            f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}: NVML lists every GPU in "
            "nvidia-smi order; CUDA renumbers the visible ones"
        )
    return Resources(
        host=socket.gethostname(),
        gpus=gpus,
        driver_version=driver,
        cpu_count=psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        cpu_load=_cpu_load(),
        ram_total_gb=round(machine.total_ram_gb(), 3),
        ram_available_gb=round(machine.free_ram_gb(), 3),
        lab_runs=runs,
        slurm=shutil.which("sbatch") is not None,
        notes=notes,
    )
