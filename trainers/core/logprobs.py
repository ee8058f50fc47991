"""Token log-probabilities without a full-vocabulary float32 log_softmax.

log p(label) = logit[label] - logsumexp(logits). We compute it chunk by chunk along the sequence,
casting only one chunk of logits to float32 at a time. When the model's hidden states are
available, :func:`completion_logps` goes one step further: it applies the LM head per chunk
(under activation checkpointing while training), so the full (batch, seq, vocab) logits tensor
is never built, in any dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK = 256  # sequence positions per chunk


def _chunk_logps(logits: Tensor, labels: Tensor) -> Tensor:
    logits = logits.float()
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def selective_log_softmax(
    logits: Tensor, labels: Tensor, chunk_size: int = DEFAULT_CHUNK
) -> Tensor:
    """``log_softmax(logits.float())`` gathered at ``labels``; (B, T, V), (B, T) -> (B, T) fp32."""
    pieces = [
        _chunk_logps(logits[:, s : s + chunk_size], labels[:, s : s + chunk_size])
        for s in range(0, logits.shape[1], chunk_size)
    ]
    return torch.cat(pieces, dim=1)


def _head_chunk_logps(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor
) -> Tensor:
    return _chunk_logps(F.linear(hidden, weight, bias), labels)


def hidden_to_logps(
    hidden: Tensor, lm_head: torch.nn.Linear, labels: Tensor, chunk_size: int = DEFAULT_CHUNK
) -> Tensor:
    """Apply ``lm_head`` chunk by chunk and gather label log-probs. With gradients enabled each
    chunk is recomputed in backward, so only the hidden states are kept alive."""
    pieces = []
    for s in range(0, hidden.shape[1], chunk_size):
        h, y = hidden[:, s : s + chunk_size], labels[:, s : s + chunk_size]
        if torch.is_grad_enabled() and (h.requires_grad or lm_head.weight.requires_grad):
            out = checkpoint(
                _head_chunk_logps, h, lm_head.weight, lm_head.bias, y, use_reentrant=False
            )
        else:
            out = _head_chunk_logps(h, lm_head.weight, lm_head.bias, y)
        pieces.append(out)
    return torch.cat(pieces, dim=1)


def completion_logps(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    loss_mask: Tensor,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[Tensor, Tensor]:
    """Per-sequence summed log-prob of the masked (completion) tokens and their count.

    ``loss_mask`` marks completion tokens aligned with ``input_ids``; position t is predicted
    from positions < t, so the first token can never be scored.
    Returns (sum_logps (B,), n_tokens (B,)), both float32.

    Only the positions that predict a completion token go through the LM head: prompt and
    padding positions (most of a preference batch) never pay for the vocabulary projection or
    its log-softmax, forward or backward.
    """
    labels = input_ids[:, 1:]
    mask = loss_mask[:, 1:].bool()
    counts = mask.sum(-1).float()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is not None and isinstance(lm_head, torch.nn.Linear):
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if bool(mask.any()):
            picked = hidden[:, :-1][mask].unsqueeze(0)  # (1, N, H), row-major over (sequence, t)
            logps = hidden_to_logps(picked, lm_head, labels[mask].unsqueeze(0), chunk_size)[0]
            token_logps = logps.new_zeros(mask.shape).masked_scatter(mask, logps)
        else:  # nothing to score: zeros that stay connected to the graph
            token_logps = hidden[:, :-1, 0].float() * 0.0
    else:  # generic fallback: the model materialises logits, we still avoid fp32 log_softmax
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        token_logps = selective_log_softmax(logits[:, :-1], labels, chunk_size) * mask
    return token_logps.sum(-1), counts
