"""One run folder as a row of the run index: ids, state, timestamps, model, seed, W&B link, the
run's own headline metric (final and best) and its final metrics. Torch-free.

The state and the last rows come from the lab's one status reader
(:func:`rlhf_lab.runs.state._status`), so the index never disagrees with ``run_status``. The
headline's best value needs every held-out row, so ``metrics.jsonl`` is scanned once, keeping
per metric a few running statistics (:class:`MetricScan`): a run still writing rows is scanned
on from where the last scan stopped, and a finished run is never read again unless one of its
files changes.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = [
    "IndexedRun",
    "MetricScan",
    "extract_run",
    "file_sig",
    "record_sig",
    "scan_metrics",
    "stat_sig",
]

# Files whose change can change a finished run's row (run.json is checked on every listing).
WATCHED_FILES = ("metrics.jsonl", "summary.json", "exit.json", "progress.json", "config.yaml")
# A file modified this recently may change again within the file system's timestamp resolution:
# its signature is not trusted (the row is read again next time), as git does with racy files.
RACY_NS = 2_000_000_000
_META_KEYS = ("step", "time_s", "phase")
_DATED = re.compile(r"^\d{4}-\d{2}-\d{2}-")


def stat_sig(path: str | Path, now_ns: int, *, size: bool = True) -> str | None:
    """``ino:size:mtime`` of a file (``ino:mtime`` without ``size``, for a folder), "-" when it
    is absent, None when it changed too recently to be trusted."""
    try:
        st = os.stat(path)
    except OSError:
        return "-"
    if now_ns - st.st_mtime_ns < RACY_NS:
        return None
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}" if size else f"{st.st_ino}:{st.st_mtime_ns}"


def record_sig(run_dir: str | Path, now_ns: int) -> str | None:
    """The signature of run.json (checked for every run on every listing)."""
    return stat_sig(f"{run_dir}/run.json", now_ns)


def file_sig(run_dir: str | Path, now_ns: int) -> str | None:
    """The signature of the other files a row is built from (None: not to be trusted)."""
    parts = [stat_sig(f"{run_dir}/{name}", now_ns) for name in WATCHED_FILES]
    if any(p is None for p in parts):
        return None
    return "|".join(p for p in parts if p is not None)


# ---------------------------------------------------------------------------------- the scan


@dataclass
class MetricScan:
    """Running statistics of each metric over the rows of metrics.jsonl read so far (held-out
    rows and rows naming the proxy reward: what the headline rule looks at). ``stats[name]``:
    [values, finite values, nonzero seen, min, min step, max, max step, last, last step]."""

    ino: int | None = None
    offset: int = 0
    stats: dict[str, list[Any]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"ino": self.ino, "offset": self.offset, "stats": self.stats})

    @classmethod
    def from_json(cls, text: str | None) -> MetricScan:
        try:
            data = json.loads(text or "")
            return cls(ino=data["ino"], offset=int(data["offset"]), stats=dict(data["stats"]))
        except (ValueError, KeyError, TypeError):
            return cls()

    def add(self, row: dict[str, Any]) -> None:
        step = row.get("step")
        for name, value in row.items():
            if name in _META_KEYS or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            value = float(value)
            s = self.stats.setdefault(name, [0, 0, False, None, None, None, None, None, None])
            s[0] += 1
            s[2] = s[2] or value != 0
            if not math.isfinite(value):
                continue
            s[1] += 1
            if s[3] is None or value < s[3]:
                s[3], s[4] = value, step
            if s[5] is None or value > s[5]:
                s[5], s[6] = value, step
            s[7], s[8] = value, step

    def rows(self) -> list[dict[str, Any]]:
        """Stand-in rows that tell the headline rule what it asks of real rows: which metrics
        were logged with a finite value, and which were 0 at every one of two or more rows."""
        out: list[dict[str, Any]] = []
        for name, s in self.stats.items():
            if s[1]:
                out.append({name: s[7]})
            elif s[0]:
                out.append({name: float("nan")})
            if s[0] >= 2 and not s[2]:
                out += [{name: 0.0}, {name: 0.0}]
        return out


def _wanted(line: bytes) -> bool:
    return b'"eval' in line or b"proxy_reward" in line


def scan_metrics(path: Path, scan: MetricScan) -> MetricScan:
    """``scan`` carried on over the whole lines appended to ``path`` since it stopped (from the
    start when the file was replaced or shrank)."""
    try:
        st = os.stat(path)
    except OSError:
        return MetricScan()
    if scan.ino != st.st_ino or st.st_size < scan.offset:
        scan = MetricScan(ino=st.st_ino)
    if st.st_size == scan.offset:
        return scan
    with open(path, "rb") as fh:
        fh.seek(scan.offset)
        data = fh.read(st.st_size - scan.offset)
    end = data.rfind(b"\n")
    if end < 0:
        return scan
    for line in data[:end].split(b"\n"):
        if not _wanted(line):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            scan.add(row)
    scan.offset += end + 1
    return scan


# ----------------------------------------------------------------------------------- the row


@dataclass
class IndexedRun:
    """A row of the ``runs`` table plus its final metrics (name -> (phase, value, step))."""

    row: dict[str, Any]
    metrics: dict[str, tuple[str, float, int | None]]


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _headline(
    family: str | None, algorithm: str | None, config: TrainerConfig | None, scan: MetricScan
):
    """(metric, higher is better, final, final step, best, best step) of the run's own headline."""
    from rlhf_lab.results.headline import headline_for

    try:
        head = headline_for(family, algorithm, config, scan.rows())
    except Exception:  # an unknown algorithm of a known family: no headline, never a crash
        head = None
    if head is None:
        return None, None, None, None, None, None
    s = scan.stats.get(head.metric)
    if not s or not s[1]:
        return head.metric, head.higher_is_better, None, None, None, None
    best, best_step = (s[5], s[6]) if head.higher_is_better else (s[3], s[4])
    return head.metric, head.higher_is_better, s[7], s[8], best, best_step


