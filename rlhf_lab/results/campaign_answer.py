"""Recording a campaign's answer when its runs are compared (``compare --campaign``): the
change-from-start answer of :mod:`rlhf_lab.results.answer` for the families whose runs evaluate
their starting model at step 0, with its figure in the campaign's plots folder. Torch-free."""

from __future__ import annotations

from collections.abc import Sequence

from rlhf_lab.headline import Headline
from rlhf_lab.ledger import (
    AnswerEntry,
    ArmSummary,
    answer_figure_path,
    read_metric_rows,
    record_answer,
)
from rlhf_lab.results.answer import TRAIN_LENGTH, change_answer, draw_change_figure

__all__ = ["ANSWER_COMPANIONS", "ANSWER_TRENDS", "record_change_answer"]

# family -> the held-out metrics the answer reports beside the headline, with their words
ANSWER_COMPANIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "policy_gradients": (
        ("eval/avg_format", "the held-out tag format rate"),
        ("eval/response_length/mean", "the held-out response length (tokens)"),
    ),
}


# family -> training-row metrics whose trend over the run the answer reports
ANSWER_TRENDS: dict[str, tuple[tuple[str, str], ...]] = {
    "policy_gradients": ((TRAIN_LENGTH, "sampled response length over training (tokens)"),),
}


def record_change_answer(
    campaign: str, family: str, head: Headline | None, arms: Sequence[ArmSummary]
) -> AnswerEntry | None:
    """Compute, draw and record the change-from-start answer of ``arms``; None (nothing recorded)
    for a family without an answer rule or runs without a step-0 evaluation."""
    if head is None or family not in ANSWER_COMPANIONS or not arms:
        return None
    groups = {arm.label: list(arm.run_ids) for arm in arms}
    rows = {run_id: read_metric_rows(run_id) for ids in groups.values() for run_id in ids}
    metrics = [(head.metric, head.label or head.metric), *ANSWER_COMPANIONS[family]]
    trends = ANSWER_TRENDS.get(family, ())
    answer = change_answer(groups, rows, metrics, trends)
    if answer is None:
        return None
    panels = [(m, "eval", label.removeprefix("the ")) for m, label in metrics[:2]]
    panels.append((TRAIN_LENGTH, "rollout", "response length over training (tokens)"))
    out = answer_figure_path(campaign)
    figure = draw_change_figure(groups, rows, panels, out)
    entry = AnswerEntry(
        verdict=answer.verdict,
        details=answer.details,
        rule=answer.rule,
        budget=answer.budget,
        figure=f"plots/{out.name}" if figure else None,
        source=answer.source,
        run_ids=answer.run_ids,
    )
    record_answer(campaign, entry)
    return entry
