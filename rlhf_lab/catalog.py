"""The catalog: algorithm families, their shipped recipes (one YAML per algorithm or strategy) and
what to watch in each. Reads YAML only: no trainer module (and no torch) is imported here.

A *recipe* is a shipped config file ``trainers/<family>/configs/<name>.yaml``. It is named by its
file stem (``dpo``), by ``<family>/<stem>`` (``direct_alignment/dpo``) or by its path; an
algorithm name or alias (``dr. grpo``, ``bradley-terry``) also finds the recipe that runs it.

:data:`FAMILIES` is the registry the rest of the lab builds on: for each family, where its
pydantic config model lives (imported lazily by :mod:`rlhf_lab.configs`), which field names the
algorithm, the trainer module, the metrics that show progress, the acceptance criteria of a
sanity run and what to watch while it runs (ALGORITHMS.md, in our own words).
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rlhf_lab.paths import LabError

__all__ = [
    "ALGORITHM_ALIASES",
    "FAMILIES",
    "FamilyInfo",
    "Recipe",
    "acceptance_for",
    "algorithm_family",
    "algorithm_of",
    "all_algorithms",
    "family_info",
    "find_recipe",
    "get_dotted",
    "infer_family",
    "key_metrics_for",
    "list_recipes",
    "normalize_algorithm",
    "recipe_for_algorithm",
    "source_root",
    "watch_for",
]


class FamilyInfo(BaseModel):
    """One algorithm family of ``trainers/``."""

    name: str
    config_module: str = Field(description="torch-free module holding the pydantic config model")
    config_class: str = Field(description="class name of the config model in that module")
    algorithm_field: str | None = Field(
        description="dotted config key naming the algorithm (None: the family has one algorithm)"
    )
    default_algorithm: str
    algorithms: list[str]
    trainer_module: str = Field(description="run as `python -m <trainer_module> --config ...`")
    configs_dir: str = Field(description="shipped recipes, relative to the source root")
    key_metrics: list[str] = Field(description="the metrics that show progress (ALGORITHMS.md)")
    acceptance: list[str] = Field(description="what a good sanity run shows")
    watch: list[str] = Field(description="what to look at while it runs")
    comparison: str = Field(description="how runs of this family are compared")
    builtin_datasets: dict[str, str] = Field(
        default_factory=dict,
        description="offline data set per algorithm ('*' for all) used with a tiny preset",
    )


FAMILIES: dict[str, FamilyInfo] = {
    "direct_alignment": FamilyInfo(
        name="direct_alignment",
        config_module="trainers.direct_alignment.config",
        config_class="DirectAlignmentConfig",
        algorithm_field="loss",
        default_algorithm="dpo",
        algorithms=[
            "dpo",
            "cdpo",
            "dpo_norm",
            "ipo",
            "simpo",
            "orpo",
            "kto",
            "apo_zero",
            "apo_down",
        ],
        trainer_module="trainers.direct_alignment.train",
        configs_dir="trainers/direct_alignment/configs",
        key_metrics=[
            "accuracy",
            "margins",
            "chosen_rewards",
            "rejected_rewards",
            "eval/accuracy",
            "eval/margins",
            "eval/chosen_rewards",
            "eval/rejected_rewards",
        ],
        acceptance=[
            "accuracy and margins trend up within the first 10-20 optimizer steps "
            "(eval/accuracy ends above 0.5)",
            "sample generations stay coherent: no repetition collapse",
        ],
        watch=[
            "accuracy and margins (train and eval/) rising together",
            "chosen_rewards vs rejected_rewards: the gap should widen; both falling is common",
            "grad_norm spikes and a loss that turns NaN (lower the learning rate)",
            "samples.jsonl for repetition or gibberish",
        ],
        comparison="compare eval/accuracy and eval/margins at matched steps; loss scales differ "
        "across losses (IPO's is not comparable to DPO's)",
        builtin_datasets={"*": "builtin:reasoning-preferences"},
    ),
    "policy_gradients": FamilyInfo(
        name="policy_gradients",
        config_module="trainers.policy_gradients.config",
        config_class="PolicyGradientConfig",
        algorithm_field="algorithm",
        default_algorithm="grpo",
        algorithms=[
            "reinforce",
            "rloo",
            "ppo",
            "grpo",
            "drgrpo",
            "gspo",
            "cispo",
            "sapo",
            "dapo",
            "maxrl",
        ],
        trainer_module="trainers.policy_gradients.train",
        configs_dir="trainers/policy_gradients/configs",
        key_metrics=[
            "avg_correctness",
            "avg_format",
            "avg_binary",
            "loss",
            "frac_reward_zero_std",
        ],
        acceptance=[
            "avg_correctness, avg_format and avg_binary rise over the rollout steps",
            "reward contrast is present: frac_reward_zero_std stays well below 1",
            "no NaN loss and no collapse of response_length/mean",
        ],
        watch=[
            "avg_correctness / avg_format / avg_binary (the signal; the loss alone says little "
            "and hovers near 0 with beta 0)",
            "frac_reward_zero_std: groups without reward contrast teach nothing",
            "response_length/mean and response_length/clipped_frac",
            "kl and clip_frac when beta > 0 or several updates per rollout",
        ],
        comparison="compare avg_correctness / avg_binary curves over rollout steps at matched "
        "prompts per step; check that groups carry reward contrast",
    ),
    "reward_models": FamilyInfo(
        name="reward_models",
        config_module="trainers.reward_models.config",
        config_class="RewardModelConfig",
        algorithm_field="kind",
        default_algorithm="preference",
        algorithms=["preference", "orm", "prm"],
        trainer_module="trainers.reward_models.train",
        configs_dir="trainers/reward_models/configs",
        key_metrics=[
            "eval/accuracy",
            "eval/reward_margin",
            "eval/auroc",
            "eval/ranking_accuracy",
            "eval/step_accuracy",
            "eval/majority_baseline",
        ],
        acceptance=[
            "held-out metrics beat chance and improve over training "
            "(compare held-out numbers, never the training loss)",
        ],
        watch=[
            "eval/ metrics in the later part of training (overfitting shows there first)",
            "the training loss floor: identical pairs after truncation inflate it",
        ],
        comparison="compare held-out margins / correctness scores, not training loss",
        builtin_datasets={
            "preference": "builtin:reasoning-preferences",
            "orm": "builtin:reasoning-outcomes",
            "prm": "builtin:reasoning-steps",
        },
    ),
    "rejection_sampling": FamilyInfo(
        name="rejection_sampling",
        config_module="trainers.rejection_sampling.config",
        config_class="RejectionSamplingConfig",
        algorithm_field="strategy",
        default_algorithm="top_per_prompt",
        algorithms=["top_per_prompt", "top_k_overall", "random_per_prompt", "random_k_overall"],
        trainer_module="trainers.rejection_sampling.train",
        configs_dir="trainers/rejection_sampling/configs",
        key_metrics=["eval/exact_match", "diagnostics/decidable_frac", "loss"],
        acceptance=[
            "each reward-selected strategy's held-out exact match is reported beside its "
            "matched random control (top_per_prompt vs random_per_prompt, top_k_overall vs "
            "random_k_overall); a gain counts only against that control",
            "diagnostics/decidable_frac is well above 0 (prompts with both correct and incorrect "
            "completions), otherwise selection cannot help",
        ],
        watch=[
            "diagnostics/decidable_frac after scoring",
            "the SFT loss falling on the selection",
            "exact match of the strategy vs its matched random control",
        ],
        builtin_datasets={"*": "builtin:chain_sum"},
        comparison="always beside the matched random control with the same selection size",
    ),
    "sft": FamilyInfo(
        name="sft",
        config_module="trainers.sft.config",
        config_class="SFTConfig",
        algorithm_field=None,
        default_algorithm="sft",
        algorithms=["sft"],
        trainer_module="trainers.sft.train",
        configs_dir="trainers/sft/configs",
        key_metrics=["loss", "mean_token_accuracy", "eval/loss"],
        acceptance=[
            "loss and eval/loss fall (eval/loss without rising again)",
            "mean_token_accuracy rises; samples take the chat format and end their turn",
        ],
        watch=[
            "eval/loss against loss (overfitting when they part)",
            "samples.jsonl: the answers should follow the format and terminate",
        ],
        comparison="compare eval/loss and held-out samples at matched steps",
        builtin_datasets={"*": "builtin:reasoning-sft"},
    ),
}

# Extra metrics and notes per algorithm, on top of the family's.
_ALGO_METRICS: dict[str, list[str]] = {
    "orpo": ["sft_loss", "or_loss", "log_odds_ratio"],
    "kto": ["kl"],
    "ppo": ["value_loss", "explained_variance"],
    "dapo": ["dynamic_sampling/kept_frac"],
    "preference": ["eval/accuracy", "eval/reward_margin"],
    "orm": ["eval/accuracy", "eval/auroc", "eval/ranking_accuracy"],
    "prm": ["eval/step_accuracy", "eval/majority_baseline"],
}
_ALGO_ACCEPTANCE: dict[str, list[str]] = {
    "orpo": [
        "margins leave 0 and or_loss is not negligible next to sft_loss (the known failure is "
        "'stable but flat')"
    ],
    "simpo": ["samples stay coherent: SimPO is learning-rate sensitive"],
    "ipo": ["IPO's loss starts high (10-25 on real data) and is not comparable to DPO's"],
    "ppo": ["value_loss falls and explained_variance rises above 0"],
    "dapo": ["dynamic_sampling/kept_frac stays above 0 (groups with reward contrast exist)"],
    "maxrl": ["avg_binary must be above 0 in some groups: MaxRL's advantage is 0 otherwise"],
    "preference": ["eval/accuracy above 0.5 and eval/reward_margin growing"],
    "orm": ["eval/auroc above 0.5 and eval/ranking_accuracy above 0.5"],
    "prm": ["eval/step_accuracy above eval/majority_baseline"],
}
_ALGO_WATCH: dict[str, list[str]] = {
    "kto": ["kl (the detached reference point z)"],
    "simpo": ["repetitive or incoherent samples (lower the learning rate)"],
    "orpo": ["or_loss next to sft_loss"],
    "reinforce": ["high variance: no baseline"],
    "gspo": ["clip_frac (GSPO's clip range is tiny by design)"],
    "cispo": ["clip_frac at the upper bound"],
}

# Free-text names -> canonical algorithm names. Keys are normalised by `_norm_key`.
ALGORITHM_ALIASES: dict[str, str] = {
    "dr grpo": "drgrpo",
    "dr. grpo": "drgrpo",
    "dr.grpo": "drgrpo",
    "dr-grpo": "drgrpo",
    "dr_grpo": "drgrpo",
    "grpo done right": "drgrpo",
    "max rl": "maxrl",
    "max-rl": "maxrl",
    "vanilla policy gradient": "reinforce",
    "bradley-terry": "preference",
    "bradley terry": "preference",
    "bt": "preference",
    "reward model": "preference",
    "reward modelling": "preference",
    "reward modeling": "preference",
    "preference rm": "preference",
    "preference_rm": "preference",
    "preference reward model": "preference",
    "outcome reward model": "orm",
    "process reward model": "prm",
    "best-of-n": "top_per_prompt",
    "best of n": "top_per_prompt",
    "bon": "top_per_prompt",
    "rejection sampling": "top_per_prompt",
    "top per prompt": "top_per_prompt",
    "top-k overall": "top_k_overall",
    "top k overall": "top_k_overall",
    "random per prompt": "random_per_prompt",
    "random k overall": "random_k_overall",
    "random-k overall": "random_k_overall",
    "dpo-norm": "dpo_norm",
    "dpo norm": "dpo_norm",
    "length-normalized dpo": "dpo_norm",
    "length-normalised dpo": "dpo_norm",
    "c-dpo": "cdpo",
    "conservative dpo": "cdpo",
    "apo-zero": "apo_zero",
    "apo zero": "apo_zero",
    "apo-down": "apo_down",
    "apo down": "apo_down",
    "direct preference optimization": "dpo",
    "identity preference optimization": "ipo",
    "simple preference optimization": "simpo",
    "odds ratio preference optimization": "orpo",
    "odds-ratio preference optimization": "orpo",
    "kahneman-tversky optimization": "kto",
    "proximal policy optimization": "ppo",
    "group relative policy optimization": "grpo",
    "instruction tuning": "sft",
    "supervised fine-tuning": "sft",
    "supervised finetuning": "sft",
    "supervised fine tuning": "sft",
}

_YAML_SUFFIXES = (".yaml", ".yml")


class Recipe(BaseModel):
    """A shipped (or user) config file and what it runs."""

    id: str = Field(description="<family>/<name>")
    family: str
    algorithm: str
    name: str = Field(description="the file stem, e.g. dpo")
    config_path: str = Field(
        description="relative to the source root for shipped recipes, else the file's path"
    )
    description: str = Field(description="the first comment line of the YAML")
    model: str | None = None
    dataset: str | None = None
    shipped: bool = True

    def path(self) -> Path:
        """The config file's absolute path."""
        p = Path(self.config_path)
        return p if p.is_absolute() else source_root() / p


