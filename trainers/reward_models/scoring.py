"""Score texts with a trained reward model (used by rejection sampling and by hand).

    scorer = RewardScorer.from_pretrained("runs/orm-1/final_model")
    scorer.score([[{"role": "user", "content": q}, {"role": "assistant", "content": a}], ...])
    scorer.score(["raw text scored as is", ...])

* ``preference``: the Bradley–Terry reward r (a real number; only differences mean something).
* ``orm``: P(correct) = σ(score at the last token), in (0, 1).
* ``prm``: items are ``{"problem": str, "steps": [str, ...]}``; the score of a solution is the
  smallest per-step probability of "not bad" (one bad step spoils a solution).
  :meth:`RewardScorer.score_steps` gives every step's class probabilities.

A chat conversation is rendered with the tokenizer's chat template, exactly as in training (the
last message should be the assistant's answer); a string is tokenised as is, without special
tokens. Sequences longer than the model's training ``max_length`` keep their last
``max_length`` tokens (the score is read at the end). Scoring runs batched (sorted by length,
right-padded) under ``torch.no_grad`` and returns scores in the input order. A PRM solution
longer than ``max_length`` is scored in windows like in training; a single step (or problem)
too long to fit keeps its last tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trainers.reward_models.data import chat_ids, encode_solution, right_pad, window_solution
from trainers.reward_models.losses import BAD_CLASS
from trainers.reward_models.model import RewardModel, load_reward_model


class RewardScorer:
    def __init__(self, model: RewardModel, tokenizer, batch_size: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        *,
        device="auto",
        dtype="auto",
        attn_implementation: str = "auto",
        batch_size: int = 16,
    ) -> RewardScorer:
        model, tokenizer = load_reward_model(
            folder, device=device, dtype=dtype, attn_implementation=attn_implementation
        )
        return cls(model, tokenizer, batch_size=batch_size)

    @property
    def kind(self) -> str:
        return self.model.kind

    # ------------------------------------------------------------------------------------------

    def encode(self, items: Sequence[str | list[dict]]) -> list[list[int]]:
        """Token ids of each text (as is) or chat conversation (chat template)."""
        ids: list[list[int] | None] = [None] * len(items)
        convs = [(i, x) for i, x in enumerate(items) if isinstance(x, list)]
        for i, x in enumerate(items):
            if isinstance(x, str):
                ids[i] = list(self.tokenizer(x, add_special_tokens=False)["input_ids"])
            elif not isinstance(x, list):
                raise TypeError(
                    f"score() takes strings or chat conversations (lists of messages), got "
                    f"{type(x).__name__}"
                )
        if convs:
            encoded = chat_ids(self.tokenizer, [c for _, c in convs], add_generation_prompt=False)
            for (i, _), e in zip(convs, encoded, strict=True):
                ids[i] = e
        limit = self.model.max_length
        out = []
        for seq in ids:
            if not seq:
                raise ValueError("cannot score an empty text")
            out.append(seq[-limit:] if limit else seq)
        return out

    @torch.no_grad()
    def raw_scores(self, sequences: Sequence[Sequence[int]]) -> list[float]:
        """The scalar head at the last token of each id sequence (preference / orm)."""
        if self.model.num_labels != 1:
            raise ValueError("raw_scores needs a scalar reward model (preference or orm)")
        was_training = self.model.training
        self.model.eval()
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        out = [0.0] * len(sequences)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            ids, mask = right_pad([sequences[i] for i in chunk], self.pad_id)
            s = self.model.sequence_scores(ids.to(self.model.device), mask.to(self.model.device))
            for i, v in zip(chunk, s.float().cpu().tolist(), strict=True):
                out[i] = v
        self.model.train(was_training)
        return out

    def score(self, items: Sequence[Any]) -> list[float]:
        """One float per item (see the module docstring for what it means per kind)."""
        items = list(items)
        if not items:
            return []
        if self.kind == "prm":
            return [min(1.0 - p[BAD_CLASS] for p in probs) for probs in self._prm_items(items)]
        scores = self.raw_scores(self.encode(items))
        if self.kind == "orm":
            return torch.sigmoid(torch.tensor(scores, dtype=torch.float64)).tolist()
        return scores

    # ------------------------------------------------------------------------------------------

    def _prm_items(self, items: Sequence[Any]) -> list[list[list[float]]]:
        for x in items:
            if not (isinstance(x, dict) and "problem" in x and "steps" in x):
                raise TypeError('a PRM scores items {"problem": str, "steps": [str, ...]}')
        return self.score_steps([x["problem"] for x in items], [x["steps"] for x in items])

    @torch.no_grad()
    def score_steps(
        self, problems: Sequence[str], solutions: Sequence[Sequence[str]]
    ) -> list[list[list[float]]]:
        """Per solution, per step: class probabilities ([bad, neutral, good] or [bad, good])."""
        if self.kind != "prm":
            raise ValueError(f"score_steps needs a prm reward model, this one is {self.kind}")
        if self.model.separator is None:
            raise ValueError("the saved PRM has no step separator in reward_model.json")
        limit = self.model.max_length or 10**9
        windows = []  # (solution index, first step, ids, positions)
        for s_idx, (problem, steps) in enumerate(zip(problems, solutions, strict=True)):
            if not steps:
                raise ValueError(f"solution {s_idx} has no steps")
            prompt, pieces = encode_solution(
                self.tokenizer, problem, list(steps), self.model.separator
            )
            if len(prompt) > limit // 2:  # an over-long problem keeps its end
                prompt = prompt[-(limit // 2) :]
            budget = limit - len(prompt)
            pieces = [p[-budget:] for p in pieces]  # an over-long step keeps its end
            found, _ = window_solution(prompt, pieces, limit)
            windows += [(s_idx, first, ids, pos) for ids, pos, first, _ in found]
        was_training = self.model.training
        self.model.eval()
        out: list[list[list[float]]] = [[[] for _ in steps] for steps in solutions]
        for start in range(0, len(windows), self.batch_size):
            chunk = windows[start : start + self.batch_size]
            ids, mask = right_pad([w[2] for w in chunk], self.pad_id)
            logits = self.model(ids.to(self.model.device), mask.to(self.model.device))
            for row, (s_idx, first, _, positions) in enumerate(chunk):
                probs = torch.softmax(logits[row, positions].float(), dim=-1).cpu().tolist()
                for j, p in enumerate(probs):
                    out[s_idx][first + j] = p
        self.model.train(was_training)
        return out
