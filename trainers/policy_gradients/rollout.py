"""The rollout phase: generate, score, and get everything the update needs.

One rollout step, as in the algorithm box:

1. ``generate_group_batch`` — each prompt is prefilled once and its ``num_rollouts``
   completions are sampled from the repeated KV cache (``trainers/core/decoding.py``: left
   padding, temperature / top-k / top-p / min-p). The completion mask ends after the *first*
   end-of-turn token (inclusive).
2. ``score`` — rewards.compute_rewards on the decoded completions (DAPO adds the overlong
   penalty).
3. DAPO only (``rollout_step``): dynamic sampling keeps drawing prompts until
   ``prompts_per_step`` groups with differing correctness are kept, within a bound.
4. ``prepare_update`` — π_old log-probs (only when the update needs them: see
   ``PolicyGradientConfig.needs_old_logps``), reference log-probs (β > 0), PPO values; KL
   shaping of the reward for reinforce / rloo / ppo; advantages.

The result is an :class:`Experience` that lives on the CPU between phases.

Layout of a batch: ``input_ids`` is ``[left-padded prompt | completion, right-padded]``; every row
shares the prompt width ``P``, so completion position ``t`` is column ``P + t`` and all per-token
tensors (``completion_mask``, log-probs, values, advantages) are ``(N, T)``. Position ids are
``cumsum(attention_mask) − 1``, as the sampling loop uses, so scoring a left-padded row reproduces the
log-probs of its generation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from trainers.core.decoding import Sampling, sample_tokens
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids
from trainers.core.logprobs import (
    DEFAULT_CHUNK,
    position_ids_of,
    selective_log_softmax,
    shared_prompt_hidden,
)
from trainers.policy_gradients.advantages import (
    ADVANTAGES,
    gae,
    sequence_reward_to_tokens,
)
from trainers.policy_gradients.config import (
    KL_IN_REWARD,
    PolicyGradientConfig,
)
from trainers.policy_gradients.data import Prompt
from trainers.policy_gradients.losses import kl_estimate
from trainers.policy_gradients.rewards import compute_rewards, dapo_keep_groups


class DynamicSamplingError(RuntimeError):
    """DAPO could not find enough prompt groups with reward contrast within its bound."""


# ---------------------------------------------------------------------------------------------
# The rollout batch
# ---------------------------------------------------------------------------------------------


@dataclass
class Experience:
    """One rollout step's sequences (rows of a prompt's group are contiguous)."""

    input_ids: Tensor  # (N, P+T) long
    attention_mask: Tensor  # (N, P+T) long: prompt tokens + completion up to the first EOT
    prompt_lens: Tensor  # (N,) long: real (unpadded) prompt tokens
    completion_mask: Tensor  # (N, T) float
    truncated: Tensor  # (N,) bool: no end-of-turn token within max_new_tokens
    texts: list[str]
    prompts: list[Prompt]  # per sequence (each prompt repeated G times)
    rewards: dict[str, Tensor] = field(default_factory=dict)  # (N,) each
    old_logps: Tensor | None = None  # (N, T) π_old, when the update needs it
    ref_logps: Tensor | None = None  # (N, T) π_ref, when β > 0
    values: Tensor | None = None  # (N, T) PPO value model at rollout time
    returns: Tensor | None = None  # (N, T) PPO GAE returns
    advantages: Tensor | None = None  # (N, T), zero outside the mask
    shaped_total: Tensor | None = None  # (N,) the reward the advantage used (after KL shaping)

    @property
    def prompt_width(self) -> int:
        return self.input_ids.shape[1] - self.completion_mask.shape[1]

    @property
    def num_sequences(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> Tensor:
        return self.completion_mask.sum(-1)

    def to(self, device) -> Experience:
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                moved[f.name] = value.to(device)
            elif isinstance(value, dict):
                moved[f.name] = {k: v.to(device) for k, v in value.items()}
        return replace(self, **moved)

    def select(self, rows: list[int]) -> Experience:
        """A copy with only ``rows`` (tensors sliced, lists picked)."""
        idx = torch.tensor(rows, dtype=torch.long)
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                picked[f.name] = value[idx]
            elif isinstance(value, dict):
                picked[f.name] = {k: v[idx] for k, v in value.items()}
            elif isinstance(value, list):
                picked[f.name] = [value[i] for i in rows]
        return replace(self, **picked)


def concat_experiences(parts: list[Experience], pad_id: int) -> Experience:
    """Stack rollout batches (before prepare_update) into one, re-padding to a common layout."""
    if len(parts) == 1:
        return parts[0]
    width_p = max(p.prompt_width for p in parts)
    width_t = max(p.completion_mask.shape[1] for p in parts)
    ids, attn, cmask = [], [], []
    for p in parts:
        dp, dt = width_p - p.prompt_width, width_t - p.completion_mask.shape[1]
        ids.append(F.pad(p.input_ids, (dp, dt), value=pad_id))
        attn.append(F.pad(p.attention_mask, (dp, dt), value=0))
        cmask.append(F.pad(p.completion_mask, (0, dt), value=0.0))
    return Experience(
        input_ids=torch.cat(ids),
        attention_mask=torch.cat(attn),
        prompt_lens=torch.cat([p.prompt_lens for p in parts]),
        completion_mask=torch.cat(cmask),
        truncated=torch.cat([p.truncated for p in parts]),
        texts=[t for p in parts for t in p.texts],
        prompts=[q for p in parts for q in p.prompts],
        rewards={k: torch.cat([p.rewards[k] for p in parts]) for k in parts[0].rewards},
    )


def assemble(
    prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Lay out sequences as [left-padded prompt | right-padded completion].
    Returns input_ids, attention_mask, prompt_lens, completion_mask."""
    n = len(prompt_ids)
    width_p = max(len(p) for p in prompt_ids)
    width_t = max(1, max(len(c) for c in completion_ids))
    ids = torch.full((n, width_p + width_t), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width_p + width_t), dtype=torch.long)
    cmask = torch.zeros((n, width_t), dtype=torch.float32)
    for row, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        ids[row, width_p - len(p) : width_p] = torch.tensor(p, dtype=torch.long)
        attn[row, width_p - len(p) : width_p] = 1
        if c:
            ids[row, width_p : width_p + len(c)] = torch.tensor(c, dtype=torch.long)
            attn[row, width_p : width_p + len(c)] = 1
            cmask[row, : len(c)] = 1.0
    lens = torch.tensor([len(p) for p in prompt_ids], dtype=torch.long)
    return ids, attn, lens, cmask


