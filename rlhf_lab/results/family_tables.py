"""The family comparison tables: the columns each family is compared on (from its spec,
held-out headline first, training signal labelled as such), how each family's rows are read
from its runs (policy gradients: means over the last logged steps, the change of correctness,
reward contrast; rejection sampling: each reward-selected strategy beside its matched random
control), and the markdown table. Torch-free."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import Field

from rlhf_lab.ledger import (
    RunRecord,
    _cell,
    _code,
    _fmt_num,
    _Model,
    _one_line,
    find_run,
    load_yaml,
    read_metric_rows,
)
from rlhf_lab.ledger.metrics import TOOL_LEGEND, TOOL_METRICS
from rlhf_lab.paths import LabError
from rlhf_lab.planning.catalog import matched_controls
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.results.plots import as_float
from trainers.core.spec import family_spec


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


# a multi-turn run with a tool: its per-trajectory means (rlhf_lab.ledger.metrics.TOOL_METRICS),
# held out (final) and in the rollouts (last PG_WINDOW steps); shown only when a run logs them
PG_TOOL_EVAL_COLUMNS: tuple[str, ...] = ("eval/tools/called", "eval/tools/used_result")
PG_TOOL_COLUMNS: tuple[str, ...] = TOOL_METRICS


def _tool_values(rec: RunRecord, metric_rows: list[dict]) -> dict[str, float | None]:
    """A run's tool columns (None where it logs none: a single-turn run)."""
    values: dict[str, float | None] = {c: _final(rec, c) for c in PG_TOOL_EVAL_COLUMNS}
    for name in PG_TOOL_COLUMNS:
        series = _train_values(metric_rows, name)
        values[name] = _mean(series[-PG_WINDOW:]) if series else None
    return values


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


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
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


def norm_strategy(value: str | None) -> str | None:
    return None if value is None else value.strip().lower().replace("-", "_")


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
        values.update(_tool_values(rec, metric_rows))
        rows.append(table_row(rec, values))
    held_out = [
        c
        for c in (*PG_RM_EVAL_COLUMNS, *PG_EVAL_COLUMNS)
        if any(r.values.get(c) is not None for r in rows)
    ]
    if any(r.values.get("eval/avg_correctness_change") is not None for r in rows):
        held_out.append("eval/avg_correctness_change")
    rm = [c for c in PG_RM_COLUMNS if any(r.values.get(c) is not None for r in rows)]
    tools = [
        c
        for c in (*PG_TOOL_EVAL_COLUMNS, *PG_TOOL_COLUMNS)
        if any(r.values.get(c) is not None for r in rows)
    ]
    columns = held_out + list(PG_COLUMNS) + rm + tools
    if tools:
        notes.append(f"{TOOL_LEGEND} A run without a tool shows none.")
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
        row = table_row(rec, {c: _final(rec, c) for c in DA_COLUMNS})
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
        rows.append(table_row(rec, values))
        if all(v is None for v in values.values()):
            notes.append(f"{rec.run_id}: no held-out metrics logged yet.")
    columns = [c for c in RM_COLUMNS if any(r.values.get(c) is not None for r in rows)]
    notes.append(
        "Reward models are compared on held-out margins and correctness, never on training loss. "
        "A PRM's step accuracy means something only above the majority-label baseline."
    )
    return columns or list(RM_COLUMNS[:2]), rows


def _sft(records: list[RunRecord], notes: list[str]) -> _Rules:
    rows = [table_row(rec, {c: _final(rec, c) for c in SFT_COLUMNS}) for rec in records]
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


def recorded_config(rec: RunRecord) -> TrainerConfig | None:
    """A recorded run's config.yaml as the view, where the results code reads many runs'
    configs (None when it is missing, unreadable or empty)."""
    try:
        data = load_yaml(find_run(rec.run_id) / "config.yaml")
    except LabError:
        return None
    return TrainerConfig(rec.family or "", data) if data else None


def _rs_top_k(cfg: TrainerConfig | None) -> Any:
    if cfg is None:
        return None
    if cfg.has("selection.top_k"):
        return cfg.get("selection.top_k")
    return cfg.get("top_k")


def _rejection_sampling(records: list[RunRecord], notes: list[str], warnings: list[str]) -> _Rules:
    strategies = {r.run_id: norm_strategy(r.algorithm) for r in records}
    configs = {r.run_id: recorded_config(r) for r in records}
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
        row = table_row(rec, {"exact_match": scores[rec.run_id]})
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
        row = table_row(rec, {"exact_match": scores[rec.run_id]})
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
        rows = [table_row(rec, {c: _final(rec, c) for c in columns}) for rec in records]
        notes.append(
            family_spec(family).comparison[:1].upper() + family_spec(family).comparison[1:]
        )
        return columns, rows

    return rule


# One comparison rule per family (each family's spec states the rule in words).
FAMILY_RULES: dict[str, _FamilyRule] = {
    "policy_gradients": lambda records, notes, warnings: _policy_gradients(records, notes),
    "direct_alignment": lambda records, notes, warnings: _direct_alignment(records, notes),
    "reward_models": lambda records, notes, warnings: _reward_models(records, notes),
    "sft": lambda records, notes, warnings: _sft(records, notes),
    "rejection_sampling": _rejection_sampling,
    "distillation": _spec_columns("distillation"),
}


def table_row(rec: RunRecord, values: dict[str, float | None]) -> ComparisonRow:
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


def render_table(
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
        return md_table(headers, body)
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
    return md_table(headers, body)


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
