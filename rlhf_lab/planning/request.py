"""Reading a planning request: the algorithms (or recipes, or a YAML file), the model, the
intent (one run or a comparison) and the tools (multi-turn environments: "with a calculator",
"without tools", "with vs without a calculator") named in free text such as "compare dpo and
ipo on tiny", and the recipe each named algorithm plans with. Torch-free."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, Field

from rlhf_lab.errors import InvalidArgument, NextStep, NotFound
from rlhf_lab.paths import LabError
from rlhf_lab.planning.catalog import (
    ALGORITHM_ALIASES,
    Recipe,
    all_algorithms,
    close_algorithm_matches,
    find_recipe,
    list_recipes,
    normalize_algorithm,
    recipe_for_algorithm,
)

_COMPARE_WORDS = re.compile(r"\b(compare|comparison|vs\.?|versus|against)\b")


# Algorithm names too common as plain words to be read from free text ("dpo on my preference
# data"); aliases such as "preference rm" or "reward model" still name them.
_TEXT_EXCLUDED = {"preference"}


def _phrases() -> dict[str, str]:
    """Phrase -> 'algo:<name>' or 'recipe:<id>', for matching inside free text."""
    out: dict[str, str] = {}
    for algo in all_algorithms():
        if algo in _TEXT_EXCLUDED:
            continue
        out[algo] = f"algo:{algo}"
        out[algo.replace("_", " ")] = f"algo:{algo}"
        out[algo.replace("_", "-")] = f"algo:{algo}"
    for alias, algo in ALGORITHM_ALIASES.items():
        out[alias] = f"algo:{algo}"
    for recipe in list_recipes():
        out.setdefault(recipe.name, f"recipe:{recipe.id}")
        out.setdefault(recipe.name.replace("_", " "), f"recipe:{recipe.id}")
        out[recipe.id] = f"recipe:{recipe.id}"
    return out


def _find_targets(text: str) -> list[str]:
    """Algorithms / recipes named in ``text``, in order, longest phrases first."""
    low = text.lower()
    hits: list[tuple[int, int, str]] = []
    for phrase, target in _phrases().items():
        pattern = r"(?<![a-z0-9_./-])" + re.escape(phrase) + r"s?(?![a-z0-9_/-])"
        for m in re.finditer(pattern, low):
            hits.append((m.start(), m.end(), target))
    hits.sort(key=lambda h: (-(h[1] - h[0]), h[0]))
    taken: list[tuple[int, int, str]] = []
    for start, end, target in hits:
        if all(end <= s or start >= e for s, e, _ in taken):
            taken.append((start, end, target))
    ordered = [t for _, _, t in sorted(taken)]
    return list(dict.fromkeys(ordered))


_PRESET_RE = re.compile(r"(?<![a-z0-9_-])(tiny-llama|tiny)(?![a-z0-9_-])")


_SMALL_RE = re.compile(r"\b(?:on|with|using)\s+(?:the\s+)?small\b|\bsmall\s+(?:model|preset)\b")


_HUB_RE = re.compile(r"(?<![\w./-])([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?![\w/-])")


_PATH_RE = re.compile(r"(?:^|\s)((?:\.{1,2}/|/|~/)\S+)")


def _find_model(text: str) -> str | None:
    low = text.lower()
    m = _PRESET_RE.search(low)
    if m:
        return m.group(1)
    if _SMALL_RE.search(low):
        return "small"
    for m in _PATH_RE.finditer(text):
        candidate = m.group(1).rstrip(".,;")
        p = Path(candidate).expanduser()
        if p.exists() and not candidate.endswith((".yaml", ".yml")):
            return candidate
    recipe_ids = {r.id for r in list_recipes()}
    for m in _HUB_RE.finditer(text):
        candidate = m.group(1).rstrip(".,;")
        if candidate in recipe_ids or candidate.endswith((".yaml", ".yml")):
            continue
        if candidate.split("/")[0] in {"trainers", "experiments"}:
            continue
        if not re.search(r"[A-Z0-9]", candidate):  # "and/or" is no model id
            continue
        return candidate
    return None


def _find_config_path(text: str) -> str | None:
    for token in text.split():
        token = token.strip(",;\"'")
        if token.endswith((".yaml", ".yml")) and Path(token).expanduser().is_file():
            return token
    return None


# Tools named in free text (issue #28): phrase -> the environment (trainers/core/environments)
_TOOL_ENVS = {
    "calculator": "calculator",
    "calc": "calculator",
    "tool": "calculator",
    "tools": "calculator",
    "tool use": "calculator",
    "tool-use": "calculator",
    "python": "python",
    "python tool": "python",
    "python interpreter": "python",
    "python sandbox": "python",
    "code interpreter": "python",
}
_ARTICLE = r"(?:an?\s+|the\s+|any\s+)?"
_TOOL = "(" + "|".join(sorted(map(re.escape, _TOOL_ENVS), key=len, reverse=True)) + r")\b"
_WITH_AND_WITHOUT = re.compile(
    r"\bwith\s*(?:/|vs\.?|versus|and|or)\s*without\s+" + _ARTICLE + _TOOL
)
_WITH_TOOL = re.compile(r"\b(?:with|using|plus)\s+" + _ARTICLE + _TOOL)
_WITHOUT_TOOL = re.compile(r"\b(?:without|no)\s+" + _ARTICLE + _TOOL)
_AND_WITHOUT = re.compile(r"\b(?:vs\.?|versus|and|or)\s+without\b")


def _find_envs(text: str) -> list[str | None]:
    """The environments a request asks for, in order, None standing for "no tool": [] when the
    text names no tool; ["calculator"] for "with a calculator"; [None] for "without a
    calculator" / "no tools"; ["calculator", None] for "with vs without a calculator" (and
    "with a calculator vs without")."""
    low = text.lower()
    both = _WITH_AND_WITHOUT.search(low)
    if both:
        return [_TOOL_ENVS[both.group(1)], None]
    envs: list[str | None] = [_TOOL_ENVS[m.group(1)] for m in _WITH_TOOL.finditer(low)]
    if _WITHOUT_TOOL.search(low) or (envs and _AND_WITHOUT.search(low)):
        envs.append(None)
    return list(dict.fromkeys(envs))


class ParsedRequest(BaseModel):
    targets: list[str] = Field(description="'algo:<name>' / 'recipe:<id>' / 'path:<file>'")
    model: str | None
    compare: bool
    envs: list[str | None] = Field(
        default_factory=list,
        description="tools asked for ('with a calculator': calculator; 'without': None); "
        "empty when the text names none",
    )


def parse_request(text: str) -> ParsedRequest:
    """Algorithms (or recipes / a YAML path), model and intent named in a free-text request."""
    targets = _find_targets(text)
    path = _find_config_path(text)
    if path:
        targets.insert(0, f"path:{path}")
    envs = _find_envs(text)
    return ParsedRequest(
        targets=targets,
        model=_find_model(text),
        compare=bool(_COMPARE_WORDS.search(text.lower())) or len(targets) > 1 or len(envs) > 1,
        envs=envs,
    )


def no_algorithm_error(text: str) -> LabError:
    close: list[str] = []
    for word in re.findall(r"[a-z][a-z0-9_.-]{2,}", text.lower()):
        for m in close_algorithm_matches(word, n=2):
            if m not in close:
                close.append(m)
    hint = f" Did you mean: {', '.join(close[:5])}?" if close else ""
    return InvalidArgument(
        f"no algorithm found in {text!r}.{hint} Name one, e.g. 'dpo sanity check', "
        f"'compare dpo and ipo', 'grpo on tiny'. Algorithms: {', '.join(all_algorithms())}",
        next=NextStep("list_recipes", note="lists every algorithm by family"),
    )


def recipe_of(target: str) -> Recipe:
    kind, _, value = target.partition(":")
    if kind == "algo":
        return recipe_for_algorithm(value)
    return find_recipe(value)


def recipe_from_algorithm_arg(algorithm: str) -> Recipe:
    canon = normalize_algorithm(algorithm)
    if canon is not None:
        return recipe_for_algorithm(canon)
    try:
        return find_recipe(algorithm)
    except LabError:
        pass
    close = close_algorithm_matches(algorithm)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise NotFound(
        f"unknown algorithm {algorithm!r}.{hint} Algorithms: {', '.join(all_algorithms())}",
        next=NextStep("list_recipes", note="lists every algorithm by family"),
    )
