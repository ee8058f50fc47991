"""The campaign's Next section: follow-ups the lab derives from what it recorded, each with the
exact command to run. Pure functions of the ledger's data (no file is read). Torch-free.

Rules (stated in docs/architecture.md and printed under the block):

- a comparison verdict "tie within noise" or "undecided" -> more seeds for those arms
  (``sweep a,b --seeds K --base-seed <next unused seed>``: fresh seeds, K enough for 3 per arm,
  or double what it has);
- a clear winner (better than every other arm) -> a finer learning-rate sweep around it
  (×0.5 and ×2 of its learning rate, same seeds count);
- arms that are not matched -> the same arms again with one set of settings;
- a run whose held-out headline regressed -> fewer steps (stop at its best held-out step) or a
  stronger KL / reference anchor where the family has one (the family's ``kl_key``, doubled);
- a run that overoptimised its reward model (proxy up, gold down:
  :func:`rlhf_lab.results.overoptimisation.overoptimisation`) -> stop where the gold reward peaked (the family's
  steps key) or a tighter KL leash (its ``kl_key`` doubled, 0.04 when it was 0), the changes
  :func:`rlhf_lab.results.overoptimisation.overoptimisation_advice` gives the run's alert too (this item replaces
  the held-out regression one for the same run);
- every arm of a comparison regressed on its held-out headline from its starting model (most
  runs of each arm flagged ``heldout_regression``) -> the same sweep at a learning rate ten times
  lower (the common cause is the step size, not one algorithm; the per-run held-out items of
  those runs are folded into this one);
- a run whose key metric stayed flat -> a learning-rate sweep (×3 and ×10);
- a run whose samples are noise on the ``tiny`` preset -> warm-start it with SFT first: two
  commands, the SFT launch, then the run again from its final model (``model.name=run:<id>``,
  which queues it ``--after`` the SFT run), ``<sft-run-id>`` standing for the id the first
  command prints.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rlhf_lab.ledger.schema import ArmSummary, ComparisonEntry, RunRecord, _LedgerData
from rlhf_lab.results.divergence import divergence_advice
from rlhf_lab.results.overoptimisation import overoptimisation_advice
from trainers.core.spec import FAMILY_NAMES, family_spec, spec_for

__all__ = [
    "WARM_START_ID",
    "NextItem",
    "deduplicated_items",
    "lower_lr_items",
    "next_items",
    "warm_start_commands",
    "without_folded",
]

LAB = ["uv", "run", "rlhf-lab"]
MIN_SEEDS = 3
WARM_START_RECIPE = "sft_tiny_warmstart"
WARM_START_ID = "<sft-run-id>"  # the id the warm start's launch prints


@dataclass
class NextItem:
    """One follow-up: why (what the lab saw), what to do, and the exact commands."""

    why: str
    action: str
    commands: list[str] = field(default_factory=list)
    kind: str = ""  # "heldout_regression" for the per-run item a comparison-level one can fold
    # the alternative of a divergence item that lowers the learning rate ten times (its command
    # and its part of ``action``): a comparison-level item that reruns the arm at a tenth of the
    # learning rate covers it, so :func:`without_folded` takes it out
    lower_lr_command: str = ""
    lower_lr_action: str = ""


def _overrides(items: Iterable[str]) -> dict[str, str]:
    """Ordered ``key -> "key=value"`` of override strings (the last one of a key wins)."""
    out: dict[str, str] = {}
    for item in items:
        key = str(item).split("=", 1)[0].strip()
        out[key] = str(item)
    return out


def _with(items: Iterable[str], **changes: Any) -> list[str]:
    """Override strings with ``changes`` (dotted keys given with ``__``) set, seed dropped."""
    table = _overrides(items)
    table.pop("seed", None)
    for dotted, value in changes.items():
        key = dotted.replace("__", ".")
        table[key] = f"{key}={_fmt(value)}"
    return list(table.values())


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _sets(items: Iterable[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def _sweep(recipes: list[str], items: list[str], campaign: str, **options: Any) -> str:
    args = [*LAB, "sweep", ",".join(recipes), "--no-shrink", *_sets(items)]
    for name, value in options.items():
        if value is not None:
            args += [f"--{name.replace('_', '-')}", str(value)]
    args += ["--campaign", campaign]
    return shlex.join(args)


def _advice_item(
    run, campaign: str, why: str, advice, fallback: str, lr_key: str | None = None
) -> NextItem:
    """One Next item from a list of setting changes (``key``, ``value``, ``override``, ``why``):
    the changes as the action, one launch command per change, ``fallback`` when there are none.
    ``lr_key``: the learning-rate key, whose change is marked as one a comparison may cover."""
    actions = [f"{a.override} ({a.why})" for a in advice]
    commands = [
        _launch(run.recipe, _with(run.overrides, **{a.key.replace(".", "__"): a.value}), campaign)
        for a in advice
    ]
    lowers = [i for i, a in enumerate(advice) if lr_key and a.key == lr_key]
    return NextItem(
        why=f"{run.run_id}: {why}",
        action=" or ".join(actions) or fallback,
        commands=commands,
        lower_lr_command=commands[lowers[0]] if lowers else "",
        lower_lr_action=actions[lowers[0]] if lowers else "",
    )


def _launch(recipe: str, items: list[str], campaign: str) -> str:
    return shlex.join([*LAB, "launch", recipe, *_sets(items), "--campaign", campaign])


def warm_start_commands(recipe: str, overrides: Iterable[str], campaign: str) -> list[str]:
    """The two commands of a warm-start follow-up: the SFT run, then ``recipe`` from its final
    model (``run:<id>`` implies ``--after`` it, so the second can be issued at once)."""
    first = shlex.join([*LAB, "launch", WARM_START_RECIPE, "--campaign", campaign])
    then = _with(overrides, model__name=f"run:{WARM_START_ID}")
    return [first, _launch(recipe, then, campaign)]


def _setting(run: RunRecord, key: str | None) -> Any:
    return None if key is None else run.settings.get(key)


def _family(run_or_family: RunRecord | str | None):
    name = run_or_family.family if isinstance(run_or_family, RunRecord) else run_or_family
    return family_spec(name) if name in FAMILY_NAMES else None


def _seed_plan(arms: list[ArmSummary], runs: list[RunRecord]) -> tuple[int, int]:
    """(seeds to add per arm, first unused seed) for a tie: enough for MIN_SEEDS per arm, or
    double the most any arm has."""
    have = max((len(a.run_ids) for a in arms), default=1)
    target = max(MIN_SEEDS, 2 * have) if have >= MIN_SEEDS else MIN_SEEDS
    used = [s for r in runs if isinstance(s := r.seed, int)]
    used += [s for a in arms for s in a.seeds if isinstance(s, int)]
    return target - have, (max(used) + 1 if used else 0)


def _arm_commands(
    arms: list[ArmSummary], campaign: str, changes: dict[str, Any], **options: Any
) -> list[str]:
    """One sweep of the arms when they share their settings, else one sweep per arm."""
    recipes = [a.recipe for a in arms]
    if any(r is None for r in recipes):
        return []
    sets = [_with(a.overrides, **changes) for a in arms]
    if all(s == sets[0] for s in sets):
        return [_sweep(list(dict.fromkeys(recipes)), sets[0], campaign, **options)]
    return [_sweep([r], s, campaign, **options) for r, s in zip(recipes, sets, strict=True)]


def _comparison_items(entry: ComparisonEntry, runs: list[RunRecord], campaign: str):
    arms = {a.label: a for a in entry.arms}
    metric = entry.headline or "the headline"
    undecided = [v for v in entry.verdicts if v.verdict in ("tie within noise", "undecided")]
    if undecided:
        involved = list(dict.fromkeys(x for v in undecided for x in (v.a, v.b)))
        chosen = [arms[name] for name in involved if name in arms]
        add, base = _seed_plan(chosen, runs)
        pairs = "; ".join(f"{v.a} vs {v.b}: {v.verdict}" for v in undecided)
        yield NextItem(
            why=f"{pairs} on {metric}",
            action=f"add {add} seed(s) per arm (fresh seeds from {base}) so the interval can "
            "separate them",
            commands=_arm_commands(chosen, campaign, {}, seeds=add, base_seed=base),
        )
    unmatched = [v for v in entry.verdicts if v.verdict == "not comparable"]
    if unmatched:
        involved = list(dict.fromkeys(x for v in unmatched for x in (v.a, v.b)))
        chosen = [arms[name] for name in involved if name in arms]
        if chosen and all(a.recipe for a in chosen):
            shared = _with(chosen[0].overrides)
            yield NextItem(
                why="; ".join(f"{v.a} vs {v.b}: not comparable ({v.reason})" for v in unmatched),
                action="run the arms again with one set of settings (the first arm's)",
                commands=[
                    _sweep(
                        list(dict.fromkeys(a.recipe for a in chosen if a.recipe)),
                        shared,
                        campaign,
                        seeds=max(1, len(chosen[0].run_ids)),
                    )
                ],
            )
    decided = [v for v in entry.verdicts if v.verdict in ("better", "worse")]
    if decided and len(decided) == len(entry.verdicts):
        winners = {v.a if v.verdict == "better" else v.b for v in decided}
        if len(winners) == 1:
            winner = arms.get(next(iter(winners)))
            spec = _family(entry.family)
            lr = _winner_lr(winner, spec)
            if winner is not None and winner.recipe and spec is not None and lr is not None:
                scaled, commands = _lr_sweep(
                    winner,
                    campaign,
                    spec.learning_rate_key,
                    lr,
                    (0.5, 2.0),
                    max(1, len(winner.run_ids)),
                )
                yield NextItem(
                    why=f"{winner.label} beats every other arm on {metric} beyond the noise",
                    action=f"a finer sweep around it: {scaled}",
                    commands=commands,
                )


def _lr_sweep(
    arm: ArmSummary | RunRecord,
    campaign: str,
    key: str,
    lr: float,
    factors: tuple[float, ...],
    seeds: int | None = None,
) -> tuple[str, list[str]]:
    """A sweep of the arm's (or run's) recipe at ``lr`` times each factor: what it changes
    (``key ×a and ×b (now lr)``) and its commands, one a factor."""
    scaled = " and ".join(f"×{_fmt(f)}" for f in factors)
    commands = [
        _sweep(
            [arm.recipe],
            _with(arm.overrides, **{key.replace(".", "__"): lr * f}),
            campaign,
            seeds=seeds,
        )
        for f in factors
    ]
    return f"{key} {scaled} (now {_fmt(lr)})", commands


LOWER_LR_FACTOR = 0.1


def _arm_regressed(arm: ArmSummary, regressed: set[str]) -> bool:
    """Most of the arm's runs fell on their held-out headline from the start."""
    fell = [i for i in arm.run_ids if i in regressed]
    return bool(arm.run_ids) and 2 * len(fell) > len(arm.run_ids)


