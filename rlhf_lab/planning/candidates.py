"""Candidate tasks of the difficulty calibration (:mod:`rlhf_lab.planning.calibration`): a
difficulty ladder per kind of reasoning-gym task (arithmetic, counting, spelling), the easy set
probed when the user named no task, and how a run's configured specs map onto a candidate."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field


class Candidate(BaseModel):
    id: str = Field(description="task/difficulty, e.g. chain_sum/2x1-digit")
    specs: list[dict[str, Any]] = Field(description="reasoning-gym specs, as data.specs takes")


def _one(cid: str, task: str, settings: dict[str, Any]) -> Candidate:
    """A candidate of one reasoning-gym ``task`` with its ``settings``."""
    return Candidate(id=cid, specs=[{"name": task, "weight": 1.0, "config": settings}])


def _sums(terms: tuple[int, int], digits: tuple[int, int]) -> dict[str, Any]:
    return {
        "min_terms": terms[0],
        "max_terms": terms[1],
        "min_digits": digits[0],
        "max_digits": digits[1],
    }


_ARITH = {"operators": ["+", "-"], "allow_parentheses": False, "allow_negation": False}
CANDIDATE_SETS: dict[str, list[Candidate]] = {
    "arithmetic": [
        _one("chain_sum/2x1-digit", "chain_sum", _sums((2, 2), (1, 1))),
        _one("chain_sum/2-3x1-2-digit", "chain_sum", _sums((2, 3), (1, 2))),
        _one("basic_arithmetic/2x1-digit", "basic_arithmetic", {**_sums((2, 2), (1, 1)), **_ARITH}),
        _one(
            "basic_arithmetic/2-3x1-2-digit",
            "basic_arithmetic",
            {**_sums((2, 3), (1, 2)), **_ARITH},
        ),
    ],
    "counting": [
        _one("letter_counting/1-3-words", "letter_counting", {"min_words": 1, "max_words": 3}),
        _one("letter_counting/3-6-words", "letter_counting", {"min_words": 3, "max_words": 6}),
    ],
    "spelling": [
        _one(
            f"spell_backward/3-{n}-letters",
            "spell_backward",
            {"min_word_len": 3, "max_word_len": n},
        )
        for n in (5, 7, 10)
    ],
}
"""Difficulty ladders per kind of reasoning-gym task (easiest first)."""
EASY_SET = [
    "chain_sum/2x1-digit",
    "basic_arithmetic/2x1-digit",
    "letter_counting/1-3-words",
    "chain_sum/2-3x1-2-digit",
    "spell_backward/3-5-letters",
]
"""Probed when the user named no task: the easy end of each ladder, and one step up."""
_TASK_KIND = {
    "chain_sum": "arithmetic",
    "basic_arithmetic": "arithmetic",
    "letter_counting": "counting",
    "spell_backward": "spelling",
}


def _by_id() -> dict[str, Candidate]:
    return {c.id: c for cands in CANDIDATE_SETS.values() for c in cands}


def _same_specs(a: list[dict], b: list[dict]) -> bool:
    def norm(specs: list[dict]) -> str:
        return json.dumps(
            [{"name": s.get("name"), "config": s.get("config") or {}} for s in specs],
            sort_keys=True,
        )

    return norm(a) == norm(b)


def _label(specs: list[dict]) -> str:
    """A candidate id for specs the sets do not hold: the task names and their settings."""
    parts = []
    for s in specs:
        conf = ",".join(f"{k}={v}" for k, v in sorted((s.get("config") or {}).items()))
        parts.append(f"{s.get('name')}[{conf}]" if conf else str(s.get("name")))
    return "+".join(parts)


def as_candidate(specs: list[dict]) -> Candidate:
    """The candidate for ``specs``: one of the sets' when it has the same tasks and settings."""
    for cand in _by_id().values():
        if _same_specs(cand.specs, specs):
            return cand
    return Candidate(id=_label(specs), specs=specs)


def candidates_for(requested: list[dict] | None, configured: list[dict] | None) -> list[Candidate]:
    """What to probe: the requested specs first, then the ladder of its task kind (so a warning
    can name a sibling difficulty); without a request the configured task, then the easy set."""
    by_id = _by_id()
    out: list[Candidate] = []
    if requested:
        out.append(as_candidate(requested))
        for spec in requested:
            out += CANDIDATE_SETS.get(_TASK_KIND.get(str(spec.get("name")), ""), [])
        out += [by_id[c] for c in EASY_SET[:2]]
    else:  # the configured task first: the cost cap never drops it
        if configured:
            out.append(as_candidate(configured))
        out += [by_id[c] for c in EASY_SET]
    return list({c.id: c for c in out}.values())
