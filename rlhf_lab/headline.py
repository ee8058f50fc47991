"""Held-out first: each run's headline metric (the held-out number its family is judged on, from
the family's spec), the training-time metric that mirrors it (the secondary "training signal"),
how many held-out items the headline was measured on, and the run's value and noise. Status,
comparison, ledger and diagnosis read the headline through here. Torch-free.

The trainers do not log how many held-out items an evaluation used (rejection sampling logs
``eval/num_prompts``): the count comes from that metric when present, else from the family's
eval-size config key (``data.eval_size``, ``data.max_test_samples``) in the run's config.yaml.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlhf_lab.catalog import get_dotted, metric_direction
from rlhf_lab.stats import Interval, wilson_interval
from trainers.core.spec import FAMILY_NAMES, FamilySpec, family_spec

__all__ = [
    "Headline",
    "ItemCount",
    "headline_for",
    "headline_line",
    "heldout_items",
    "last_value",
    "read_run_config",
]

# metrics a trainer may log with the number of held-out items of an evaluation
COUNT_METRICS = ("eval/num_prompts", "eval/num_examples", "eval/n")


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


def headline_for(family: str | None, algorithm: str | None = None) -> Headline | None:
    """The headline of a run of ``family`` (and ``algorithm``); None for an unknown family."""
    spec = _spec(family)
    if spec is None:
        return None
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


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def heldout_items(family: str | None, config: dict | None, rows: Sequence[dict] = ()) -> ItemCount:
    """The number of held-out items behind the headline: a count metric the trainer logged, else
    the family's eval-size key in the run's config."""
    for row in reversed(rows):
        for name in COUNT_METRICS:
            value = _as_float(row.get(name))
            if value is not None and value >= 1 and value.is_integer():
                return ItemCount(int(value), f"{name} logged")
    spec = _spec(family)
    if spec is not None and isinstance(config, dict):
        for key in spec.eval_size_keys:
            value = get_dotted(config, key)
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


def noise_interval(headline: Headline, value: float, n: int | None) -> Interval | None:
    """The sampling noise of one run's headline: the Wilson 95 % interval of an accuracy on n
    held-out items (None for a loss or an unknown n)."""
    if not headline.share or n is None or not 0.0 <= value <= 1.0:
        return None
    return wilson_interval(value, n)


def read_run_config(run_dir: Path) -> dict | None:
    """A run's resolved config.yaml as a mapping (None when missing or unreadable)."""
    import yaml

    try:
        data = yaml.safe_load((Path(run_dir) / "config.yaml").read_text(errors="replace"))
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def _num(value: float) -> str:
    return f"{value:.4g}"


def headline_line(
    family: str | None,
    algorithm: str | None,
    last_eval: dict,
    last_train: dict,
    config: dict | None = None,
) -> str | None:
    """One line for a run's status, held-out headline first and the training signal labelled
    as such: ``held-out eval/accuracy 0.867 (step 40; 95% 0.80–0.92 on n=128) · training
    signal accuracy 0.95``. None for an unknown family."""
    head = headline_for(family, algorithm)
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
        if extra:
            text += f" ({'; '.join(extra)})"
    signal = head.training_signal
    if signal is not None:
        train = _as_float(last_train.get(signal))
        if train is not None:
            text += f" · training signal {signal} {_num(train)}"
    return text
