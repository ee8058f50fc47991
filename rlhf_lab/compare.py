"""Comparison tables that follow each family's comparison rules (docs/algorithms.md).

- policy gradients: avg_correctness, avg_format, avg_binary and loss (means over the last few
  logged steps, since single rollout steps are noisy), the change of avg_correctness over the run,
  and reward contrast = 1 − frac_reward_zero_std (the share of groups whose rewards differ — the
  only ones that teach anything);
- direct alignment: held-out accuracy, margins, chosen and rejected rewards, plus one sample per run;
- reward models: held-out metrics only (accuracy, reward margin, AUROC, ranking accuracy, PRM step
  accuracy beside the majority-label baseline), never the training loss;
- SFT: held-out and training loss and token accuracy;
- rejection sampling: every reward-selected strategy beside its matched random control
  (top_per_prompt ↔ random_per_prompt, top_k_overall ↔ random_k_overall) and the difference.

Runs of different families are never put in one table. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import Field

from rlhf_lab.catalog import matched_controls
from rlhf_lab.errors import Corrupt, InvalidArgument, NextStep
from rlhf_lab.ledger import (
    ComparisonEntry,
    RunRecord,
    _cell,
    _code,
    _fmt_num,
    _Model,
    _one_line,
    check_run_id,
    find_run,
    inspect_run,
    load_yaml,
    read_metric_rows,
    record_comparison,
    resolve_campaign,
)
from rlhf_lab.paths import LabError
from rlhf_lab.plots import as_float
from trainers.core.spec import family_spec

__all__ = [
    "PG_WINDOW",
    "RS_PAIRS",
    "Comparison",
    "ComparisonRow",
    "compare_runs",
]


def _columns(family: str) -> tuple[str, ...]:
    """The comparison columns the family's spec declares."""
    return family_spec(family).comparison_columns


def _eval_twins_of_rising_metrics(family: str) -> tuple[str, ...]:
    """``eval/`` twins of the family's training key metrics that should rise."""
    return tuple(
        f"eval/{m.name}"
        for m in family_spec(family).key_metrics
        if m.key and m.higher_is_better and not m.name.startswith("eval/")
    )


# Each reward-selected strategy -> its matched random control (from the specs).
RS_PAIRS: dict[str, str] = matched_controls()
RS_SCORE_KEYS: tuple[str, ...] = _columns("rejection_sampling")
PG_WINDOW = 5
PG_COLUMNS: tuple[str, ...] = _columns("policy_gradients")
PG_EVAL_COLUMNS: tuple[str, ...] = _eval_twins_of_rising_metrics("policy_gradients")
DA_COLUMNS: tuple[str, ...] = _columns("direct_alignment")
RM_COLUMNS: tuple[str, ...] = _columns("reward_models")
SFT_COLUMNS: tuple[str, ...] = _columns("sft")
_HEADERS = {
    "reward_contrast": "reward contrast (1 − frac_reward_zero_std)",
    "avg_correctness_change": "Δ avg_correctness",
    "step_accuracy_over_baseline": "step_accuracy − majority_baseline",
}


class ComparisonRow(_Model):
    """One line of a comparison table (structured; the markdown is rendered from these)."""

    run_id: str
    algorithm: str | None = None
    state: str = "unknown"
    seed: int | None = None
    values: dict[str, float | None] = Field(default_factory=dict)
    sample: str | None = Field(default=None, description="a generation (direct alignment)")
    role: Literal["run", "selected", "control"] = "run"
    strategy: str | None = Field(default=None, description="rejection-sampling strategy")
    control_strategy: str | None = None
    control_run_id: str | None = None
    score: float | None = Field(default=None, description="held-out exact match (RS)")
    control_score: float | None = None
    difference: float | None = Field(default=None, description="selected − matched control")


class Comparison(_Model):
    family: str
    run_ids: list[str]
    columns: list[str] = Field(description="metric columns of the table, in order")
    rows: list[ComparisonRow]
    table: str = Field(description="the markdown table alone")
    markdown: str = Field(description="the table plus notes (what the ledger records)")
    notes: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    recorded_in: str | None = Field(default=None, description="campaign it was recorded into")


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |"]
    lines.append("|" + "---|" * len(headers))
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def _final(record: RunRecord, name: str) -> float | None:
    m = record.metric(name)
    return None if m is None else m.final