def _final_metrics(status: Any) -> dict[str, tuple[str, float, int | None]]:
    out: dict[str, tuple[str, float, int | None]] = {}
    for phase, last in (("train", status.last_train), ("eval", status.last_eval)):
        step = last.get("step") if isinstance(last.get("step"), int) else None
        for name, value in last.items():
            if name in _META_KEYS or (number := _finite(value)) is None:
                continue
            out[name] = (phase, number, step)
    return out


def extract_run(run_dir: Path, previous_scan: str | None, now_ns: int) -> IndexedRun:
    """The index row of ``run_dir`` (a damaged run is listed as died with the reason, as the
    folder scan did). ``previous_scan``: the stored scan to carry on (None: read from the
    start)."""
    from rlhf_lab.errors import LabError
    from rlhf_lab.planning.trainer_config import read_run_config
    from rlhf_lab.runs.state import _status, _unreadable_run

    # signatures first: a file changing while it is read is then read again next time
    rec_sig, files_sig = record_sig(run_dir, now_ns), file_sig(run_dir, now_ns)
    try:
        status = _status(run_dir)
    except LabError as err:
        status = _unreadable_run(run_dir, str(err))
    config = read_run_config(run_dir, status.family)
    scan = scan_metrics(run_dir / "metrics.jsonl", MetricScan.from_json(previous_scan))
    metric, higher, final, final_step, best, best_step = _headline(
        status.family, status.algorithm, config, scan
    )
    model_name = config.get("model.name") if config is not None else None
    seed = config.get("seed") if config is not None else None
    campaign = run_dir.parent.parent.name
    row = {
        "id": run_dir.name,  # the folder is the run's identity (find_run looks it up so)
        "campaign": campaign,
        "slug": _DATED.sub("", campaign),
        "family": status.family,
        "algorithm": status.algorithm,
        "state": status.state,
        "created_at": status.created_at,
        "started_at": status.started_at,
        "ended_at": status.ended_at,
        "model": model_name if isinstance(model_name, str) else None,
        "seed": seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
        "device": status.device,
        "wandb_url": status.wandb_url,
        "step": status.step,
        "total_steps": status.total_steps,
        "outcome": status.outcome,
        "error": (status.error or "")[:500] or None,
        "headline": metric,
        "higher_is_better": None if higher is None else int(higher),
        "final": final,
        "final_step": final_step,
        "best": best,
        "best_step": best_step,
        # an active run is read again on every listing anyway
        "record_sig": rec_sig,
        "files_sig": files_sig,
        "scan": scan.to_json(),
    }
    return IndexedRun(row=row, metrics=_final_metrics(status))
