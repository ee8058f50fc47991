"""Devices a run trains on: ``cpu`` or ``cuda:N`` (or a set of them for a run under torchrun)
resolved from what the caller asked and what this machine shows, the free GPUs a queued run is
placed on, and the CPU share of a trainer started beside other CPU runs. Torch-free.

Numbering: ``cuda:N`` and ``--gpus`` ids are the lab's numbers, which are NVML's (nvidia-smi's,
by PCI bus id) when ``CUDA_VISIBLE_DEVICES`` is unset, and positions in that list when it is
set (as CUDA numbers them). The trainer gets ``CUDA_VISIBLE_DEVICES`` set to the physical ids
and ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so its ``cuda:0..k-1`` are exactly the GPUs the lab chose.

Every GPU fact comes from :func:`rlhf_lab.runs.machine.this_machine` (whose real GPU inventory is
:func:`rlhf_lab.runs.resources.query_gpus`, the one device query; tests set a fake machine).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from rlhf_lab.errors import InvalidArgument, NextStep, Unavailable
from rlhf_lab.runs.machine import this_machine

if TYPE_CHECKING:  # pragma: no cover
    from rlhf_lab.planning.trainer_config import TrainerConfig
    from rlhf_lab.runs.resources import GpuInfo

__all__ = [
    "DEVICE_RE",
    "Placement",
    "cpu_threads_beside",
    "freest_gpus",
    "parse_gpus",
    "resolve_device",
    "resolve_placement",
    "visible_gpus",
]

DEVICE_RE = re.compile(r"^(cpu|cuda:\d{1,3})$")
MAX_NPROC = 256


def _visible_entries() -> list[str] | None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return [v.strip() for v in visible.split(",") if v.strip()]


def visible_gpus() -> list[GpuInfo]:
    """The GPUs the lab may use, numbered as ``cuda:N``: NVML's list in nvidia-smi order,
    narrowed and renumbered by ``CUDA_VISIBLE_DEVICES`` when it is set (entries are NVML
    indices or GPU UUIDs; ``-1`` or an empty value hides every GPU)."""
    return this_machine().visible_gpus()


def physical_gpu_ids(devices: list[str]) -> list[str]:
    """What the trainer's ``CUDA_VISIBLE_DEVICES`` holds for the lab devices ``cuda:N``: the
    entries of the lab's own ``CUDA_VISIBLE_DEVICES`` at those positions, else the numbers."""
    entries = _visible_entries()
    out = []
    for dev in devices:
        index = int(dev.split(":", 1)[1])
        out.append(entries[index] if entries is not None and index < len(entries) else str(index))
    return out


class Placement(BaseModel):
    """Where a run trains: its devices (``["cpu"]``, ``["cuda:0", "cuda:2"]``) or, when the
    lab picks at start time, how many GPUs; and how many processes (ranks) it runs."""

    devices: list[str] = Field(default_factory=list, description="empty: picked at start")
    gpus_wanted: int = Field(default=0, description="GPUs to pick at start (0: devices fixed)")
    nproc: int = Field(default=1, description="ranks on this machine (torchrun processes)")
    distributed: bool = Field(default=False, description="started under torchrun")

    @property
    def world_size(self) -> int:
        return self.nproc

    @property
    def device(self) -> str:
        """The run's first device (run.json ``device``), ``auto`` until the lab picks."""
        return self.devices[0] if self.devices else "auto"


def parse_gpus(gpus: str | int | None) -> tuple[list[int] | None, int | None]:
    """``--gpus``: ``"0,1,2,3"`` (or ``"2,"``) names GPU ids, ``"4"`` (or ``4``) asks for that
    many GPUs; returns (ids, count), one of them None."""
    if gpus is None:
        return None, None
    text = str(gpus).strip()
    hint = "gpus is a count (e.g. 4) or comma-separated GPU ids (e.g. 0,1,2,3; one id: 2,)"
    if "," in text:
        parts = [x.strip() for x in text.split(",") if x.strip()]
        if not parts or not all(x.isdigit() for x in parts):
            raise InvalidArgument(f"bad gpus {text!r}: {hint}")
        ids = [int(x) for x in parts]
        if len(set(ids)) != len(ids):
            raise InvalidArgument(f"bad gpus {text!r}: an id appears twice")
        return ids, None
    if not text.isdigit() or int(text) < 1:
        raise InvalidArgument(f"bad gpus {text!r}: {hint}")
    return None, int(text)


