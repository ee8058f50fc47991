"""Chat prompts to token ids, and batched chat generation (shared by every family), including
the held-out samples a loop logs; the sampling loop itself is trainers/core/decoding.py."""

from __future__ import annotations

from typing import Any

import torch

from trainers.core.decoding import GREEDY, Sampling, sample_tokens
from trainers.core.loop import round_robin
from trainers.core.tokenization import chat_template_ids  # noqa: F401  (re-exported)
from trainers.core.tokenization import token_id_lists as _token_ids


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """One conversation's ids, ending with the assistant turn's opening (a generation prompt)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return _token_ids(out)


def end_of_turn_ids(tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    for tok in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return sorted(i for i in ids if i is not None)


@torch.no_grad()
def generate_completions(
    model,
    tokenizer,
    prompts: list[list[dict]],
    *,
    max_new_tokens: int = 128,
    do_sample: bool = True,
    temperature: float = 0.7,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float | None = None,
    max_input_tokens: int | None = None,
    batch_size: int = 16,
    samples_per_prompt: int = 1,
) -> list[str]:
    """Generate ``samples_per_prompt`` completions per chat prompt (a prompt's samples
    consecutive, its prefill computed once); returns the decoded texts, cut at the first
    end-of-turn token (special tokens such as <think> are kept). ``batch_size`` counts prompts."""
    sampling = (
        Sampling(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p or 0.0)
        if do_sample
        else GREEDY
    )
    was_training = model.training
    model.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stop_ids = set(end_of_turn_ids(tokenizer))
    texts: list[str] = []
    for start in range(0, len(prompts), batch_size):
        encoded = [chat_prompt_ids(tokenizer, p) for p in prompts[start : start + batch_size]]
        if max_input_tokens:
            encoded = [e[-max_input_tokens:] for e in encoded]
        rows = sample_tokens(
            model,
            encoded,
            max_new_tokens=max_new_tokens,
            stop_ids=stop_ids,
            pad_id=pad_id,
            sampling=sampling,
            repeats=samples_per_prompt,
        )
        for row in rows:
            body = row[:-1] if row and row[-1] in stop_ids else row
            texts.append(tokenizer.decode(body, skip_special_tokens=False))
    model.train(was_training)
    return texts


def sample_held_out(
    model, tokenizer, records: list[Any], event: int, section: Any
) -> tuple[list[Any], list[str]]:
    """The held-out records sample event ``event`` shows (``section.num_samples`` of them, taken
    round-robin) and one completion of each record's ``prompt``, sampled as the eval ``section``
    says (``sample_max_new_tokens``, ``sample_do_sample``, ``sample_temperature``,
    ``sample_top_p``, and ``sample_max_input_tokens`` where the section has it)."""
    n = min(section.num_samples, len(records))
    picked = [records[i] for i in round_robin(len(records), n, event)]
    if not picked:
        return [], []
    completions = generate_completions(
        model,
        tokenizer,
        [r.prompt for r in picked],
        max_new_tokens=section.sample_max_new_tokens,
        do_sample=section.sample_do_sample,
        temperature=section.sample_temperature,
        top_p=section.sample_top_p,
        max_input_tokens=getattr(section, "sample_max_input_tokens", None),
    )
    return picked, completions
