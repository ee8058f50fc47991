"""Devices a run trains on: ``cpu`` or ``cuda:N`` resolved from what the caller asked and what
this machine shows, and the CPU share of a trainer started beside other CPU runs. Torch-free:
GPUs are counted through NVML (``pynvml``), never through torch.

``_visible_gpu_count`` and ``_cpu_cores`` are called through the :mod:`rlhf_lab.runs` package
(tests replace them there).
"""

from __future__ import annotations

import os
import re

from rlhf_lab.errors import InvalidArgument, NextStep
from rlhf_lab.runs.records import patchable

__all__ = ["DEVICE_RE", "cpu_threads_beside", "resolve_device"]

DEVICE_RE = re.compile(r"^(cpu|cuda:\d{1,3})$")


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
        return "cuda:0" if patchable()._visible_gpu_count() > 0 else "cpu"
    if device == "cuda":
        return "cuda:0"
    if not DEVICE_RE.fullmatch(device):
        raise InvalidArgument(
            f"bad device {device!r}: use auto, cpu, cuda or cuda:N (e.g. cuda:1)",
            next=NextStep("check_resources", note="lists the devices of this machine"),
        )
    return device


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
