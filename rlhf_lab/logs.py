"""Reading a run: its metrics (down-sampled), and the lab's one diagnosis of failure modes
(alerts with one-line hints for a run's status; :func:`run_notes` for a ledger row). Torch-free;
reads the run folder through :mod:`rlhf_lab.runfolder` and train.log through
:mod:`rlhf_lab.runlog` (``tail_log`` and the log helpers are re-exported here)."""

from __future__ import annotations

import math
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rlhf_lab.errors import InvalidArgument
from rlhf_lab.paths import find_run
from rlhf_lab.runfolder import read_json_lines, read_metric_rows, read_summary
from rlhf_lab.runlog import (
    PARTIAL_LINE_IDLE_S,
    TRACEBACK_HEAD,
    LogChunk,
    fold_carriage_returns,
    last_traceback,
    tail_log,
)
from rlhf_lab.runlog import last_error_line as _last_error_line
from rlhf_lab.runlog import read_log as _read_log
from rlhf_lab.runs import RunStatus, run_state
from trainers.core.runfolder import TERMINAL_STATES

__all__ = [
    "PARTIAL_LINE_IDLE_S",
    "TRACEBACK_HEAD",
    "Alert",
    "LogChunk",
    "MetricSeries",
    "diagnose",
    "fold_carriage_returns",
    "last_traceback",
    "read_metrics",
    "repetition_reason",
    "run_notes",
    "tail_log",
]

STALL_AFTER_S = 900.0
ZERO_STD_THRESHOLD = 0.9
ZERO_STD_ROWS = 3
FLAT_WINDOW = 6
# Per family: (metric, phase) candidates for "is it learning?", first present wins. A rule of the
# flat-learning check, not the key-metric table (that is the catalog's, see ledger/metrics.py).
# (Kept here: the order is the check's own — a policy-gradient run is judged on its training
# correctness first, which every step logs, before the periodic held-out one.)
KEY_METRICS: dict[str, tuple[tuple[str, str], ...]] = {
    "direct_alignment": (("eval/accuracy", "eval"), ("accuracy", "train")),
    "policy_gradients": (("avg_correctness", "train"), ("eval/avg_correctness", "eval")),
    "reward_models": (
        ("eval/accuracy", "eval"),
        ("eval/auroc", "eval"),
        ("eval/step_accuracy", "eval"),
    ),
    "sft": (("loss", "train"),),
}
DOWNLOAD_PATTERNS = (
    "OfflineModeIsEnabled",
    "ModelNotAvailableError",
    "DatasetNotFoundError",
    "Couldn't reach",
    "ConnectionError",
)
OOM_RE = re.compile(
    r"CUDA out of memory|OutOfMemoryError|MPS backend out of memory|"
    r"DefaultCPUAllocator: (?:can't allocate|not enough) memory|^Killed\s*$",
    re.MULTILINE,
)


class MetricSeries(BaseModel):
    run_id: str
    phase: str | None = None
    keys: list[str] = Field(description="metric names in the returned rows")
    rows: list[dict[str, Any]] = Field(
        description="step, phase, time_s and the metrics; non-finite values stay as 'nan'/'inf'"
    )
    total_rows: int = Field(description="matching rows before down-sampling")
    downsampled: bool = False


class Alert(BaseModel):
    kind: Literal[
        "oom",
        "nan_loss",
        "stalled",
        "no_reward_contrast",
        "repetition",
        "flat_learning",
        "download_failure",
        "failed",
        "died",
    ]
    severity: Literal["error", "warning", "info"]
    message: str
    hint: str = Field(description="one actionable line")
    step: int | None = None
    detail: str | None = Field(default=None, description="e.g. the last traceback")


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def _even_indices(n: int, k: int) -> list[int]:
    """k indices spread evenly over range(n), always including the first and the last."""
    if k >= n:
        return list(range(n))
    if k == 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def read_metrics(
    run_id: str,
    keys: list[str] | None = None,
    phase: str | None = None,
    max_points: int | None = None,
) -> MetricSeries:
    """metrics.jsonl rows of a run. ``keys`` keeps only those metrics (rows holding none of them
    are dropped); ``phase`` keeps one phase (train / eval / rollout); ``max_points`` down-samples
    each phase evenly, always keeping its last row."""
    if max_points is not None and max_points < 1:
        raise InvalidArgument("max_points must be at least 1")
    rows = read_metric_rows(find_run(run_id) / "metrics.jsonl").rows
    if phase is not None:
        rows = [r for r in rows if r.get("phase") == phase]
    meta = ("step", "phase", "time_s")
    if keys:
        wanted = list(dict.fromkeys(keys))
        rows = [
            {**{m: r[m] for m in meta if m in r}, **{k: r[k] for k in wanted if k in r}}
            for r in rows
            if any(k in r for k in wanted)
        ]
    total = len(rows)
    downsampled = False
    if max_points is not None:
        by_phase: dict[Any, list[int]] = {}
        for i, r in enumerate(rows):
            by_phase.setdefault(r.get("phase"), []).append(i)
        keep: list[int] = []
        for idx in by_phase.values():
            picked = _even_indices(len(idx), max_points)
            keep.extend(idx[j] for j in picked)
            downsampled = downsampled or len(picked) < len(idx)
        rows = [rows[i] for i in sorted(keep)]
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            if k not in meta:
                seen.setdefault(k, None)
    return MetricSeries(
        run_id=run_id,
        phase=phase,
        keys=list(seen),
        rows=rows,
        total_rows=total,
        downsampled=downsampled,
    )