def lower_lr_items(
    comparisons: list[ComparisonEntry], regressed: set[str], campaign: str
) -> tuple[list[NextItem], set[str]]:
    """(the lower-learning-rate items of the comparisons whose every arm regressed, the ids of
    the runs they cover). ``regressed``: ids of the runs flagged ``heldout_regression``."""
    items, folded = [], set()
    for entry in comparisons:
        item = _all_regressed_item(entry, regressed, campaign)
        if item is not None:
            items.append(item)
            folded.update(i for a in entry.arms for i in a.run_ids)
    return items, folded


def without_folded(items: list[NextItem], run_id: str, folded: set[str]) -> list[NextItem]:
    """A run's items when a comparison-level item covers the run: without its held-out
    regression item, and without the lower-learning-rate alternative of its other items."""
    if run_id not in folded:
        return items
    return [_without_lower_lr(i) for i in items if i.kind != "heldout_regression"]


def _without_lower_lr(item: NextItem) -> NextItem:
    """The item without its lower-learning-rate alternative (the comparison's item reruns the
    arm at a tenth of the learning rate: the same run, which the lab would refuse as identical
    while the first is queued)."""
    if not item.lower_lr_command or item.lower_lr_command not in item.commands:
        return item
    rest = [a for a in item.action.split(" or ") if a != item.lower_lr_action]
    return NextItem(
        why=item.why,
        action=" or ".join(rest) or item.action,
        commands=[c for c in item.commands if c != item.lower_lr_command],
        kind=item.kind,
    )


