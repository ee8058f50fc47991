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
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rlhf_lab.paths import find_run
from rlhf_lab.planning.trainer_config import TrainerConfig, read_run_config
from rlhf_lab.results.divergence import (
    divergence_hint,
    kl_blowup,
    repetition_finding,
)
from rlhf_lab.results.guards import (
    Regression,
    as_number,
    heldout_regression,
    noise_reason,
    noisy_samples,
    regression_hint,
)
from rlhf_lab.results.headline import headline_for, headline_line
from rlhf_lab.results.metrics import MetricSeries, read_metrics
from rlhf_lab.results.overoptimisation import overoptimisation, overoptimisation_advice
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
# Diagnose
# ---------------------------------------------------------------------------------------------


def _check_regression(
    family: str | None, algorithm: str | None, rows: list[dict], config: TrainerConfig | None
) -> Alert | None:
    found = heldout_regression(family, algorithm, rows, config)
    if found is None:
        return None
    return Alert(
        kind="heldout_regression",
        severity="warning",
        step=found.last_step if isinstance(found.last_step, int) else None,
        message=found.message,
        hint=regression_hint(family),
    )


def _check_overoptimisation(
    family: str | None,
    algorithm: str | None,
    rows: list[dict],
    config: TrainerConfig | None,
    steps: Any,
) -> Alert | None:
    found = overoptimisation(rows)
    if found is None:
        return None
    from trainers.core.spec import FAMILY_NAMES, family_spec

    kl_key = family_spec(family).kl_key if family in FAMILY_NAMES else None
    kl_now = config.get(kl_key) if kl_key and config is not None else None
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


def _check_noise(samples: list[dict]) -> Alert | None:
    finding = noisy_samples(samples)
    if finding is None:
        return None
    return Alert(
        kind="noise_samples",
        severity="warning",
        message=finding,
        hint="warm-start from an SFT model (on tiny: the sft_tiny_warmstart recipe) or train "
        "longer before reading samples; check the chat template and tokenizer",
    )


def _check_samples(samples: list[dict]) -> Alert | None:
    """Repetition in the latest samples, compared with the first sampled step: a divergence
    (warning) or looping inherited from the starting model (info; rlhf_lab.results.divergence)."""
    found = repetition_finding(samples, excerpt_chars=160)
    if found is None:
        return None
    if found.inherited:
        kind, severity = "repetition_inherited", "info"
        hint = (
            "the starting model loops already, training did not cause it: check the chat "
            "template and the end-of-turn token, or warm-start with SFT"
        )
    else:
        kind, severity = "repetition", "warning"
        hint = (
            "lower the learning rate or raise the KL/β penalty; check the chat template and "
            "the end-of-turn token so generation stops"
        )
    step = found.step if isinstance(found.step, int) else None
    return Alert(kind=kind, severity=severity, step=step, message=found.message, hint=hint)


def _check_kl_blowup(
    family: str | None, algorithm: str | None, rows: list[dict], config: TrainerConfig | None
) -> Alert | None:
    found = kl_blowup(rows)
    hint = divergence_hint(family, algorithm, config) if found else ""
    return found and Alert(
        kind="kl_blowup", severity="warning", step=found.step, message=found.message, hint=hint
    )


def _is_non_finite(value: Any) -> bool:
    """A logged value that is nan or ±inf (a number, or its JSON spelling "nan"/"inf")."""
    f = as_number(value)
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
        v = as_number(r.get("frac_reward_zero_std"))
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
            and (f := as_number(r.get(key))) is not None
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


def _check_process_end(status: RunStatus, log: str) -> Alert | None:
    """Out of memory (the log says so, or SIGKILL nobody asked for) or the processes gone."""
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
        return Alert(
            kind="oom",
            severity="error",
            step=status.step,
            message=what,
            hint="lower train.batch_size or data.max_length (raise "
            "train.gradient_accumulation_steps to keep the batch), enable "
            "model.gradient_checkpointing, or check `dmesg | grep -i oom`",
        )
    if status.state == "died" and "launcher" in (status.error or ""):
        return Alert(
            kind="died",
            severity="error",
            step=status.step,
            message=status.error,
            hint="nothing ran: launch it again",
        )
    if status.state == "died":
        return Alert(
            kind="died",
            severity="error",
            step=status.step,
            message="the run's processes are gone without an exit status "
            "(SIGKILL of the whole group, OOM killer or a reboot)",
            hint="resume it to continue from the last checkpoint (or launch it again); if "
            "it recurs, lower memory use",
        )
    return None


def _check_download(log: str) -> Alert | None:
    """A model or dataset the hub could not deliver."""
    hits = [p for p in DOWNLOAD_PATTERNS if p in log]
    if not hits:
        return None
    line = next((ln for ln in reversed(log.splitlines()) if any(p in ln for p in hits)), "")
    return Alert(
        kind="download_failure",
        severity="error",
        message=f"a model or dataset could not be fetched from the hub: {line.strip()[:300]}",
        hint="work offline: model.name=tiny or a local folder / .gguf, "
        "data.dataset=builtin:..., or pull a model (in a shell: `uv run rlhf-lab models "
        "pull <name>`) while online",
    )


def _check_failed(status: RunStatus, summary: Any, log: str) -> Alert | None:
    """The trainer failed: its error line and last traceback."""
    nonzero = status.exit_code not in (None, 0)
    if not (status.state == "failed" or (nonzero and status.state != "stopped")):
        return None
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
    return Alert(
        kind="failed",
        severity="error",
        step=status.step,
        message=(f"the trainer exited with code {code}" if code is not None else "the run failed")
        + f": {error_line or 'no error text'}",
        hint=hint,
        detail=tb[-4000:] if tb else None,
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
    config = read_run_config(run_dir, status.family)  # read once for every check below
    samples = read_json_lines(run_dir / "samples.jsonl").rows
    alerts: list[Alert] = []
    for check in (
        _check_process_end(status, log),
        _check_download(log),
        _check_failed(status, summary, log),
    ):
        if check is not None:
            alerts.append(check)

    repetition = _check_samples(samples)
    if (
        repetition is not None
        and repetition.kind == "repetition"
        and status.family == "policy_gradients"
    ):
        repetition.hint = divergence_hint(status.family, status.algorithm, config)
    for check in (
        _check_nan(rows),
        _check_regression(status.family, status.algorithm, rows, config),
        _check_overoptimisation(status.family, status.algorithm, rows, config, status.step),
        _check_kl_blowup(status.family, status.algorithm, rows, config),
        _check_zero_std([r for r in rows if r.get("phase") in ("train", "rollout")]),
        repetition,
        None if repetition else _check_noise(samples),
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
    config: TrainerConfig | None = None,
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
    config = read_run_config(Path(status.run_dir), status.family) if status.run_dir else None
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
