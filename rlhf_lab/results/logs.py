"""Reading a run: its metrics (down-sampled), and the lab's one diagnosis of failure modes
(alerts with one-line hints for a run's status; :func:`run_notes` for a ledger row). Torch-free;
reads the run folder through :mod:`rlhf_lab.runs.folder` and train.log through
:mod:`rlhf_lab.runs.log` (``tail_log`` and the log helpers are re-exported here).

Two checks guard against reading training numbers as results (held-out first):
:func:`heldout_regression` (the held-out headline got worse beyond its noise, typically while
the training signal rose) and :func:`noise_reason` (samples that are noise, e.g. from a
random-init model); :func:`run_notes` and :func:`diagnose` report both. For a run optimising a
learned reward model, :func:`overoptimisation` finds the proxy reward still rising while the gold
reward falls (the rule is stated there and in docs/architecture.md), and
:func:`overoptimisation_advice` gives the config changes its alert and the ledger's Next section
both propose."""

from __future__ import annotations

import math
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rlhf_lab.errors import InvalidArgument
from rlhf_lab.paths import find_run
from rlhf_lab.planning.catalog import get_dotted
from rlhf_lab.results.divergence import (
    divergence_hint,
    kl_blowup,
    repetition_finding,
)
from rlhf_lab.results.divergence import (
    sample_text as _sample_text,
)
from rlhf_lab.results.headline import headline_for, headline_line, heldout_items, read_run_config
from rlhf_lab.results.overoptimisation import overoptimisation, overoptimisation_advice
from rlhf_lab.results.stats import newcombe_difference
from rlhf_lab.runs import RunStatus, run_state
from rlhf_lab.runs.folder import (
    read_json_lines,
    read_metric_rows,
    read_summary,
    run_eval_rows,
    tail_metric_rows,
)
from rlhf_lab.runs.log import (
    PARTIAL_LINE_IDLE_S,
    TRACEBACK_HEAD,
    LogChunk,
    fold_carriage_returns,
    last_traceback,
    tail_log,
)
from rlhf_lab.runs.log import last_error_line as _last_error_line
from rlhf_lab.runs.log import read_log as _read_log
from trainers.core.runfolder import TERMINAL_STATES

