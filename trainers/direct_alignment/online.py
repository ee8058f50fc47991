"""Online DPO (Guo et al. 2024, "Direct Language Model Alignment from Online AI Feedback").

    python -m trainers.direct_alignment.train --config configs/online_dpo.yaml --run-dir DIR

The pairs are not read from a data set: each step draws them from the policy being trained.
Per optimizer step:
  1. take the next ``batch_size × gradient_accumulation_steps`` training prompts;
  2. sample ``online.num_samples`` completions per prompt (two, the paper's) from the CURRENT
     policy (trainers/core/onpolicy.py: one prefill per prompt, its KV cache repeated), at
     ``online.temperature``;
  3. score each with the ranker: the reward model's score (``reward.model``) plus, when the
     verifier is on, reasoning-gym correctness + ``reward.format_weight``·format;
  4. the highest score is chosen, the lowest rejected (with two samples: the higher and the
     lower); a prompt whose samples all score the same is a tie and is skipped (``tie_frac``
     counts them; a step without an untied prompt changes no weight);
  5. per micro-batch of ``batch_size`` untied pairs: summed log-probs of both completions under
     the policy (with gradients) and the frozen starting model (the reference, kept loaded:
     the samples are new every step, so nothing can be cached), loss = ``LOSSES[online.loss]``
     (any pairwise loss of the family), scaled by the micro-batch's share of the step's pairs;
  6. clip, step, schedule.
Held out: the family's preference metrics on the held-out pairs of ``data.dataset``
(``eval/accuracy``, the headline, comparable with offline DPO on the same pairs) and the
ranker's score of greedy completions of the held-out prompts (``eval/score``,
``eval/correctness`` with the verifier).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from trainers.core.decoding import GREEDY, Sampling
from trainers.core.generation import end_of_turn_ids
from trainers.core.harness import raise_if_stopping
from trainers.core.loop import (
    BestMetric,
    StepTimer,
    TrainingRun,
    step_metrics,
)
from trainers.core.models import load_causal_lm, load_reference, load_tokenizer, pick_runtime
from trainers.core.onpolicy import rows_of, sample_policy, step_generator
from trainers.core.preferences import (
    TokenizedExample,
    configured_preference_records,
    tokenize_records,
)
from trainers.core.reward_scorer import PolicyCompletions
from trainers.core.rundir import RunDir
from trainers.core.runfolder import SummaryFile
from trainers.core.splits import split_train_eval
from trainers.core.tokenization import chat_template_ids
from trainers.core.training import (
    StepMetrics,
    optimizer_step,
    ready_to_train,
    seed_everything,
)
from trainers.core.verifier import Verifier, compute_rewards
from trainers.direct_alignment.config import DirectAlignmentConfig
from trainers.direct_alignment.losses import LOSSES, LossInputs
from trainers.direct_alignment.pairs import (
    batch_logps,
    compute_reference_logps,
    evaluate,
    loss_params,
)

# ---------------------------------------------------------------------------------------------
# Ranking: pure functions
# ---------------------------------------------------------------------------------------------


def rank_samples(scores: Tensor, k: int) -> tuple[list[tuple[int, int, int]], Tensor]:
    """The ``k`` samples of prompt i sit at rows ``k·i … k·i + k − 1`` of ``scores`` (k·P,).
    Returns (the (prompt, chosen row, rejected row) of every untied prompt, in prompt order:
    chosen = the highest score, the first such row; rejected = the lowest, the last such row;
    ``tie`` (P,) bool: every sample scored the same, the prompt gives no pair)."""
    if k < 2 or scores.dim() != 1 or scores.numel() % k:
        raise ValueError(f"scores of shape {tuple(scores.shape)} are not {k} per prompt")
    groups = scores.view(-1, k)
    best = groups.argmax(dim=1)
    worst = k - 1 - groups.flip(1).argmin(dim=1)
    tie = groups.amax(dim=1) == groups.amin(dim=1)
    ranked = [
        (i, k * i + b, k * i + w)
        for i, (b, w, tied) in enumerate(
            zip(best.tolist(), worst.tolist(), tie.tolist(), strict=True)
        )
        if not tied
    ]
    return ranked, tie


# ---------------------------------------------------------------------------------------------
# Prompts, sampling and the ranker
# ---------------------------------------------------------------------------------------------


@dataclass
class OnlinePrompt:
    """A training or held-out prompt: its messages, its ids (cut so a completion fits) and the
    reasoning-gym entry the verifier scores against (empty for other data)."""

    messages: list[dict]
    ids: list[int]
    meta: dict


def prompt_rows(
    cfg: DirectAlignmentConfig,
    tokenizer: Any,
    records: list[Any],
    max_new_tokens: int | None = None,
) -> list[Any]:
    """Each record's prompt as an :class:`OnlinePrompt`, its ids cut from the left to
    ``data.max_prompt_length`` and to leave ``max_new_tokens`` (None: ``online.max_new_tokens``)
    within ``data.max_length``; a prompt repeated in the data set (several pairs per prompt) is
    kept once."""
    new = cfg.online.max_new_tokens if max_new_tokens is None else max_new_tokens
    cap = cfg.data.max_length - new
    if cfg.data.max_prompt_length:
        cap = min(cap, cfg.data.max_prompt_length)
    seen, unique = set(), []
    for r in records:
        key = repr(r.prompt)
        if key not in seen:
            seen.add(key)
            unique.append(r)
    ids = chat_template_ids(tokenizer, [r.prompt for r in unique], add_generation_prompt=True)
    return [
        OnlinePrompt(r.prompt, list(i)[-cap:], dict(r.meta or {}))
        for r, i in zip(unique, ids, strict=True)
    ]


def body_text(tokenizer: Any, tokens: list[int], stop_ids: set[int]) -> str:
    """A completion's text without its end-of-turn token."""
    body = tokens[:-1] if tokens and tokens[-1] in stop_ids else tokens
    return tokenizer.decode(body, skip_special_tokens=True)


