"""The shrink's gold-evaluation rule for offline direct alignment on a pretrained model. Torch-free.

An offline DPO-family run on the built-in reasoning preferences
(``builtin:reasoning-preferences``) has held-out prompts with reference answers, so the trainer
can score the policy's greedy answers with the verifier and measure its KL to the reference at
each evaluation (``trainers/direct_alignment/gold.py``): the numbers an overoptimisation study
plots (gold against √KL). For such a run the shrink:

* turns it on for :data:`GOLD_PROMPTS` held-out prompts (at most ``data.eval_size``), with
  :data:`GOLD_NEW_TOKENS` new tokens per answer: the set's chosen answers (reasoning in
  ``<think>``, the answer in ``<answer>``) are 32 tokens at the median and 39 at the 90th
  percentile with SmolLM2's tokenizer (42 at most, 200 records), and 64 is ~1.6× that 90th
  percentile, the issue's rule for generation limits; every token of the limit costs two
  decode steps per evaluation (greedy and sampled);
* evaluates :data:`GOLD_EVAL_POINTS` times along training besides step 0 (``eval.eval_every`` =
  ⌈steps / 6⌉), so the curve has a shape.

Any ``eval.gold_prompts`` or ``eval.eval_every`` of the user's wins (``eval.gold_prompts=0``
turns it off). ``checkpoint.save_final_model`` is the shrink's to keep (it is, whenever an
evaluation is proposed).
"""

from __future__ import annotations

import math
from typing import Any

from rlhf_lab.planning.overrides import Override

__all__ = ["GOLD_EVAL_POINTS", "GOLD_NEW_TOKENS", "GOLD_PROMPTS", "gold_eval_rules"]

GOLD_PROMPTS = 32
GOLD_NEW_TOKENS = 64
GOLD_EVAL_POINTS = 6
_BUILTIN = "builtin:reasoning-preferences"
_ONLINE = "online_dpo"  # samples its own pairs and scores greedy answers already


def _steps(r: Any, user: list[Override]) -> int | None:
    """Optimizer steps of the config as the shrink leaves it, the user's overrides applied."""
    from rlhf_lab.planning.steps import expected_optimizer_steps

    try:
        config = r.preview(*user)
    except (ValueError, KeyError):
        return None
    return expected_optimizer_steps("direct_alignment", config)[0]


def gold_eval_rules(
    r: Any, family: str, algorithm: str, user: list[Override], notes: list[str]
) -> None:
    """Gold evaluation on for an offline direct-alignment run on the built-in reasoning
    preferences (module doc); nothing for any other run or when the user set it."""
    keys = {o.key for o in user}
    if family != "direct_alignment" or algorithm == _ONLINE or "eval.gold_prompts" in keys:
        return
    if r.get("eval.gold_prompts") is None or not str(r.get("data.dataset") or "").startswith(
        _BUILTIN
    ):
        return  # a config without the field, or prompts the verifier cannot score
    prompts = min(GOLD_PROMPTS, int(r.get("data.eval_size") or 0))
    if prompts <= 0:
        return
    r.set("eval.gold_prompts", prompts)
    r.set("eval.gold_max_new_tokens", GOLD_NEW_TOKENS)
    steps = _steps(r, user)
    every = max(1, math.ceil(steps / GOLD_EVAL_POINTS)) if steps else None
    if every and "eval.eval_every" not in keys:
        r.set("eval.eval_every", every)
    if "eval.eval_every" in keys:  # the user's own schedule, not the rule's
        every = next(o.text.split("=", 1)[1].strip() for o in user if o.key == "eval.eval_every")
    when = f"every {every} steps and at step 0" if every else "at every evaluation"
    notes.append(
        f"gold evaluation on: the verifier scores greedy answers ({GOLD_NEW_TOKENS} new tokens) "
        f"to {prompts} held-out prompts and the KL to the reference is measured on sampled "
        f"ones, {when} (eval/gold_correctness, eval/kl_ref); eval.gold_prompts=0 turns it off"
    )
