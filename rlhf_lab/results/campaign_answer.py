"""Recording a campaign's answer when its runs are compared (``compare --campaign``): for
direct-alignment runs that logged the gold evaluation, gold against √KL per β
(:mod:`rlhf_lab.results.gold_vs_kl`); for the families whose runs evaluate their starting model at
step 0, the change from the start (:mod:`rlhf_lab.results.answer`); the figure in the campaign's
plots folder. Torch-free."""

from __future__ import annotations

from collections.abc import Sequence

from rlhf_lab.ledger import (
    AnswerEntry,
    ArmSummary,
    Verdict,
    answer_figure_path,
    read_metric_rows,
    record_answer,
)
from rlhf_lab.paths import LabError, find_run
from rlhf_lab.results.answer import TRAIN_LENGTH, change_answer, draw_change_figure
from rlhf_lab.results.gold_vs_kl import FIGURE, gold_vs_kl, plot_gold_vs_kl, read_run_gold
from rlhf_lab.results.headline import Headline

__all__ = [
    "ANSWER_COMPANIONS",
    "ANSWER_TRENDS",
    "record_best_of_n_answer",
    "record_change_answer",
    "record_gold_answer",
]

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


def arms_lead(head: Headline, verdicts: Sequence[Verdict]) -> str | None:
    """The answer of a campaign with several arms: the first decided verdict between two arms
    (the leading arm against another), with its 95% interval; None when there is none."""
    for v in verdicts:
        if v.difference is None or v.low is None or v.high is None:
            continue
        if v.verdict not in ("better", "worse", "tie within noise"):
            continue
        words = {"better": "beats", "worse": "trails", "tie within noise": "ties within noise with"}
        return (
            f"**{v.a}** {words[v.verdict]} **{v.b}** on {head.label or head.metric}: "
            f"Δ {v.difference:+.3g} (95% {v.low:+.3g} … {v.high:+.3g}; {v.method})"
        )
    return None


def record_change_answer(
    campaign: str,
    family: str,
    head: Headline | None,
    arms: Sequence[ArmSummary],
    verdicts: Sequence[Verdict] = (),
) -> AnswerEntry | None:
    """Compute, draw and record the change-from-start answer of ``arms``; None (nothing recorded)
    for a family without an answer rule or runs without a step-0 evaluation. With a decided
    verdict between arms (``verdicts``), that comparison leads and each arm's change from the
    start follows it."""
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
    lead = arms_lead(head, verdicts) if len(arms) > 1 else None
    entry = AnswerEntry(
        verdict=lead or answer.verdict,
        details=[answer.verdict, *answer.details] if lead else answer.details,
        rule=answer.rule,
        budget=answer.budget,
        figure=f"plots/{out.name}" if figure else None,
        source=answer.source,
        run_ids=answer.run_ids,
    )
    record_answer(campaign, entry)
    return entry


def record_gold_answer(campaign: str, run_ids: Sequence[str]) -> AnswerEntry | None:
    """Gold against √KL for the direct-alignment ``run_ids`` that logged the gold evaluation,
    recorded as the campaign's answer with its figure; None (nothing recorded) without them."""
    runs = [got for rid in run_ids if (got := read_run_gold(find_run(rid), rid)) is not None]
    result = gold_vs_kl(runs)
    if not result.arms:
        return None
    out = answer_figure_path(campaign).with_name(FIGURE)
    figure = plot_gold_vs_kl(result.arms, out, title="gold (verifier, greedy) against √KL")
    drift = ", ".join(f"{a.arm}: √KL {a.sqrt_kl[-1]:.3g}" for a in result.arms)
    entry = AnswerEntry(
        verdict=result.verdict,
        details=[*(a.line() for a in result.arms), *result.notes],
        rule=result.method,
        budget=f"drift from the reference at the last evaluation — {drift}",
        figure=f"plots/{FIGURE}" if figure else None,
        source="gold against KL",
        run_ids=[r.run_id for r in runs],
    )
    record_answer(campaign, entry)
    return entry


def _is_best_of_n(run_id: str) -> bool:
    import json

    try:
        return json.loads((find_run(run_id) / "eval.json").read_text()).get("suite") == "best_of_n"
    except (OSError, ValueError, LabError):
        return False


def record_best_of_n_answer(campaign: str, run_ids: Sequence[str]) -> AnswerEntry | None:
    """Best-of-n by ORM, PRM, majority vote and at random from the finished ``best_of_n``
    evaluation jobs among ``run_ids`` (several jobs of the same prompts pooled prompt by prompt),
    recorded as the campaign's answer with its figure; None without such jobs."""
    from rlhf_lab.results.best_of_n import analyse_best_of_n

    jobs = [r for r in run_ids if _is_best_of_n(r)]
    if not jobs:
        return None
    out = answer_figure_path(campaign).with_name("best-of-n.png")
    result = analyse_best_of_n([find_run(r) for r in jobs], out)
    accuracy = [row for row in result.table]
    random_at_1 = accuracy[0].get("random") if accuracy else None
    entry = AnswerEntry(
        verdict=result.verdict,
        details=[result.markdown_table(), *result.per_evaluation],
        rule=(
            f"expected accuracy of the answer each selector picks among n of the {max(result.sizes)} "
            f"samples per prompt ({result.n_prompts} held-out prompts; PRM score = {result.prm_aggregate} "
            "of its step probabilities); 95% intervals by a bootstrap over prompts"
        ),
        budget=f"the policy's own accuracy (random choice, n = 1): {random_at_1}",
        figure=f"plots/{out.name}" if result.figure else None,
        source="best-of-n",
        run_ids=jobs,
    )
    record_answer(campaign, entry)
    return entry