def cut_at_first_stop(tokens: list[int], stop_ids: set[int]) -> tuple[list[int], bool]:
    """Completion tokens up to and including the first end-of-turn token; and whether it was
    truncated (no end-of-turn token at all)."""
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return tokens[: i + 1], False
    return tokens, True


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------


def _sampling(cfg: PolicyGradientConfig) -> Sampling:
    rc = cfg.rollout
    return Sampling(
        temperature=rc.temperature, top_k=rc.top_k, top_p=rc.top_p, min_p=rc.min_p or 0.0
    )


@torch.no_grad()
def generate_group_batch(
    model, tokenizer, prompts: list[Prompt], cfg: PolicyGradientConfig
) -> Experience:
    """``num_rollouts`` sampled completions per prompt (rows of a group contiguous). Each prompt
    is prefilled once and its KV cache repeated for the group (trainers/core/decoding.py)."""
    rc = cfg.rollout
    G = rc.num_rollouts
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stop_ids = set(end_of_turn_ids(tokenizer))
    sampling = _sampling(cfg)
    groups_per_call = max(1, (rc.generation_batch_size or len(prompts) * G) // G)

    was_training = model.training
    model.eval()
    prompt_rows, completion_rows, truncated, texts, owners = [], [], [], [], []
    for start in range(0, len(prompts), groups_per_call):
        chunk = prompts[start : start + groups_per_call]
        encoded = [chat_prompt_ids(tokenizer, p.messages) for p in chunk]
        new_tokens = sample_tokens(
            model,
            encoded,
            max_new_tokens=rc.max_new_tokens,
            stop_ids=stop_ids,
            pad_id=pad_id,
            sampling=sampling,
            repeats=G,
        )
        for row, tokens in enumerate(new_tokens):
            kept, cut = cut_at_first_stop(tokens, stop_ids)
            prompt_rows.append(encoded[row // G])
            completion_rows.append(kept)
            truncated.append(cut)
            body = kept if cut else kept[:-1]
            texts.append(tokenizer.decode(body, skip_special_tokens=True))
            owners.append(chunk[row // G])
    model.train(was_training)
    ids, attn, lens, cmask = assemble(prompt_rows, completion_rows, pad_id)
    return Experience(
        input_ids=ids,
        attention_mask=attn,
        prompt_lens=lens,
        completion_mask=cmask,
        truncated=torch.tensor(truncated, dtype=torch.bool),
        texts=texts,
        prompts=owners,
    )


@torch.no_grad()
def greedy_completions(
    model, tokenizer, prompts: list[Prompt], max_new_tokens: int, batch_size: int
) -> tuple[list[str], list[int], list[bool]]:
    """Greedy completions for held-out evaluation: (texts, lengths, truncated)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stop_ids = set(end_of_turn_ids(tokenizer))
    was_training = model.training
    model.eval()
    texts, lengths, truncated = [], [], []
    for start in range(0, len(prompts), batch_size):
        rows = [chat_prompt_ids(tokenizer, p.messages) for p in prompts[start : start + batch_size]]
        new_tokens = sample_tokens(
            model, rows, max_new_tokens=max_new_tokens, stop_ids=stop_ids, pad_id=pad_id
        )
        for tokens in new_tokens:
            kept, cut = cut_at_first_stop(tokens, stop_ids)
            lengths.append(len(kept))
            truncated.append(cut)
            texts.append(tokenizer.decode(kept if cut else kept[:-1], skip_special_tokens=True))
    model.train(was_training)
    return texts, lengths, truncated


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------


def score(exp: Experience, cfg: PolicyGradientConfig) -> dict[str, Tensor]:
    penalty = (cfg.loss.l_max, cfg.loss.l_cache) if cfg.algorithm == "dapo" else None
    return compute_rewards(
        exp.texts,
        [p.meta for p in exp.prompts],
        [int(n) for n in exp.lengths.tolist()],
        format_weight=cfg.reward.format_weight,
        penalty=penalty,
    )


# ---------------------------------------------------------------------------------------------
# Per-token log-probs (and entropy) of completion tokens
# ---------------------------------------------------------------------------------------------


def _head_chunk(hidden, weight, bias, labels, with_entropy: bool):
    logits = F.linear(hidden, weight, bias).float()
    lse = torch.logsumexp(logits, dim=-1)
    logp = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, None
    with torch.no_grad():  # a metric: no gradient, computed from the same logits chunk
        entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def trim(exp_ids: Tensor, attn: Tensor, prompt_lens: Tensor, cmask: Tensor, width_p: int):
    """Cut the columns every row of a micro-batch pads: returns ids, attn, completion width,
    and the new prompt width."""
    left = width_p - int(prompt_lens.max())
    width_t = max(1, int(cmask.sum(-1).max()))
    ids = exp_ids[:, left : width_p + width_t]
    return ids, attn[:, left : width_p + width_t], width_t, width_p - left


def completion_token_stats(
    model, input_ids: Tensor, attention_mask: Tensor, width_p: int, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Log-prob (and entropy, detached) of every completion position: (B, T) float32 each, with
    T = input width − ``width_p``. A prompt shared by several rows runs once
    (``trainers.core.logprobs.shared_prompt_hidden``); the LM head runs chunk by chunk
    (recomputed in backward), so the full float32 logits tensor is never built."""
    labels = input_ids[:, width_p:]
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or not isinstance(lm_head, nn.Linear):  # generic fallback
        pos = position_ids_of(attention_mask)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos).logits
        logits = logits[:, width_p - 1 : -1]
        logp = selective_log_softmax(logits, labels)
        entropy = None
        if with_entropy:
            with torch.no_grad():
                lf = logits.float()
                entropy = torch.logsumexp(lf, -1) - (torch.softmax(lf, -1) * lf).sum(-1)
        return logp, entropy
    hidden = shared_prompt_hidden(decoder, input_ids[:, :-1], attention_mask[:, :-1], width_p)
    logps, entropies = [], []
    for s in range(0, hidden.shape[1], DEFAULT_CHUNK):
        h, y = hidden[:, s : s + DEFAULT_CHUNK], labels[:, s : s + DEFAULT_CHUNK]
        if torch.is_grad_enabled() and (h.requires_grad or lm_head.weight.requires_grad):
            lp, ent = checkpoint(
                _head_chunk, h, lm_head.weight, lm_head.bias, y, with_entropy, use_reentrant=False
            )
        else:
            lp, ent = _head_chunk(h, lm_head.weight, lm_head.bias, y, with_entropy)
        logps.append(lp)
        entropies.append(ent)
    logp = torch.cat(logps, dim=1)
    return logp, (torch.cat(entropies, dim=1) if with_entropy else None)


class ValueModel(nn.Module):
    """PPO critic: the policy-sized decoder body plus a scalar head on its hidden states.
    ``values[:, t]`` is read from the state that predicts completion token ``t`` (aligned with
    the log-probs)."""

    def __init__(self, causal_lm):
        super().__init__()
        self.body = causal_lm.get_decoder()
        hidden = causal_lm.config.get_text_config().hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)  # V starts at 0 everywhere
        nn.init.zeros_(self.head.bias)
        self.head.to(device=next(self.body.parameters()).device)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, width_p: int) -> Tensor:
        hidden = shared_prompt_hidden(self.body, input_ids[:, :-1], attention_mask[:, :-1], width_p)
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1).float()


def load_value_model(name: str, **load_kwargs) -> ValueModel:
    from trainers.core.models import load_causal_lm

    lm = load_causal_lm(name, trainable=True, **load_kwargs)
    value = ValueModel(lm)
    del lm
    return value


@torch.no_grad()
def _per_token_pass(fn, exp: Experience, batch_size: int, device) -> Tensor:
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


def sequence_logps(model, exp: Experience, batch_size: int, device) -> Tensor:
    was_training = model.training
    model.eval()
    try:
        return _per_token_pass(
            lambda ids, attn, wp: completion_token_stats(model, ids, attn, wp)[0],
            exp,
            batch_size,
            device,
        )
    finally:
        model.train(was_training)


# ---------------------------------------------------------------------------------------------
# From scored rollouts to an update batch
# ---------------------------------------------------------------------------------------------


def masked_mean_rows(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def prepare_update(
    exp: Experience,
    cfg: PolicyGradientConfig,
    policy,
    ref_model,
    value_model,
    device,
) -> tuple[Experience, dict[str, float]]:
    """Fill π_old / π_ref log-probs, PPO values, KL shaping and advantages. Returns the batch
    and the rollout-side metrics it produced (kl in the reward, explained variance)."""
    mask = exp.completion_mask
    bs = cfg.train.batch_size
    G = cfg.rollout.num_rollouts
    info: dict[str, float] = {}
    kl_in_reward = cfg.uses_kl and cfg.algorithm in KL_IN_REWARD
    if cfg.needs_old_logps or kl_in_reward:
        exp.old_logps = sequence_logps(policy, exp, bs, device)
    if cfg.uses_kl:
        exp.ref_logps = sequence_logps(ref_model, exp, bs, device)

    total = exp.rewards["total"].clone()
    token_kl = None
    if kl_in_reward:
        token_kl = kl_estimate(exp.old_logps, exp.ref_logps, cfg.loss.kl_estimator, mask)
        info["kl_reward"] = float(masked_mean_rows(token_kl, mask).mean())

    if cfg.algorithm == "ppo":
        was_training = value_model.training
        value_model.eval()
        exp.values = _per_token_pass(value_model, exp, bs, device)
        value_model.train(was_training)
        token_rewards = sequence_reward_to_tokens(total, mask)
        if token_kl is not None:
            token_rewards = token_rewards - cfg.loss.beta * token_kl
        adv, ret = gae(token_rewards, exp.values, mask, cfg.loss.gamma, cfg.loss.lam)
        exp.advantages, exp.returns = adv * mask, ret * mask
        exp.shaped_total = (token_rewards * mask).sum(-1)
        info["explained_variance"] = explained_variance(exp.values, exp.returns, mask)
    else:
        if token_kl is not None:  # reinforce / rloo: one scalar per sequence
            total = total - cfg.loss.beta * masked_mean_rows(token_kl, mask)
        shaped = {**exp.rewards, "total": total}
        seq_adv = ADVANTAGES[cfg.algorithm](shaped, G)
        exp.advantages = seq_adv.float().unsqueeze(-1) * mask
        exp.shaped_total = total
    return exp, info


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 − Var(R − V) / Var(R) over completion tokens (1 = perfect critic, ≤ 0 = useless)."""
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    if r.numel() < 2:
        return float("nan")
    var_r = r.var(unbiased=False)
    if var_r <= 1e-12:
        return float("nan")
    return float(1.0 - (r - v).var(unbiased=False) / var_r)


@dataclass
class RolloutInfo:
    prompts_drawn: int
    groups_drawn: int
    groups_kept: int
    generate_s: float
    score_s: float
    drawn: Experience  # every scored rollout of the step (DAPO: before filtering)


def rollout_step(
    policy, tokenizer, stream, train_prompts: list[Prompt], cfg: PolicyGradientConfig
) -> tuple[Experience, RolloutInfo]:
    """Sample prompts, generate, score. DAPO keeps drawing ``prompts_per_step`` prompts at a
    time and keeps only groups whose correctness is not all-min / all-max, until
    ``prompts_per_step`` groups are kept or ``max_draw_factor × prompts_per_step`` prompts have
    been drawn (then DynamicSamplingError). Returns the scored batch (on CPU) and what was drawn."""
    P, G = cfg.rollout.prompts_per_step, cfg.rollout.num_rollouts
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    gen_s = score_s = 0.0
    kept: list[Experience] = []
    drawn: list[Experience] = []
    n_kept = n_drawn_prompts = 0
    limit = cfg.loss.max_draw_factor * P
    while True:
        ids = stream.take(P)
        prompts = [train_prompts[i] for i in ids]
        t0 = time.time()
        batch = generate_group_batch(policy, tokenizer, prompts, cfg)
        t1 = time.time()
        batch.rewards = score(batch, cfg)
        score_s += time.time() - t1
        gen_s += t1 - t0
        n_drawn_prompts += P
        drawn.append(batch)
        if cfg.algorithm != "dapo":
            kept, n_kept = [batch], P
            break
        keep = dapo_keep_groups(
            batch.rewards["correctness"],
            G,
            cfg.loss.accuracy_min_reward,
            cfg.loss.accuracy_max_reward,
        )
        groups = [g for g in range(P) if bool(keep[g])]
        if groups:
            rows = [g * G + j for g in groups for j in range(G)]
            kept.append(batch.select(rows))
            n_kept += len(groups)
        if n_kept >= P:
            break
        if n_drawn_prompts >= limit:
            raise DynamicSamplingError(
                f"DAPO dynamic sampling drew {n_drawn_prompts} prompts "
                f"(loss.max_draw_factor={cfg.loss.max_draw_factor} × "
                f"prompts_per_step={P}) and kept only {n_kept} of the {P} groups it needs: all "
                "other groups had identical correctness (every rollout at "
                f"accuracy_min_reward={cfg.loss.accuracy_min_reward} or at "
                f"accuracy_max_reward={cfg.loss.accuracy_max_reward}). The task is too hard or "
                "too easy for this model: change the task difficulty (data.specs), warm start "
                "from an SFT model, raise rollout.num_rollouts / temperature, or raise "
                "loss.max_draw_factor."
            )
    exp = concat_experiences(kept, pad_id)
    if cfg.algorithm == "dapo" and exp.num_sequences > P * G:
        exp = exp.select(list(range(P * G)))
    info = RolloutInfo(
        prompts_drawn=n_drawn_prompts,
        groups_drawn=n_drawn_prompts,
        groups_kept=n_kept,
        generate_s=gen_s,
        score_s=score_s,
        drawn=concat_experiences(drawn, pad_id),
    )
    return exp, info