def _train_values(rows: Sequence[dict], name: str) -> list[float]:
    out = []
    for row in rows:
        if row.get("phase") == "eval" or name not in row:
            continue
        value = as_float(row[name])
        if value is not None:
            out.append(value)
    return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _norm_strategy(value: str | None) -> str | None:
    return None if value is None else value.strip().lower().replace("-", "_")


# ---------------------------------------------------------------------------------------------
# Family rules
# ---------------------------------------------------------------------------------------------

_Rules = tuple[list[str], list[ComparisonRow]]  # (metric columns, rows)


def _policy_gradients(records: list[RunRecord], notes: list[str]) -> _Rules:
    rows: list[ComparisonRow] = []
    for rec in records:
        metric_rows = read_metric_rows(rec.run_id)
        values: dict[str, float | None] = {}
        for name in ("avg_correctness", "avg_format", "avg_binary", "loss"):
            series = _train_values(metric_rows, name)
            values[name] = _mean(series[-PG_WINDOW:]) if series else _final(rec, name)
        zero = _train_values(metric_rows, "frac_reward_zero_std")
        frac = _mean(zero[-PG_WINDOW:]) if zero else _final(rec, "frac_reward_zero_std")
        values["reward_contrast"] = None if frac is None else 1.0 - frac
        corr = _train_values(metric_rows, "avg_correctness")
        values["avg_correctness_change"] = (
            _mean(corr[-PG_WINDOW:]) - _mean(corr[:PG_WINDOW]) if len(corr) >= 2 else None
        )
        for name in PG_EVAL_COLUMNS:
            values[name] = _final(rec, name)
        rows.append(_row(rec, values))
    columns = list(PG_COLUMNS) + [
        c for c in PG_EVAL_COLUMNS if any(r.values.get(c) is not None for r in rows)
    ]
    notes.append(
        f"Training columns are means over the last {PG_WINDOW} logged steps (one rollout step "
        "is noisy); Δ avg_correctness = that mean minus the mean of the first "
        f"{PG_WINDOW}. Progress shows as avg_correctness, avg_format and avg_binary rising while "
        "reward contrast stays above 0; the loss alone says little."
    )
    for r in rows:
        contrast = r.values.get("reward_contrast")
        if contrast is not None and contrast < 0.05:
            notes.append(
                f"{r.run_id}: almost no reward contrast — its groups scored alike, so it learns "
                "nothing; warm-start the model (SFT) or ease the task."
            )
    return columns, rows


def _direct_alignment(records: list[RunRecord], notes: list[str]) -> _Rules:
    rows = []
    for rec in records:
        row = _row(rec, {c: _final(rec, c) for c in DA_COLUMNS})
        if rec.samples:
            s = rec.samples[0]
            row.sample = _one_line(f"{s.prompt} → {s.completion}", 240)
        rows.append(row)
        if all(row.values[c] is None for c in DA_COLUMNS):
            notes.append(
                f"{rec.run_id}: no held-out metrics (eval.eval_every=0, no eval split, or it "
                "stopped before the first evaluation)."
            )
    algos = {r.algorithm for r in rows if r.algorithm}
    if len(algos) > 1:
        notes.append(
            "Margins and rewards live on each loss's own scale (β, reference-free SimPO/ORPO, "
            "IPO's squared loss); compare held-out accuracy across losses and margins within one."
        )
    return list(DA_COLUMNS), rows


def _reward_models(records: list[RunRecord], notes: list[str]) -> _Rules:
    rows = []
    for rec in records:
        values = {c: _final(rec, c) for c in RM_COLUMNS[:-1]}
        step, base = values["eval/step_accuracy"], values["eval/majority_baseline"]
        values["step_accuracy_over_baseline"] = (
            None if step is None or base is None else step - base
        )
        rows.append(_row(rec, values))
        if all(v is None for v in values.values()):
            notes.append(f"{rec.run_id}: no held-out metrics logged yet.")
    columns = [c for c in RM_COLUMNS if any(r.values.get(c) is not None for r in rows)]
    notes.append(
        "Reward models are compared on held-out margins and correctness, never on training loss. "
        "A PRM's step accuracy means something only above the majority-label baseline."
    )
    return columns or list(RM_COLUMNS[:2]), rows


