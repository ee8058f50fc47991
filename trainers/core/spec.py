"""Algorithm specs: one torch-free record per algorithm, declared once in its family.

Each family package holds a ``spec.py`` (no torch, no transformers) that declares a
:class:`FamilySpec` with its :class:`AlgorithmSpec` records. The trainers' dispatch reads the
advantage/loss registry names, the KL placement and the defaults from these records; the lab
(catalog, shrink, plan, compare, ledger, memory estimate) reads the rest. No other table repeats
what a spec says.

The registry functions below import only ``trainers.<family>.spec`` modules, so the lab can call
them without pulling in torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from typing import Any, Literal, NamedTuple

__all__ = [
    "FAMILY_NAMES",
    "AlgorithmSpec",
    "FamilySpec",
    "KLPlacement",
    "MetricSpec",
    "all_specs",
    "family_spec",
    "family_specs",
    "metrics",
    "spec_for",
]

KLPlacement = Literal["loss", "reward", "none"]

FAMILY_NAMES: tuple[str, ...] = (
    "direct_alignment",
    "policy_gradients",
    "reward_models",
    "rejection_sampling",
    "sft",
    "distillation",
)
"""The algorithm families, in the order the lab lists them (each is ``trainers/<name>/``)."""


@dataclass(frozen=True)
class MetricSpec:
    """A logged metric and which way is better.

    ``higher_is_better`` is None when the metric has no good direction (a policy-gradient loss
    hovers near 0 whatever the policy does; rejected rewards may fall while the model improves).
    ``key`` is False for a metric that has a known direction but is not shown as a key metric.
    """

    name: str
    higher_is_better: bool | None
    key: bool = True

    @property
    def direction(self) -> Literal["max", "min"] | None:
        """ "max", "min" or None, the ledger's spelling of ``higher_is_better``."""
        if self.higher_is_better is None:
            return None
        return "max" if self.higher_is_better else "min"


_DIRECTIONS: dict[str, bool | None] = {"+": True, "-": False, "~": None}


def metrics(*declared: str, key: bool = True) -> tuple[MetricSpec, ...]:
    """Metric specs written as short words: each word is a metric's name and a last character
    for which way is better, ``+`` higher, ``-`` lower, ``~`` no good direction; an argument may
    hold several words separated by spaces (as ``namedtuple``'s field names).

    ``metrics("accuracy+ loss-", "rejected_rewards~")`` is the tuple of
    ``MetricSpec("accuracy", True)``, ``MetricSpec("loss", False)`` and
    ``MetricSpec("rejected_rewards", None)``, in that order; ``key=False`` marks them all as
    declared (for their direction) but not shown as key metrics. A word without one of the three
    suffixes is a declaration bug (ValueError).
    """
    out = []
    for text in (word for arg in declared for word in arg.split()):
        name, suffix = text[:-1], text[-1:]
        if suffix not in _DIRECTIONS or not name:
            raise ValueError(
                f"metric {text!r} must be a name followed by + (higher is better), "
                "- (lower is better) or ~ (no direction)"
            )
        out.append(MetricSpec(name, _DIRECTIONS[suffix], key=key))
    return tuple(out)


@dataclass(frozen=True)
class AlgorithmSpec:
    """Everything the code needs to know about one algorithm, in one place.

    ``advantage`` and ``loss`` are names in the family's registries of pure functions (e.g.
    ``trainers.policy_gradients.advantages.ADVANTAGES``); ``kl`` says where β·KL goes; the
    ``needs_*`` flags say what the trainer must load or keep. ``selection`` names a
    rejection-sampling selection rule; ``matched_control`` the strategy a result is judged
    against (``is_control``: this one is the random control of its partner);
    ``reward_signal`` the reward its advantage reads (policy gradients: ``total`` or
    ``binary``); ``overlong_penalty`` / ``dynamic_sampling`` turn on DAPO's length penalty and
    its refilling of groups without reward contrast; ``greedy_baseline`` an extra greedy
    completion per prompt each rollout step, scored as the baseline (ReMax); ``run_name`` the name runs are filed under when it differs from ``name``. ``key_metrics``, ``acceptance``
    and ``watch`` are what this algorithm adds to its family's.
    """

    name: str
    summary: str
    loss: str
    family: str = ""
    """Filled in by the :class:`FamilySpec` that holds it."""
    paper: str = ""
    aliases: tuple[str, ...] = ()
    advantage: str | None = None
    selection: str | None = None
    kl: KLPlacement = "none"
    loss_agg: str | None = None
    clip_eps: tuple[float, float] | None = None
    default_beta: float | None = None
    needs_reference: bool = False
    needs_groups: bool = False
    needs_old_logprobs: bool = False
    needs_value_model: bool = False
    needs_reward_model: bool = False
    needs_teacher: bool = False
    reward_signal: str = "total"
    overlong_penalty: bool = False
    dynamic_sampling: bool = False
    greedy_baseline: bool = False
    key_metrics: tuple[MetricSpec, ...] = ()
    headline_metric: str | None = None
    """Its held-out headline; left out, its family's (filled in by the family)."""
    acceptance: tuple[str, ...] = ()
    watch: tuple[str, ...] = ()
    builtin_dataset: str | None = None
    matched_control: str | None = None
    is_control: bool = False
    run_name: str | None = None
    shrink_hook: str | None = None
    memory_hook: str | None = None
    one_process_as: str | None = None
    """Set for an algorithm whose runs stay on one process in this version although its family
    runs under torchrun (online DPO: its sampling and ranking step is not split across ranks):
    how a refusal names it."""

    @property
    def shrink_key(self) -> str:
        """The shrink rule set this algorithm uses (its family's unless it names its own)."""
        return self.shrink_hook or self.family

    @property
    def memory_key(self) -> str:
        """The memory estimator key (its family's unless it names its own)."""
        return self.memory_hook or self.family


