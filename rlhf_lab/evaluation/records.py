"""An evaluation job's numbers as the ledger and ``compare`` show them: :class:`EvalSummary`
(read from the job's ``eval.json``, kept in the job's ledger record) and the rows of the
campaign's **Evaluation** section: one table, a row per metric, the target, its baseline and the
paired difference, each with its interval. Torch-free; no ledger import (the ledger's schema
imports this module).

A win rate judged by the reward model the target policy was trained against (the judge is the
target run's ``reward.model``) measures how well the policy optimised that model, not how good
its answers are: its summary says so (``judge_is_own_reward_model``), its rows are labelled
"judged by its own reward model (proxy)" and never marked as a headline.

A suite's headline that is 0 for the target and for its baseline (verifier accuracy of models
that cannot yet solve the task, e.g. ``tiny``) is structurally constant: the first other compared
metric (one with a paired difference: format rate, score, pass@k) that is not 0 becomes the
headline, and ``headline_note`` says why (:func:`moving_headline`). Without a baseline one
measurement cannot show a constant, and the suite's headline stays.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

__all__ = [
    "EVAL_FAMILY",
    "PROXY_JUDGE",
    "EvalRow",
    "EvalSummary",
    "EvalValue",
    "evaluation_rows",
    "fmt_interval",
    "is_evaluation",
    "judged_by_own_reward_model",
    "metric_label",
    "moving_headline",
    "proxy_note",
    "read_eval_summary",
    "training_runs",
]

EVAL_FAMILY = "evaluation"
MAX_ROWS = 6  # metrics shown per evaluation (the headline first)


class EvalValue(BaseModel):
    value: float | None = None
    low: float | None = None
    high: float | None = None
    n: int | None = None


class EvalRow(BaseModel):
    """One metric of an evaluation: the target, the baseline and target − baseline."""

    metric: str
    target: EvalValue | None = None
    baseline: EvalValue | None = None
    difference: EvalValue | None = None


class EvalSummary(BaseModel):
    """What an evaluation job measured, as the ledger keeps it (from ``eval.json``)."""

    suite: str
    headline: str | None = None
    target: str = Field(description="the target as given (a run folder or a model)")
    target_run: str | None = Field(default=None, description="the evaluated run's id")
    baseline: str | None = None
    judge: str | None = None
    level: float = 0.95
    n_prompts: int | None = None
    sampling: str = Field(default="", description="n, temperature, max_new_tokens, seed")
    cache: dict[str, str] = Field(default_factory=dict, description="role -> hit / miss / off")
    rows: list[EvalRow] = Field(default_factory=list)
    headline_note: str | None = Field(
        default=None, description="why the headline is not the suite's own"
    )
    judge_is_own_reward_model: bool = Field(
        default=False,
        description="the judge is the reward model the target was trained against (a proxy)",
    )

    def row(self, metric: str) -> EvalRow | None:
        return next((r for r in self.rows if r.metric == metric), None)


def is_evaluation(family: Any) -> bool:
    return family == EVAL_FAMILY


def training_runs(runs: Sequence[Any]) -> list[Any]:
    """The records that are not evaluation jobs (the Runs, Observations and Next blocks)."""
    return [r for r in runs if not is_evaluation(getattr(r, "family", None))]


def _value(d: Any) -> EvalValue | None:
    if d is None:
        return None
    return EvalValue(value=d.value, low=d.low, high=d.high, n=d.n)


def _metric_order(ev: Any) -> list[str]:
    """The headline, then the compared metrics, then the rest; at most MAX_ROWS."""
    names = [ev.headline] if ev.headline in ev.metrics else []
    names += [k for k in ev.difference if k not in names]
    names += [k for k in ev.metrics if k not in names]
    return names[:MAX_ROWS]


def _sampling(settings: dict[str, Any]) -> str:
    s = settings.get("sampling") if isinstance(settings.get("sampling"), dict) else {}
    parts = [f"n={s.get('n')}", f"T={s.get('temperature')}", f"max_new={s.get('max_new_tokens')}"]
    return ", ".join(parts + [f"seed {settings.get('seed')}"]) if s else ""


_RUN_OUTPUT = re.compile(r"[^\s()]*/runs/([a-z0-9]+(?:-[a-z0-9]+)*)/final_model\b")


def _named(text: str | None) -> str | None:
    """A run's final_model path shown as ``run:<id>`` (the ledger names runs, not paths)."""
    return _RUN_OUTPUT.sub(r"run:\1", text) if text else text


