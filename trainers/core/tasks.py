"""Reasoning-gym tasks shared by every family: the tag-format system prompt, easy task settings,
answer extraction and scoring, and short worked demonstrations (used by the built-in preference
set, SFT demonstrations, policy-gradient prompts and the rejection-sampling verifier)."""

from __future__ import annotations

import functools
import random
import re
import warnings
from collections.abc import Callable

SYSTEM_PROMPT = (
    "Think about the question step by step inside <think> </think> tags. "
    "Then write only the final answer inside <answer> </answer> tags, "
    "in the format the question asks for."
)
"""System message of the reasoning tasks: reasoning in ``<think>``, final answer in ``<answer>``."""

TASK_CONFIGS: dict[str, dict] = {
    "spell_backward": {"min_word_len": 3, "max_word_len": 7},
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "letter_counting": {"min_words": 3, "max_words": 6},
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 3,
        "min_digits": 1,
        "max_digits": 2,
        "operators": ("+", "-"),
        "allow_parentheses": False,
        "allow_negation": False,
    },
}
"""Easy settings for the known tasks; other reasoning-gym tasks use their default config."""

ANSWER_RE = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def extract_answer(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` block, stripped; None when there is none."""
    matches = ANSWER_RE.findall(text)
    return matches[-1].strip() if matches else None


def import_reasoning_gym():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        import reasoning_gym
    return reasoning_gym


@functools.lru_cache(maxsize=64)
def score_fn(task: str):
    return import_reasoning_gym().get_score_answer_fn(task)


def score_response(response: str, meta: dict) -> float:
    """Score a tag-format response with reasoning-gym; ``meta`` holds ``task`` and ``entry``."""
    return float(score_fn(meta["task"])(extract_answer(response), meta["entry"]))


# ---- per-task reasoning text and wrong answers ---------------------------------------------


def _reason_spell(entry: dict, final: str) -> str:
    word = entry["metadata"]["word"]
    return f"The word is {word}. From the last letter to the first: {' '.join(final)}."


def _wrong_spell(entry: dict, rng: random.Random) -> list[str]:
    answer = entry["answer"]
    word = entry["metadata"]["word"]
    cands = [word]  # forgot to reverse
    positions = [i for i in range(len(answer) - 1) if answer[i] != answer[i + 1]]
    if positions:
        i = rng.choice(positions)
        cands.append(answer[:i] + answer[i + 1] + answer[i] + answer[i + 2 :])
    if len(answer) > 3:
        j = rng.randrange(len(answer))
        cands.append(answer[:j] + answer[j + 1 :])  # a letter dropped
    j = rng.randrange(len(answer))
    cands.append(answer[: j + 1] + answer[j] + answer[j + 1 :])  # a letter doubled
    return cands


def _chain_steps(expression: str) -> list[tuple[str, str, str, int]]:
    tokens = expression.split()
    total = int(tokens[0])
    steps = []
    for op, num in zip(tokens[1::2], tokens[2::2], strict=True):
        before = total
        total = total + int(num) if op == "+" else total - int(num)
        steps.append((str(before), op, num, total))
    return steps


def _reason_chain(entry: dict, final: str) -> str:
    steps = _chain_steps(entry["metadata"]["expression"])
    parts = [f"{a} {op} {b} = {res}" for a, op, b, res in steps[:-1]]
    a, op, b, _ = steps[-1]
    parts.append(f"{a} {op} {b} = {final}")
    return ". ".join(parts) + "."


def _wrong_number(answer: str, rng: random.Random) -> list[str]:
    try:
        value = int(answer)
    except ValueError:
        return []
    cands = [value + 1, value - 1, value + 10, value - 10, value + 2]
    if value != 0:
        cands.append(-value)
    return [str(c) for c in cands]


def _wrong_chain(entry: dict, rng: random.Random) -> list[str]:
    cands = _wrong_number(entry["answer"], rng)
    steps = _chain_steps(entry["metadata"]["expression"])
    a, op, b, _ = steps[-1]
    flipped = int(a) - int(b) if op == "+" else int(a) + int(b)  # last sign misread
    cands.append(str(flipped))
    return cands


def _reason_letters(entry: dict, final: str) -> str:
    letter = entry["metadata"]["target_letter"]
    hits = [(w, w.lower().count(letter)) for w in entry["metadata"]["span"]]
    listed = ", ".join(f"{w} {c}" for w, c in hits if c > 0)
    return f'Words with "{letter}": {listed}. Total {final}.'


def _wrong_letters(entry: dict, rng: random.Random) -> list[str]:
    value = int(entry["answer"])
    cands = [value + 1, value + 2]
    if value > 0:
        cands.append(value - 1)
    return [str(c) for c in cands]


def reason_generic(entry: dict, final: str) -> str:
    return f"I work through the question step by step and get {final}."


def wrong_generic(entry: dict, rng: random.Random) -> list[str]:
    answer = str(entry["answer"])
    cands = _wrong_number(answer, rng)
    if len(answer) >= 2:
        cands.append(answer[1:] + answer[0])
        cands.append(answer[:-1])
    cands.append(answer + answer[-1:] if answer else "0")
    return cands


TASK_KITS: dict[str, tuple[Callable[[dict, str], str], Callable[[dict, random.Random], list]]] = {
    "spell_backward": (_reason_spell, _wrong_spell),
    "chain_sum": (_reason_chain, _wrong_chain),
    "basic_arithmetic": (reason_generic, wrong_generic),
    "letter_counting": (_reason_letters, _wrong_letters),
}


def format_response(reasoning: str, answer: str) -> str:
    return f"<think>{reasoning}</think>\n<answer>{answer}</answer>"