class Ranker:
    """Scores completions: the reward model's score (``reward.model``) plus, with the verifier,
    correctness + ``format_weight``·format (``verify``: by default
    :func:`trainers.core.verifier.compute_rewards`). ``score`` returns the parts and their sum."""

    def __init__(
        self,
        cfg: DirectAlignmentConfig,
        tokenizer: Any,
        device,
        dtype,
        attn,
        verify: Verifier = compute_rewards,
    ):
        from trainers.core.reward_scorer import RewardScorer, inspect_reward_model

        self.tokenizer = tokenizer
        self.stop_ids = set(end_of_turn_ids(tokenizer))
        self.verifier = cfg.ranks_with_verifier
        self.verify = verify
        self.format_weight = cfg.reward.format_weight
        self.model = None
        if cfg.reward.model:
            info = inspect_reward_model(cfg.reward.model, key="reward.model")
            self.model = RewardScorer.load(
                info,
                device=device,
                dtype=dtype,
                attn_implementation=attn,
                batch_size=cfg.reward.score_batch_size,
                policy_tokenizer=tokenizer,
            )

    def score(self, prompts: list[OnlinePrompt], completions: list[list[int]]) -> dict[str, Tensor]:
        """Parts ``model``, ``correctness``, ``format`` (those that apply) and ``score``, each
        (N,) float32; ``prompts[i]`` is completion i's prompt."""
        texts = [body_text(self.tokenizer, c, self.stop_ids) for c in completions]
        parts: dict[str, Tensor] = {}
        total = torch.zeros(len(completions))
        if self.model is not None:
            parts["model"] = self.model.score_completions(
                PolicyCompletions(
                    [p.messages for p in prompts],
                    texts,
                    [p.ids for p in prompts],
                    completions,
                    self.stop_ids,
                )
            )
            total = total + parts["model"]
        if self.verifier:
            r = self.verify(
                texts,
                [p.meta for p in prompts],
                [len(c) for c in completions],
                format_weight=self.format_weight,
            )
            parts["correctness"], parts["format"] = r["correctness"], r["format"]
            total = total + r["total"]
        parts["score"] = total
        return parts