PROXY_JUDGE = "judged by its own reward model (proxy)"


def _run_ref(text: Any) -> str | None:
    """A model reference as ``run:<id>`` when it names a run of the lab (``run:<id>`` or a
    ``.../runs/<id>/final_model`` path), else the path as given."""
    if not isinstance(text, str) or not text:
        return None
    if text.startswith("run:"):
        return text
    return _named(text.rstrip("/"))


def _trained_reward_model(target_run: str | None) -> str | None:
    """The ``reward.model`` the target run was trained against (from its config.yaml)."""
    if not target_run:
        return None
    from rlhf_lab.planning.trainer_config import read_run_config

    cfg = read_run_config(Path(target_run))
    return cfg.get("reward.model") if cfg is not None else None


def judged_by_own_reward_model(judge: str | None, target_run: str | None) -> bool:
    """Whether ``judge`` is the reward model the run at ``target_run`` was trained against."""
    own = _trained_reward_model(target_run)
    if not judge or not own:
        return False
    if _run_ref(judge) == _run_ref(own):
        return True
    try:
        return Path(judge).expanduser().resolve() == Path(own).expanduser().resolve()
    except OSError:
        return False


def proxy_note(s: EvalSummary) -> str | None:
    """The warning a proxy-judged evaluation carries, or None."""
    if not s.judge_is_own_reward_model:
        return None
    return (
        f"{s.suite} {PROXY_JUDGE}: {s.judge} is the reward model the target was trained "
        "against, so this win rate measures how far the policy optimised it, not an "
        "independent judgement; judge with another reward model or a verifier suite"
    )


def metric_label(s: EvalSummary, metric: str) -> str:
    """A row's metric name: ``(headline)`` on the headline of an independent evaluation, the
    proxy label on every row of an evaluation judged by the target's own reward model."""
    if s.judge_is_own_reward_model and s.judge:
        return f"{metric} ({PROXY_JUDGE})"
    return metric + (" (headline)" if metric == s.headline else "")


def _zero(v: EvalValue | None) -> bool:
    return v is None or v.value is None or v.value == 0


def moving_headline(headline: str | None, rows: Sequence[EvalRow]) -> tuple[str | None, str | None]:
    """(the headline to show, why it is not the suite's own): the suite's headline unless it
    is 0 for the target and its baseline while another metric is not."""
    head = next((r for r in rows if r.metric == headline), None)
    if head is None or head.baseline is None or not (_zero(head.target) and _zero(head.baseline)):
        return headline, None  # no baseline: one measurement cannot show a constant
    for row in rows:
        if row.difference is None:
            continue  # only the compared (quality) metrics, never e.g. a length
        if row.metric != headline and not (_zero(row.target) and _zero(row.baseline)):
            note = (
                f"{headline} is 0 for the target and its baseline (no signal at this scale): "
                f"{row.metric} is the headline"
            )
            return row.metric, note
    return headline, None