# ---------------------------------------------------------------------------------------------
# Diagnose
# ---------------------------------------------------------------------------------------------


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf", "+inf"):
        return float(value)
    return None


def repetition_reason(text: str, min_tokens: int = 16) -> str | None:
    """Why a completion looks collapsed (None if it does not): one token repeated many times in
    a row, one n-gram (n = 2..4) covering most of it, a loop (few distinct 4-grams), or one
    character repeated at length."""
    run_ch = max((len(m.group(0)) for m in re.finditer(r"(\S)\1*", text)), default=0)
    if run_ch >= 40:
        return f"one character repeated {run_ch} times in a row"
    toks = re.findall(r"\w+|[^\w\s]", text)
    if len(toks) < min_tokens:
        return None
    longest, cur = 1, 1
    for a, b in zip(toks, toks[1:], strict=False):
        cur = cur + 1 if a == b else 1
        longest = max(longest, cur)
    if longest >= 10:
        return f"one token repeated {longest} times in a row"
    for n in (2, 3, 4):
        grams = Counter(tuple(toks[i : i + n]) for i in range(len(toks) - n + 1))
        gram, count = grams.most_common(1)[0]
        coverage = min(1.0, count * n / len(toks))
        if count >= 4 and coverage >= 0.6:
            return f"the {n}-gram {' '.join(gram)!r} covers {coverage:.0%} of it"
    fours = [tuple(toks[i : i + 4]) for i in range(len(toks) - 3)]
    distinct = len(set(fours)) / len(fours)
    if len(toks) >= 24 and distinct <= 0.25:
        return f"it loops: only {distinct:.0%} of its 4-grams are distinct"
    return None


def _sample_text(row: dict) -> str | None:
    for key in ("completion", "response", "output", "text", "generation"):
        value = row.get(key)
        if isinstance(value, str):
            return value
    return None


def _check_samples(path: Path) -> Alert | None:
    rows = [r for r in read_json_lines(path).rows if _sample_text(r) is not None]
    if not rows:
        return None
    last_step = rows[-1].get("step")
    latest = [r for r in rows if r.get("step") == last_step]
    collapsed = [(r, why) for r in latest if (why := repetition_reason(_sample_text(r) or ""))]
    if not collapsed or len(collapsed) * 2 < len(latest):
        return None
    row, why = collapsed[0]
    excerpt = (_sample_text(row) or "")[:160].replace("\n", " ")
    return Alert(
        kind="repetition",
        severity="warning",
        step=last_step if isinstance(last_step, int) else None,
        message=f"{len(collapsed)}/{len(latest)} samples at step {last_step} repeat themselves "
        f"({why}): {excerpt!r}",
        hint="lower the learning rate or raise the KL/β penalty; check the chat template and "
        "the end-of-turn token so generation stops",
    )


def _is_non_finite(value: Any) -> bool:
    """A logged value that is nan or ±inf (a number, or its JSON spelling "nan"/"inf")."""
    f = _float(value)
    return f is not None and not math.isfinite(f)


def _check_nan(rows: list[dict]) -> Alert | None:
    for r in rows:
        bad = [
            k for k, v in r.items() if k not in ("step", "time_s", "phase") and _is_non_finite(v)
        ]
        if bad:
            step = r.get("step")
            shown = ", ".join(bad[:5])
            return Alert(
                kind="nan_loss",
                severity="error",
                step=step if isinstance(step, int) else None,
                message=f"non-finite values (nan/inf) from step {step} on: {shown}",
                hint="lower train.learning_rate, keep train.max_grad_norm set, and prefer bf16 or "
                "fp32 to fp16",
            )
    return None