def online_sampling(cfg: DirectAlignmentConfig) -> Sampling:
    """How the training samples are drawn (``online.temperature``, ``top_p``, ``top_k``)."""
    o = cfg.online
    return Sampling(temperature=o.temperature, top_p=o.top_p, top_k=o.top_k)


# ---------------------------------------------------------------------------------------------
# Loss on a micro-batch of ranked pairs
# ---------------------------------------------------------------------------------------------


def pair_loss(cfg, model, ref_model, pairs: list[TokenizedExample], pad_id, device):
    """The pair loss and its metrics on ranked pairs (policy with gradients, reference none)."""
    parts, n_tokens = batch_logps(model, pairs, pad_id, device, with_kl=False)
    (c_sum, c_n), (r_sum, r_n) = parts["chosen"], parts["rejected"]
    ref_c = ref_r = None
    if ref_model is not None:
        with torch.no_grad():
            ref_parts, _ = batch_logps(ref_model, pairs, pad_id, device, with_kl=False)
        ref_c, ref_r = ref_parts["chosen"][0].detach(), ref_parts["rejected"][0].detach()
    inputs = LossInputs(
        chosen_logps=c_sum,
        rejected_logps=r_sum,
        chosen_tokens=c_n,
        rejected_tokens=r_n,
        ref_chosen_logps=ref_c,
        ref_rejected_logps=ref_r,
    )
    loss, metrics = LOSSES[cfg.online.loss](inputs, loss_params(cfg))
    return loss, metrics, n_tokens


# ---------------------------------------------------------------------------------------------
# Held-out evaluation
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def greedy_scores(model, tokenizer, ranker: Ranker, prompts, batch_size: int, max_new: int):
    """The ranker's mean score (and its parts) of greedy completions of ``prompts``."""
    if not prompts:
        return {}
    completions = sample_policy(
        model,
        tokenizer,
        [p.ids for p in prompts],
        max_new_tokens=max_new,
        sampling=GREEDY,
        batch_size=batch_size,
    )
    parts = ranker.score(prompts, completions)
    return {f"eval/{k}": float(v.mean()) for k, v in parts.items()}


# ---------------------------------------------------------------------------------------------
# The training loop
# ---------------------------------------------------------------------------------------------


@dataclass
class RankedStep:
    """One step's samples: the completions (k per prompt, consecutive), the ranker's score
    parts, the (prompt, chosen, rejected) indices, the tied share and the pairs to train on."""

    completions: list[list[int]]
    parts: dict[str, Tensor]
    ranked: list[tuple[int, int, int]]
    tie: Tensor
    pairs: list[TokenizedExample]


def sample_and_rank(cfg, model, tokenizer, ranker: Ranker, prompts, generator) -> RankedStep:
    """``online.num_samples`` completions of each prompt from the policy as it is now, scored
    by the ranker; each prompt's best-scored against its worst-scored (:func:`rank_samples`)."""
    k = cfg.online.num_samples
    completions = sample_policy(
        model,
        tokenizer,
        [p.ids for p in prompts],
        max_new_tokens=cfg.online.max_new_tokens,
        sampling=online_sampling(cfg),
        repeats=k,
        generator=generator,
    )
    parts = ranker.score(rows_of(prompts, k), completions)
    ranked, tie = rank_samples(parts["score"], k)
    pairs = [TokenizedExample(prompts[i].ids, completions[c], completions[r]) for i, c, r in ranked]
    return RankedStep(completions, parts, ranked, tie, pairs)


