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


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy of the next-token distribution at each position, detached (a metric):
    logsumexp(z) − Σ softmax(z)·z, on float32 logits."""
    with torch.no_grad():
        lf = logits.float()
        return torch.logsumexp(lf, dim=-1) - (torch.softmax(lf, dim=-1) * lf).sum(-1)


def _head_chunk_stats(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """One chunk through the LM head: label log-probs and, when asked, the entropy computed from
    the same float32 logits (no gradient)."""
    logits = F.linear(hidden, weight, bias).float()
    lse = torch.logsumexp(logits, dim=-1)
    logp = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def hidden_to_token_stats(
    hidden: Tensor,
    lm_head: torch.nn.Linear,
    labels: Tensor,
    chunk_size: int = DEFAULT_CHUNK,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Apply ``lm_head`` chunk by chunk: label log-probs (B, T) float32 and, with
    ``with_entropy``, the detached entropy (B, T) (else None). With gradients enabled each chunk
    is recomputed in backward, so only the hidden states are kept alive."""
    logps: list[Tensor] = []
    entropies: list[Tensor | None] = []
    for s in range(0, hidden.shape[1], chunk_size):
        h, y = hidden[:, s : s + chunk_size], labels[:, s : s + chunk_size]
        if torch.is_grad_enabled() and (h.requires_grad or lm_head.weight.requires_grad):
            lp, ent = checkpoint(
                _head_chunk_stats,
                h,
                lm_head.weight,
                lm_head.bias,
                y,
                with_entropy,
                use_reentrant=False,
            )
        else:
            lp, ent = _head_chunk_stats(h, lm_head.weight, lm_head.bias, y, with_entropy)
        logps.append(lp)
        entropies.append(ent)
    entropy = torch.cat(entropies, dim=1) if with_entropy else None  # type: ignore[arg-type]
    return torch.cat(logps, dim=1), entropy


def hidden_to_logps(
    hidden: Tensor, lm_head: torch.nn.Linear, labels: Tensor, chunk_size: int = DEFAULT_CHUNK
) -> Tensor:
    """Label log-probs through ``lm_head`` chunk by chunk (:func:`hidden_to_token_stats`
    without the entropy)."""
    return hidden_to_token_stats(hidden, lm_head, labels, chunk_size)[0]


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


# ---------------------------------------------------------------------------------------------
# Rows that share a prompt: [left-padded prompt | right-padded completion]
# ---------------------------------------------------------------------------------------------


def padding_sees_itself(module: torch.nn.Module, attention_mask: Tensor) -> Tensor:
    """The attention mask to give ``module`` (a decoder or causal LM) for left-padded rows.

    A left-padding position is a query with no key it may attend to (its keys are padding or in
    its future). Under ``sdpa`` on CUDA such a fully masked row is the one case the kernels do
    not agree on (see ``bench/README.md``, GPU section); the CPU kernels give it zeros. So under
    ``sdpa``, when some row starts with padding, the 2-D mask becomes the equivalent 4-D boolean
    one (causal, padding keys hidden) in which each padding position also sees itself: real
    positions attend exactly as before, and no row is empty. Other attention implementations
    (``eager`` adds a finite minimum; flash-attention unpads) and rows without left padding get
    the 2-D mask back unchanged."""
    config = getattr(module, "config", None)
    if (
        getattr(config, "_attn_implementation", None) != "sdpa"
        or attention_mask.dim() != 2
        or bool(attention_mask[:, 0].all())
    ):
        return attention_mask
    keys = attention_mask.bool()
    width = keys.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=keys.device).tril()
    mask = (causal & keys[:, None, :]) | torch.eye(width, dtype=torch.bool, device=keys.device)
    return mask[:, None]