def _all_regressed_item(entry: ComparisonEntry, regressed: set[str], campaign: str):
    """Every arm regressed: the same arms (same seeds) at a learning rate ten times lower."""
    spec = _family(entry.family)
    arms = entry.arms
    if spec is None or len(arms) < 2 or not all(_arm_regressed(a, regressed) for a in arms):
        return None
    key = spec.learning_rate_key
    lrs = [_winner_lr(a, spec) for a in arms]
    if any(lr is None for a, lr in zip(arms, lrs, strict=True)) or any(not a.recipe for a in arms):
        return None
    seeds = max(1, max(len(a.run_ids) for a in arms))
    known = [s for a in arms for s in a.seeds if isinstance(s, int)]
    base = min(known) if known else None
    commands = []
    for lr in dict.fromkeys(lrs):
        group = [a for a, x in zip(arms, lrs, strict=True) if x == lr]
        change = {key.replace(".", "__"): float(lr) * LOWER_LR_FACTOR}
        commands += _arm_commands(group, campaign, change, seeds=seeds, base_seed=base)
    now = ", ".join(_fmt(float(x)) for x in dict.fromkeys(lrs))
    return NextItem(
        why=f"every arm ({', '.join(a.label for a in arms)}) regressed on held-out "
        f"{entry.headline or 'the headline'} from its starting model",
        action=f"the same arms and seeds at a learning rate ten times lower ({key} now {now}): "
        "when every algorithm falls, the step size is the common cause",
        commands=commands,
    )