# ---------------------------------------------------------------------------------------------
# Families and algorithms
# ---------------------------------------------------------------------------------------------


def source_root() -> Path:
    """The checkout holding the ``trainers`` package (where shipped recipes live). Unlike
    :func:`rlhf_lab.paths.repo_root` this ignores ``$RLHF_LAB_ROOT``, which moves only the
    experiments folder."""
    return Path(__file__).resolve().parent.parent


def family_info(family: str) -> FamilyInfo:
    try:
        return FAMILIES[family]
    except KeyError:
        close = difflib.get_close_matches(str(family), list(FAMILIES), n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise LabError(
            f"unknown family {family!r}.{hint} Families: {', '.join(FAMILIES)}"
        ) from None


def all_algorithms() -> dict[str, str]:
    """Algorithm name -> family, for every registered family."""
    return {algo: fam.name for fam in FAMILIES.values() for algo in fam.algorithms}


def algorithm_family(algorithm: str) -> str:
    family = all_algorithms().get(algorithm)
    if family is None:
        raise LabError(_unknown_algorithm_message(algorithm))
    return family


def _norm_key(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def normalize_algorithm(text: str) -> str | None:
    """Canonical algorithm name for ``text`` (a name, a spelling variant or an alias), or None."""
    key = _norm_key(text)
    algos = all_algorithms()
    if key in algos:
        return key
    if key in ALGORITHM_ALIASES:
        return ALGORITHM_ALIASES[key]
    squashed = key.replace("-", "_").replace(" ", "_")
    if squashed in algos:
        return squashed
    bare = re.sub(r"[^a-z0-9]", "", key)
    for algo in algos:
        if bare == re.sub(r"[^a-z0-9]", "", algo):
            return algo
    return None


def _known_names() -> list[str]:
    return sorted(set(all_algorithms()) | set(ALGORITHM_ALIASES))


def close_algorithm_matches(text: str, n: int = 4) -> list[str]:
    names = _known_names() + [r.name for r in list_recipes()]
    matches = difflib.get_close_matches(_norm_key(text), sorted(set(names)), n=n, cutoff=0.5)
    out: list[str] = []
    for m in matches:
        canon = normalize_algorithm(m) or m
        if canon not in out:
            out.append(canon)
    return out


def _unknown_algorithm_message(text: str) -> str:
    close = close_algorithm_matches(text)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    by_family = "; ".join(f"{f.name}: {', '.join(f.algorithms)}" for f in FAMILIES.values())
    return f"unknown algorithm {text!r}.{hint} Known algorithms — {by_family}"


def key_metrics_for(family: str, algorithm: str | None = None) -> list[str]:
    info = family_info(family)
    if family == "reward_models" and algorithm in _ALGO_METRICS:
        metrics = ["loss", *_ALGO_METRICS[algorithm]]
    else:
        metrics = list(info.key_metrics) + _ALGO_METRICS.get(algorithm or "", [])
    return list(dict.fromkeys(metrics))


def acceptance_for(family: str, algorithm: str | None = None) -> list[str]:
    return list(family_info(family).acceptance) + _ALGO_ACCEPTANCE.get(algorithm or "", [])


def watch_for(family: str, algorithm: str | None = None) -> list[str]:
    return list(family_info(family).watch) + _ALGO_WATCH.get(algorithm or "", [])


# ---------------------------------------------------------------------------------------------
# Reading YAML
# ---------------------------------------------------------------------------------------------


def get_dotted(data: dict[str, Any], key: str, default: Any = None) -> Any:
    """``data["a"]["b"]`` for ``key="a.b"``; ``default`` when any part is missing."""
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _first_comment(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            return stripped.lstrip("#").strip()
        return ""
    return ""


def _read(path: Path) -> tuple[dict[str, Any], str]:
    # yaml is imported here (commands that read no recipe skip it) and parses with libyaml's
    # safe loader when present: the same documents as yaml.safe_load, about five times faster,
    # which is most of `rlhf-lab recipes`.
    import yaml

    try:
        text = path.read_text()
    except OSError as err:
        raise LabError(f"cannot read config {path}: {err}") from None
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as err:
        raise LabError(f"{path} is not valid YAML: {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise LabError(f"{path} must hold a mapping at the top level")
    return data, _first_comment(text)


def _find_leaf(data: Any, key: str) -> Any:
    """The first value stored under ``key`` at any depth (depth-first), or None."""
    if isinstance(data, dict):
        if key in data and not isinstance(data[key], dict):
            return data[key]
        for value in data.values():
            found = _find_leaf(value, key)
            if found is not None:
                return found
    return None


def algorithm_of(info: FamilyInfo, data: dict[str, Any]) -> str:
    """The algorithm a config runs: its algorithm field (found at any depth if it moved), else
    the family's default."""
    if info.algorithm_field is None:
        return info.default_algorithm
    value = get_dotted(data, info.algorithm_field)
    if not isinstance(value, str):
        value = _find_leaf(data, info.algorithm_field.split(".")[-1])
    return value if isinstance(value, str) and value else info.default_algorithm


def _model_name(data: dict[str, Any]) -> str | None:
    for key in ("model.name", "model_name", "model_id", "model"):
        value = get_dotted(data, key)
        if isinstance(value, str):
            return value
    return None


def _make_recipe(family: str, path: Path, shipped: bool) -> Recipe:
    info = FAMILIES[family]
    data, description = _read(path)
    if shipped:
        config_path = path.relative_to(source_root()).as_posix()
    else:
        config_path = str(path)
    dataset = get_dotted(data, "data.dataset")
    return Recipe(
        id=f"{family}/{path.stem}",
        family=family,
        algorithm=algorithm_of(info, data),
        name=path.stem,
        config_path=config_path,
        description=description,
        model=_model_name(data),
        dataset=dataset if isinstance(dataset, str) else None,
        shipped=shipped,
    )


@lru_cache(maxsize=8)
def _scan(root: str, stamp: tuple) -> tuple[Recipe, ...]:
    out: list[Recipe] = []
    for family, info in FAMILIES.items():
        folder = Path(root) / info.configs_dir
        if not folder.is_dir():
            continue
        files = sorted(p for p in folder.iterdir() if p.suffix in _YAML_SUFFIXES and p.is_file())
        out.extend(_make_recipe(family, p, shipped=True) for p in files)
    return tuple(out)


def _stamp(root: Path) -> tuple:
    """Changes whenever a recipe file is added, removed or edited (cache key)."""
    items = []
    for info in FAMILIES.values():
        folder = root / info.configs_dir
        if folder.is_dir():
            for p in sorted(folder.iterdir()):
                if p.suffix in _YAML_SUFFIXES:
                    st = p.stat()
                    items.append((str(p), st.st_mtime_ns, st.st_size))
    return tuple(items)


def list_recipes(family: str | None = None) -> list[Recipe]:
    """Every shipped recipe (optionally of one family), in registry then file-name order."""
    if family is not None:
        family_info(family)
    root = source_root()
    recipes = list(_scan(str(root), _stamp(root)))
    if family is not None:
        recipes = [r for r in recipes if r.family == family]
    return recipes


# ---------------------------------------------------------------------------------------------
# Finding a recipe
# ---------------------------------------------------------------------------------------------


def _looks_like_path(text: str) -> bool:
    return text.endswith(_YAML_SUFFIXES) or text.startswith(("/", "./", "../", "~"))


def infer_family(path: Path, data: dict[str, Any] | None = None) -> str:
    """The family of a config file: from its location (``trainers/<family>/configs``, or a run
    directory's ``run.json``), else from its keys."""
    path = Path(path)
    resolved = path.resolve()
    for parent in resolved.parents:
        if parent.name in FAMILIES and parent.parent.name == "trainers":
            return parent.name
    run_json = resolved.parent / "run.json"
    if run_json.is_file():
        try:
            import json

            fam = json.loads(run_json.read_text()).get("family")
        except (OSError, ValueError):
            fam = None
        if fam in FAMILIES:
            return fam
    if data is None:
        data, _ = _read(path)
    candidates = []
    for info in FAMILIES.values():
        if info.algorithm_field is None:
            continue
        value = get_dotted(data, info.algorithm_field)
        if not isinstance(value, str):
            value = _find_leaf(data, info.algorithm_field.split(".")[-1])
        if isinstance(value, str) and value in info.algorithms:
            candidates.append(info.name)
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        # No algorithm key: a family whose model validates the file (lazy import, torch-free).
        from rlhf_lab.configs import families_accepting

        fits = families_accepting(data)
        if len(fits) == 1:
            return fits[0]
        candidates = fits
    choices = ", ".join(candidates) if candidates else ", ".join(FAMILIES)
    raise LabError(
        f"cannot tell which family {path} belongs to (candidates: {choices}). Put the file "
        "under trainers/<family>/configs/ or name the algorithm in it (e.g. `loss: dpo`, "
        "`algorithm: grpo`, `kind: preference`)."
    )


def _is_file(path: str | Path) -> bool:
    """Path.is_file for any text a caller may pass: a name too long for the file system, an
    unknown ~user or a NUL byte is simply not a file (Path raises for those)."""
    try:
        return Path(path).expanduser().is_file()
    except (OSError, ValueError, RuntimeError):
        return False


def recipe_for_file(path: str | Path) -> Recipe:
    """A recipe for any YAML file: the shipped one when the path is a shipped recipe."""
    if not _is_file(path):
        raise LabError(
            f"config file not found: {path}. Pass an existing YAML file or a recipe name"
        )
    resolved = Path(path).expanduser().resolve()
    for recipe in list_recipes():
        if recipe.path().resolve() == resolved:
            return recipe
    data, _ = _read(resolved)
    family = infer_family(resolved, data)
    return _make_recipe(family, resolved, shipped=False)


def recipe_for_algorithm(algorithm: str) -> Recipe:
    """The shipped recipe that runs ``algorithm`` (the one named after it when several do)."""
    family = algorithm_family(algorithm)
    matches = [r for r in list_recipes(family) if r.algorithm == algorithm]
    if not matches:
        raise LabError(
            f"algorithm {algorithm} belongs to family {family}, which ships no config for it "
            f"yet (looked in {FAMILIES[family].configs_dir}/). Pass a YAML file instead."
        )
    named = [r for r in matches if r.name == algorithm]
    if named:
        return named[0]
    return sorted(matches, key=lambda r: (len(r.name), r.name))[0]


def find_recipe(name_or_path: str | Path | Recipe) -> Recipe:
    """Find a recipe by name (``dpo``), ``<family>/<name>``, YAML path, or algorithm name/alias.

    Unknown names raise :class:`LabError` listing close matches.
    """
    if isinstance(name_or_path, Recipe):
        return name_or_path
    if isinstance(name_or_path, Path):
        return recipe_for_file(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise LabError("empty recipe name; try one of: " + ", ".join(_recipe_names()))
    text = name_or_path.strip()
    recipes = list_recipes()

    by_id = {r.id: r for r in recipes}
    if text in by_id:
        return by_id[text]
    if _looks_like_path(text) or _is_file(text):
        return recipe_for_file(text)

    named = [r for r in recipes if r.name == text]
    if len(named) == 1:
        return named[0]
    if len(named) > 1:
        raise LabError(
            f"recipe name {text!r} is ambiguous: {', '.join(r.id for r in named)}. "
            "Use <family>/<name>."
        )
    algo = normalize_algorithm(text)
    if algo is not None:
        return recipe_for_algorithm(algo)

    pool = sorted({r.name for r in recipes} | {r.id for r in recipes} | set(_known_names()))
    close = difflib.get_close_matches(text.lower(), pool, n=4, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise LabError(
        f"unknown recipe {text!r}.{hint} Recipes: {', '.join(_recipe_names())} "
        "(or pass a YAML path)."
    )


def _recipe_names() -> list[str]:
    return [r.name for r in list_recipes()]
