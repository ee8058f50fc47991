"""Comparison tables that follow each family's comparison rules (docs/algorithms.md), led by
the held-out headline metric of the family's spec, with arms, intervals and verdicts.

Held-out first: the table's first metric column is the headline (greedy held-out correctness,
held-out preference accuracy, held-out accuracy, held-out loss, held-out exact match); training
numbers (sampled rollouts, training batches) follow, labelled "training signal". Runs are grouped
into arms (same algorithm and settings, differing only in seed); each arm gets a mean and a 95 %
interval, and each pair of arms a verdict by :data:`rlhf_lab.results.stats.VERDICT_RULE`
(better / worse / tie within noise / not comparable / undecided), printed with the table.

- policy gradients: avg_correctness, avg_format, avg_binary and loss (means over the last few
  logged steps, since single rollout steps are noisy), the change of avg_correctness over the run,
  and reward contrast = 1 − frac_reward_zero_std (the share of groups whose rewards differ — the
  only ones that teach anything); for runs optimising a learned reward model also the held-out
  gold and proxy reward and the training proxy_reward, gold_reward and kl_ref;
- direct alignment: held-out accuracy, margins, chosen and rejected rewards, plus one sample per run;
- reward models: held-out metrics only (accuracy, reward margin, AUROC, ranking accuracy, PRM step
  accuracy beside the majority-label baseline), never the training loss;
- SFT: held-out and training loss and token accuracy;
- rejection sampling: every reward-selected strategy beside its matched random control
  (top_per_prompt ↔ random_per_prompt, top_k_overall ↔ random_k_overall) and the difference.

Runs of different families are never put in one table. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from rlhf_lab.errors import Corrupt, InvalidArgument, NextStep
from rlhf_lab.evaluation.compare import EVAL_NOTE, evaluation_comparison, evaluations_of_runs
from rlhf_lab.evaluation.records import EVAL_FAMILY
from rlhf_lab.ledger import (
    ArmSummary,
    ComparisonEntry,
    RunRecord,
    _code,
    _Model,
    check_run_id,
    inspect_run,
    read_metric_rows,
    record_comparison,
    resolve_campaign,
)
from rlhf_lab.ledger import Verdict as VerdictModel
from rlhf_lab.results.campaign_answer import (
    record_best_of_n_answer,
    record_change_answer,
    record_gold_answer,
)
from rlhf_lab.results.diagnosis import heldout_regression
from rlhf_lab.results.family_tables import (
    FAMILY_RULES,
    PG_WINDOW,
    RS_PAIRS,
    ComparisonRow,
    recorded_config,
    render_table,
    table_row,
)
from rlhf_lab.results.stats import (
    VERDICT_RULE,
)
from rlhf_lab.results.verdicts import arms_and_verdicts, arms_markdown, verdict_between

__all__ = [
    "PG_WINDOW",
    "RS_PAIRS",
    "Comparison",
    "ComparisonRow",
    "compare_runs",
    "verdict_between",
]


class Comparison(_Model):
    family: str
    run_ids: list[str]
    headline: str | None = Field(
        default=None, description="the held-out metric the verdicts are decided on"
    )
    higher_is_better: bool = True
    columns: list[str] = Field(description="metric columns of the table, held-out first")
    rows: list[ComparisonRow]
    arms: list[ArmSummary] = Field(
        default_factory=list, description="runs grouped by setting (differing only in seed)"
    )
    verdicts: list[VerdictModel] = Field(default_factory=list)
    rule: str = Field(description="how intervals and verdicts are made")
    table: str = Field(description="the markdown table alone")
    markdown: str = Field(description="the table plus notes (what the ledger records)")
    notes: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    recorded_in: str | None = Field(default=None, description="campaign it was recorded into")


def compare_runs(run_ids: Sequence[str], record_in: str | None = None) -> Comparison:
    """A comparison table of ``run_ids`` by their family's rules.

    All runs must belong to one family (mixing is an error). With ``record_in`` (a campaign slug or
    name) the table is also written into that campaign's Comparison section; comparing the same
    set again replaces it there.
    """
    if isinstance(run_ids, str):
        run_ids = [run_ids]
    ids = list(dict.fromkeys(run_ids))
    if not ids:
        raise InvalidArgument(
            "compare needs at least one run id (run_ids) or a campaign",
            next=NextStep("list_runs", note="shows run ids"),
        )
    for run_id in ids:
        check_run_id(run_id)
    campaign = resolve_campaign(record_in) if record_in is not None else None
    records = [inspect_run(run_id) for run_id in ids]

    unknown = [r.run_id for r in records if not r.family]
    if unknown:
        raise Corrupt(
            f"cannot tell the family of {', '.join(unknown)}: run.json is missing or unreadable; "
            "a comparison needs each run's family",
            next=[NextStep("run_status", {"run_id": run_id}) for run_id in unknown],
        )
    families: dict[str, list[str]] = {}
    for r in records:
        families.setdefault(r.family or "", []).append(r.run_id)
    if len(families) > 1:
        parts = "; ".join(f"{fam}: {', '.join(ids_)}" for fam, ids_ in families.items())
        raise InvalidArgument(
            f"cannot compare runs of different families ({parts}); each family has its own "
            "comparison rules, so compare the runs of one family at a time",
            next=[NextStep("compare_runs", {"run_ids": ids_}) for ids_ in families.values()],
        )
    family = next(iter(families))
    notes: list[str] = []
    warnings: list[str] = []
    for r in records:
        if r.state != "succeeded":
            notes.append(f"{r.run_id} ({r.state}): its numbers are from where it stopped.")
    if family == EVAL_FAMILY:  # evaluation jobs: their own table (rlhf_lab.evaluation.compare)
        return _evaluations(ids, records, notes, campaign)
    rules = FAMILY_RULES.get(family)
    if rules is None:
        raise InvalidArgument(f"no comparison rules for family {family!r}")
    columns, rows = rules(records, notes, warnings)
    head, arms, verdicts = arms_and_verdicts(family, records)
    if family == "policy_gradients" and head is not None and head.metric in columns:
        columns = [head.metric] + [c for c in columns if c != head.metric]  # the result first
    for rec in records:
        found = heldout_regression(
            family, rec.algorithm, read_metric_rows(rec.run_id), recorded_config(rec)
        )
        if found is not None:
            warnings.append(f"{rec.run_id}: {found.message}")
        if "noise_samples" in rec.flags:
            notes.append(f"{rec.run_id}: its samples are noise, not text (see its ledger row).")

    table = render_table(family, columns, rows, head.metric if head else None)
    parts = [arms_markdown(head, arms, verdicts), table]
    samples = [r for r in rows if r.sample]
    if samples:
        parts.append(
            "Samples (latest step):\n\n"
            + "\n".join(f"- {_code(r.run_id)}: {_code(r.sample)}" for r in samples)
        )
    evaluated = evaluations_of_runs(records)
    if evaluated:
        parts.append(evaluated)
    if notes or warnings:
        parts.append("\n".join([f"- {n}" for n in notes] + [f"- warning: {w}" for w in warnings]))
    markdown = "\n\n".join(parts)
    comparison = Comparison(
        family=family,
        run_ids=ids,
        headline=head.metric if head else None,
        higher_is_better=head.higher_is_better if head else True,
        columns=columns,
        rows=rows,
        arms=arms,
        verdicts=verdicts,
        rule=VERDICT_RULE,
        table=table,
        markdown=markdown,
        notes=notes,
        warnings=warnings,
    )
    if campaign is not None:
        algos = ", ".join(dict.fromkeys(r.algorithm or "?" for r in records))
        title = f"{family.replace('_', ' ')}: {len(ids)} run(s) ({algos})"
        comparison.recorded_in = _record(comparison, title, campaign)
        if family != "direct_alignment" or record_gold_answer(campaign, ids) is None:
            record_change_answer(campaign, family, head, arms, verdicts)
    return comparison


def _evaluations(
    ids: list[str], records: list[RunRecord], notes: list[str], campaign: str | None
) -> Comparison:
    """compare_runs of evaluation jobs (rlhf_lab.evaluation.compare)."""
    columns, values, table = evaluation_comparison(records)
    rows = [table_row(rec, v) for rec, v in zip(records, values, strict=True)]
    markdown = "\n\n".join([table, EVAL_NOTE, *[f"- {n}" for n in notes]])
    comparison = Comparison(
        family=EVAL_FAMILY,
        run_ids=ids,
        headline=columns[0] if columns else None,
        columns=columns,
        rows=rows,
        rule=EVAL_NOTE,
        table=table,
        markdown=markdown,
        notes=notes,
    )
    if campaign is not None:
        comparison.recorded_in = _record(comparison, f"evaluations: {len(ids)} job(s)", campaign)
        record_best_of_n_answer(campaign, ids)
    return comparison


def _record(comparison: Comparison, title: str, campaign: str) -> str:
    """Write ``comparison`` into the campaign's Comparison section under ``title`` (the same set
    of runs compared again replaces it there); the campaign's id."""
    key = f"{comparison.family}:{','.join(sorted(comparison.run_ids))}"
    shared = comparison.model_dump(include=set(ComparisonEntry.model_fields))
    return record_comparison(campaign, ComparisonEntry(key=key, title=title, **shared)).id