def _check_zero_std(rows: list[dict]) -> Alert | None:
    streak, first = 0, None
    for r in rows:
        v = _float(r.get("frac_reward_zero_std"))
        if v is not None and math.isfinite(v) and v >= ZERO_STD_THRESHOLD:
            streak += 1
            first = r.get("step") if streak == 1 else first
            if streak >= ZERO_STD_ROWS:
                return Alert(
                    kind="no_reward_contrast",
                    severity="warning",
                    step=first if isinstance(first, int) else None,
                    message=f"frac_reward_zero_std ≥ {ZERO_STD_THRESHOLD} for {streak}+ "
                    f"consecutive rows from step {first}: most groups score the same, so the "
                    "advantage (and the gradient) is zero",
                    hint="warm-start with SFT, use an easier task, or raise rollout.num_rollouts "
                    "so groups contain both right and wrong answers",
                )
        elif v is not None:
            streak = 0
    return None


def _infer_family(rows: list[dict]) -> str | None:
    keys = {k for r in rows for k in r}
    if "avg_correctness" in keys or "frac_reward_zero_std" in keys:
        return "policy_gradients"
    if "margins" in keys or "chosen_rewards" in keys:
        return "direct_alignment"
    if "eval/reward_margin" in keys or "eval/auroc" in keys or "eval/step_accuracy" in keys:
        return "reward_models"
    return None


def _check_flat(family: str | None, rows: list[dict]) -> Alert | None:
    family = family if family in KEY_METRICS else _infer_family(rows)
    for key, phase in KEY_METRICS.get(family or "", ()):
        series = [
            (r.get("step"), f)
            for r in rows
            if r.get("phase") == phase
            and (f := _float(r.get(key))) is not None
            and math.isfinite(f)
        ]
        if not series:
            continue
        if len(series) < FLAT_WINDOW:
            return None
        window = [v for _, v in series[-FLAT_WINDOW:]]
        lo, hi = min(window), max(window)
        if key.endswith("loss"):
            mean = sum(window) / len(window)
            flat = mean > 0.01 and hi - lo <= 0.005 * abs(mean)
        else:
            flat = hi < 0.99 and hi - lo <= 1e-3
        if not flat:
            return None
        first_step = series[-FLAT_WINDOW][0]
        return Alert(
            kind="flat_learning",
            severity="warning",
            step=first_step if isinstance(first_step, int) else None,
            message=f"{key} has not moved over the last {FLAT_WINDOW} {phase} rows "
            f"(from step {first_step}: {lo:.4g}..{hi:.4g})",
            hint="raise train.learning_rate or the number of steps, and check the data and "
            "the model can learn the task (warm-start tiny models with SFT)",
        )
    return None


def _check_stalled(status: RunStatus, run_dir: Path, stall_after_s: float) -> Alert | None:
    if status.state != "running":
        return None
    marks = [status.progress_updated_at or 0.0]
    for name in ("train.log", "metrics.jsonl", "progress.json"):
        try:
            marks.append((run_dir / name).stat().st_mtime)
        except OSError:
            pass
    idle = time.time() - max(marks)
    if idle <= stall_after_s:
        return None
    return Alert(
        kind="stalled",
        severity="warning",
        step=status.step,
        message=f"running, but nothing was logged or progressed for {idle / 60:.0f} min "
        f"(at step {status.step}/{status.total_steps})",
        hint="read the end of its log and, in a shell, `py-spy dump --pid "
        f"{status.trainer_pid or status.pid}`; stop it and resume it if it is stuck",
    )


