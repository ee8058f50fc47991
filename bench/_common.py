"""Shared plumbing for the bench/ scripts: machine description, package versions, runs that
alternate between the contenders so machine drift cancels, medians, the printed table and
``bench/results/<name>.json``. Standard library only (torch is optional, imported when present).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"


def package_versions(*names: str) -> dict[str, str]:
    """Installed versions of ``names`` (missing ones are left out)."""
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def machine_info() -> dict[str, Any]:
    """Where the numbers were measured: CPU, cores, threads, GPU and the load when measuring."""
    info: dict[str, Any] = {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def alternate(contenders: dict[str, Callable[[], dict]], rounds: int) -> dict[str, list[dict]]:
    """Run every contender once per round, flipping the order each round (A B, B A, A B, ...)
    so slow drift of the machine (thermal, neighbours) falls on both. Each call returns its own
    figures (a dict); the lists keep them in call order."""
    names = list(contenders)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            results[name].append(contenders[name]())
    return results


def time_variants(variants: dict[str, Callable[[], Any]], reps: int) -> dict[str, dict]:
    """Median wall and CPU seconds of each variant's call, alternating between them (after one
    untimed call each) so drift of the machine falls on all."""
    for fn in variants.values():
        fn()
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(reps):
        for name in names if r % 2 == 0 else reversed(names):
            started, started_cpu = time.perf_counter(), time.process_time()
            variants[name]()
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - started_cpu)
    return {
        "wall": {name: statistics.median(ts) for name, ts in wall.items()},
        "cpu": {name: statistics.median(ts) for name, ts in cpu.items()},
    }


def median_of(rows: Sequence[dict], key: str) -> float | None:
    values = [row[key] for row in rows if isinstance(row.get(key), int | float)]
    return statistics.median(values) if values else None


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain fixed-width table on stdout (numbers to 3 significant decimals)."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return "-" if value is None else str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    """``payload`` as indented JSON at ``path`` (its folder made when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def write_results(name: str, payload: dict[str, Any], out: Path | None = None) -> Path:
    """Write ``bench/results/<name>.json`` with the date, machine and versions added."""
    path = out or RESULTS_DIR / f"{name}.json"
    report = {
        "benchmark": name,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": package_versions("torch", "transformers", "trl", "rlhf-lab", "mcp"),
        **payload,
    }
    write_json(path, report)
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return path