@dataclass(frozen=True)
class FamilySpec:
    """One algorithm family: where its code lives, how its runs are judged, its algorithms.

    Its algorithms are declared without their family: it fills in its name as their ``family``
    and its headline metric where they name none."""

    name: str
    config_class: str
    algorithm_field: str | None
    default_algorithm: str
    algorithms: tuple[AlgorithmSpec, ...]
    key_metrics: tuple[MetricSpec, ...]
    headline_metric: str
    acceptance: tuple[str, ...]
    watch: tuple[str, ...]
    comparison: str
    comparison_columns: tuple[str, ...] = ()
    builtin_datasets: dict[str, str] = field(default_factory=dict)
    replace_key_metrics: bool = False
    """True: an algorithm's own key metrics replace the family's (after ``loss``) instead of
    adding to them (reward models: each kind reports different held-out metrics)."""
    headline_label: str = ""
    """The headline metric in words (what a reader is told the result is)."""
    headline_is_share: bool = True
    """The headline is a share of the held-out items (an accuracy): its sampling noise on n
    items is binomial. False for a loss (SFT), whose single-run noise the lab cannot bound."""
    training_signal: str | None = None
    """The training-time metric that mirrors the headline (a rollout or training-batch number,
    shown as secondary); None: the headline's bare twin (``eval/accuracy`` -> ``accuracy``)."""
    eval_size_keys: tuple[str, ...] = ("data.eval_size",)
    """Dotted config keys holding the number of held-out items behind the headline (the first
    one present wins); the trainers do not log the count."""
    heldout_keys: tuple[str, ...] = ()
    """Config keys that fix the held-out set: runs that differ in one are not comparable."""
    algorithm_knobs: tuple[str, ...] = ()
    """Config keys (a trailing ``.`` covers a section) that belong to the algorithm itself:
    arms of different algorithms may differ there and still be matched."""
    learning_rate_key: str = "train.learning_rate"
    steps_key: str = "train.max_steps"
    kl_key: str | None = None
    """The config key of the KL / reference-anchoring strength (None: the family has none)."""
    multi_process: bool = True
    """Its trainer runs under torchrun (False: one process only in this version)."""
    lora_multi_process: bool = False
    """Its LoRA runs were checked under torchrun too (else a LoRA run stays on one process)."""

    def __post_init__(self) -> None:
        for algo in self.algorithms:
            if algo.family not in ("", self.name):
                raise ValueError(
                    f"{algo.name} is declared in family {algo.family}, not {self.name}"
                )
        own = tuple(
            replace(a, family=self.name, headline_metric=a.headline_metric or self.headline_metric)
            for a in self.algorithms
        )
        object.__setattr__(self, "algorithms", own)

    @property
    def config_module(self) -> str:
        """The torch-free module holding its pydantic config model: ``trainers.<name>.config``."""
        return f"trainers.{self.name}.config"

    @property
    def trainer_module(self) -> str:
        """The module run as ``python -m <trainer_module> --config ...``:
        ``trainers.<name>.train``."""
        return f"trainers.{self.name}.train"

    @property
    def configs_dir(self) -> str:
        """Its shipped recipes, relative to the source root: ``trainers/<name>/configs``."""
        return f"trainers/{self.name}/configs"

    @property
    def algorithm_names(self) -> tuple[str, ...]:
        """Canonical algorithm names, in declaration order."""
        return tuple(a.name for a in self.algorithms)

    @property
    def algorithm_literal(self) -> Any:
        """``Literal[<algorithm names>]``: the type of the config field that picks one (pydantic
        accepts only these names and shows them as the field's enum). A type built at run time,
        so a static checker cannot read it as an annotation."""
        return Literal[self.algorithm_names]

    def algorithm(self, name: str) -> AlgorithmSpec:
        """The spec of one of this family's algorithms (KeyError when it has none by that name)."""
        for spec in self.algorithms:
            if spec.name == name:
                return spec
        raise KeyError(f"family {self.name} has no algorithm {name!r}")

    def key_metric_names(self) -> tuple[str, ...]:
        """Names of the family's key metrics (those flagged ``key``), in order."""
        return tuple(m.name for m in self.key_metrics if m.key)

    def headline_for(self, algorithm: str | None = None) -> str:
        """The held-out headline metric of ``algorithm`` (its own when it names one, else the
        family's)."""
        if algorithm:
            for spec in self.algorithms:
                if algorithm in (spec.name, spec.run_name) and spec.headline_metric:
                    return spec.headline_metric
        return self.headline_metric

    def training_signal_for(self, algorithm: str | None = None) -> str | None:
        """The training-time twin of the headline (secondary; see ``training_signal``)."""
        if self.training_signal is not None:
            return self.training_signal
        headline = self.headline_for(algorithm)
        return headline.removeprefix("eval/") if headline.startswith("eval/") else None


