"""Two guards against reading training numbers as results (held-out first): the held-out
headline got worse beyond its noise, typically while the training signal rose
(:func:`heldout_regression`), and samples that are noise rather than text, as a random-init
model writes (:func:`noise_reason`). :mod:`rlhf_lab.results.diagnosis` raises both as alerts and
the ledger notes them. Torch-free."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.results.divergence import (
    sample_text as _sample_text,
)
from rlhf_lab.results.headline import headline_for, heldout_items
from rlhf_lab.results.stats import newcombe_difference


def as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf", "+inf"):
        return float(value)
    return None


# The noise rule (stated in words in docs/architecture.md and the skills): a completion is noise
# when it has no letter or digit at all (empty, whitespace, punctuation: what a random-init
# model's greedy decoding gives), when it holds U+FFFD (byte-level tokens that decode to no
# text), when at least NOISE_NONWORD_SHARE of its ≥ NOISE_MIN_WORDS alphabetic words are not
# words (mixed case inside a word, "WITHvel", or five or more letters without a vowel), or when
# fewer than NOISE_DISTINCT_RATIO of its ≥ NOISE_MIN_TOKENS tokens are distinct. A run's samples
# are noise when at least half of the latest step's samples are.
NOISE_MIN_WORDS = 8


NOISE_NONWORD_SHARE = 0.15


NOISE_MIN_TOKENS = 20


NOISE_DISTINCT_RATIO = 0.2


_VOWELS = frozenset("aeiouyAEIOUY")


def _non_word(word: str) -> bool:
    inner = word[1:]
    if any(c.isupper() for c in inner) and any(c.islower() for c in inner):
        return True
    if any(a.islower() and b.isupper() for a, b in zip(word, word[1:], strict=False)):
        return True
    return len(word) >= 5 and not any(c in _VOWELS for c in word)


def noise_reason(text: str) -> str | None:
    """Why a completion looks like noise rather than text (None when it does not); the rule is
    stated above :data:`NOISE_MIN_WORDS`."""
    if not any(c.isalnum() for c in text):
        return "no letter or digit (empty, whitespace or punctuation only)"
    broken = text.count("\ufffd")
    if broken:
        return f"{broken} broken character(s) (U+FFFD): byte tokens that decode to no text"
    words = re.findall(r"[A-Za-z]+", text)
    if len(words) >= NOISE_MIN_WORDS:
        bad = [w for w in words if _non_word(w)]
        share = len(bad) / len(words)
        if share >= NOISE_NONWORD_SHARE:
            shown = ", ".join(repr(w) for w in bad[:3])
            return f"{share:.0%} of its words are not words ({shown})"
    toks = re.findall(r"\w+|[^\w\s]", text)
    if len(toks) >= NOISE_MIN_TOKENS:
        ratio = len(set(toks)) / len(toks)
        if ratio < NOISE_DISTINCT_RATIO:
            return f"only {ratio:.0%} of its {len(toks)} tokens are distinct"
    return None


def latest_samples(rows: list[dict]) -> list[dict]:
    """The sample rows of the last step that wrote samples (held-out ones when it has both)."""
    rows = [r for r in rows if _sample_text(r) is not None]
    if not rows:
        return []
    last_step = rows[-1].get("step")
    latest = [r for r in rows if r.get("step") == last_step]
    held_out = [r for r in latest if r.get("kind") == "eval"]
    return held_out or latest


def noisy_samples(rows: list[dict]) -> str | None:
    """A one-line finding when the latest samples are noise (at least half of them), else
    None."""
    latest = latest_samples(rows)
    noisy = [(r, why) for r in latest if (why := noise_reason(_sample_text(r) or ""))]
    if not noisy or len(noisy) * 2 < len(latest):
        return None
    row, why = noisy[0]
    excerpt = (_sample_text(row) or "")[:80]
    return (
        f"{len(noisy)}/{len(latest)} samples at step {row.get('step')} are noise, not text "
        f"({why}; e.g. {excerpt!r}): the model has not learned to write yet (random-init or "
        "untrained weights), so its samples show nothing about the algorithm"
    )


@dataclass(frozen=True)
class Regression:
    """The held-out headline got worse from its first to its last evaluation beyond noise."""

    metric: str
    first: float
    last: float
    first_step: Any
    last_step: Any
    noise: str
    signal: str | None = None
    signal_first: float | None = None
    signal_last: float | None = None
    signal_improved: bool | None = None

    @property
    def message(self) -> str:
        worse = "fell" if self.last < self.first else "rose"
        text = (
            f"held-out {self.metric} {worse} {self.first:.4g} → {self.last:.4g} (steps "
            f"{self.first_step} → {self.last_step}; {self.noise})"
        )
        if self.signal is not None and self.signal_first is not None:
            moved = "rose" if (self.signal_last or 0) > self.signal_first else "fell"
            text += (
                f" while the training signal {self.signal} {moved} {self.signal_first:.4g} → "
                f"{self.signal_last:.4g} (means of its first and last training rows)"
            )
            if self.signal_improved:
                text += ": the training numbers are not the result"
        return text


REGRESSION_SHARE_DROP = 0.05  # an accuracy without a known n: this absolute drop counts


REGRESSION_LOSS_RISE = 0.05  # a held-out loss: this relative rise counts


def metric_series(rows: list[dict], name: str, *, train_only: bool) -> list[tuple[Any, float]]:
    out = []
    for r in rows:
        if train_only and r.get("phase") == "eval":
            continue
        value = as_number(r.get(name))
        if value is not None and math.isfinite(value):
            out.append((r.get("step"), value))
    return out


def heldout_regression(
    family: str | None,
    algorithm: str | None,
    rows: list[dict],
    config: TrainerConfig | None = None,
) -> Regression | None:
    """The held-out headline's last evaluation against its first: a :class:`Regression` when it
    is worse beyond noise — for an accuracy on n held-out items, Newcombe's 95 % interval of the
    difference excludes 0 (without n: a drop of ``REGRESSION_SHARE_DROP``); for a loss, a rise
    of ``REGRESSION_LOSS_RISE`` of the first value. Reports how the training signal moved
    (mean of the first vs the last up-to-5 training rows)."""
    head = headline_for(family, algorithm, config, rows)
    if head is None:
        return None
    points = metric_series(rows, head.metric, train_only=False)
    if len(points) < 2:
        return None
    (s0, v0), (s1, v1) = points[0], points[-1]
    sign = 1.0 if head.higher_is_better else -1.0
    if sign * (v1 - v0) >= 0:
        return None
    n = heldout_items(family, config, rows).n
    if head.share and n is not None and 0 <= v0 <= 1 and 0 <= v1 <= 1:
        iv = newcombe_difference(v1, n, v0, n)
        if not (iv.high < 0 if head.higher_is_better else iv.low > 0):
            return None
        noise = f"beyond the 95% sampling noise on n={n} held-out items"
    elif head.share:
        if abs(v1 - v0) < REGRESSION_SHARE_DROP:
            return None
        noise = f"a change of at least {REGRESSION_SHARE_DROP} (held-out count unknown)"
    else:
        if abs(v1 - v0) < REGRESSION_LOSS_RISE * max(abs(v0), 1e-12):
            return None
        noise = f"more than {REGRESSION_LOSS_RISE:.0%} of its first value"
    found = Regression(head.metric, v0, v1, s0, s1, noise)
    signal = head.training_signal
    train = metric_series(rows, signal, train_only=True) if signal else []
    if signal and len(train) >= 2:
        w = max(1, min(5, len(train) // 2))
        a = sum(v for _, v in train[:w]) / w
        b = sum(v for _, v in train[-w:]) / w
        improved = None
        if head.training_higher_is_better is not None and a != b:
            improved = (b > a) == head.training_higher_is_better
        found = Regression(head.metric, v0, v1, s0, s1, noise, signal, a, b, improved)
    return found


def regression_hint(family: str | None) -> str:
    from trainers.core.spec import FAMILY_NAMES, family_spec

    if family not in FAMILY_NAMES:
        return "train fewer steps"
    spec = family_spec(family)
    kl = f" or raise the KL strength ({spec.kl_key})" if spec.kl_key else ""
    return (
        f"judge the run by the held-out number; train fewer steps ({spec.steps_key}){kl}, "
        "or lower the learning rate"
    )
