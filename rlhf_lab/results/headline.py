"""Held-out first: each run's headline metric (the held-out number its family is judged on, from
the family's spec), the training-time metric that mirrors it (the secondary "training signal"),
how many held-out items the headline was measured on, and the run's value and noise. Status,
comparison, ledger and diagnosis read the headline through here. Torch-free.

Runs rewarded by a learned reward model (a policy-gradient run with ``reward.model`` set, or
whose rows log ``proxy_reward``) are judged on the gold signal when there is one: the headline
is ``eval/gold_reward`` (a verifier, or a held-out gold reward model the policy is not optimised
against) when it is logged or expected, else the spec's own headline when the rows log it, else
``eval/proxy_reward`` (the optimised model's own score, labelled "judged by its own reward model
(proxy)"). A spec headline that the rows do not log while they log other held-out numbers falls
back the same way (then to the held-out twins of the family's rising key metrics).

Structurally constant headlines are passed over, for every run (not only those rewarded by a
model): a candidate that is 0 at every one of two or more evaluations (verifier correctness of a
model that cannot yet solve the task, e.g. on ``tiny``) carries no signal, so the next candidate
that moved is the headline; when none moved, the first logged one stays. :func:`headline_for`
applies this when given the run's config and rows; without them it returns the spec's headline.
Status, compare, the ledger and the run index all pass the run's eval rows, so they agree.

Every headline is shown beside its value at the start (:func:`start_value`: the step-0
evaluation, or the first one when the run has no step-0 evaluation).

The trainers do not log how many held-out items an evaluation used (rejection sampling logs
``eval/num_prompts``): the count comes from that metric when present, else from the family's
eval-size config key (``data.eval_size``, ``data.max_test_samples``) in the run's config.yaml.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rlhf_lab.planning.catalog import metric_direction
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.results.stats import Interval, wilson_interval
from trainers.core.spec import FAMILY_NAMES, FamilySpec, family_spec

__all__ = [
    "GOLD_HEADLINE",
    "PROXY_HEADLINE",
    "PROXY_LABEL",
    "Headline",
    "ItemCount",
    "headline_for",
    "headline_line",
    "heldout_items",
    "last_value",
    "rewarded_by_model",
    "start_text",
    "start_value",
]

# metrics a trainer may log with the number of held-out items of an evaluation
COUNT_METRICS = ("eval/num_prompts", "eval/num_examples", "eval/n")
# The RLHF contract of the policy-gradient trainer (held-out twins of the rollout metrics).
GOLD_HEADLINE = "eval/gold_reward"
PROXY_HEADLINE = "eval/proxy_reward"
PROXY_LABEL = "judged by its own reward model (proxy)"
_RM_ROW_KEYS = ("proxy_reward", PROXY_HEADLINE)


@dataclass(frozen=True)
class Headline:
    """What a run of ``family`` / ``algorithm`` is judged on."""

    family: str
    metric: str
    label: str
    higher_is_better: bool
    share: bool
    training_signal: str | None
    training_higher_is_better: bool | None

    @property
    def direction_text(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"


@dataclass(frozen=True)
class ItemCount:
    """How many held-out items a headline was measured on, and where that number came from."""

    n: int | None
    source: str


def _spec(family: str | None) -> FamilySpec | None:
    return family_spec(family) if family in FAMILY_NAMES else None


def _spec_headline(spec: FamilySpec, algorithm: str | None) -> Headline:
    metric = spec.headline_for(algorithm)
    direction = metric_direction(metric, spec.name)
    signal = spec.training_signal_for(algorithm)
    signal_direction = metric_direction(signal, spec.name) if signal else None
    return Headline(
        family=spec.name,
        metric=metric,
        label=spec.headline_label or f"held-out {metric}",
        higher_is_better=direction != "min",
        share=spec.headline_is_share,
        training_signal=signal,
        training_higher_is_better=None if signal_direction is None else signal_direction == "max",
    )


def rewarded_by_model(config: TrainerConfig | None, rows: Sequence[dict] = ()) -> bool:
    """Whether a run optimises a learned reward model: ``reward.model`` in its config, or rows
    that log the proxy reward."""
    if config is not None and config.get("reward.model"):
        return True
    return any(key in row for row in rows for key in _RM_ROW_KEYS)


def _verifier_prompts(config: TrainerConfig | None) -> bool | None:
    """Whether the run's prompts come with a verifier (reasoning-gym); None when unknown."""
    if config is None:
        return None
    return config.get("data.source") in (None, "reasoning_gym")