def _spec_module_name(family: str) -> str:
    return f"trainers.{family}.spec"


@cache
def family_spec(name: str) -> FamilySpec:
    """The :class:`FamilySpec` of family ``name`` (KeyError for an unknown family)."""
    if name not in FAMILY_NAMES:
        raise KeyError(f"unknown family {name!r}; families: {', '.join(FAMILY_NAMES)}")
    module = importlib.import_module(_spec_module_name(name))
    spec = module.FAMILY
    if not isinstance(spec, FamilySpec) or spec.name != name:
        raise TypeError(f"{_spec_module_name(name)}.FAMILY is not the FamilySpec of {name}")
    return spec


class OneProcessOnly(NamedTuple):
    """Why a run stays on one process: ``kind`` is ``family`` (the whole trainer; ``subject``
    names it), ``algorithm`` (``subject`` names it) or ``lora`` (LoRA in a family that does not
    shard it; ``subject`` lists the families that do)."""

    kind: Literal["family", "algorithm", "lora"]
    subject: str


def one_process_only(family: str, algorithm: str | None, lora: bool) -> OneProcessOnly | None:
    """Whether a run of ``family`` (``algorithm``; with LoRA adapters or not) must stay on one
    process in this version, from the specs' ``multi_process`` / ``lora_multi_process`` /
    ``one_process_as``: the trainers' harness refuses such a run under torchrun and the lab
    refuses to launch it on several ranks, both from this one answer."""
    spec = family_spec(family)
    if not spec.multi_process:
        return OneProcessOnly("family", f"the {family} trainer")
    own = next((a for a in spec.algorithms if a.name == algorithm), None)
    if own is not None and own.one_process_as:
        return OneProcessOnly("algorithm", own.one_process_as)
    if lora and not spec.lora_multi_process:
        sharded = ", ".join(f.name for f in family_specs() if f.lora_multi_process)
        return OneProcessOnly("lora", sharded)
    return None


def family_specs() -> tuple[FamilySpec, ...]:
    """Every family's spec, in :data:`FAMILY_NAMES` order."""
    return tuple(family_spec(name) for name in FAMILY_NAMES)


def all_specs() -> tuple[AlgorithmSpec, ...]:
    """Every algorithm's spec, family by family in declaration order."""
    return tuple(algo for fam in family_specs() for algo in fam.algorithms)


def _normalise(text: str) -> str:
    return " ".join(text.strip().lower().split())


@lru_cache(maxsize=1)
def _by_name_or_alias() -> dict[str, AlgorithmSpec]:
    """Canonical name and every alias (normalised) -> spec; a clash is a declaration bug."""
    table: dict[str, AlgorithmSpec] = {}
    for spec in all_specs():
        for key in (spec.name, *spec.aliases):
            norm = _normalise(key)
            other = table.get(norm)
            if other is not None and other is not spec:
                raise ValueError(f"{key!r} names both {other.name} and {spec.name}")
            table[norm] = spec
    return table


def spec_for(name_or_alias: str) -> AlgorithmSpec:
    """The spec of an algorithm named by its canonical name or one of its aliases (case and
    spacing ignored); KeyError when nothing matches."""
    try:
        return _by_name_or_alias()[_normalise(name_or_alias)]
    except KeyError:
        raise KeyError(f"no algorithm named {name_or_alias!r}") from None
