"""The catalog: algorithm families, their shipped recipes (one YAML per algorithm or strategy) and
what to watch in each. Reads the trainers' torch-free spec modules and YAML only: no trainer
module (and no torch) is imported here.

A *recipe* is a shipped config file ``trainers/<family>/configs/<name>.yaml``. It is named by its
file stem (``dpo``), by ``<family>/<stem>`` (``direct_alignment/dpo``) or by its path; an
algorithm name or alias (``dr. grpo``, ``bradley-terry``) also finds the recipe that runs it.

:data:`FAMILIES` (from :mod:`rlhf_lab.planning.families`) is the registry the rest of the lab builds on,
derived from the algorithm specs (``trainers/<family>/spec.py``): for each family, where its
pydantic config model lives, which field names the algorithm, the trainer module, the metrics
that show progress, the acceptance criteria of a sanity run and what to watch while it runs.
Aliases, per-algorithm metrics, acceptance criteria and metric directions come from the same
specs (docs/algorithms.md explains them).
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rlhf_lab.errors import InvalidArgument, NextStep, NotFound
from rlhf_lab.planning.families import FAMILIES, FamilyInfo, family_info
from trainers.core.spec import (
    FAMILY_NAMES,
    AlgorithmSpec,
    MetricSpec,
    all_specs,
    family_spec,
    spec_for,
)

EVAL_PREFIX = "eval/"

__all__ = [
    "ALGORITHM_ALIASES",
    "FAMILIES",
    "FamilyInfo",
    "Recipe",
    "acceptance_for",
    "algorithm_family",
    "algorithm_spec",
    "algorithm_of",
    "all_algorithms",
    "family_info",
    "find_recipe",
    "get_dotted",
    "headline_metric",
    "infer_family",
    "key_metrics_for",
    "list_recipes",
    "matched_controls",
    "metric_direction",
    "normalize_algorithm",
    "recipe_for_algorithm",
    "source_root",
    "watch_for",
]


# Free-text names -> canonical algorithm names, from the specs' aliases. Keys are normalised by
# `_norm_key`.
ALGORITHM_ALIASES: dict[str, str] = {
    re.sub(r"\s+", " ", alias.strip().lower()): spec.name
    for spec in all_specs()
    for alias in spec.aliases
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
    cpu_sized: bool = False

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
    return Path(__file__).resolve().parents[2]


def all_algorithms() -> dict[str, str]:
    """Algorithm name -> family, for every registered family."""
    return {algo: fam.name for fam in FAMILIES.values() for algo in fam.algorithms}


def algorithm_family(algorithm: str) -> str:
    family = all_algorithms().get(algorithm)
    if family is None:
        raise NotFound(
            _unknown_algorithm_message(algorithm),
            next=NextStep("list_recipes", note="lists every algorithm by family"),
        )
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


def algorithm_spec(algorithm: str) -> AlgorithmSpec:
    """The spec of an algorithm given by name, spelling variant or alias (a lab error when
    nothing matches)."""
    canon = normalize_algorithm(algorithm)
    if canon is None:
        raise NotFound(
            _unknown_algorithm_message(algorithm),
            next=NextStep("list_recipes", note="lists every algorithm by family"),
        )
    return spec_for(canon)


def _own_spec(family: str, algorithm: str | None) -> AlgorithmSpec | None:
    """The spec of ``algorithm`` when it names one (None for None or an unknown name)."""
    if not algorithm:
        return None
    canon = normalize_algorithm(algorithm)
    return spec_for(canon) if canon is not None else None


def key_metrics_for(family: str, algorithm: str | None = None) -> list[str]:
    """The metrics that show progress for ``family`` (and ``algorithm``): the family's key
    metrics plus the algorithm's own; for a family whose algorithms report different held-out
    metrics (reward models), the training loss and the algorithm's own only."""
    info = family_info(family)
    own = _own_spec(family, algorithm)
    own_names = [m.name for m in own.key_metrics if m.key] if own else []
    replace = family in FAMILY_NAMES and family_spec(family).replace_key_metrics
    if replace and own is not None and own.family == family and own_names:
        metrics = ["loss", *own_names]
    else:
        metrics = list(info.key_metrics) + own_names
    return list(dict.fromkeys(metrics))


def acceptance_for(family: str, algorithm: str | None = None) -> list[str]:
    """What a good sanity run of ``family`` (and ``algorithm``) shows."""
    own = _own_spec(family, algorithm)
    return list(family_info(family).acceptance) + list(own.acceptance if own else ())


def watch_for(family: str, algorithm: str | None = None) -> list[str]:
    """What to look at while a run of ``family`` (and ``algorithm``) runs."""
    own = _own_spec(family, algorithm)
    return list(family_info(family).watch) + list(own.watch if own else ())


def _metric_specs(family: str) -> list[MetricSpec]:
    """Every metric with a declared direction in ``family``: the family's, then its
    algorithms'."""
    spec = family_spec(family)
    out = list(spec.key_metrics)
    for algo in spec.algorithms:
        out.extend(algo.key_metrics)
    return out


def _strip_eval(name: str) -> str:
    return name[len(EVAL_PREFIX) :] if name.startswith(EVAL_PREFIX) else name


def _declared(name: str, family: str) -> tuple[bool, Literal["max", "min"] | None]:
    """(declared?, direction) of a metric (training name or its ``eval/`` twin) in a family."""
    base = _strip_eval(name)
    for metric in _metric_specs(family):
        if _strip_eval(metric.name) == base:
            return True, metric.direction
    return False, None


