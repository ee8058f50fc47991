"""The verifier's rewards, shared by every family that scores its own samples against a
reasoning-gym answer (policy gradients, online DPO, distillation's held-out evaluation):
correctness (reasoning-gym's ``score_answer`` on the last ``<answer>`` block), the tag format,
DAPO's soft overlong penalty, and the tag-format check of a whole response.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import Tensor

from trainers.core.tasks import extract_answer, score_fn

FORMAT_TAGS = ("<think>", "</think>", "<answer>", "</answer>")

Verifier = Callable[..., dict[str, Tensor]]
"""What scores verifier prompts: ``(texts, metas, lengths, *, format_weight, penalty)`` -> the
reward parts of :func:`compute_rewards` (which is the trainers' verifier; a learning test may
pass a stand-in with the same signature and keys)."""


def format_score(text: str) -> float:
    """0.25 for each of ``<think>``, ``</think>``, ``<answer>``, ``</answer>`` present anywhere."""
    return 0.25 * sum(tag in text for tag in FORMAT_TAGS)


def correctness_score(text: str, meta: dict) -> float:
    """reasoning-gym's ``score_answer`` on the last ``<answer>`` block (0 when there is none).

    ``meta`` = {"task": name, "entry": the reasoning-gym entry}. Graded for some tasks (for
    spell_backward in reasoning-gym 0.1.25, the share of leading letters in place).
    """
    answer = extract_answer(text)
    if answer is None:
        return 0.0
    return float(score_fn(meta["task"])(answer, meta["entry"]))


def overlong_penalty(length: int, l_max: int, l_cache: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025), with L_safe = l_max − l_cache:

    0 if length ≤ L_safe;  (L_safe − length)/l_cache if L_safe < length ≤ l_max;  −1 beyond.
    """
    if not 0 <= l_cache <= l_max:
        raise ValueError(f"need 0 <= l_cache <= l_max, got l_cache={l_cache}, l_max={l_max}")
    safe = l_max - l_cache
    if length <= safe:
        return 0.0
    if length <= l_max:
        return (safe - length) / l_cache
    return -1.0


def compute_rewards(
    texts: list[str],
    metas: list[dict],
    lengths: list[int],
    *,
    format_weight: float = 0.5,
    penalty: tuple[int, int] | None = None,
) -> dict[str, Tensor]:
    """Reward components of N completions, each a float32 tensor (N,):

    * ``correctness``: :func:`correctness_score`; ``format``: :func:`format_score`;
    * ``penalty``: :func:`overlong_penalty` on the completion length in tokens when ``penalty``
      = (l_max, l_cache) is given (DAPO), else 0;
    * ``binary``: 1.0 iff correctness == 1 and format == 1, else 0.0. Truly 0/1: the book's code
      used correctness·1[format == 1], which lets graded scores (0.05, 0.8, …) through;
    * ``total`` = correctness + format_weight·format + penalty.
    """
    if not len(texts) == len(metas) == len(lengths):
        raise ValueError("texts, metas and lengths must have the same length")
    correct = [correctness_score(t, m) for t, m in zip(texts, metas, strict=True)]
    fmt = [format_score(t) for t in texts]
    pen = [overlong_penalty(n, *penalty) if penalty else 0.0 for n in lengths]
    binary = [1.0 if c == 1.0 and f == 1.0 else 0.0 for c, f in zip(correct, fmt, strict=True)]
    out = {
        "correctness": correct,
        "format": fmt,
        "penalty": pen,
        "binary": binary,
        "total": [c + format_weight * f + p for c, f, p in zip(correct, fmt, pen, strict=True)],
    }
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in out.items()}


def text_rewards(
    texts: list[str], lengths: list[int], *, penalty: tuple[int, int] | None = None
) -> dict[str, Tensor]:
    """The reward parts that need no verifier (prompts without a reference answer): ``format``
    (:func:`format_score`) and ``penalty`` (DAPO's overlong penalty, else 0)."""
    if len(texts) != len(lengths):
        raise ValueError("texts and lengths must have the same length")
    fmt = [format_score(t) for t in texts]
    pen = [overlong_penalty(n, *penalty) if penalty else 0.0 for n in lengths]
    return {
        "format": torch.tensor(fmt, dtype=torch.float32),
        "penalty": torch.tensor(pen, dtype=torch.float32),
    }


_TAG_FORMAT = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)


def has_tag_format(text: str) -> bool:
    """True when ``text`` is exactly one ``<think>…</think>`` block then one non-empty
    ``<answer>…</answer>`` block (surrounding whitespace allowed, nothing else)."""
    text = text.strip()
    match = _TAG_FORMAT.fullmatch(text)
    if match is None or not match.group(2).strip():
        return False
    return all(text.count(tag) == 1 for tag in FORMAT_TAGS)
