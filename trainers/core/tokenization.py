"""Chat-template tokenisation and padding shared by every family's data module.

* :func:`chat_template_ids`: conversations -> token ids through the tokenizer's chat template
  (one batched call); :func:`require_chat_template` fails early with the family's advice.
* :func:`response_ids`: the ids of a response = the template of prompt + response minus the
  prompt's ids, with the text + eos fallback for templates that rewrite earlier turns.
* :func:`right_pad`: sequences of ids -> right-padded ``(ids, attention mask)`` long tensors.
* :func:`same_tokenizer`: whether two tokenizers give the same ids (a teacher, a reward model).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch

__all__ = [
    "TEMPLATE_CHUNK",
    "chat_template_ids",
    "chunks",
    "extends",
    "require_chat_template",
    "response_ids",
    "right_pad",
    "same_tokenizer",
    "text_ids",
    "token_id_lists",
]

T = TypeVar("T")

TEMPLATE_CHUNK = 256
"""Records sent to the chat template per batched call (bounds memory, keeps calls few)."""


def chunks(items: Sequence[T], size: int = TEMPLATE_CHUNK) -> Iterator[Sequence[T]]:
    """Consecutive slices of ``items`` of ``size`` (the last one may be shorter)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def token_id_lists(output: Any) -> list:
    """``apply_chat_template(tokenize=True)`` output -> plain lists (transformers 5.x returns a
    ``BatchEncoding``, 4.x a list; tensors become lists)."""
    if isinstance(output, dict) or hasattr(output, "input_ids"):
        output = output["input_ids"]
    if hasattr(output, "tolist"):
        output = output.tolist()
    return list(output)


def chat_template_ids(
    tokenizer: Any, conversations: list[list[dict]], add_generation_prompt: bool
) -> list[list[int]]:
    """Token ids of each conversation through the tokenizer's chat template (one batched call)."""
    if not conversations:
        return []
    out = tokenizer.apply_chat_template(
        conversations, add_generation_prompt=add_generation_prompt, tokenize=True
    )
    return [list(ids) for ids in token_id_lists(out)]


def require_chat_template(tokenizer: Any, usage: str) -> None:
    """Raise ValueError when ``tokenizer`` has no chat template; ``usage`` says who needs it
    and what to do (e.g. "SFT formats conversations with apply_chat_template. Set ...")."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"the tokenizer has no chat template; {usage}")


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Ids of plain ``text`` with no special tokens added."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def extends(full: Sequence[int], prefix: Sequence[int]) -> bool:
    """Whether ``full`` is ``prefix`` followed by at least one more token."""
    return len(full) > len(prefix) and list(full[: len(prefix)]) == list(prefix)


def response_ids(
    tokenizer: Any, prompt: list[int], full: list[int], text: str
) -> tuple[list[int], bool]:
    """(the response's ids, whether the fallback was used).

    Normally ``full`` (the template of prompt + response) extends ``prompt`` (the template with
    the generation prompt), and the response is what follows: its content and the template's
    end-of-turn token(s). A template that breaks this prefix property gets the response text's
    own ids + eos instead.
    """
    if extends(full, prompt):
        return full[len(prompt) :], False
    ids = text_ids(tokenizer, text)
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.append(eos)
    return ids, True


def right_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask): (N, T) long tensors, T = the longest sequence, each row's tokens
    first and ``pad_id`` after them (mask 1 on real tokens)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(list(seq), dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids, mask


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers turn text and chats into the same ids (same class, vocabulary,
    special tokens and chat template)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if getattr(a, "chat_template", None) != getattr(b, "chat_template", None):
        return False
    if list(a.all_special_ids) != list(b.all_special_ids):
        return False
    return a.get_vocab() == b.get_vocab()