def _winner_lr(arm: ArmSummary | None, spec) -> float | None:  # noqa: ANN001
    if arm is None or spec is None:
        return None
    value = arm.settings.get(spec.learning_rate_key)
    return float(value) if isinstance(value, int | float) and value > 0 else None


def _run_items(run: RunRecord, campaign: str):
    spec = _family(run)
    if spec is None or run.recipe is None:
        return
    if "heldout_regression" in run.flags and "overoptimisation" not in run.flags:
        # (overoptimisation is the sharper reading of the same fall: its item below)
        commands = []
        metric = run.headline.metric if run.headline else "the headline"
        best = run.metric(metric)
        stop_at = best.best_step if best is not None and best.best_step else None
        where = "its best held-out step"
        if not stop_at and run.steps:
            stop_at, where = max(1, run.steps // 2), "half its steps"
        if stop_at:
            commands.append(
                _launch(
                    run.recipe,
                    _with(run.overrides, **{spec.steps_key.replace(".", "__"): stop_at}),
                    campaign,
                )
            )
        kl_note = ""
        algo = _algorithm(run)
        if spec.kl_key and (algo is None or algo.kl != "none"):
            current = _setting(run, spec.kl_key)
            stronger = 2 * float(current) if isinstance(current, int | float) and current else 0.04
            commands.append(
                _launch(
                    run.recipe,
                    _with(run.overrides, **{spec.kl_key.replace(".", "__"): stronger}),
                    campaign,
                )
            )
            kl_note = f", or a stronger KL ({spec.kl_key}={_fmt(stronger)})"
        yield NextItem(
            why=f"{run.run_id}: held-out {metric} regressed while training went on",
            action=f"fewer steps ({spec.steps_key}={stop_at}, {where}){kl_note}",
            commands=commands,
            kind="heldout_regression",
        )
    if "overoptimisation" in run.flags:
        advice = overoptimisation_advice(
            run.family,
            run.algorithm,
            _setting(run, spec.kl_key),
            run.gold_peak_step,
            run.steps,
        )
        yield _advice_item(
            run,
            campaign,
            "its proxy reward kept rising while the gold reward fell "
            "(overoptimisation of the reward model)",
            advice,
            "stop earlier or tighten the KL leash",
        )
    diverged = [f for f in ("kl_blowup", "repetition") if f in run.flags]
    if diverged:
        advice = divergence_advice(run.family, run.algorithm, run.settings.get)
        what = " and ".join(
            "its KL to the reference blew up" if f == "kl_blowup" else "its samples degenerated"
            for f in diverged
        )
        yield _advice_item(
            run,
            campaign,
            f"{what} (the policy diverged)",
            advice,
            "a lower learning rate or a tighter KL leash",
            lr_key=spec.learning_rate_key,
        )
    if "flat" in run.flags:
        lr = _setting(run, spec.learning_rate_key)
        if isinstance(lr, int | float) and lr > 0:
            scaled, commands = _lr_sweep(
                run, campaign, spec.learning_rate_key, float(lr), (3.0, 10.0)
            )
            yield NextItem(
                why=f"{run.run_id}: its key metric stayed flat",
                action=f"a learning-rate sweep: {scaled}",
                commands=commands,
            )
    if "noise_samples" in run.flags and run.model == "tiny" and run.family != "sft":
        yield NextItem(
            why=f"{run.run_id}: its samples are noise (the tiny preset starts from random weights)",
            action="warm-start with SFT first, then launch the run again from its final model "
            f"(model.name=run:{WARM_START_ID} queues it until the SFT run succeeds; put in the "
            "id the first command prints)",
            commands=warm_start_commands(run.recipe, run.overrides, campaign),
        )


def _algorithm(run: RunRecord):
    try:
        return spec_for(run.algorithm) if run.algorithm else None
    except KeyError:
        return None


def next_items(data: _LedgerData) -> list[NextItem]:
    """The follow-ups for a campaign, comparisons first, then per-run findings (duplicates of
    the same command dropped)."""
    campaign = data.campaign.id
    regressed = {r.run_id for r in data.runs if "heldout_regression" in r.flags}
    items, folded = lower_lr_items(data.comparisons, regressed, campaign)
    for entry in data.comparisons:
        items += list(_comparison_items(entry, data.runs, campaign))
    for run in data.runs:
        items += without_folded(list(_run_items(run, campaign)), run.run_id, folded)
    return deduplicated_items(items)


def deduplicated_items(items: list[NextItem]) -> list[NextItem]:
    """The items in order, each command kept only where it first appears (an item left with
    no command of the several it had is dropped)."""
    seen: set[str] = set()
    out = []
    for item in items:
        fresh = [c for c in item.commands if c not in seen]
        seen.update(fresh)
        if fresh or not item.commands:
            item.commands = fresh
            out.append(item)
    return out
