"""Sampling and scoring for the evaluation suites, on the trainers' own loop.

Completions come from :func:`trainers.core.decoding.sample_tokens` (one prefill per prompt, its
KV cache repeated for the prompt's ``n`` samples, stopped rows leaving the batch), exactly as
policy-gradient rollouts are drawn. Every model of one evaluation samples with a fresh
``torch.Generator`` seeded with the config's seed, so target and baseline see the same random
numbers (common random numbers: where the two distributions agree, so do the draws; rows leave
the batch at different steps, so the coupling is partial).

Sequence log-probs (for the KL to the baseline) are those of the trainers' scoring pass
(:func:`trainers.core.logprobs.split_completion_logps`), in float32.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainers.core.decoding import GREEDY, Sampling, sample_tokens
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids
from trainers.core.harness import raise_if_stopping
from trainers.core.logprobs import split_completion_logps, split_rows
from trainers.core.models import load_causal_lm, load_tokenizer
from trainers.evaluation.config import EvalConfig, SamplingSection


@dataclass
class Samples:
    """``n`` completions per prompt, prompt-major (sample ``j`` of prompt ``i`` is row
    ``i * n + j``). ``completion_ids`` end with the end-of-turn token unless ``truncated``."""

    n: int
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    truncated: list[bool]
    texts: list[str]

    def rows_of(self, i: int) -> range:
        return range(i * self.n, (i + 1) * self.n)

    def lengths(self) -> list[int]:
        return [len(c) for c in self.completion_ids]


def to_sampling(s: SamplingSection) -> Sampling:
    if s.greedy:
        return GREEDY
    return Sampling(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p)


def load_policy(name: str, cfg: EvalConfig):
    """(model in eval mode with frozen weights, tokenizer) on the config's device."""
    model = load_causal_lm(
        name,
        device=cfg.device,
        dtype=cfg.dtype,
        attn_implementation=cfg.attn_implementation,
        trainable=False,
    )
    return model, load_tokenizer(name)


def release_memory() -> None:
    """Return freed memory after the caller dropped a model (between models)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def encode_prompts(tokenizer, prompts: list[list[dict]], max_tokens: int | None) -> list[list[int]]:
    encoded = [chat_prompt_ids(tokenizer, p) for p in prompts]
    return [e[-max_tokens:] for e in encoded] if max_tokens else encoded


@torch.no_grad()
def sample(
    model,
    tokenizer,
    prompts: list[list[dict]],
    s: SamplingSection,
    seed: int,
    on_batch: Callable[[], None] | None = None,
) -> Samples:
    """``s.n`` completions of every chat prompt, ``s.batch_size`` prompts per call."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stop_ids = set(end_of_turn_ids(tokenizer))
    encoded = encode_prompts(tokenizer, prompts, s.max_prompt_tokens)
    sampling = to_sampling(s)
    model.eval()
    completions, truncated, texts = [], [], []
    for start in range(0, len(encoded), s.batch_size):
        raise_if_stopping("eval_batch")
        rows = sample_tokens(
            model,
            encoded[start : start + s.batch_size],
            max_new_tokens=s.max_new_tokens,
            stop_ids=stop_ids,
            pad_id=pad_id,
            sampling=sampling,
            repeats=s.n,
            generator=generator,
        )
        for row in rows:
            ended = bool(row) and row[-1] in stop_ids
            completions.append(row)
            truncated.append(not ended)
            body = row[:-1] if ended else row
            texts.append(tokenizer.decode(body, skip_special_tokens=False))
        if on_batch is not None:
            on_batch()
    return Samples(s.n, encoded, completions, truncated, texts)


@torch.no_grad()
def sequence_logps(
    model,
    samples: Samples,
    pad_id: int,
    batch_size: int,
    on_batch: Callable[[], None] | None = None,
) -> list[float]:
    """Summed log-prob of every completion (end-of-turn token included) given its prompt under
    ``model``, one float per row of ``samples``."""
    device = next(model.parameters()).device
    model.eval()
    out: list[float] = []
    n_rows = len(samples.completion_ids)
    for start in range(0, n_rows, batch_size):
        raise_if_stopping("eval_batch")
        rows = range(start, min(start + batch_size, n_rows))
        prompts = [samples.prompt_ids[r // samples.n] for r in rows]
        completions = [samples.completion_ids[r] for r in rows]
        ids, attn, cmask, width_p = split_rows(prompts, completions, pad_id)
        sums, _ = split_completion_logps(
            model, ids.to(device), attn.to(device), width_p, cmask.to(device)
        )
        out.extend(sums.float().cpu().tolist())
        if on_batch is not None:
            on_batch()
    return out