def position_ids_of(attention_mask: Tensor) -> Tensor:
    """Positions that skip padding: ``cumsum(attention_mask) − 1`` (0 on left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def forward_left_padded(module: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, **kw):
    """``module``'s forward over left-padded rows: positions that skip the padding
    (:func:`position_ids_of`) and a mask in which no query row is empty
    (:func:`padding_sees_itself`). ``kw`` go to the forward (``use_cache``, ...)."""
    return module(
        input_ids=input_ids,
        attention_mask=padding_sees_itself(module, attention_mask),
        position_ids=position_ids_of(attention_mask),
        **kw,
    )


def split_rows(
    prompts: list[list[int]], completions: list[list[int]], pad_id: int
) -> tuple[Tensor, Tensor, Tensor, int]:
    """``[left-padded prompt | right-padded completion]`` rows: (input_ids, attention_mask,
    completion_mask, prompt width). Every row's prompt ends at column ``width_p − 1`` and its
    completion starts at ``width_p``."""
    width_p = max(len(p) for p in prompts)
    width_c = max(1, max(len(c) for c in completions))
    n = len(prompts)
    ids = torch.full((n, width_p + width_c), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width_p + width_c), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, width_p - len(p) : width_p + len(c)] = torch.tensor(p + c, dtype=torch.long)
        attn[i, width_p - len(p) : width_p + len(c)] = 1
    return ids, attn, attn[:, width_p:].clone(), width_p


def _checkpointing(decoder) -> bool:
    return bool(getattr(decoder, "gradient_checkpointing", False)) and decoder.training


def shared_prompt_hidden(decoder, input_ids: Tensor, attention_mask: Tensor, width_p: int):
    """The decoder's last hidden states at positions ``width_p − 1 … width − 1`` of
    ``[left-padded prompt | right-padded completion]`` rows: (B, 1 + T, H). Position
    ``width_p − 1 + t`` predicts completion token ``t``.

    Rows with the same prompt (a GRPO group; the chosen, rejected and KL responses of one
    preference example) share its forward: each distinct prompt runs through the decoder once,
    its KV cache and last hidden state are gathered for every row that has it (a differentiable
    gather), and only the completion tokens run per row. The numbers and gradients are those of
    one forward of the full rows; the prompt's share of the compute is divided by the number of
    rows per distinct prompt. Falls back to the full-row forward when no prompt repeats, and
    under gradient checkpointing (which cannot keep a cache)."""
    prompts = torch.cat([input_ids[:, :width_p], attention_mask[:, :width_p]], dim=1)
    distinct, owner = torch.unique(prompts, dim=0, return_inverse=True)
    if distinct.shape[0] == input_ids.shape[0] or _checkpointing(decoder):
        out = forward_left_padded(decoder, input_ids, attention_mask)
        return out.last_hidden_state[:, width_p - 1 :]
    p_ids, p_mask = distinct[:, :width_p], distinct[:, width_p:]
    prefix = forward_left_padded(decoder, p_ids, p_mask, use_cache=True)
    last = prefix.last_hidden_state[owner, -1:]
    if input_ids.shape[1] == width_p:
        return last
    cache = prefix.past_key_values
    cache.batch_select_indices(owner)  # row i gets its prompt's keys and values
    rest = decoder(
        input_ids=input_ids[:, width_p:],
        attention_mask=attention_mask,
        position_ids=position_ids_of(attention_mask)[:, width_p:],
        past_key_values=cache,
        use_cache=True,
    )
    return torch.cat([last, rest.last_hidden_state], dim=1)


def split_completion_logps(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    width_p: int,
    completion_mask: Tensor,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[Tensor, Tensor]:
    """:func:`completion_logps` for ``[left-padded prompt | right-padded completion]`` rows
    (:func:`split_rows`), with each distinct prompt forwarded once
    (:func:`shared_prompt_hidden`). ``completion_mask`` (B, T) marks the scored completion
    tokens. Returns (sum_logps (B,), n_tokens (B,)), float32."""
    labels = input_ids[:, width_p:]
    mask = completion_mask.bool()
    counts = mask.sum(-1).float()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or not isinstance(lm_head, torch.nn.Linear):  # generic: full rows
        loss_mask = torch.cat([torch.zeros_like(input_ids[:, :width_p]), completion_mask], dim=1)
        return completion_logps(model, input_ids, attention_mask, loss_mask, chunk_size)
    hidden = shared_prompt_hidden(decoder, input_ids[:, :-1], attention_mask[:, :-1], width_p)
    if not bool(mask.any()):
        return (hidden[:, :, 0].float() * 0.0).sum(-1), counts
    picked = hidden[mask].unsqueeze(0)
    logps = hidden_to_logps(picked, lm_head, labels[mask].unsqueeze(0), chunk_size)[0]
    token_logps = logps.new_zeros(mask.shape).masked_scatter(mask, logps)
    return token_logps.sum(-1), counts
