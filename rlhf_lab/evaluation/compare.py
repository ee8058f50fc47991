"""Evaluations in ``compare``: a table of evaluation jobs (``compare`` given their ids), and the
evaluations of compared training runs appended to the family's table. Torch-free.

Each row is one evaluation job: its target, suite, and for each shown metric the target's
value, the baseline's and the paired difference target − baseline, with their intervals.
Evaluations of different targets usually ran on different prompts (each target's held-out
questions), so two rows are not paired with each other; each row's Δ is paired with its own
baseline, which is why an evaluation against the common starting model is the comparison to
read.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhf_lab.evaluation.records import (
    EVAL_FAMILY,
    PROXY_JUDGE,
    EvalSummary,
    fmt_interval,
    metric_label,
    proxy_note,
    read_eval_summary,
)

__all__ = ["EVAL_NOTE", "evaluation_comparison", "evaluation_table", "evaluations_of_runs"]

EVAL_NOTE = (
    "Evaluation values carry 95% intervals over the prompts (Wilson for a share of 0/1 "
    "outcomes, else the prompt bootstrap); Δ is target − baseline "
    "paired by prompt. Rows with different targets ran on different held-out prompts: compare "
    "their Δ against the shared starting model rather than their raw values."
)


def _rows(items: Sequence[tuple[str, str, EvalSummary | None]]) -> list[list[str]]:
    body = []
    for job, state, s in items:
        if s is None:
            body.append([f"`{job}`", state, "—", "—", "—", "—", "—", "—"])
            continue
        for i, row in enumerate(s.rows[:3]):  # the headline and two more
            body.append(
                [
                    f"`{job}`" if i == 0 else "",
                    (s.target_run or Path(s.target).name) if i == 0 else "",
                    s.suite if i == 0 else "",
                    metric_label(s, row.metric),
                    fmt_interval(row.target),
                    fmt_interval(row.baseline),
                    fmt_interval(row.difference, signed=True),
                    "—" if row.target is None or row.target.n is None else str(row.target.n),
                ]
            )
    return body


def evaluation_table(items: Sequence[tuple[str, str, EvalSummary | None]]) -> str:
    """The markdown table of ``(job id, state, summary)`` items."""
    headers = ["evaluation", "target", "suite", "metric", "target", "baseline", "Δ", "n"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(items)]
    notes = [f"- `{job}`: {note}" for job, _, s in items if s and (note := proxy_note(s))]
    return "\n".join(lines + ([""] + notes if notes else []))


def _evaluation_dirs(run_dir: Path) -> list[Path]:
    """The evaluation jobs of the campaign holding ``run_dir``."""
    from rlhf_lab.runs.folder import read_record

    out = []
    for d in sorted(run_dir.parent.iterdir()):
        if d.is_dir() and (read_record(d).data or {}).get("family") == EVAL_FAMILY:
            out.append(d)
    return out


def evaluations_of_runs(records: Sequence[Any]) -> str | None:
    """The evaluations whose target is one of the compared training runs, as a markdown part
    (None when there is none)."""
    from rlhf_lab.paths import find_run

    ids = {r.run_id for r in records}
    items: list[tuple[str, str, EvalSummary | None]] = []
    seen: set[Path] = set()
    for rec in records:
        try:
            campaign_runs = _evaluation_dirs(find_run(rec.run_id))
        except Exception:  # noqa: BLE001 - an unreadable campaign folder leaves the part out
            continue
        for d in campaign_runs:
            if d in seen:
                continue
            seen.add(d)
            summary, _ = read_eval_summary(d)
            if summary is not None and summary.target_run in ids:
                items.append((d.name, "succeeded", summary))
    if not items:
        return None
    return "Evaluations of these runs:\n\n" + evaluation_table(items) + "\n\n" + EVAL_NOTE


def _column(s: EvalSummary) -> str:
    """The headline column of one evaluation (a proxy-judged one is named as such)."""
    assert s.headline is not None
    return f"{s.headline} ({PROXY_JUDGE})" if s.judge_is_own_reward_model else s.headline


def evaluation_comparison(
    records: Sequence[Any],
) -> tuple[list[str], list[dict[str, float | None]], str]:
    """(columns, each job's values, markdown table) for ``compare`` given evaluation jobs: the
    values are each job's headline, its baseline's and the difference. A win rate judged by the
    target's own reward model gets columns of its own, after the independent ones: it is never
    the lead when an independent judge or a verifier suite was compared."""
    items = [(r.run_id, r.state, r.evaluation) for r in records]
    summaries = [s for _, _, s in items if s is not None and s.headline]
    heads = sorted({_column(s) for s in summaries}, key=lambda c: (PROXY_JUDGE in c, c))
    columns = [c for h in heads for c in (h, f"baseline {h}", f"Δ {h}")]
    rows = []
    for r in records:
        s: EvalSummary | None = r.evaluation
        values: dict[str, float | None] = {}
        if s is not None and s.headline and (row := s.row(s.headline)) is not None:
            col = _column(s)
            values[col] = row.target.value if row.target else None
            values[f"baseline {col}"] = row.baseline.value if row.baseline else None
            values[f"Δ {col}"] = row.difference.value if row.difference else None
        rows.append(values)
    return columns, rows, evaluation_table(items)