def _sft(records: list[RunRecord], notes: list[str]) -> _Rules:
    rows = [_row(rec, {c: _final(rec, c) for c in SFT_COLUMNS}) for rec in records]
    notes.append(
        "Lower held-out loss and higher token accuracy are better; the training loss alone "
        "can hide over-fitting."
    )
    return list(SFT_COLUMNS), rows


def _rs_score(rec: RunRecord) -> float | None:
    for key in RS_SCORE_KEYS:
        value = _final(rec, key)
        if value is not None:
            return value
    return None


def _rs_config(rec: RunRecord) -> dict:
    try:
        return load_yaml(find_run(rec.run_id) / "config.yaml")
    except LabError:
        return {}


def _rs_top_k(cfg: dict) -> Any:
    sel = cfg.get("selection")
    if isinstance(sel, dict) and "top_k" in sel:
        return sel["top_k"]
    return cfg.get("top_k")


def _rejection_sampling(records: list[RunRecord], notes: list[str], warnings: list[str]) -> _Rules:
    strategies = {r.run_id: _norm_strategy(r.algorithm) for r in records}
    configs = {r.run_id: _rs_config(r) for r in records}
    scores = {r.run_id: _rs_score(r) for r in records}
    controls = {c for c in RS_PAIRS.values()}
    used: set[str] = set()
    rows: list[ComparisonRow] = []

    def matched(rec: RunRecord, control_strategy: str) -> RunRecord | None:
        pool = [r for r in records if strategies[r.run_id] == control_strategy]
        if not pool:
            return None

        def rank(c: RunRecord) -> tuple:
            return (
                c.run_id in used,
                c.seed != rec.seed,
                (c.model, c.dataset) != (rec.model, rec.dataset),
            )

        return min(pool, key=rank)

    for rec in records:
        strategy = strategies[rec.run_id]
        if strategy not in RS_PAIRS:
            continue
        control_strategy = RS_PAIRS[strategy]
        control = matched(rec, control_strategy)
        row = _row(rec, {"exact_match": scores[rec.run_id]})
        row.role, row.strategy, row.control_strategy = "selected", strategy, control_strategy
        row.score = scores[rec.run_id]
        if control is None:
            notes.append(
                f"{rec.run_id} ({strategy}) has no matched random control among these runs: "
                f"launch {control_strategy} with the same seed, model and data."
            )
        else:
            used.add(control.run_id)
            row.control_run_id = control.run_id
            row.control_score = scores[control.run_id]
            if row.score is not None and row.control_score is not None:
                row.difference = row.score - row.control_score
            for field in ("seed", "model", "dataset"):
                a, b = getattr(rec, field), getattr(control, field)
                if a != b:
                    warnings.append(
                        f"{rec.run_id} ↔ {control.run_id}: {field} differs ({a} vs {b}); the "
                        "control is not matched"
                    )
            if strategy == "top_k_overall":
                ka, kb = _rs_top_k(configs[rec.run_id]), _rs_top_k(configs[control.run_id])
                if ka != kb:
                    warnings.append(
                        f"{rec.run_id} ↔ {control.run_id}: top_k differs ({ka} vs {kb}); the "
                        "selections are not the same size"
                    )
        rows.append(row)
    for rec in records:
        strategy = strategies[rec.run_id]
        if strategy in RS_PAIRS or rec.run_id in used:
            continue
        row = _row(rec, {"exact_match": scores[rec.run_id]})
        row.strategy, row.score = strategy, scores[rec.run_id]
        if strategy in controls:
            row.role = "control"
            notes.append(
                f"{rec.run_id} ({strategy}) is a random control with no reward-selected run "
                "beside it in this comparison."
            )
        else:
            notes.append(
                f"{rec.run_id}: unknown selection strategy {strategy!r}; expected one of "
                f"{', '.join(list(RS_PAIRS) + list(controls))}."
            )
        rows.append(row)
    notes.append(
        "Each reward-selected strategy is read against its matched random control (same size, "
        "seed and data): a positive difference is what reward selection adds over SFT on "
        "random samples of the same pool."
    )
    return ["exact_match"], rows