def load_prompt_sets(cfg: DirectAlignmentConfig, tokenizer) -> tuple[list, list, list]:
    """(training prompts, held-out prompts, held-out pairs): the preference set's prompts
    (its responses unused but for the held-out pairs, which keep the offline accuracy)."""
    train_records, eval_records = split_train_eval(
        configured_preference_records(cfg.data, cfg.seed),
        eval_size=cfg.data.eval_size,
        seed=cfg.seed,
    )
    eval_pairs, _ = tokenize_records(
        eval_records, tokenizer, cfg.data.max_length, cfg.data.max_prompt_length
    )
    train_prompts = prompt_rows(cfg, tokenizer, train_records)
    return train_prompts, prompt_rows(cfg, tokenizer, eval_records), eval_pairs


def load_models(cfg: DirectAlignmentConfig, device, dtype, attn) -> tuple[Any, Any]:
    """(the policy in train mode, the frozen starting model when the loss needs a reference)."""
    ref_model = None
    if cfg.needs_reference:  # the starting model, frozen for the whole run
        ref_model = load_reference(cfg.model, device, dtype, attn)
    model = load_causal_lm(
        cfg.model.name, device=device, dtype=dtype, attn_implementation=attn, trainable=True
    )
    ready_to_train(model, cfg.model)  # one process: no sharding
    return model, ref_model


def run_info(cfg: DirectAlignmentConfig, train_prompts, eval_prompts, eval_pairs) -> dict:
    """What the summary records about the data and the ranker."""
    return {
        "data": {
            "n_train_prompts": len(train_prompts),
            "n_eval_prompts": len(eval_prompts),
            "n_eval_pairs": len(eval_pairs),
        },
        "ranker": {"reward_model": cfg.reward.model, "verifier": cfg.ranks_with_verifier},
    }


def train_online(
    cfg: DirectAlignmentConfig, run: RunDir, resume: bool, *, verifier: Verifier = compute_rewards
) -> SummaryFile:
    """Online DPO; see the module doc. ``verifier``: the ranker's, with ``reward.verifier``."""
    seed_everything(cfg.seed)
    device, dtype, attn = pick_runtime(cfg.model)
    tokenizer = load_tokenizer(cfg.model.name)
    pad_id = tokenizer.pad_token_id

    run.update_phase("tokenizing")
    train_prompts, eval_prompts, eval_pairs = load_prompt_sets(cfg, tokenizer)
    info = run_info(cfg, train_prompts, eval_prompts, eval_pairs)
    print(f"data: {info['data']}; ranker: {info['ranker']}", flush=True)
    loop = TrainingRun.over_epochs(run, cfg, len(train_prompts))

    run.update_phase("loading_model", loop.total_steps)
    ranker = Ranker(cfg, tokenizer, device, dtype, attn, verifier)
    model, ref_model = load_models(cfg, device, dtype, attn)
    optimizer, scheduler, state = loop.optimizer_and_resume(
        model, model.parameters(), cfg.train, resume
    )
    loop.start_tracker(cfg.logging, cfg.model_dump(mode="json"), f"{cfg.loss}-{run.path.name}")
    best = BestMetric("eval/accuracy")

    pair_cfg = cfg.model_copy(update={"loss": cfg.online.loss})
    ref_eval = None
    if ref_model is not None and eval_pairs:
        run.update_phase("reference_logprobs", loop.total_steps)
        ref_eval = compute_reference_logps(
            ref_model, eval_pairs, pad_id, device, cfg.eval.eval_batch_size, with_kl=False
        )

    def held_out() -> dict[str, float]:
        out = evaluate(pair_cfg, model, eval_pairs, ref_eval, pad_id, device) if eval_pairs else {}
        out.update(
            greedy_scores(
                model,
                tokenizer,
                ranker,
                eval_prompts,
                cfg.eval.eval_batch_size,
                cfg.online.max_new_tokens,
            )
        )
        return out

    def run_eval() -> None:
        loop.progress("evaluating")
        loop.last_eval = held_out()
        loop.log("eval", loop.last_eval)
        best.update(loop.last_eval)

    last_samples: list[dict[str, Any]] = []

    def after_step() -> None:
        if loop.every(cfg.eval.eval_every) and eval_prompts:
            run_eval()
        if loop.every(cfg.eval.sample_every) and last_samples:
            loop.log_samples(last_samples[: cfg.eval.num_samples])

    if not resume and cfg.eval.eval_every > 0 and eval_prompts:  # the starting point
        loop.progress("evaluating")
        loop.log_start(held_out())
    if loop.redo_events:
        after_step()

    position = state["data_position"] if state else None
    for pos in loop.epoch_steps(len(train_prompts), cfg.train, cfg.seed, position):
        timer = StepTimer()
        # 1-4. sample k completions per prompt from the current policy and rank them: best
        # against worst; a prompt whose samples all tie gives no pair
        loop.progress("generating")
        prompts = [train_prompts[i] for i in pos.ids]
        generator = step_generator(device, cfg.seed, loop.step)
        step = sample_and_rank(cfg, model, tokenizer, ranker, prompts, generator)
        completions, parts, ranked, pairs = step.completions, step.parts, step.ranked, step.pairs
        # 5. the pair loss, micro-batch by micro-batch
        loop.progress("training", epoch=pos.epoch)
        agg, step_tokens = StepMetrics(), 0
        for m in range(0, len(pairs), cfg.train.batch_size):
            raise_if_stopping("micro_batch")
            chunk = pairs[m : m + cfg.train.batch_size]
            loss, metrics, n_tok = pair_loss(cfg, model, ref_model, chunk, pad_id, device)
            (loss * len(chunk) / len(pairs)).backward()
            agg.add(metrics, weight=len(chunk))
            step_tokens += n_tok
        # 6. update (no untied pair: no gradient, no weight changes)
        grad_norm, lr = optimizer_step(
            model.parameters(), optimizer, scheduler, cfg.train.max_grad_norm
        )
        row = step_metrics(
            {**agg.mean(), **ranking_metrics(parts, ranked, step.tie, completions)},
            grad_norm,
            lr,
            step_tokens,
            timer,
            device,
            epoch=pos.epoch_progress,
        )
        last_samples[:] = pair_samples(tokenizer, ranker, prompts, completions, parts, ranked)
        loop.step_done(row, step_tokens, cfg.logging.log_every, "accuracy", show=bool(ranked))
        if not ranked:
            print(f"step {loop.step}/{loop.total_steps}: every pair tied, no update", flush=True)
        loop.end_step(after_step, epoch=pos.epoch)

    loop.save_final_model(model, tokenizer)
    loop.finish()
    return loop.summary(cfg.loss, best, device, **info)


