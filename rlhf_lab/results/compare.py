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

import json
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import Field

from rlhf_lab.errors import Corrupt, InvalidArgument, NextStep
from rlhf_lab.evaluation.compare import EVAL_NOTE, evaluation_comparison, evaluations_of_runs
from rlhf_lab.evaluation.records import EVAL_FAMILY
from rlhf_lab.ledger import (
    ArmSummary,
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
from rlhf_lab.ledger import Verdict as VerdictModel
from rlhf_lab.paths import LabError
from rlhf_lab.planning.catalog import get_dotted, matched_controls
from rlhf_lab.results.campaign_answer import (
    record_best_of_n_answer,
    record_change_answer,
    record_gold_answer,
)
from rlhf_lab.results.headline import Headline, headline_for
from rlhf_lab.results.logs import heldout_regression
from rlhf_lab.results.plots import as_float
from rlhf_lab.results.stats import (
    VERDICT_RULE,
    Interval,
    mean_interval,
    newcombe_difference,
    pooled_share_interval,
    verdict_of,
    welch_difference,
    wilson_interval,
)
from trainers.core.spec import FAMILY_NAMES, family_spec

__all__ = [
    "PG_WINDOW",
    "RS_PAIRS",
    "Comparison",
    "ComparisonRow",
    "compare_runs",
    "verdict_between",
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
# a run optimising a learned reward model (the RLHF contract of the policy-gradient trainer):
# shown only when some compared run logs them
PG_RM_COLUMNS: tuple[str, ...] = ("proxy_reward", "gold_reward", "kl_ref")
PG_RM_EVAL_COLUMNS: tuple[str, ...] = ("eval/gold_reward", "eval/proxy_reward")
DA_COLUMNS: tuple[str, ...] = _columns("direct_alignment")
RM_COLUMNS: tuple[str, ...] = _columns("reward_models")
SFT_COLUMNS: tuple[str, ...] = _columns("sft")
_HEADERS = {
    "reward_contrast": "reward contrast (1 − frac_reward_zero_std)",
    "avg_correctness_change": "Δ avg_correctness",
    "eval/avg_correctness_change": "Δ eval/avg_correctness",
    "step_accuracy_over_baseline": "step_accuracy − majority_baseline",
}
# held-out columns whose name does not start with eval/
_HELD_OUT_DERIVED = frozenset({"step_accuracy_over_baseline"})


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
        held = [
            v
            for r in metric_rows
            if r.get("phase") == "eval"
            and (v := as_float(r.get("eval/avg_correctness"))) is not None
        ]
        values["eval/avg_correctness_change"] = held[-1] - held[0] if len(held) >= 2 else None
        for name in PG_RM_COLUMNS:
            series = _train_values(metric_rows, name)
            values[name] = _mean(series[-PG_WINDOW:]) if series else None
        for name in PG_RM_EVAL_COLUMNS:
            values[name] = _final(rec, name)
        rows.append(_row(rec, values))
    held_out = [
        c
        for c in (*PG_RM_EVAL_COLUMNS, *PG_EVAL_COLUMNS)
        if any(r.values.get(c) is not None for r in rows)
    ]
    if any(r.values.get("eval/avg_correctness_change") is not None for r in rows):
        held_out.append("eval/avg_correctness_change")
    rm = [c for c in PG_RM_COLUMNS if any(r.values.get(c) is not None for r in rows)]
    columns = held_out + list(PG_COLUMNS) + rm
    if rm:
        notes.append(
            "Runs optimising a learned reward model: proxy_reward is that model's own score (it "
            "rises by construction), gold_reward a judge the policy is not optimised against "
            "(a verifier or a held-out gold model), kl_ref the KL to the reference (training "
            f"columns: means over the last {PG_WINDOW} rollout steps). Read gold, not proxy: "
            "proxy up with gold down is overoptimisation."
        )
    result = (
        "the held-out headline: the gold reward of a run optimising a reward model (the proxy "
        "when it has no gold)"
        if any(c in PG_RM_EVAL_COLUMNS for c in held_out)
        else "the greedy held-out eval/avg_correctness"
    )
    notes.append(
        f"The result is {result} (first column). The training "
        f"signal columns are sampled-rollout means over the last {PG_WINDOW} logged steps (one "
        f"rollout step is noisy); Δ avg_correctness = that mean minus the mean of the first "
        f"{PG_WINDOW}. Sampled correctness can rise while held-out correctness falls; avg_format, "
        "avg_binary and reward contrast above 0 show whether the run learns at all, and the loss "
        "alone says little."
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


def _spec_columns(family: str) -> _FamilyRule:
    """The rule of a family compared on its spec's columns at the end of each run, with the
    spec's comparison sentence as the note (distillation)."""

    def rule(records: list[RunRecord], notes: list[str], warnings: list[str]) -> _Rules:
        columns = list(_columns(family))
        rows = [_row(rec, {c: _final(rec, c) for c in columns}) for rec in records]
        notes.append(
            family_spec(family).comparison[:1].upper() + family_spec(family).comparison[1:]
        )
        return columns, rows

    return rule


# One comparison rule per family (each family's spec states the rule in words).
_FAMILY_RULES: dict[str, _FamilyRule] = {
    "policy_gradients": lambda records, notes, warnings: _policy_gradients(records, notes),
    "direct_alignment": lambda records, notes, warnings: _direct_alignment(records, notes),
    "reward_models": lambda records, notes, warnings: _reward_models(records, notes),
    "sft": lambda records, notes, warnings: _sft(records, notes),
    "rejection_sampling": _rejection_sampling,
    "distillation": _spec_columns("distillation"),
}


def _row(rec: RunRecord, values: dict[str, float | None]) -> ComparisonRow:
    return ComparisonRow(
        run_id=rec.run_id,
        algorithm=rec.algorithm,
        state=rec.state,
        seed=rec.seed,
        values=values,
    )


def _header(column: str, headline: str | None) -> str:
    """A column's header: the headline marked, training columns labelled as the training
    signal."""
    text = _HEADERS.get(column, column)
    if column == headline:
        return f"**{text}** (held-out headline)"
    if column.startswith("eval/") or column in _HELD_OUT_DERIVED:
        return text
    return f"{text} (training signal)"


def _render_table(
    family: str, columns: list[str], rows: list[ComparisonRow], headline: str | None = None
) -> str:
    if family == "rejection_sampling":
        headers = [
            "strategy",
            "run",
            "state",
            "**held-out exact match** (headline)",
            "matched control",
            "control run",
            "control held-out exact match",
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
    headers = ["run", "algorithm", "state", "seed"] + [_header(c, headline) for c in columns]
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
# Arms, intervals, verdicts
# ---------------------------------------------------------------------------------------------

# override keys that never make arms unmatched (where logs and checkpoints go, the device)
_IGNORED_PREFIXES = ("logging.", "checkpoint.", "model.device", "seed")


class _Arm:
    """Runs of one setting (internal; becomes an :class:`ArmSummary`)."""

    def __init__(self, key: tuple, records: list[RunRecord], configs: dict[str, dict | None]):
        self.key = key
        self.records = records
        self.configs = configs
        self.algorithm = records[0].algorithm
        self.label = self.algorithm or records[0].run_id

    @property
    def values(self) -> list[float]:
        out = []
        for r in self.records:
            h = r.headline
            if h is not None and h.value is not None and math.isfinite(h.value):
                out.append(h.value)
        return out

    @property
    def n_items(self) -> int | None:
        counts = {r.headline.n for r in self.records if r.headline is not None}
        return counts.pop() if len(counts) == 1 else None

    @property
    def n_source(self) -> str | None:
        return next((r.headline.n_source for r in self.records if r.headline is not None), None)

    @property
    def metric(self) -> str | None:
        names = {r.headline.metric for r in self.records if r.headline is not None}
        return names.pop() if len(names) == 1 else None

    def config(self) -> dict | None:
        return next((c for r in self.records if (c := self.configs.get(r.run_id))), None)

    def overrides(self) -> list[str]:
        return [o for o in self.records[0].overrides if not o.startswith("seed=")]


def _override_keys(records: Sequence[RunRecord]) -> set[str]:
    return {o.split("=", 1)[0].strip() for r in records for o in r.overrides if "=" in o}


def _arm_key(rec: RunRecord, cfg: dict | None) -> tuple:
    """Runs with equal keys form one arm: same algorithm and settings, any seed."""
    if rec.config_source:
        rest = tuple(sorted(o for o in rec.overrides if not o.startswith("seed=")))
        return (rec.algorithm, rec.config_source, rest)
    without_seed = {k: v for k, v in (cfg or {}).items() if k != "seed"}
    return (rec.algorithm, None, json.dumps(without_seed, sort_keys=True, default=str))


def _group_arms(records: list[RunRecord], configs: dict[str, dict | None]) -> list[_Arm]:
    groups: dict[tuple, list[RunRecord]] = {}
    for rec in records:
        groups.setdefault(_arm_key(rec, configs.get(rec.run_id)), []).append(rec)
    arms = [_Arm(key, members, configs) for key, members in groups.items()]
    by_algorithm: dict[str | None, list[_Arm]] = {}
    for arm in arms:
        by_algorithm.setdefault(arm.algorithm, []).append(arm)
    for same in by_algorithm.values():
        if len(same) < 2:
            continue
        keys = sorted(_override_keys([r for a in same for r in a.records]))
        for i, arm in enumerate(same, start=1):
            cfg = arm.config()
            shown = [
                f"{k}={_short(get_dotted(cfg, k))}"
                for k in keys
                if not k.startswith(_IGNORED_PREFIXES)
                and len({json.dumps(get_dotted(a.config(), k), default=str) for a in same}) > 1
            ]
            arm.label = f"{arm.label} ({', '.join(shown)})" if shown else f"{arm.label} #{i}"
    return arms


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:39] + "…"


def _summarise(arm: _Arm, head: Headline | None) -> ArmSummary:
    values = arm.values
    summary = ArmSummary(
        label=arm.label,
        algorithm=arm.algorithm,
        run_ids=[r.run_id for r in arm.records],
        seeds=[r.seed for r in arm.records],
        values=values,
        n_items=arm.n_items,
        recipe=arm.records[0].recipe,
        overrides=arm.overrides(),
        settings=arm.records[0].settings,
    )
    starts = [h.start_value for r in arm.records if (h := r.headline) and h.start_value is not None]
    summary.start_mean = sum(starts) / len(starts) if starts else None
    if not values:
        summary.basis = "no held-out value"
        return summary
    if len(values) >= 2:
        iv = mean_interval(values)
        summary.mean, summary.low, summary.high = iv.estimate, iv.low, iv.high
        summary.basis = f"t interval over {len(values)} seeds"
        pooled = pooled_share_interval(values, arm.n_items) if head and head.share else None
        if iv.low == iv.high and pooled is not None:
            # seeds that all score the same share (e.g. 0): no spread, so the t interval is a
            # point; the pooled items' Wilson interval keeps the sampling noise
            summary.low, summary.high = pooled.low, pooled.high
            summary.basis += f" (no spread: Wilson on the {len(values)}×{arm.n_items} items)"
        return summary
    summary.mean = values[0]
    n = arm.n_items
    if head is not None and head.share and n is not None and 0 <= values[0] <= 1:
        iv = wilson_interval(values[0], n)
        summary.low, summary.high = iv.low, iv.high
        summary.basis = (
            f"single seed: Wilson 95% sampling noise on n={n} held-out items ({arm.n_source})"
        )
    else:
        summary.basis = "single seed: no noise estimate (sweep again with 3 seeds)"
    return summary


def _heldout_difference(a: _Arm, b: _Arm, keys: Sequence[str]) -> str | None:
    ca, cb = a.config(), b.config()
    if ca is None or cb is None:
        return None
    for key in keys:
        va, vb = get_dotted(ca, key), get_dotted(cb, key)
        if json.dumps(va, sort_keys=True, default=str) != json.dumps(
            vb, sort_keys=True, default=str
        ):
            return f"held-out set differs: {key} {_short(va)} vs {_short(vb)}"
    return None


def _is_knob(key: str, knobs: Sequence[str]) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in knobs)


def _setting_difference(a: _Arm, b: _Arm, knobs: Sequence[str]) -> str | None:
    """The first overridden setting (not seed, not the algorithms' own knobs) whose value differs
    between two arms of different algorithms; None when they are matched."""
    if a.algorithm == b.algorithm:
        return None  # one algorithm: the arms differ in exactly what is being compared
    ca, cb = a.config(), b.config()
    for key in sorted(_override_keys(a.records + b.records)):
        if key.startswith(_IGNORED_PREFIXES) or _is_knob(key, knobs):
            continue
        if ca is not None and cb is not None:
            va, vb = get_dotted(ca, key), get_dotted(cb, key)
        else:
            va = next((o for o in a.overrides() if o.split("=", 1)[0] == key), None)
            vb = next((o for o in b.overrides() if o.split("=", 1)[0] == key), None)
        if json.dumps(va, sort_keys=True, default=str) != json.dumps(
            vb, sort_keys=True, default=str
        ):
            return f"not matched: {key} is {_short(va)} vs {_short(vb)}"
    return None


def verdict_between(
    a: ArmSummary,
    b: ArmSummary,
    *,
    higher_is_better: bool,
    share: bool,
    same_family: bool = True,
    same_metric: bool = True,
    mismatch: str | None = None,
) -> VerdictModel:
    """The verdict of arm ``a`` against arm ``b`` on their headline values by
    :data:`~rlhf_lab.results.stats.VERDICT_RULE` (pure: takes the arms' values and what is known about
    their matching)."""

    def verdict(word: str, reason: str = "", iv: Interval | None = None, method: str = ""):
        return VerdictModel(
            a=a.label,
            b=b.label,
            verdict=word,
            difference=None if iv is None else iv.estimate,
            low=None if iv is None else iv.low,
            high=None if iv is None else iv.high,
            method=method,
            reason=reason,
        )

    if not same_family:
        return verdict("not comparable", "different families")
    if not same_metric:
        return verdict("not comparable", "different headline metrics")
    if mismatch:
        return verdict("not comparable", mismatch)
    if not a.values or not b.values:
        missing = a.label if not a.values else b.label
        return verdict("undecided", f"{missing} has no held-out value")
    na, nb = a.n_items, b.n_items
    no_spread = False
    if len(a.values) >= 2 and len(b.values) >= 2:
        iv = welch_difference(a.values, b.values)
        no_spread = iv.low == iv.high  # every seed of both arms the same: a point, not noise
        if not (no_spread and share and na and nb):
            method = f"Welch 95% over {len(a.values)} and {len(b.values)} seeds"
            return verdict(verdict_of(iv, higher_is_better), "", iv, method)
    if share and na and nb and all(0 <= v <= 1 for v in a.values + b.values):
        ka, kb = len(a.values), len(b.values)
        pa, pb = sum(a.values) / ka, sum(b.values) / kb
        iv = newcombe_difference(pa, na * ka, pb, nb * kb)
        method = f"Newcombe 95% for two proportions on n={na * ka} and {nb * kb} held-out items"
        reason = (
            "no spread over seeds in either arm: sampling noise of the pooled held-out items"
            if no_spread
            else "single seed: sampling noise of the held-out items only"
            if ka == kb == 1
            else "one arm has a single seed: sampling noise only, seed noise not measured"
        )
        return verdict(verdict_of(iv, higher_is_better), reason, iv, method)
    return verdict(
        "undecided", "single seed and no noise estimate for this metric: sweep again with 3 seeds"
    )


def _pairs(family: str, arms: list[ArmSummary], higher_is_better: bool) -> list[tuple[int, int]]:
    """Which arms are compared: rejection sampling pairs each reward-selected strategy with its
    matched random control; otherwise the leading arm (best mean) against each other arm."""
    if family == "rejection_sampling":
        by_strategy = {_norm_strategy(a.algorithm): i for i, a in enumerate(arms)}
        out = []
        for i, arm in enumerate(arms):
            control = RS_PAIRS.get(_norm_strategy(arm.algorithm) or "")
            if control in by_strategy:
                out.append((i, by_strategy[control]))
        return out
    ranked = sorted(
        range(len(arms)),
        key=lambda i: (
            arms[i].mean is None,
            -(arms[i].mean or 0.0) if higher_is_better else (arms[i].mean or 0.0),
        ),
    )
    return [(ranked[0], j) for j in ranked[1:]]


def _arms_and_verdicts(
    family: str, records: list[RunRecord]
) -> tuple[Headline | None, list[ArmSummary], list[VerdictModel]]:
    configs = {r.run_id: _rs_config(r) or None for r in records}
    arms = _group_arms(records, configs)
    # one headline for all (else the family's, and the verdicts say "not comparable")
    heads = {r.headline.metric for r in records if r.headline is not None}
    head = headline_for(family, records[0].algorithm if len(heads) == 1 else None)
    if len(heads) == 1 and head is not None and head.metric not in heads:
        # the runs' own headline (e.g. the gold reward of runs optimising a reward model)
        first = records[0]
        head = headline_for(
            family, first.algorithm, configs.get(first.run_id), read_metric_rows(first.run_id)
        )
    summaries = [_summarise(arm, head) for arm in arms]
    spec = family_spec(family) if family in FAMILY_NAMES else None
    higher = head.higher_is_better if head else True
    verdicts = []
    for i, j in _pairs(family, summaries, higher):
        a, b = arms[i], arms[j]
        mismatch = None
        if spec is not None:
            mismatch = _heldout_difference(a, b, spec.heldout_keys) or _setting_difference(
                a, b, spec.algorithm_knobs
            )
        verdicts.append(
            verdict_between(
                summaries[i],
                summaries[j],
                higher_is_better=higher,
                share=bool(head and head.share),
                same_metric=a.metric == b.metric,
                mismatch=mismatch,
            )
        )
    return head, summaries, verdicts


def _pm(value: float | None) -> str:
    return "—" if value is None else f"{value:+.3g}".replace("-", "−")


def _arms_markdown(
    head: Headline | None, arms: list[ArmSummary], verdicts: list[VerdictModel]
) -> str:
    metric = head.metric if head else "headline"
    lines = [
        f"**Result** — held-out headline `{metric}` ({head.label + ', ' if head else ''}"
        f"{head.direction_text if head else ''}), final value per run, by arm:",
        "",
    ]
    body = []
    for a in arms:
        interval = "—" if a.low is None else f"{_fmt_num(a.low)} – {_fmt_num(a.high)}"
        seeds = ", ".join("?" if s is None else str(s) for s in a.seeds)
        body.append(
            [
                _cell(a.label),
                str(len(a.run_ids)),
                _cell(seeds),
                _fmt_num(a.mean),
                interval,
                _fmt_num(a.start_mean),
                _cell(a.basis),
            ]
        )
    headers = ["arm", "runs", "seeds", f"mean {metric}", "95% interval", "at step 0", "basis"]
    lines.append(_md_table(headers, body))
    if verdicts:
        lines += ["", "Verdicts:", ""]
        for v in verdicts:
            text = f"- **{v.a} vs {v.b}: {v.verdict}**"
            if v.difference is not None:
                text += (
                    f" — Δ {metric} = {_pm(v.difference)} (95% {_pm(v.low)} … "
                    f"{_pm(v.high)}; {v.method})"
                )
                if v.low is not None and v.high is not None:
                    text += f"; differences within about ±{(v.high - v.low) / 2:.2g} are noise here"
            if v.reason:
                text += f". {v.reason[0].upper()}{v.reason[1:]}."
            lines.append(text)
    if arms and all(len(a.values) <= 1 for a in arms):
        lines += [
            "",
            "Single seed: every interval above is the sampling noise of the held-out items, not "
            "run-to-run noise; a sweep with 3 seeds per arm measures that.",
        ]
    lines += ["", f"_Rule: {VERDICT_RULE}_"]
    return "\n".join(lines)


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
    rules = _FAMILY_RULES.get(family)
    if rules is None:
        raise InvalidArgument(f"no comparison rules for family {family!r}")
    columns, rows = rules(records, notes, warnings)
    head, arms, verdicts = _arms_and_verdicts(family, records)
    if family == "policy_gradients" and head is not None and head.metric in columns:
        columns = [head.metric] + [c for c in columns if c != head.metric]  # the result first
    for rec in records:
        found = heldout_regression(
            family, rec.algorithm, read_metric_rows(rec.run_id), _rs_config(rec) or None
        )
        if found is not None:
            warnings.append(f"{rec.run_id}: {found.message}")
        if "noise_samples" in rec.flags:
            notes.append(f"{rec.run_id}: its samples are noise, not text (see its ledger row).")

    table = _render_table(family, columns, rows, head.metric if head else None)
    parts = [_arms_markdown(head, arms, verdicts), table]
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
        entry = ComparisonEntry(
            key=f"{family}:{','.join(sorted(ids))}",
            title=f"{family.replace('_', ' ')}: {len(ids)} run(s) ({algos})",
            family=family,
            run_ids=ids,
            markdown=markdown,
            headline=comparison.headline,
            higher_is_better=comparison.higher_is_better,
            arms=arms,
            verdicts=verdicts,
        )
        comparison.recorded_in = record_comparison(campaign, entry).id
        if family != "direct_alignment" or record_gold_answer(campaign, ids) is None:
            record_change_answer(campaign, family, head, arms)
    return comparison


def _evaluations(
    ids: list[str], records: list[RunRecord], notes: list[str], campaign: str | None
) -> Comparison:
    """compare_runs of evaluation jobs (rlhf_lab.evaluation.compare)."""
    columns, values, table = evaluation_comparison(records)
    rows = [_row(rec, v) for rec, v in zip(records, values, strict=True)]
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
        entry = ComparisonEntry(
            key=f"{EVAL_FAMILY}:{','.join(sorted(ids))}",
            title=f"evaluations: {len(ids)} job(s)",
            family=EVAL_FAMILY,
            run_ids=ids,
            markdown=markdown,
            headline=comparison.headline,
        )
        comparison.recorded_in = record_comparison(campaign, entry).id
        record_best_of_n_answer(campaign, ids)
    return comparison