def _gold_expected(config: TrainerConfig | None) -> bool | None:
    """Whether the run has a gold signal (a gold reward model, or verifier prompts)."""
    if config is None:
        return None
    return bool(config.get("reward.gold_model")) or bool(_verifier_prompts(config))


def _logged(rows: Sequence[dict], name: str) -> bool:
    """Whether some row holds a finite value of ``name``."""
    return any((v := _as_float(row.get(name))) is not None and math.isfinite(v) for row in rows)


def _zero_throughout(rows: Sequence[dict], name: str) -> bool:
    """Whether ``name`` is 0 in every row that logs it, over at least two evaluations: a
    signal that never moved off zero says nothing about the run (the task is out of the
    model's reach), so the headline falls back past it."""
    values = [v for row in rows if (v := _as_float(row.get(name))) is not None]
    return len(values) >= 2 and all(v == 0 for v in values)


def _rising_twins(spec: FamilySpec) -> list[str]:
    """The held-out twins of the family's key metrics that should rise, in the spec's order."""
    return [
        f"eval/{m.name}"
        for m in spec.key_metrics
        if m.key and m.higher_is_better and not m.name.startswith("eval/")
    ]


def _reward_headline(spec: FamilySpec, metric: str, config: TrainerConfig | None) -> Headline:
    """The headline for the gold or proxy reward (or a fallback metric) of ``spec``'s run."""
    if metric == GOLD_HEADLINE:
        # a verifier's score on held-out prompts is a share of them; a gold model's is not
        share = not (config is not None and config.get("reward.gold_model")) and bool(
            _verifier_prompts(config)
        )
        label = "held-out gold reward (a judge the policy is not optimised against)"
    elif metric == PROXY_HEADLINE:
        share = False
        label = (
            f"held-out reward {PROXY_LABEL}: the score the policy was trained to raise, not an "
            "independent judge"
        )
    else:
        share = spec.headline_is_share
        label = f"held-out {metric}"
    direction = metric_direction(metric, spec.name)
    signal = metric.removeprefix("eval/")
    signal_direction = metric_direction(signal, spec.name)
    return Headline(
        family=spec.name,
        metric=metric,
        label=label,
        higher_is_better=direction != "min",
        share=share,
        training_signal=signal,
        training_higher_is_better=signal_direction != "min",
    )


def _resolve(
    spec: FamilySpec, metric: str, config: TrainerConfig | None, rows: Sequence[dict]
) -> str:
    """The rule of the module docstring: which held-out metric a run is judged on."""
    rm = rewarded_by_model(config, rows)
    if rm:
        order = [GOLD_HEADLINE, metric, PROXY_HEADLINE]
    else:
        order = [metric, GOLD_HEADLINE, PROXY_HEADLINE]
    order = list(dict.fromkeys(order + _rising_twins(spec)))
    logged = [name for name in order if _logged(rows, name)]
    moved = [name for name in logged if not _zero_throughout(rows, name)]
    if moved:
        return moved[0]
    if logged:
        return logged[0]
    if not rm and metric not in (GOLD_HEADLINE, PROXY_HEADLINE):
        return metric
    # nothing logged yet: the first one the config says will be
    gold, verifier = _gold_expected(config), _verifier_prompts(config)
    for name in order:
        if name == GOLD_HEADLINE and gold is False:
            continue
        if name == metric and rm and verifier is False and metric != PROXY_HEADLINE:
            continue  # e.g. correctness on preference prompts that have no verifier
        return name
    return order[0]


def headline_for(
    family: str | None,
    algorithm: str | None = None,
    config: TrainerConfig | None = None,
    rows: Sequence[dict] = (),
) -> Headline | None:
    """The headline of a run of ``family`` (and ``algorithm``); None for an unknown family.
    With the run's ``config`` and metrics ``rows``: the run's own headline by the rule of the
    module docstring (the gold reward for a run rewarded by a learned model)."""
    spec = _spec(family)
    if spec is None:
        return None
    head = _spec_headline(spec, algorithm)
    if config is None and not rows:
        return head
    metric = _resolve(spec, head.metric, config, rows)
    return head if metric == head.metric else _reward_headline(spec, metric, config)


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def heldout_items(
    family: str | None, config: TrainerConfig | None, rows: Sequence[dict] = ()
) -> ItemCount:
    """The number of held-out items behind the headline: a count metric the trainer logged, else
    the family's eval-size key in the run's config."""
    for row in reversed(rows):
        for name in COUNT_METRICS:
            value = _as_float(row.get(name))
            if value is not None and value >= 1 and value.is_integer():
                return ItemCount(int(value), f"{name} logged")
    spec = _spec(family)
    if spec is not None and config is not None:
        for key in spec.eval_size_keys:
            value = config.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return ItemCount(value, f"{key} in its config; the trainer logs no count")
    return ItemCount(None, "unknown (no eval size in the config)")