__all__ = [
    "PARTIAL_LINE_IDLE_S",
    "TRACEBACK_HEAD",
    "Alert",
    "LogChunk",
    "MetricSeries",
    "Regression",
    "diagnose",
    "fold_carriage_returns",
    "heldout_regression",
    "last_traceback",
    "noise_reason",
    "noisy_samples",
    "read_metrics",
    "run_notes",
    "status_headline",
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
# Phase "train" also matches the policy-gradient trainer's "rollout" rows (where its rewards are).
# A run optimising a learned reward model is judged on the proxy reward it optimises first.
KEY_METRICS: dict[str, tuple[tuple[str, str], ...]] = {
    "direct_alignment": (("eval/accuracy", "eval"), ("accuracy", "train")),
    "policy_gradients": (
        ("proxy_reward", "train"),
        ("avg_correctness", "train"),
        ("eval/avg_correctness", "eval"),
    ),
    "reward_models": (
        ("eval/accuracy", "eval"),
        ("eval/auroc", "eval"),
        ("eval/step_accuracy", "eval"),
    ),
    "sft": (("loss", "train"),),
    "distillation": (("teacher_logp", "train"), ("eval/avg_correctness", "eval")),
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
        "repetition_inherited",
        "flat_learning",
        "download_failure",
        "failed",
        "died",
        "heldout_regression",
        "noise_samples",
        "overoptimisation",
        "kl_blowup",
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


# The noise rule (stated in words in docs/architecture.md and the skills): a completion is noise
# when it has no letter or digit at all (empty, whitespace, punctuation: what a random-init
# model's greedy decoding gives), when it holds U+FFFD (byte-level tokens that decode to no
# text), when at least NOISE_NONWORD_SHARE of its ≥ NOISE_MIN_WORDS alphabetic words are not
# words (mixed case inside a word, "WITHvel", or five or more letters without a vowel), or when
# fewer than NOISE_DISTINCT_RATIO of its ≥ NOISE_MIN_TOKENS tokens are distinct. A run's samples
# are noise when at least half of the latest step's samples are.
NOISE_MIN_WORDS = 8
NOISE_NONWORD_SHARE = 0.15
NOISE_MIN_TOKENS = 20
NOISE_DISTINCT_RATIO = 0.2
_VOWELS = frozenset("aeiouyAEIOUY")


def _non_word(word: str) -> bool:
    inner = word[1:]
    if any(c.isupper() for c in inner) and any(c.islower() for c in inner):
        return True
    if any(a.islower() and b.isupper() for a, b in zip(word, word[1:], strict=False)):
        return True
    return len(word) >= 5 and not any(c in _VOWELS for c in word)


def noise_reason(text: str) -> str | None:
    """Why a completion looks like noise rather than text (None when it does not); the rule is
    stated above :data:`NOISE_MIN_WORDS`."""
    if not any(c.isalnum() for c in text):
        return "no letter or digit (empty, whitespace or punctuation only)"
    broken = text.count("\ufffd")
    if broken:
        return f"{broken} broken character(s) (U+FFFD): byte tokens that decode to no text"
    words = re.findall(r"[A-Za-z]+", text)
    if len(words) >= NOISE_MIN_WORDS:
        bad = [w for w in words if _non_word(w)]
        share = len(bad) / len(words)
        if share >= NOISE_NONWORD_SHARE:
            shown = ", ".join(repr(w) for w in bad[:3])
            return f"{share:.0%} of its words are not words ({shown})"
    toks = re.findall(r"\w+|[^\w\s]", text)
    if len(toks) >= NOISE_MIN_TOKENS:
        ratio = len(set(toks)) / len(toks)
        if ratio < NOISE_DISTINCT_RATIO:
            return f"only {ratio:.0%} of its {len(toks)} tokens are distinct"
    return None


def _latest_samples(rows: list[dict]) -> list[dict]:
    """The sample rows of the last step that wrote samples (held-out ones when it has both)."""
    rows = [r for r in rows if _sample_text(r) is not None]
    if not rows:
        return []
    last_step = rows[-1].get("step")
    latest = [r for r in rows if r.get("step") == last_step]
    held_out = [r for r in latest if r.get("kind") == "eval"]
    return held_out or latest


def noisy_samples(rows: list[dict]) -> str | None:
    """A one-line finding when the latest samples are noise (at least half of them), else
    None."""
    latest = _latest_samples(rows)
    noisy = [(r, why) for r in latest if (why := noise_reason(_sample_text(r) or ""))]
    if not noisy or len(noisy) * 2 < len(latest):
        return None
    row, why = noisy[0]
    excerpt = (_sample_text(row) or "")[:80]
    return (
        f"{len(noisy)}/{len(latest)} samples at step {row.get('step')} are noise, not text "
        f"({why}; e.g. {excerpt!r}): the model has not learned to write yet (random-init or "
        "untrained weights), so its samples show nothing about the algorithm"
    )


@dataclass(frozen=True)
class Regression:
    """The held-out headline got worse from its first to its last evaluation beyond noise."""

    metric: str
    first: float
    last: float
    first_step: Any
    last_step: Any
    noise: str
    signal: str | None = None
    signal_first: float | None = None
    signal_last: float | None = None
    signal_improved: bool | None = None

    @property
    def message(self) -> str:
        worse = "fell" if self.last < self.first else "rose"
        text = (
            f"held-out {self.metric} {worse} {self.first:.4g} → {self.last:.4g} (steps "
            f"{self.first_step} → {self.last_step}; {self.noise})"
        )
        if self.signal is not None and self.signal_first is not None:
            moved = "rose" if (self.signal_last or 0) > self.signal_first else "fell"
            text += (
                f" while the training signal {self.signal} {moved} {self.signal_first:.4g} → "
                f"{self.signal_last:.4g} (means of its first and last training rows)"
            )
            if self.signal_improved:
                text += ": the training numbers are not the result"
        return text


REGRESSION_SHARE_DROP = 0.05  # an accuracy without a known n: this absolute drop counts
REGRESSION_LOSS_RISE = 0.05  # a held-out loss: this relative rise counts


def _series(rows: list[dict], name: str, *, train_only: bool) -> list[tuple[Any, float]]:
    out = []
    for r in rows:
        if train_only and r.get("phase") == "eval":
            continue
        value = _float(r.get(name))
        if value is not None and math.isfinite(value):
            out.append((r.get("step"), value))
    return out


def heldout_regression(
    family: str | None, algorithm: str | None, rows: list[dict], config: dict | None = None
) -> Regression | None:
    """The held-out headline's last evaluation against its first: a :class:`Regression` when it
    is worse beyond noise — for an accuracy on n held-out items, Newcombe's 95 % interval of the
    difference excludes 0 (without n: a drop of ``REGRESSION_SHARE_DROP``); for a loss, a rise
    of ``REGRESSION_LOSS_RISE`` of the first value. Reports how the training signal moved
    (mean of the first vs the last up-to-5 training rows)."""
    head = headline_for(family, algorithm, config, rows)
    if head is None:
        return None
    points = _series(rows, head.metric, train_only=False)
    if len(points) < 2:
        return None
    (s0, v0), (s1, v1) = points[0], points[-1]
    sign = 1.0 if head.higher_is_better else -1.0
    if sign * (v1 - v0) >= 0:
        return None
    n = heldout_items(family, config, rows).n
    if head.share and n is not None and 0 <= v0 <= 1 and 0 <= v1 <= 1:
        iv = newcombe_difference(v1, n, v0, n)
        if not (iv.high < 0 if head.higher_is_better else iv.low > 0):
            return None
        noise = f"beyond the 95% sampling noise on n={n} held-out items"
    elif head.share:
        if abs(v1 - v0) < REGRESSION_SHARE_DROP:
            return None
        noise = f"a change of at least {REGRESSION_SHARE_DROP} (held-out count unknown)"
    else:
        if abs(v1 - v0) < REGRESSION_LOSS_RISE * max(abs(v0), 1e-12):
            return None
        noise = f"more than {REGRESSION_LOSS_RISE:.0%} of its first value"
    found = Regression(head.metric, v0, v1, s0, s1, noise)
    signal = head.training_signal
    train = _series(rows, signal, train_only=True) if signal else []
    if signal and len(train) >= 2:
        w = max(1, min(5, len(train) // 2))
        a = sum(v for _, v in train[:w]) / w
        b = sum(v for _, v in train[-w:]) / w
        improved = None
        if head.training_higher_is_better is not None and a != b:
            improved = (b > a) == head.training_higher_is_better
        found = Regression(head.metric, v0, v1, s0, s1, noise, signal, a, b, improved)
    return found


def _regression_hint(family: str | None) -> str:
    from trainers.core.spec import FAMILY_NAMES, family_spec

    if family not in FAMILY_NAMES:
        return "train fewer steps"
    spec = family_spec(family)
    kl = f" or raise the KL strength ({spec.kl_key})" if spec.kl_key else ""
    return (
        f"judge the run by the held-out number; train fewer steps ({spec.steps_key}){kl}, "
        "or lower the learning rate"
    )


def _check_regression(
    family: str | None, algorithm: str | None, rows: list[dict], run_dir: Path
) -> Alert | None:
    found = heldout_regression(family, algorithm, rows, read_run_config(run_dir))
    if found is None:
        return None
    return Alert(
        kind="heldout_regression",
        severity="warning",
        step=found.last_step if isinstance(found.last_step, int) else None,
        message=found.message,
        hint=_regression_hint(family),
    )


def _check_overoptimisation(
    family: str | None, algorithm: str | None, rows: list[dict], run_dir: Path, steps: Any
) -> Alert | None:
    found = overoptimisation(rows)
    if found is None:
        return None
    config = read_run_config(run_dir)
    from trainers.core.spec import FAMILY_NAMES, family_spec

    kl_key = family_spec(family).kl_key if family in FAMILY_NAMES else None
    kl_now = get_dotted(config, kl_key) if kl_key and isinstance(config, dict) else None
    advice = overoptimisation_advice(family, algorithm, kl_now, found.gold_peak_step, steps)
    options = " or ".join(f"the override {a.override} ({a.why})" for a in advice)
    hint = (
        f"launch it again with {options}; recording the run puts the full commands in the "
        "campaign's Next section"
        if options
        else "stop earlier, or tighten the KL leash to the reference"
    )
    return Alert(
        kind="overoptimisation",
        severity="warning",
        step=found.last_step if isinstance(found.last_step, int) else None,
        message=found.message,
        hint=hint,
    )


def _check_noise(path: Path) -> Alert | None:
    finding = noisy_samples(read_json_lines(path).rows)
    if finding is None:
        return None
    return Alert(
        kind="noise_samples",
        severity="warning",
        message=finding,
        hint="warm-start from an SFT model (on tiny: the sft_tiny_warmstart recipe) or train "
        "longer before reading samples; check the chat template and tokenizer",
    )


def _check_samples(path: Path) -> Alert | None:
    """Repetition in the latest samples, compared with the first sampled step: a divergence
    (warning) or looping inherited from the starting model (info; rlhf_lab.results.divergence)."""
    found = repetition_finding(read_json_lines(path).rows, excerpt_chars=160)
    if found is None:
        return None
    step = found.step if isinstance(found.step, int) else None
    if found.inherited:
        return Alert(
            kind="repetition_inherited",
            severity="info",
            step=step,
            message=found.message,
            hint="the starting model loops already, training did not cause it: check the chat "
            "template and the end-of-turn token, or warm-start with SFT",
        )
    return Alert(
        kind="repetition",
        severity="warning",
        step=step,
        message=found.message,
        hint="lower the learning rate or raise the KL/β penalty; check the chat template and "
        "the end-of-turn token so generation stops",
    )


def _check_kl_blowup(
    family: str | None, algorithm: str | None, rows: list[dict], run_dir: Path
) -> Alert | None:
    found = kl_blowup(rows)
    hint = divergence_hint(family, algorithm, read_run_config(run_dir)) if found else ""
    return found and Alert(
        kind="kl_blowup", severity="warning", step=found.step, message=found.message, hint=hint
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
        phases = ("train", "rollout") if phase == "train" else (phase,)
        series = [
            (r.get("step"), f)
            for r in rows
            if r.get("phase", "train") in phases
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
            message=f"{key} has not moved over the last {FLAT_WINDOW} {'/'.join(phases)} rows "
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

    repetition = _check_samples(run_dir / "samples.jsonl")
    if (
        repetition is not None
        and repetition.kind == "repetition"
        and status.family == "policy_gradients"
    ):
        repetition.hint = divergence_hint(status.family, status.algorithm, read_run_config(run_dir))
    for check in (
        _check_nan(rows),
        _check_regression(status.family, status.algorithm, rows, run_dir),
        _check_overoptimisation(status.family, status.algorithm, rows, run_dir, status.step),
        _check_kl_blowup(status.family, status.algorithm, rows, run_dir),
        _check_zero_std([r for r in rows if r.get("phase") in ("train", "rollout")]),
        repetition,
        None if repetition else _check_noise(run_dir / "samples.jsonl"),
        _check_flat(status.family, rows),
        _check_stalled(status, run_dir, stall_after_s),
    ):
        if check is not None:
            alerts.append(check)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(alerts, key=lambda a: order[a.severity])


RunFlag = Literal[
    "heldout_regression",
    "overoptimisation",
    "noise_samples",
    "flat",
    "kl_blowup",
    "repetition",
    "repetition_inherited",
]


def run_flags(
    family: str | None,
    algorithm: str | None,
    rows: list[dict],
    samples: list[dict] | None = None,
    config: dict | None = None,
) -> dict[str, str]:
    """The findings a ledger row and the Next section act on, flag -> one-line note:
    ``heldout_regression`` (:func:`heldout_regression`), ``noise_samples``
    (:func:`noisy_samples`), ``overoptimisation`` (:func:`overoptimisation`) and ``flat`` (the
    flat-learning check: the key metric did not move over the last rows)."""
    flags: dict[str, str] = {}
    found = heldout_regression(family, algorithm, rows, config)
    if found is not None:
        flags["heldout_regression"] = found.message
    gamed = overoptimisation(rows)
    if gamed is not None:
        flags["overoptimisation"] = gamed.message
    blowup = kl_blowup(rows)
    if blowup is not None:
        flags["kl_blowup"] = blowup.message
    looping = repetition_finding(samples or []) if family == "policy_gradients" else None
    if looping is not None:
        flags["repetition_inherited" if looping.inherited else "repetition"] = looping.message
    noise = None if looping else noisy_samples(samples or [])
    if noise is not None:
        flags["noise_samples"] = noise
    flat = _check_flat(family, rows)
    if flat is not None:
        flags["flat"] = flat.message
    return flags


def run_notes(
    family: str | None,
    state: str,
    rows: list[dict],
    names: list[str],
    finals: dict[str, float | None],
    flags: dict[str, str] | None = None,
) -> list[str]:
    """The diagnosis of a run's metrics as the short notes a ledger row records: each key metric
    (``names``) that turned non-finite and from which step, no metrics at all from a finished
    run, no reward contrast at the end of a policy-gradient run, held-out accuracy at or below
    chance at the end of a direct-alignment run, and the findings of :func:`run_flags`
    (``flags``). ``finals``: each key metric's final value."""
    notes: list[str] = list((flags or {}).values())
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


def status_headline(status: RunStatus) -> str | None:
    """The run's status line, held-out first: the headline metric from the last eval row (with
    its sampling noise), then the training signal from the last train row, labelled as such."""
    config = read_run_config(Path(status.run_dir)) if status.run_dir else None
    # the eval rows from the start: the step-0 value, and whether a candidate ever moved
    evals = run_eval_rows(Path(status.run_dir) / "metrics.jsonl") if status.run_dir else []
    head = headline_for(status.family, status.algorithm, config, [*evals, status.last_eval])
    rows: list[dict] = []
    if head is not None and head.training_signal and head.training_signal not in status.last_train:
        # the policy-gradient trainer logs its rewards on "rollout" rows, not on train rows
        if status.run_dir:
            rows = tail_metric_rows(Path(status.run_dir) / "metrics.jsonl", 64 * 1024)
    return headline_line(
        status.family, status.algorithm, status.last_eval, status.last_train, config, rows, evals
    )