def read_eval_summary(run_dir: Path) -> tuple[EvalSummary | None, str | None]:
    """The job's summary from its ``eval.json`` (None while it has none); never raises."""
    from trainers.core.runfolder import EvalFile, read_file

    ev, warning = read_file(Path(run_dir) / "eval.json", EvalFile)
    if ev is None:
        return None, warning
    target_run = Path(ev.target_run).name if ev.target_run else None
    rows = [
        EvalRow(
            metric=name,
            target=_value(ev.metrics.get(name)),
            baseline=_value(ev.baseline_metrics.get(name)),
            difference=_value(ev.difference.get(name)),
        )
        for name in _metric_order(ev)
    ]
    prompts = ev.details.get("prompts") if isinstance(ev.details.get("prompts"), dict) else {}
    n_prompts = prompts.get("n_prompts")
    if not isinstance(n_prompts, int):
        head = ev.metrics.get(ev.headline or "")
        n_prompts = head.n if head is not None else None
    cache = ev.details.get("cache") if isinstance(ev.details.get("cache"), dict) else {}
    headline, note = moving_headline(ev.headline, rows)
    if headline != ev.headline:  # the moving one first
        rows.sort(key=lambda r: r.metric != headline)
    return (
        EvalSummary(
            suite=ev.suite,
            headline=headline,
            headline_note=note,
            target=ev.target,
            target_run=target_run,
            baseline=_named(ev.baseline),
            judge=_named(ev.judge),
            level=ev.level,
            n_prompts=n_prompts,
            sampling=_sampling(ev.settings),
            cache={str(k): str(v) for k, v in cache.items()},
            rows=rows,
            judge_is_own_reward_model=judged_by_own_reward_model(ev.judge, ev.target_run),
        ),
        None,
    )


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.3g}"


def fmt_interval(v: EvalValue | None, signed: bool = False) -> str:
    """``0.281 [0.16, 0.41]`` (``+0.05 [...]`` for a difference); ``—`` without a value."""
    if v is None or v.value is None:
        return "—"
    head = f"{v.value:+.3g}" if signed else _num(v.value)
    if v.low is None or v.high is None:
        return head
    return f"{head} [{_num(v.low)}, {_num(v.high)}]"


def _target_label(record: Any, s: EvalSummary) -> str:
    if s.target_run:
        return s.target_run
    return Path(s.target).name if "/" in s.target else s.target


def evaluation_rows(records: Sequence[Any]) -> list[dict[str, Any]]:
    """The Evaluation section's table rows (dicts for the template), one per metric of each
    evaluation job's record, and a row saying ``pending`` for a job that has no eval.json yet."""
    out: list[dict[str, Any]] = []
    for r in records:
        if not is_evaluation(getattr(r, "family", None)):
            continue
        s: EvalSummary | None = getattr(r, "evaluation", None)
        if s is None:
            out.append(
                {
                    "job": f"`{r.run_id}`",
                    "target": "",
                    "suite": r.algorithm or "",
                    "metric": r.state,
                    "value": "—",
                    "baseline": "—",
                    "difference": "—",
                    "n": "—",
                    "first": True,
                }
            )
            continue
        for i, row in enumerate(s.rows):
            n = row.target.n if row.target is not None else None
            out.append(
                {
                    "job": f"`{r.run_id}`" if i == 0 else "",
                    "target": _target_label(r, s) if i == 0 else "",
                    "suite": s.suite if i == 0 else "",
                    "metric": metric_label(s, row.metric),
                    "value": fmt_interval(row.target),
                    "baseline": fmt_interval(row.baseline),
                    "difference": fmt_interval(row.difference, signed=True),
                    "n": "—" if n is None else str(n),
                    "first": i == 0,
                }
            )
    return out


def evaluation_notes(records: Sequence[Any]) -> list[str]:
    """One line per finished evaluation: what it compared with, how it sampled, the cache."""
    notes = []
    for r in records:
        s: EvalSummary | None = getattr(r, "evaluation", None)
        if not is_evaluation(getattr(r, "family", None)) or s is None:
            continue
        parts = [f"baseline {s.baseline}" if s.baseline else "no baseline"]
        if s.judge:
            parts.append(f"judge {s.judge}" + (f" ({PROXY_JUDGE})" if proxy_note(s) else ""))
        if s.sampling:
            parts.append(s.sampling)
        if s.n_prompts is not None:
            parts.append(f"{s.n_prompts} prompts")
        if s.headline_note:
            parts.append(s.headline_note)
        if s.cache:
            parts.append("cache " + ", ".join(f"{k} {v}" for k, v in s.cache.items()))
        notes.append(f"`{r.run_id}`: " + "; ".join(parts) + f" ({r.run_dir}/eval.json)")
    return notes
