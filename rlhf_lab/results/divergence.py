"""Divergence of a policy-gradient run: its KL to the reference blew up, or its samples
collapsed into repetition (``Your Your Your …``). Torch-free.

Rules (each run on the rows and samples a run folder already holds):

* **KL blow-up** (:func:`kl_blowup`): ``kl_ref`` (the mean over sequences of the summed per-token
  KL to the reference, in nats, on ``rollout`` rows) reached more than ``KL_BOUND_NATS`` (50) in
  the second half of the run *and* more than ``KL_GROWTH`` (10) times its level over the first
  quarter of the rows (that level floored at 1 nat, since the first step's KL is 0). A healthy
  run on tiny against a learned reward model stays under ~6 nats; the diverged one reached 100+.
* **Degenerate repetition** (:func:`degenerate_samples`): at least half of the samples of the
  latest sampled step repeat themselves (:func:`repetition_reason`), *compared with the start*
  (:func:`repetition_finding`): when the first sampled step (step 0, the starting model) already
  had at least half its samples looping, the looping is **inherited** from the starting model,
  not a divergence of training (a chat template or end-of-turn problem, or a base model that
  loops): it is reported as such and the divergence advice is not given. With no earlier sampled
  step to compare with, a latest step at step 0 is inherited, a later one is a divergence.

:func:`divergence_advice` gives the config changes the alert and the ledger's Next section both
propose: a learning rate ten times lower, a KL leash twice as tight (where the algorithm has a
KL term), and for a KL in the reward estimated with k3, the k1 estimator (k3 as a per-token
reward pushes the policy away from the reference).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlhf_lab.results.overoptimisation import Advice

if TYPE_CHECKING:
    from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = [
    "KL_BOUND_NATS",
    "KL_GROWTH",
    "KlBlowup",
    "Repetition",
    "degenerate_samples",
    "divergence_advice",
    "divergence_hint",
    "kl_blowup",
    "repetition_finding",
    "repetition_reason",
    "sample_text",
]

KL_BOUND_NATS = 50.0
KL_GROWTH = 10.0
KL_EARLY_FLOOR = 1.0
MIN_KL_ROWS = 4
DEFAULT_BETA = 0.05


@dataclass(frozen=True)
class KlBlowup:
    """``kl_ref`` grew past the bound (see the rule above)."""

    early: float
    peak: float
    peak_step: Any
    first_step: Any

    @property
    def step(self) -> int | None:
        return self.peak_step if isinstance(self.peak_step, int) else None

    @property
    def message(self) -> str:
        return (
            f"kl_ref blew up: {self.peak:.1f} nats at step {self.peak_step} against "
            f"{self.early:.2f} over the first steps (bound: above {KL_BOUND_NATS:g} nats and "
            f"{KL_GROWTH:g}x the start); the policy left its reference"
        )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if f == f and abs(f) != float("inf") else None


def kl_blowup(rows: list[dict]) -> KlBlowup | None:
    """The KL blow-up in a run's metric rows, or None (fewer than 4 ``kl_ref`` rows: None)."""
    series = [
        (r.get("step"), v)
        for r in rows
        if r.get("phase") in (None, "rollout") and (v := _number(r.get("kl_ref"))) is not None
    ]
    if len(series) < MIN_KL_ROWS:
        return None
    quarter = max(1, len(series) // 4)
    early = max(KL_EARLY_FLOOR, sum(v for _, v in series[:quarter]) / quarter)
    late = series[len(series) // 2 :]
    step, peak = max(late, key=lambda sv: sv[1])
    if peak > KL_BOUND_NATS and peak > KL_GROWTH * early:
        return KlBlowup(early=early, peak=peak, peak_step=step, first_step=series[0][0])
    return None


def repetition_reason(text: str, min_tokens: int = 16) -> str | None:
    """Why a completion looks collapsed (None if it does not): one token repeated many times in
    a row, one n-gram (n = 2..4) covering most of it, a loop (few distinct 4-grams), or one
    character repeated at length."""
    run_ch = max((len(m.group(0)) for m in re.finditer(r"(\S)\1*", text)), default=0)
    if run_ch >= 40:
        return f"one character repeated {run_ch} times in a row"
    toks = re.findall(r"\w+|[^\w\s]", text)
    if len(toks) < min_tokens:
        return None
    longest, cur = 1, 1
    for a, b in zip(toks, toks[1:], strict=False):
        cur = cur + 1 if a == b else 1
        longest = max(longest, cur)
    if longest >= 10:
        return f"one token repeated {longest} times in a row"
    for n in (2, 3, 4):
        grams = Counter(tuple(toks[i : i + n]) for i in range(len(toks) - n + 1))
        gram, count = grams.most_common(1)[0]
        coverage = min(1.0, count * n / len(toks))
        if count >= 4 and coverage >= 0.6:
            return f"the {n}-gram {' '.join(gram)!r} covers {coverage:.0%} of it"
    fours = [tuple(toks[i : i + 4]) for i in range(len(toks) - 3)]
    distinct = len(set(fours)) / len(fours)
    if len(toks) >= 24 and distinct <= 0.25:
        return f"it loops: only {distinct:.0%} of its 4-grams are distinct"
    return None


def sample_text(row: dict) -> str | None:
    for key in ("completion", "response", "output", "text", "generation"):
        value = row.get(key)
        if isinstance(value, str):
            return value
    return None


@dataclass(frozen=True)
class Repetition:
    """Samples of the latest sampled step that repeat themselves, against the first step."""

    step: Any
    collapsed: int
    of: int
    why: str
    excerpt: str
    start_step: Any
    start_collapsed: int
    start_of: int

    @property
    def inherited(self) -> bool:
        """Looping already present at the start (at least half of the first step's samples),
        or the latest step is the start itself."""
        if self.start_step == self.step:
            return self.step in (0, None)
        return self.start_collapsed * 2 >= self.start_of

    @property
    def message(self) -> str:
        head = (
            f"{self.collapsed}/{self.of} samples at step {self.step} repeat themselves "
            f"({self.why}), e.g. {self.excerpt!r}"
        )
        if self.start_step == self.step:
            return head
        start = f"{self.start_collapsed}/{self.start_of} at step {self.start_step}"
        if self.inherited:
            return f"{head}; inherited, not diverged: {start} already did"
        return f"{head}; diverged from the start ({start})"


def _collapsed(rows: list[dict]) -> list[str]:
    return [why for r in rows if (why := repetition_reason(sample_text(r) or ""))]


def repetition_finding(samples: list[dict], excerpt_chars: int = 80) -> Repetition | None:
    """The latest sampled step's repetition compared with the first sampled step (None unless
    at least half of the latest step's samples repeat themselves)."""
    rows = [r for r in samples if sample_text(r) is not None]
    if not rows:
        return None
    last_step, first_step = rows[-1].get("step"), rows[0].get("step")
    latest = [r for r in rows if r.get("step") == last_step]
    collapsed = _collapsed(latest)
    if not collapsed or len(collapsed) * 2 < len(latest):
        return None
    first = [r for r in rows if r.get("step") == first_step]
    example = next(r for r in latest if repetition_reason(sample_text(r) or ""))
    return Repetition(
        step=last_step,
        collapsed=len(collapsed),
        of=len(latest),
        why=collapsed[0],
        excerpt=(sample_text(example) or "")[:excerpt_chars].replace("\n", " "),
        start_step=first_step,
        start_collapsed=len(_collapsed(first)),
        start_of=len(first),
    )


def degenerate_samples(samples: list[dict]) -> str | None:
    """Why the latest samples degenerated during training (at least half of the latest sampled
    step's completions repeat themselves, and the start did not), or None (also when the
    looping is inherited from the start: :func:`repetition_finding`)."""
    found = repetition_finding(samples)
    return found.message if found is not None and not found.inherited else None


def divergence_advice(
    family: str | None, algorithm: str | None, value_of: Callable[[str], Any]
) -> list[Advice]:
    """What to change after a KL blow-up or degenerate samples, one alternative per item: the
    family's learning rate ÷10; its KL coefficient ×2 (``DEFAULT_BETA`` when it was 0) where the
    algorithm has a KL term; ``loss.kl_estimator=k1`` where the KL sits in the reward with k3.
    ``value_of``: a dotted key's value in the run's settings (its config's
    :meth:`~rlhf_lab.planning.trainer_config.TrainerConfig.get`, or ``.get`` of a ledger row's
    flat dotted settings); None when unset."""
    from trainers.core.spec import FAMILY_NAMES, family_spec, spec_for

    if family not in FAMILY_NAMES:
        return []
    spec = family_spec(family)
    out: list[Advice] = []
    lr = _number(value_of(spec.learning_rate_key)) if spec.learning_rate_key else None
    if lr and lr > 0:
        out.append(Advice(spec.learning_rate_key, lr / 10, f"smaller steps, lr now {lr:g}"))
    try:
        algo = spec_for(algorithm) if algorithm else None
    except KeyError:
        algo = None
    if spec.kl_key and (algo is None or algo.kl != "none"):
        now = _number(value_of(spec.kl_key)) or 0.0
        out.append(
            Advice(
                spec.kl_key,
                2 * now if now > 0 else DEFAULT_BETA,
                f"a tighter KL leash to the reference, now {now:g}",
            )
        )
    if (
        family == "policy_gradients"
        and algo is not None
        and algo.kl == "reward"
        and value_of("loss.kl_estimator") == "k3"
    ):
        out.append(
            Advice("loss.kl_estimator", "k1", "k3 as a per-token reward pushes away from the ref")
        )
    return out


def _unset(key: str) -> Any:
    return None


def divergence_hint(family: str | None, algorithm: str | None, config: TrainerConfig | None) -> str:
    """The alert's one actionable line: the overrides of :func:`divergence_advice` for the run's
    ``config`` (none known: the defaults)."""
    advice = divergence_advice(family, algorithm, config.get if config is not None else _unset)
    options = " or ".join(f"the override {a.override} ({a.why})" for a in advice)
    if not options:
        return "lower the learning rate or tighten the KL leash to the reference"
    return (
        f"launch it again with {options}; recording the run puts the full commands in the "
        "campaign's Next section"
    )