_FamilyRule = Callable[[list[RunRecord], list[str], list[str]], _Rules]

# One comparison rule per family (each family's spec states the rule in words).
_FAMILY_RULES: dict[str, _FamilyRule] = {
    "policy_gradients": lambda records, notes, warnings: _policy_gradients(records, notes),
    "direct_alignment": lambda records, notes, warnings: _direct_alignment(records, notes),
    "reward_models": lambda records, notes, warnings: _reward_models(records, notes),
    "sft": lambda records, notes, warnings: _sft(records, notes),
    "rejection_sampling": _rejection_sampling,
}


def _row(rec: RunRecord, values: dict[str, float | None]) -> ComparisonRow:
    return ComparisonRow(
        run_id=rec.run_id,
        algorithm=rec.algorithm,
        state=rec.state,
        seed=rec.seed,
        values=values,
    )


def _render_table(family: str, columns: list[str], rows: list[ComparisonRow]) -> str:
    if family == "rejection_sampling":
        headers = [
            "strategy",
            "run",
            "state",
            "exact match",
            "matched control",
            "control run",
            "control exact match",
            "difference",
        ]
        body = []
        for r in rows:
            body.append(
                [
                    _cell(r.strategy),
                    _code(r.run_id),
                    _state_cell(r.state),
                    _fmt_num(r.score),
                    _control_cell(r),
                    _code(r.control_run_id) if r.control_run_id else "—",
                    _fmt_num(r.control_score),
                    _signed(r.difference),
                ]
            )
        return _md_table(headers, body)
    headers = ["run", "algorithm", "state", "seed"] + [_HEADERS.get(c, c) for c in columns]
    body = [
        [_code(r.run_id), _cell(r.algorithm), _state_cell(r.state), _cell(r.seed)]
        + [
            _signed(r.values.get(c))
            if c.endswith(("_change", "_over_baseline"))
            else _fmt_num(r.values.get(c))
            for c in columns
        ]
        for r in rows
    ]
    return _md_table(headers, body)


def _control_cell(row: ComparisonRow) -> str:
    if row.role == "selected":
        return _cell(row.control_strategy)
    return "(is a control)" if row.role == "control" else "—"


def _state_cell(state: str) -> str:
    return _cell(state) if state == "succeeded" else f"**{_cell(state)}**"


def _signed(value: float | None) -> str:
    if value is None:
        return "—"
    if math.isnan(value):
        return "nan"
    return f"{value:+.4g}"


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


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
            "compare needs at least one run id", next=NextStep("list_runs", note="shows run ids")
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
    rules = _FAMILY_RULES.get(family)
    if rules is None:
        raise InvalidArgument(f"no comparison rules for family {family!r}")
    columns, rows = rules(records, notes, warnings)

    table = _render_table(family, columns, rows)
    parts = [table]
    samples = [r for r in rows if r.sample]
    if samples:
        parts.append(
            "Samples (latest step):\n\n"
            + "\n".join(f"- {_code(r.run_id)}: {_code(r.sample)}" for r in samples)
        )
    if notes or warnings:
        parts.append("\n".join([f"- {n}" for n in notes] + [f"- warning: {w}" for w in warnings]))
    markdown = "\n\n".join(parts)
    comparison = Comparison(
        family=family,
        run_ids=ids,
        columns=columns,
        rows=rows,
        table=table,
        markdown=markdown,
        notes=notes,
        warnings=warnings,
    )
    if campaign is not None:
        algos = ", ".join(dict.fromkeys(r.algorithm or "?" for r in records))
        entry = ComparisonEntry(
            key=f"{family}:{','.join(sorted(ids))}",
            title=f"{family.replace('_', ' ')}: {len(ids)} run(s) ({algos})",
            family=family,
            run_ids=ids,
            markdown=markdown,
        )
        comparison.recorded_in = record_comparison(campaign, entry).id
    return comparison
