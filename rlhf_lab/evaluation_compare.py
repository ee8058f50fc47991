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

from rlhf_lab.evaluation_records import (
    EVAL_FAMILY,
    EvalSummary,
    fmt_interval,
    read_eval_summary,
)

__all__ = ["EVAL_NOTE", "evaluation_comparison", "evaluation_table", "evaluations_of_runs"]

EVAL_NOTE = (
    "Evaluation values carry bootstrap 95% intervals over the prompts; Δ is target − baseline "
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
                    row.metric,
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
    return "\n".join(lines)


def _evaluation_dirs(run_dir: Path) -> list[Path]:
    """The evaluation jobs of the campaign holding ``run_dir``."""
    from rlhf_lab.runfolder import read_record

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


def evaluation_comparison(
    records: Sequence[Any],
) -> tuple[list[str], list[dict[str, float | None]], str]:
    """(columns, each job's values, markdown table) for ``compare`` given evaluation jobs: the
    values are each job's headline, its baseline's and the difference."""
    items = [(r.run_id, r.state, r.evaluation) for r in records]
    heads = sorted({s.headline for _, _, s in items if s is not None and s.headline})
    columns = [c for h in heads for c in (h, f"baseline {h}", f"Δ {h}")]
    rows = []
    for r in records:
        s: EvalSummary | None = r.evaluation
        values: dict[str, float | None] = {}
        if s is not None and s.headline and (row := s.row(s.headline)) is not None:
            values[s.headline] = row.target.value if row.target else None
            values[f"baseline {s.headline}"] = row.baseline.value if row.baseline else None
            values[f"Δ {s.headline}"] = row.difference.value if row.difference else None
        rows.append(values)
    return columns, rows, evaluation_table(items)
