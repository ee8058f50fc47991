"""Arms, intervals and verdicts of a comparison: runs that differ only in seed are one arm,
each arm gets its held-out mean with a 95 % interval, and each pair of arms a verdict by
:data:`rlhf_lab.results.stats.VERDICT_RULE` (better / worse / tie within noise / not comparable /
undecided), with the settings that tell them apart. Torch-free."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhf_lab.ledger import (
    ArmSummary,
    RunRecord,
    _cell,
    _fmt_num,
    read_metric_rows,
)
from rlhf_lab.ledger import Verdict as VerdictModel
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.results.family_tables import RS_PAIRS, md_table, norm_strategy, recorded_config
from rlhf_lab.results.headline import Headline, headline_for
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

# override keys that never make arms unmatched (where logs and checkpoints go, the device)
_IGNORED_PREFIXES = ("logging.", "checkpoint.", "model.device", "seed")


class _Arm:
    """Runs of one setting (internal; becomes an :class:`ArmSummary`)."""

    def __init__(
        self, key: tuple, records: list[RunRecord], configs: dict[str, TrainerConfig | None]
    ):
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

    def config(self) -> TrainerConfig | None:
        return next((c for r in self.records if (c := self.configs.get(r.run_id))), None)

    def overrides(self) -> list[str]:
        return [o for o in self.records[0].overrides if not o.startswith("seed=")]


def _override_keys(records: Sequence[RunRecord]) -> set[str]:
    return {o.split("=", 1)[0].strip() for r in records for o in r.overrides if "=" in o}


def _arm_key(rec: RunRecord, cfg: TrainerConfig | None) -> tuple:
    """Runs with equal keys form one arm: same algorithm and settings, any seed."""
    if rec.config_source:
        rest = tuple(sorted(o for o in rec.overrides if not o.startswith("seed=")))
        return (rec.algorithm, rec.config_source, rest)
    data = cfg.to_data() if cfg is not None else {}
    without_seed = {k: v for k, v in data.items() if k != "seed"}
    return (rec.algorithm, None, json.dumps(without_seed, sort_keys=True, default=str))


def _group_arms(records: list[RunRecord], configs: dict[str, TrainerConfig | None]) -> list[_Arm]:
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
        recipes = [_recipe_of(arm.records[0]) for arm in same]
        if None not in recipes and len(set(recipes)) == len(same):
            for arm, recipe in zip(same, recipes, strict=True):  # e.g. grpo_tools against grpo
                arm.label = recipe or arm.label
            continue
        keys = sorted(_override_keys([r for a in same for r in a.records]))
        for i, arm in enumerate(same, start=1):
            cfg = arm.config()
            shown = [
                f"{k}={_short(_value(cfg, k))}"
                for k in keys
                if not k.startswith(_IGNORED_PREFIXES)
                and len({json.dumps(_value(a.config(), k), default=str) for a in same}) > 1
            ]
            arm.label = f"{arm.label} ({', '.join(shown)})" if shown else f"{arm.label} #{i}"
    return arms


def _value(cfg: TrainerConfig | None, key: str) -> Any:
    return cfg.get(key) if cfg is not None else None


def _recipe_of(rec: RunRecord) -> str | None:
    """The shipped recipe a run started from (its config file's name), when it names one."""
    return Path(rec.config_source).stem if rec.config_source else None


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
        va, vb = ca.get(key), cb.get(key)
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
            va, vb = ca.get(key), cb.get(key)
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
        by_strategy = {norm_strategy(a.algorithm): i for i, a in enumerate(arms)}
        out = []
        for i, arm in enumerate(arms):
            control = RS_PAIRS.get(norm_strategy(arm.algorithm) or "")
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


def arms_and_verdicts(
    family: str, records: list[RunRecord]
) -> tuple[Headline | None, list[ArmSummary], list[VerdictModel]]:
    configs = {r.run_id: recorded_config(r) for r in records}
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


def arms_markdown(
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
    lines.append(md_table(headers, body))
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
