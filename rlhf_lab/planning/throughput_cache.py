"""The throughput calibration of a model on this machine, measured once and kept. Torch-free.

The measurement itself is trainer-side (``python -m trainers.core.throughput``, run here as a
subprocess); its JSON is cached under ``$RLHF_LAB_CACHE/throughput/`` (the same root as the
built presets and pulled models: a fact of this machine, not of one repository), one file per
key. The key holds everything that changes the figures: the model's shape
(:func:`trainers.core.models.architecture_fingerprint`: its layers, widths and dtype, not its
weights, so a warm start saved from a pulled model uses the pulled model's figures), the device,
the intra-op thread count, the torch version, the host and the measurement's format version.

Modes (``$RLHF_LAB_THROUGHPUT`` or the caller's ``mode``): ``auto`` measures when nothing is
cached, ``cached`` only reads the cache (what a launch and the test suite use: a miss is "not
calibrated", never a surprise measurement), ``off`` never calibrates. A
:func:`calibration_scope` sets the mode, and the measurement itself, for a block.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = [
    "CALIBRATION_ENV",
    "CalibrationResult",
    "Mode",
    "cache_key",
    "calibration_mode",
    "calibration_scope",
    "default_threads",
    "get_calibration",
    "read_cached",
    "throughput_cache_dir",
    "write_cached",
]

Mode = Literal["auto", "cached", "off"]
CALIBRATION_ENV = "RLHF_LAB_THROUGHPUT"
TIMEOUT_S = 300  # a calibration that takes longer than this is not worth waiting for in a plan


class CalibrationResult(BaseModel):
    """The calibration for one key, or why there is none."""

    key: str | None = None
    data: dict[str, Any] | None = Field(default=None, description="the trainer-side JSON")
    measured_now: bool = Field(default=False, description="it ran during this call")
    seconds: float | None = Field(default=None, description="what measuring it cost")
    reason: str | None = Field(default=None, description="why there is no calibration")

    @property
    def ok(self) -> bool:
        return self.data is not None


def throughput_cache_dir() -> Path:
    from trainers.core.tiny import cache_root

    return cache_root() / "throughput"


Measure = Callable[[str, str, "int | None"], dict[str, Any]]
"""``(model, device, threads) -> the trainer-side JSON`` (raises RuntimeError)."""


@dataclass(frozen=True)
class _Scope:
    mode: str | None = None
    measure: Measure | None = None


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("calibration", default=None)


def _scope() -> _Scope:
    return _SCOPE.get() or _Scope()


@contextlib.contextmanager
def calibration_scope(mode: str | None, measure: Measure | None = None) -> Iterator[None]:
    """Within the block, calibrations use ``mode`` (None: unchanged), e.g. a plan asked not to
    calibrate reads the cache only, and measure with ``measure`` instead of the trainer-side
    subprocess when it is given (None: unchanged; how tests stand in for a measurement)."""
    outer = _scope()
    token = _SCOPE.set(_Scope(mode or outer.mode, measure or outer.measure))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def calibration_mode(mode: str | None = None) -> Mode:
    """The caller's mode, else the enclosing :func:`calibration_scope`'s, else
    ``$RLHF_LAB_THROUGHPUT``, else ``auto``. A scope or variable can only make it stricter
    than ``auto``: ``off`` beats ``cached`` beats ``auto``."""
    order = ("auto", "cached", "off")
    scoped = _scope().mode
    given = [m.strip().lower() for m in (mode, scoped, os.environ.get(CALIBRATION_ENV)) if m]
    given = [m for m in given if m in order]
    if mode and mode in order:
        return mode  # type: ignore[return-value]
    return max(given, key=order.index, default="auto")  # type: ignore[return-value]


def default_threads() -> int:
    """The intra-op threads a run started now gets: ``OMP_NUM_THREADS`` when set (the launcher
    keeps it), else every core this process may use (the launcher's share when alone)."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    from rlhf_lab.runs.machine import this_machine

    return this_machine().cpu_cores()


def _torch_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "none"


def cache_key(
    fingerprint: str, device: str, threads: int | None, torch_version: str, host: str
) -> str:
    """One file name per (weights, device, threads, torch, host, format version)."""
    from trainers.core.throughput import FORMAT_VERSION

    parts = [fingerprint, device, str(threads if device == "cpu" else ""), torch_version, host]
    digest = hashlib.sha256("|".join([*parts, str(FORMAT_VERSION)]).encode()).hexdigest()
    return f"{fingerprint}-{device.replace(':', '')}-t{threads or 0}-{digest[:12]}"


def _key_for(model: str, device: str, threads: int | None) -> str:
    from trainers.core.models import architecture_fingerprint

    return cache_key(
        architecture_fingerprint(model),
        device,
        threads,
        _torch_version(),
        platform.node() or "host",
    )


def read_cached(key: str) -> dict[str, Any] | None:
    """The cached calibration of ``key``; None when missing, unreadable or of another format."""
    from trainers.core.throughput import FORMAT_VERSION

    path = throughput_cache_dir() / f"{key}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        return None
    return data


def write_cached(key: str, data: dict[str, Any]) -> Path:
    folder = throughput_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.json"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
    return path


def _measure(model: str, device: str, threads: int | None) -> dict[str, Any]:
    """Run the trainer-side calibration and return its JSON (raises RuntimeError)."""
    argv = [sys.executable, "-m", "trainers.core.throughput", "--model", model]
    argv += ["--device", device, "--json"]
    env = dict(os.environ)
    if threads and device == "cpu":
        argv += ["--threads", str(threads)]
        env["OMP_NUM_THREADS"] = str(threads)
    from rlhf_lab.planning.catalog import source_root

    try:
        out = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            cwd=source_root(),
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the calibration took more than {TIMEOUT_S} s") from None
    if out.returncode != 0:
        tail = (out.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the calibration failed: {first_sentence(tail[0])}")
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RuntimeError("the calibration printed no JSON") from None


def _loadable(model: str) -> bool:
    """Whether a trainer could load ``model`` here without network (a hub model whose weights
    are not cached is not measured: its subprocess would only fail)."""
    from rlhf_lab.errors import LabError
    from rlhf_lab.planning.memory import model_facts

    try:
        return bool(model_facts(model).loadable)
    except LabError:  # a hub id whose config is not cached: nothing here to load
        return False
    except Exception:  # noqa: BLE001 - let the measurement say
        return True


def first_sentence(error_line: str, limit: int = 160) -> str:
    """``pkg.Error: Model X is not here. Try Y.`` -> ``Model X is not here`` (at most
    ``limit`` characters): a traceback's last line as a short reason."""
    head, sep, rest = error_line.partition(": ")
    text = rest if sep and "." in head and " " not in head else error_line
    text = text.split(". ")[0].rstrip(".")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def get_calibration(
    model: str | None, device: str = "cpu", threads: int | None = None, mode: str | None = None
) -> CalibrationResult:
    """The calibration of ``model`` on ``device`` with ``threads`` (default: this machine's,
    :func:`default_threads`): from the cache, else measured now when the mode is ``auto``."""
    wanted = calibration_mode(mode)
    if wanted == "off":
        return CalibrationResult(reason="calibration switched off")
    if not model:
        return CalibrationResult(reason="the config names no model")
    device = "cpu" if device.startswith("cpu") else device
    threads = threads or (default_threads() if device == "cpu" else None)
    try:
        key = _key_for(model, device, threads)
    except Exception as err:  # noqa: BLE001 - an unresolvable model is "not calibrated"
        return CalibrationResult(reason=f"model {model!r} not resolvable here ({err})")
    cached = read_cached(key)
    if cached is not None:
        return CalibrationResult(key=key, data=cached)
    if wanted == "cached":
        return CalibrationResult(key=key, reason="no calibration cached for this model here")
    if not _loadable(model):
        return CalibrationResult(
            key=key, reason=f"model {model} cannot be loaded here (no download is attempted)"
        )
    from rlhf_lab.planning.notices import starting

    where = f"{device}, {threads} thread(s)" if threads else device
    starting(
        f"measuring the throughput of {model} on {where} for the time estimates "
        "(once: cached for later plans)..."
    )
    start = time.perf_counter()
    try:
        data = (_scope().measure or _measure)(model, device, threads)
    except RuntimeError as err:
        return CalibrationResult(key=key, reason=str(err))
    write_cached(key, data)
    return CalibrationResult(
        key=key, data=data, measured_now=True, seconds=round(time.perf_counter() - start, 1)
    )