def _no_such_gpu(asked: str, count: int) -> Unavailable:
    return Unavailable(
        f"{asked} was asked for but this machine shows {count} GPU(s) (numbered 0 to "
        f"{count - 1}; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        if count
        else f"{asked} was asked for but this machine shows no GPU",
        next=[NextStep("check_resources", note="lists the GPUs this machine shows")],
    )


def resolve_placement(
    device: str | None,
    gpus: str | int | None = None,
    nproc: int | None = None,
    config: TrainerConfig | None = None,
) -> Placement:
    """The devices and ranks of a run from ``device`` (auto, cpu, cuda, cuda:N), ``gpus``
    (ids or a count: one rank per GPU, under torchrun) and ``nproc`` (ranks on the CPU, under
    torchrun). ``auto``/``cuda`` on a machine with GPUs leaves the GPU to be picked (the freest
    free one, :func:`freest_gpus`); a GPU id this machine does not show is refused."""
    if nproc is not None and (isinstance(nproc, bool) or not 1 <= int(nproc) <= MAX_NPROC):
        raise InvalidArgument(f"nproc must be between 1 and {MAX_NPROC}, got {nproc!r}")
    ids, count = parse_gpus(gpus)
    if ids is None and count is None:
        if nproc is not None:
            if device not in (None, "auto", "cpu"):
                raise InvalidArgument(
                    "nproc is the number of CPU processes; on GPUs name them with gpus "
                    "(ids or a count) instead of a device"
                )
            return Placement(devices=["cpu"], nproc=int(nproc), distributed=True)
        dev = (device or "auto").strip().lower()
        if dev in ("auto", "cuda"):
            resolved = resolve_device(dev, config)
            if resolved == "cpu":
                return Placement(devices=["cpu"])
            return Placement(gpus_wanted=1)
        return Placement(devices=[resolve_device(dev, config)])
    if device not in (None, "auto", "cuda"):
        raise InvalidArgument(
            f"give either a device ({device}) or gpus ({gpus}), not both",
            next=NextStep("check_resources", note="lists the GPUs"),
        )
    shown = this_machine().visible_gpu_count()
    if count is not None:
        if count > shown:
            raise _no_such_gpu(f"{count} GPU(s)", shown)
        wanted = count
        placement = Placement(gpus_wanted=wanted, nproc=wanted, distributed=True)
    else:
        missing = [i for i in ids or [] if i >= shown]
        if missing:
            raise _no_such_gpu(f"GPU {', '.join(map(str, missing))}", shown)
        devices = [f"cuda:{i}" for i in ids or []]
        placement = Placement(devices=devices, nproc=len(devices), distributed=True)
    if nproc is not None and int(nproc) != placement.nproc:
        raise InvalidArgument(
            f"nproc {nproc} differs from the {placement.nproc} GPU(s) asked for: one process "
            "per GPU (leave nproc out)"
        )
    return placement


def freest_gpus(count: int, held: set[str]) -> list[str] | None:
    """The ``count`` GPUs with the most free memory that no lab run holds (``held``), freest
    first; None when fewer than ``count`` are free."""
    free = [g for g in visible_gpus() if f"cuda:{g.index}" not in held]
    if len(free) < count:
        return None
    free.sort(key=lambda g: (-g.free_gb, g.index))
    return sorted((f"cuda:{g.index}" for g in free[:count]), key=lambda d: int(d.split(":")[1]))


def resolve_device(device: str | None, config: TrainerConfig | None = None) -> str:
    """``auto`` -> ``cpu`` when the config pins the CPU or no GPU is visible, else ``cuda:0``;
    ``cuda`` -> ``cuda:0``. Returns ``cpu`` or ``cuda:N``. (Which GPU a new run gets is
    :func:`resolve_placement`'s choice: the freest free one.)"""
    device = (device or "auto").strip().lower()
    if device == "auto":
        if config is not None and config.get("model.device") == "cpu":
            return "cpu"
        return "cuda:0" if this_machine().visible_gpu_count() > 0 else "cpu"
    if device == "cuda":
        return "cuda:0"
    if not DEVICE_RE.fullmatch(device):
        raise InvalidArgument(
            f"bad device {device!r}: use auto, cpu, cuda or cuda:N (e.g. cuda:1)",
            next=NextStep("check_resources", note="lists the devices of this machine"),
        )
    return device


def cpu_threads_beside(sharing: int, cores: int) -> int:
    """Intra-op threads for a CPU trainer that starts beside ``sharing`` other CPU runs: the
    cores split evenly, at least one. (torch's default, one thread per core in every process,
    oversubscribes a shared CPU and runs many times slower.)"""
    return max(1, cores // (sharing + 1))