def last_value(rows: Sequence[dict], name: str, phase: Literal["eval", "train"] | None = None):
    """(step, value) of the last finite value of ``name`` in metrics rows (``phase="train"``
    skips eval rows), or None."""
    for row in reversed(rows):
        if phase == "train" and row.get("phase") == "eval":
            continue
        value = _as_float(row.get(name))
        if value is not None and math.isfinite(value):
            return row.get("step"), value
    return None


def start_value(rows: Sequence[dict], name: str) -> tuple[Any, float] | None:
    """(step, value) of the first finite value of ``name`` in metrics rows: the step-0
    evaluation of the headline when the run made one (else its first evaluation), or None."""
    for row in rows:
        value = _as_float(row.get(name))
        if value is not None and math.isfinite(value):
            return row.get("step"), value
    return None


def start_text(start: tuple[Any, float] | None, final_step: Any = None) -> str | None:
    """``step 0: 0.05`` (``first eval, step 20: 0.05`` when no step-0 evaluation was made);
    None without a start value or when the start is the shown value itself."""
    if start is None:
        return None
    step, value = start
    if final_step is not None and step == final_step:
        return None
    where = "step 0" if step in (0, None) else f"first eval, step {step}"
    return f"{where}: {_num(value)}"


def noise_interval(headline: Headline, value: float, n: int | None) -> Interval | None:
    """The sampling noise of one run's headline: the Wilson 95 % interval of an accuracy on n
    held-out items (None for a loss or an unknown n)."""
    if not headline.share or n is None or not 0.0 <= value <= 1.0:
        return None
    return wilson_interval(value, n)


def _num(value: float) -> str:
    return f"{value:.4g}"


def headline_line(
    family: str | None,
    algorithm: str | None,
    last_eval: dict,
    last_train: dict,
    config: TrainerConfig | None = None,
    rows: Sequence[dict] = (),
    eval_rows: Sequence[dict] = (),
) -> str | None:
    """One line for a run's status, held-out headline first with its step-0 value beside it,
    and the training signal labelled as such: ``held-out eval/accuracy 0.867 (step 40; 95%
    0.80–0.92 on n=128; step 0: 0.62) · training signal accuracy 0.95``. None for an unknown
    family. ``rows``: recent metrics rows (e.g. the rollout rows of a policy-gradient run) where
    the training signal is looked up when the last train row lacks it. ``eval_rows``: the run's
    evaluation rows from its start (the start value, and which candidate headline moved)."""
    head = headline_for(family, algorithm, config, [*eval_rows, last_eval, last_train, *rows])
    if head is None:
        return None
    value = _as_float(last_eval.get(head.metric))
    if value is None or not math.isfinite(value):
        text = f"held-out {head.metric}: not evaluated yet"
    else:
        text = f"held-out {head.metric} {_num(value)}"
        extra = []
        if last_eval.get("step") is not None:
            extra.append(f"step {last_eval['step']}")
        n = heldout_items(family, config, [last_eval]).n
        noise = noise_interval(head, value, n)
        if noise is not None:
            extra.append(f"95% {_num(noise.low)}–{_num(noise.high)} on n={n}")
        start = start_text(start_value([*eval_rows, last_eval], head.metric), last_eval.get("step"))
        if start is not None:
            extra.append(start)
        if extra:
            text += f" ({'; '.join(extra)})"
    if head.metric == PROXY_HEADLINE:
        text += f" [{PROXY_LABEL}]"
    signal = head.training_signal
    if signal is not None:
        train = _as_float(last_train.get(signal))
        if train is None:
            found = last_value(rows, signal, phase="train")
            train = found[1] if found else None
        if train is not None:
            text += f" · training signal {signal} {_num(train)}"
    return text
