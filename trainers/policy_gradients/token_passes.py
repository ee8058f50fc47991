"""Forward passes over a rollout batch: per-token log-probs (and entropy) of the completion
tokens, PPO's value model, and the no-grad passes that fill π_old / π_ref / values.

Position ids are ``cumsum(attention_mask) − 1``, as the sampling loop uses, so scoring a
left-padded row reproduces the log-probs of its generation. Each pass runs the decoder over a
micro-batch in one of two layouts (:func:`completion_hidden`): packed, each prompt once and its
rows' completions after it in rows without padding between them
(``trainers.core.seq_packing.pack_split_rows``), where that costs fewer token slots and
attention entries; else each distinct prompt once with its cache gathered for its rows
(``trainers.core.logprobs.shared_prompt_hidden``). The values are the same either way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from trainers.core.config import LoraSection
from trainers.core.distributed import any_rank
from trainers.core.logprobs import (
    forward_left_padded,
    hidden_to_token_stats,
    selective_log_softmax,
    shared_prompt_hidden,
    token_entropy,
)
from trainers.core.seq_packing import completion_states, pack_split_rows
from trainers.policy_gradients.experience import Experience


def trim(
    exp_ids: Tensor, attn: Tensor, prompt_lens: Tensor, cmask: Tensor, width_p: int
) -> tuple[Tensor, Tensor, int, int]:
    """Cut the columns every row of a micro-batch pads: returns ids, attn, completion width,
    and the new prompt width."""
    left = width_p - int(prompt_lens.max())
    # the completion columns any row attends (multi-turn: tool replies inside, mask 0 there)
    width_t = max(1, int(attn[:, width_p:].sum(-1).max()))
    ids = exp_ids[:, left : width_p + width_t]
    return ids, attn[:, left : width_p + width_t], width_t, width_p - left


def completion_hidden(
    decoder: nn.Module, input_ids: Tensor, attention_mask: Tensor, width_p: int, pack: bool = True
) -> Tensor:
    """The decoder's hidden states that predict each completion token (B, T, H), T = input
    width − ``width_p``: from packed rows where packing pays (and ``pack``), else from the
    shared-prompt forward (see the module doc). Under torchrun the ranks pack only together
    (FSDP gathers each layer's weights once per forward: every rank must run the same ones)."""
    layout = pack_split_rows(decoder, input_ids, attention_mask, width_p) if pack else None
    if any_rank(layout is None):
        return shared_prompt_hidden(decoder, input_ids[:, :-1], attention_mask[:, :-1], width_p)
    return completion_states(decoder, *layout)


def completion_token_stats(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    width_p: int,
    with_entropy: bool = False,
    pack: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob (and entropy, detached) of every completion position: (B, T) float32 each, with
    T = input width − ``width_p``. A prompt shared by several rows runs once
    (:func:`completion_hidden`, packed where that pays unless ``pack`` is False); the LM head
    runs chunk by chunk
    (recomputed in backward), so the full float32 logits tensor is never built."""
    labels = input_ids[:, width_p:]
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or not isinstance(lm_head, nn.Linear):  # generic fallback
        logits = forward_left_padded(model, input_ids, attention_mask).logits
        logits = logits[:, width_p - 1 : -1]
        logp = selective_log_softmax(logits, labels)
        return logp, (token_entropy(logits) if with_entropy else None)
    hidden = completion_hidden(decoder, input_ids, attention_mask, width_p, pack)
    return hidden_to_token_stats(hidden, lm_head, labels, with_entropy=with_entropy)


class ValueModel(nn.Module):
    """PPO critic: the policy-sized decoder body plus a scalar head on its hidden states.
    ``values[:, t]`` is read from the state that predicts completion token ``t`` (aligned with
    the log-probs)."""

    def __init__(self, causal_lm: nn.Module) -> None:
        super().__init__()
        self.body = causal_lm.get_decoder()
        hidden = causal_lm.config.get_text_config().hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)  # V starts at 0 everywhere
        nn.init.zeros_(self.head.bias)
        self.head.to(device=next(self.body.parameters()).device)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, width_p: int) -> Tensor:
        hidden = completion_hidden(self.body, input_ids, attention_mask, width_p)
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1).float()


def load_value_model(
    name: str, lora: LoraSection | None = None, **load_kwargs: object
) -> ValueModel:
    """A fresh value model on the decoder of causal LM ``name`` (loaded trainable); with
    ``lora`` enabled its body is frozen with adapters of its own and the head trains in full."""
    from trainers.core.lora import add_adapters
    from trainers.core.models import load_causal_lm

    lm = load_causal_lm(name, trainable=True, **load_kwargs)
    if lora is not None:
        lm = add_adapters(lm, lora)
    value = ValueModel(lm)
    del lm
    return value


@torch.no_grad()
def per_token_pass(
    fn: Callable[[Tensor, Tensor, int], Tensor],
    exp: Experience,
    batch_size: int,
    device: torch.device | str,
) -> Tensor:
    """Run ``fn(ids, attn, width_p) -> (b, t)`` over ``exp`` in micro-batches; (N, T) on CPU."""
    n, width_t = exp.num_sequences, exp.completion_mask.shape[1]
    out = torch.zeros((n, width_t), dtype=torch.float32)
    for start in range(0, n, batch_size):
        rows = slice(start, min(start + batch_size, n))
        ids, attn, t, wp = trim(
            exp.input_ids[rows],
            exp.attention_mask[rows],
            exp.prompt_lens[rows],
            exp.completion_mask[rows],
            exp.prompt_width,
        )
        out[rows, :t] = fn(ids.to(device), attn.to(device), wp).float().cpu()
    return out * exp.completion_mask


def sequence_logps(
    model: nn.Module, exp: Experience, batch_size: int, device: torch.device | str
) -> Tensor:
    """Per-token log-probs (N, T) of ``exp``'s completions under ``model``, no grad, in eval mode."""
    was_training = model.training
    model.eval()
    try:
        return per_token_pass(
            lambda ids, attn, wp: completion_token_stats(model, ids, attn, wp)[0],
            exp,
            batch_size,
            device,
        )
    finally:
        model.train(was_training)


def masked_mean_rows(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of each row of ``x`` over its mask (0 for an empty row)."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def explained_variance(
    values: Tensor,
    returns: Tensor,
    mask: Tensor,
    moments: Callable[[Tensor], tuple[float, float] | None] | None = None,
) -> float:
    """1 − Var(R − V) / Var(R) over completion tokens (1 = perfect critic, ≤ 0 = useless).
    ``moments`` (torchrun): the variances pooled over every rank's tokens
    (``trainers.core.distributed.global_moments``)."""
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    if moments is not None:
        pooled_r, pooled_d = moments(r), moments(r - v)
        if pooled_r is None or pooled_r[1] ** 2 <= 1e-12:
            return float("nan")
        var_d = 0.0 if pooled_d is None else pooled_d[1] ** 2
        return float(1.0 - var_d / pooled_r[1] ** 2)
    if r.numel() < 2:
        return float("nan")
    var_r = r.var(unbiased=False)
    if var_r <= 1e-12:
        return float("nan")
    return float(1.0 - (r - v).var(unbiased=False) / var_r)