def diagnose(
    run_id: str, stall_after_s: float = STALL_AFTER_S, status: RunStatus | None = None
) -> list[Alert]:
    """Known failure modes of a run, most serious first, each with a one-line hint.
    ``status``: the run's state if the caller already has it (saves a second look-up)."""
    run_dir = find_run(run_id)
    status = status or run_state(run_id)
    log = _read_log(run_dir / "train.log")
    rows = read_metric_rows(run_dir / "metrics.jsonl").rows
    summary, _ = read_summary(run_dir)
    alerts: list[Alert] = []

    killed = status.signal == signal.SIGKILL and not status.stop_requested
    oom = OOM_RE.search(log)
    if oom or killed:
        if oom and oom.group(0).strip() != "Killed":
            start = log.rfind("\n", 0, oom.start()) + 1
            end = log.find("\n", oom.end())
            line = log[start : end if end >= 0 else len(log)].strip()
            what = f"out of memory: {line[:300]}"
        else:
            what = "the trainer was killed by SIGKILL, likely the kernel's OOM killer (out of RAM)"
        alerts.append(
            Alert(
                kind="oom",
                severity="error",
                step=status.step,
                message=what,
                hint="lower train.batch_size or data.max_length (raise "
                "train.gradient_accumulation_steps to keep the batch), enable "
                "model.gradient_checkpointing, or check `dmesg | grep -i oom`",
            )
        )
    elif status.state == "died" and "launcher" in (status.error or ""):
        alerts.append(
            Alert(
                kind="died",
                severity="error",
                step=status.step,
                message=status.error,
                hint="nothing ran: launch it again",
            )
        )
    elif status.state == "died":
        alerts.append(
            Alert(
                kind="died",
                severity="error",
                step=status.step,
                message="the run's processes are gone without an exit status "
                "(SIGKILL of the whole group, OOM killer or a reboot)",
                hint="resume it to continue from the last checkpoint (or launch it again); if "
                "it recurs, lower memory use",
            )
        )

    hits = [p for p in DOWNLOAD_PATTERNS if p in log]
    if hits:
        line = next((ln for ln in reversed(log.splitlines()) if any(p in ln for p in hits)), "")
        alerts.append(
            Alert(
                kind="download_failure",
                severity="error",
                message=f"a model or dataset could not be fetched from the hub: {line.strip()[:300]}",
                hint="work offline: model.name=tiny or a local folder / .gguf, "
                "data.dataset=builtin:..., or pull a model (in a shell: `uv run rlhf-lab models "
                "pull <name>`) while online",
            )
        )

    nonzero = status.exit_code not in (None, 0)
    if status.state == "failed" or (nonzero and status.state != "stopped"):
        tb = summary.traceback if summary else None
        tb = last_traceback(tb) if tb else last_traceback(log)
        error_line = None
        if summary and summary.error:
            error_line = str(summary.error)
        elif tb:
            error_line = tb.splitlines()[-1].strip()
        else:
            error_line = _last_error_line(log)
        code = status.exit_code
        if code == 2 and not tb:
            hint = "the trainer rejected the config before starting: fix the key named above"
        else:
            hint = "fix the error above (the traceback is in `detail`), then launch or resume it"
        alerts.append(
            Alert(
                kind="failed",
                severity="error",
                step=status.step,
                message=(
                    f"the trainer exited with code {code}" if code is not None else "the run failed"
                )
                + f": {error_line or 'no error text'}",
                hint=hint,
                detail=tb[-4000:] if tb else None,
            )
        )

    for check in (
        _check_nan(rows),
        _check_zero_std([r for r in rows if r.get("phase") in ("train", "rollout")]),
        _check_samples(run_dir / "samples.jsonl"),
        _check_flat(status.family, rows),
        _check_stalled(status, run_dir, stall_after_s),
    ):
        if check is not None:
            alerts.append(check)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(alerts, key=lambda a: order[a.severity])


def run_notes(
    family: str | None,
    state: str,
    rows: list[dict],
    names: list[str],
    finals: dict[str, float | None],
) -> list[str]:
    """The diagnosis of a run's metrics as the short notes a ledger row records: each key metric
    (``names``) that turned non-finite and from which step, no metrics at all from a finished
    run, no reward contrast at the end of a policy-gradient run, held-out accuracy at or below
    chance at the end of a direct-alignment run. ``finals``: each key metric's final value."""
    notes: list[str] = []
    for name in names:
        bad = [r.get("step") for r in rows if name in r and _is_non_finite(r[name])]
        if bad:
            notes.append(f"{name} was not finite (nan/inf) from step {bad[0]} on")
    if state in TERMINAL_STATES and not rows:
        notes.append("no metrics were logged")
    zero = finals.get("frac_reward_zero_std")
    if family == "policy_gradients" and zero is not None and zero >= 0.99:
        notes.append(
            "no reward contrast at the end (frac_reward_zero_std ≈ 1): every group scored the "
            "same, so the policy gradient is zero; warm-start the model (SFT) or ease the task"
        )
    acc = finals.get("eval/accuracy")
    if family == "direct_alignment" and acc is not None and state == "succeeded" and acc <= 0.5:
        notes.append("held-out accuracy ended at or below chance (0.5)")
    return notes
