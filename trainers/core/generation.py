"""Batched chat generation with the KV cache and left padding (shared by every family)."""

from __future__ import annotations

import torch


def _token_ids(output):
    """``apply_chat_template(tokenize=True)`` output -> plain lists (transformers 5.x returns a
    ``BatchEncoding``, 4.x a list; tensors become lists)."""
    if isinstance(output, dict) or hasattr(output, "input_ids"):
        output = output["input_ids"]
    if hasattr(output, "tolist"):
        output = output.tolist()
    return list(output)


def chat_template_ids(
    tokenizer, conversations: list[list[dict]], add_generation_prompt: bool
) -> list[list[int]]:
    """Token ids of each conversation through the tokenizer's chat template (one batched call)."""
    if not conversations:
        return []
    out = tokenizer.apply_chat_template(
        conversations, add_generation_prompt=add_generation_prompt, tokenize=True
    )
    return [list(ids) for ids in _token_ids(out)]


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """One conversation's ids, ending with the assistant turn's opening (a generation prompt)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return _token_ids(out)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[row, width - len(seq) :] = 1
    return ids, mask


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
) -> list[str]:
    """Generate one completion per chat prompt; returns the decoded completion texts (cut at the
    first end-of-turn token; special tokens such as <think> are kept)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stop_ids = end_of_turn_ids(tokenizer)
    texts: list[str] = []
    for start in range(0, len(prompts), batch_size):
        encoded = [chat_prompt_ids(tokenizer, p) for p in prompts[start : start + batch_size]]
        if max_input_tokens:
            encoded = [e[-max_input_tokens:] for e in encoded]
        ids, mask = left_pad(encoded, pad_id)
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, use_cache=True)
        if do_sample:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k)
            if min_p:
                kwargs["min_p"] = min_p
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            pad_token_id=pad_id,
            eos_token_id=stop_ids,
            **kwargs,
        )
        for row in out[:, ids.shape[1] :].tolist():
            cut = next((i for i, t in enumerate(row) if t in stop_ids), len(row))
            texts.append(tokenizer.decode(row[:cut], skip_special_tokens=False))
    model.train(was_training)
    return texts