def ranking_metrics(
    parts: dict[str, Tensor], ranked: list[tuple[int, int, int]], tie: Tensor, completions
) -> dict[str, float]:
    """What the ranker saw this step: the chosen and rejected scores and their margin (untied
    pairs), the share of tied pairs, the number of pairs trained on, the mean score and
    correctness of all samples and their length."""
    score = parts["score"]
    out = {
        "tie_frac": float(tie.float().mean()),
        "pairs": float(len(ranked)),
        "score": float(score.mean()),
        "completion_length": float(sum(len(c) for c in completions) / max(len(completions), 1)),
    }
    if "correctness" in parts:
        out["correctness"] = float(parts["correctness"].mean())
    if ranked:
        chosen = score[[c for _, c, _ in ranked]]
        rejected = score[[r for _, _, r in ranked]]
        out["score_chosen"] = float(chosen.mean())
        out["score_rejected"] = float(rejected.mean())
        out["score_margin"] = float((chosen - rejected).mean())
    return out


def pair_samples(tokenizer, ranker: Ranker, prompts, completions, parts, ranked) -> list[dict]:
    """This step's ranked pairs as samples.jsonl rows (question, chosen, rejected, scores)."""
    score = parts["score"].tolist()
    rows = []
    for i, c, r in ranked:
        rows.append(
            {
                "prompt": prompts[i].messages[-1]["content"],
                "chosen": body_text(tokenizer, completions[c], ranker.stop_ids),
                "rejected": body_text(tokenizer, completions[r], ranker.stop_ids),
                "score_chosen": score[c],
                "score_rejected": score[r],
            }
        )
    return rows
