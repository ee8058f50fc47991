"""Held-out gold evaluation for offline direct alignment: what the verifier says of the policy's
GREEDY answers, and how far the policy has drifted from the reference, at every eval point.

On by ``eval.gold_prompts > 0`` (off by default) and only on ``builtin:reasoning-preferences``,
whose held-out records carry their reasoning-gym question and answer. The DPO-overoptimisation
question ("does the true score rise and then fall as the policy drifts?") needs both numbers at
the same points: the gold score and the KL to the reference.

At each eval point (step 0 included, before any update), on the same ``eval.gold_prompts``
held-out prompts:

* **gold**: one greedy completion per prompt (``trainers.core.onpolicy.sample_policy``, the
  decoding engine of the other families; all the prompts in one batch) scored by the online-DPO ranker
  (``trainers.direct_alignment.online.Ranker``, the reasoning-gym verifier of the policy-gradient
  family): ``eval/gold_correctness`` = the share of prompts answered right (correctness 1.0),
  ``eval/gold_reward`` (the same number, the key the lab's overoptimisation rule reads),
  ``eval/gold_format`` (mean format score), ``eval/gold_length`` (mean greedy length in tokens),
  ``eval/num_prompts``;
* **KL**: one completion per prompt SAMPLED at temperature 1 from the policy (a separate draw,
  its RNG fixed by the seed and the step), scored under the policy and the reference:
  ``eval/kl_ref`` = mean over prompts of Σ_t (log π(y_t|…) − log π_ref(y_t|…)) over the sampled
  tokens — the standard Monte-Carlo estimate of KL(π ‖ π_ref) per sequence (unbiased; a single
  prompt's value can be negative, the mean tends to the true KL) — and ``eval/sqrt_kl`` =
  √max(kl_ref, 0). The reference is the base with the adapters off under LoRA
  (``trainers.core.lora.reference_view``), else a frozen copy of the starting model.

Per prompt, each event appends one line to ``eval_gold.jsonl`` in the run folder: the step, the
tasks, the greedy completions, their correctness / right flags / format, and the per-prompt KL,
so the lab can pair prompts between two eval points. A resumed run may write an event twice:
readers keep the last line per step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from trainers.core.decoding import GREEDY, Sampling
from trainers.core.logprobs import split_completion_logps, split_rows
from trainers.core.lora import reference_view
from trainers.core.onpolicy import pad_id_of, sample_policy, step_generator
from trainers.core.rundir import append_jsonl
from trainers.direct_alignment.online import OnlinePrompt, Ranker, body_text, prompt_rows

GOLD_FILE = "eval_gold.jsonl"
KL_SAMPLING = Sampling(temperature=1.0)  # the policy itself: no temperature, no filter
# The KL sample's RNG is apart from any other draw of the run (the seed and the step fix it).
KL_SEED_OFFSET = 7_919


def gold_prompt_rows(cfg, tokenizer: Any, eval_records: list[Any]) -> list[OnlinePrompt]:
    """The first ``eval.gold_prompts`` distinct held-out prompts that carry a reasoning-gym
    entry, their ids cut to leave ``eval.gold_max_new_tokens`` within ``data.max_length``."""
    scorable = [r for r in eval_records if (r.meta or {}).get("entry")]
    rows = prompt_rows(cfg, tokenizer, scorable, max_new_tokens=cfg.eval.gold_max_new_tokens)
    return rows[: cfg.eval.gold_prompts]


@torch.no_grad()
def sequence_logps(
    model, prompts: list[list[int]], completions: list[list[int]], pad_id: int, batch_size: int
) -> Tensor:
    """Summed log-prob of each completion given its prompt under ``model`` (N,), float32."""
    device = next(model.parameters()).device
    out = []
    for s in range(0, len(prompts), batch_size):
        ids, attn, cmask, width = split_rows(
            prompts[s : s + batch_size], completions[s : s + batch_size], pad_id
        )
        sums, _ = split_completion_logps(
            model, ids.to(device), attn.to(device), width, cmask.to(device)
        )
        out.append(sums.float().cpu())
    return torch.cat(out) if out else torch.zeros(0)


def sampled_kl(
    model,
    ref_model,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_id: int,
    batch_size: int,
) -> Tensor:
    """Per sequence Σ_t log π − log π_ref over ``completions`` (sampled from ``model``): the
    Monte-Carlo estimate of KL(π ‖ π_ref) per sequence. ``ref_model`` None: the policy's base
    with its adapters off."""
    was_training = model.training
    model.eval()
    try:
        policy = sequence_logps(model, prompts, completions, pad_id, batch_size)
        with reference_view(model, ref_model) as ref:
            reference = sequence_logps(ref, prompts, completions, pad_id, batch_size)
    finally:
        model.train(was_training)
    return policy - reference


@dataclass
class GoldEval:
    """What one gold evaluation needs; :meth:`run` does it at a step and returns the metrics."""

    prompts: list[OnlinePrompt]
    ranker: Ranker
    tokenizer: Any
    ref_model: Any  # None under LoRA: the policy's base is the reference
    max_new_tokens: int
    batch_size: int
    seed: int
    out_path: Path | None  # eval_gold.jsonl, None: not written (not the writing rank)
    sample: Callable[..., list[list[int]]] = sample_policy  # draws the completions

    def run(self, model, step: int) -> dict[str, float]:
        """One event: decode every prompt in one batch (a decode step at 32 rows costs a third
        of four steps at 8 on a CPU), score the sampled answers ``batch_size`` rows a pass."""
        ids = [p.ids for p in self.prompts]
        greedy = self.sample(
            model, self.tokenizer, ids, max_new_tokens=self.max_new_tokens, sampling=GREEDY
        )
        parts = self.ranker.score(self.prompts, greedy)
        device = next(model.parameters()).device
        sampled = self.sample(
            model,
            self.tokenizer,
            ids,
            max_new_tokens=self.max_new_tokens,
            sampling=KL_SAMPLING,
            generator=step_generator(device, self.seed + KL_SEED_OFFSET, step),
        )
        pad = pad_id_of(self.tokenizer)
        kl = sampled_kl(model, self.ref_model, ids, sampled, pad, self.batch_size)
        right = (parts["correctness"] == 1.0).float()
        if self.out_path is not None:
            append_jsonl(self.out_path, self.event_line(step, greedy, parts, right, kl))
        return gold_metrics(right, parts["format"], [len(c) for c in greedy], kl)

    def event_line(self, step, greedy, parts, right, kl) -> dict[str, Any]:
        return {
            "step": step,
            "task": [p.meta.get("task") for p in self.prompts],
            "completion": [body_text(self.tokenizer, c, self.ranker.stop_ids) for c in greedy],
            "correctness": parts["correctness"].tolist(),
            "right": right.tolist(),
            "format": parts["format"].tolist(),
            "kl": kl.tolist(),
        }


def gold_metrics(right: Tensor, fmt: Tensor, lengths: list[int], kl: Tensor) -> dict[str, float]:
    """The ``eval/`` gold and KL metrics of one event (see the module doc)."""
    kl_mean = float(kl.mean())
    correctness = float(right.mean())
    return {
        "eval/gold_correctness": correctness,
        "eval/gold_reward": correctness,
        "eval/gold_format": float(fmt.mean()),
        "eval/gold_length": sum(lengths) / len(lengths),
        "eval/num_prompts": float(len(lengths)),
        "eval/kl_ref": kl_mean,
        "eval/sqrt_kl": math.sqrt(max(kl_mean, 0.0)),
    }


def build_gold_eval(cfg, tokenizer, eval_records, ref_model, out_path, runtime):
    """The run's :class:`GoldEval`, or None when it is off or no held-out prompt is scorable.
    ``runtime``: (device, dtype, attn). The ranker is the verifier alone (no reward model)."""
    if cfg.eval.gold_prompts <= 0:
        return None
    prompts = gold_prompt_rows(cfg, tokenizer, eval_records)
    if not prompts:
        return None
    verifier_only = cfg.model_copy(
        update={"reward": cfg.reward.model_copy(update={"model": None, "verifier": True})}
    )
    return GoldEval(
        prompts=prompts,
        ranker=Ranker(verifier_only, tokenizer, *runtime),
        tokenizer=tokenizer,
        ref_model=ref_model,
        max_new_tokens=cfg.eval.gold_max_new_tokens,
        batch_size=cfg.eval.eval_batch_size,
        seed=cfg.seed,
        out_path=out_path,
    )