def metric_direction(name: str, family: str | None = None) -> Literal["max", "min"] | None:
    """Which way is better for metric ``name`` (a training metric or its ``eval/`` twin), read
    from the specs: the family's own declaration first (a policy-gradient loss has none: it
    hovers near 0 whatever the policy does), else the first family that declares a direction,
    else "min" for any ``*loss``; None when no direction is clear (e.g. rejected rewards)."""
    if family in FAMILY_NAMES:
        found, direction = _declared(name, family)
        if found:
            return direction
    for other in FAMILY_NAMES:
        found, direction = _declared(name, other)
        if found and direction is not None:
            return direction
    return "min" if _strip_eval(name).endswith("loss") else None


def matched_controls() -> dict[str, str]:
    """Each algorithm judged against a control -> that control (rejection sampling's
    reward-selected strategies -> their random strategy of the same selection size)."""
    return {
        spec.name: spec.matched_control
        for spec in all_specs()
        if spec.matched_control and not spec.is_control
    }


def headline_metric(family_or_algorithm: str) -> str:
    """The held-out metric that says whether a run worked, for a family or an algorithm (name
    or alias): the algorithm's own when it declares one, else its family's."""
    if family_or_algorithm in FAMILY_NAMES:
        return family_spec(family_or_algorithm).headline_metric
    spec = algorithm_spec(family_or_algorithm)
    return spec.headline_metric or family_spec(spec.family).headline_metric


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


# Recipe flags: a comment line ``# lab: <flag>[, <flag>]`` in a recipe file (the trainers never
# see comments). ``cpu_sized``: the recipe is already a CPU-sized run on a preset, so a shrink
# onto a preset keeps it whole (the tiny SFT warm start). Unknown flags are ignored.
_FLAG_LINE = re.compile(r"^#\s*lab:\s*(.+)$")


def recipe_flags(text: str) -> frozenset[str]:
    """The flags of ``# lab: ...`` comment lines in a recipe file's text."""
    flags: set[str] = set()
    for line in text.splitlines():
        match = _FLAG_LINE.match(line.strip())
        if match:
            head = match.group(1).split("(")[0]
            flags.update(f.strip() for f in head.split(",") if f.strip())
    return frozenset(flags)


def _read(path: Path) -> tuple[dict[str, Any], str, frozenset[str]]:
    """A recipe file's mapping, its first comment line and its flags."""
    # yaml is imported here (commands that read no recipe skip it) and parses with libyaml's
    # safe loader when present: the same documents as yaml.safe_load, about five times faster,
    # which is most of `rlhf-lab recipes`.
    import yaml

    try:
        text = path.read_text()
    except OSError as err:
        raise NotFound(f"cannot read config {path}: {err}") from None
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as err:
        raise InvalidArgument(f"{path} is not valid YAML: {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidArgument(f"{path} must hold a mapping at the top level")
    return data, _first_comment(text), recipe_flags(text)


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
    data, description, flags = _read(path)
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
        cpu_sized="cpu_sized" in flags,
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
        data, _, _ = _read(path)
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
        # No algorithm key: a family whose model validates the file (torch-free models).
        from rlhf_lab.planning.config_models import (
            families_accepting,  # pydantic models: on use only
        )

        fits = families_accepting(data)
        if len(fits) == 1:
            return fits[0]
        candidates = fits
    choices = ", ".join(candidates) if candidates else ", ".join(FAMILIES)
    raise InvalidArgument(
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
        raise NotFound(
            f"config file not found: {path}. Pass an existing YAML file or a recipe name",
            next=NextStep("list_recipes"),
        )
    resolved = Path(path).expanduser().resolve()
    for recipe in list_recipes():
        if recipe.path().resolve() == resolved:
            return recipe
    data, _, _ = _read(resolved)
    family = infer_family(resolved, data)
    return _make_recipe(family, resolved, shipped=False)


def recipe_for_algorithm(algorithm: str) -> Recipe:
    """The shipped recipe that runs ``algorithm`` (the one named after it when several do)."""
    family = algorithm_family(algorithm)
    matches = [r for r in list_recipes(family) if r.algorithm == algorithm]
    if not matches:
        raise NotFound(
            f"algorithm {algorithm} belongs to family {family}, which ships no config for it "
            f"yet (looked in {FAMILIES[family].configs_dir}/). Pass a YAML file instead.",
            next=NextStep("list_recipes", {"family": family}),
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
        raise InvalidArgument(
            "empty recipe name; try one of: " + ", ".join(_recipe_names()),
            next=NextStep("list_recipes"),
        )
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
        raise InvalidArgument(
            f"recipe name {text!r} is ambiguous: {', '.join(r.id for r in named)}. "
            "Use <family>/<name>."
        )
    algo = normalize_algorithm(text)
    if algo is not None:
        return recipe_for_algorithm(algo)

    pool = sorted({r.name for r in recipes} | {r.id for r in recipes} | set(_known_names()))
    close = difflib.get_close_matches(text.lower(), pool, n=4, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise NotFound(
        f"unknown recipe {text!r}.{hint} Recipes: {', '.join(_recipe_names())} "
        "(or pass a YAML path).",
        next=NextStep("list_recipes"),
    )


def _recipe_names() -> list[str]:
    return [r.name for r in list_recipes()]
