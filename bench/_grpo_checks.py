"""The checks of bench/grpo_vs_trl.py beside the throughput: the first-step loss and gradient
of ours against TRL's ``_compute_loss`` on one fixed rollout batch, and micro-benchmarks of the
fast paths that have no trainer switch."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from unittest import mock

import _grpo_contenders  # noqa: F401  (first: it sets the offline environment for torch)
import torch
from _grpo_contenders import (
    FORMAT_WEIGHT,
    Workload,
    captured_output,
    trl_config,
    trl_dataset,
    trl_model,
    trl_reward,
)

from trainers.core import decoding as core_decoding
from trainers.core import logprobs as core_logprobs
from trainers.core.decoding import (
    GREEDY,
    Sampling,
    cut_after_first_stop,
    left_pad,
    sample_tokens,
)
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids
from trainers.core.logprobs import position_ids_of
from trainers.core.models import load_causal_lm, load_tokenizer
from trainers.core.prompts import Prompt
from trainers.core.tasks import format_response
from trainers.core.verifier import compute_rewards
from trainers.policy_gradients.advantages import (
    drgrpo_advantages,
    grpo_advantages,
)
from trainers.policy_gradients.config import PolicyGradientConfig
from trainers.policy_gradients.experience import assemble
from trainers.policy_gradients.generation import generate_group_batch
from trainers.policy_gradients.losses import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossParams,
    aggregate,
)
from trainers.policy_gradients.rollout import prepare_update
from trainers.policy_gradients.token_passes import completion_token_stats, trim
from trainers.policy_gradients.update import micro_batch_loss

# ---------------------------------------------------------------------------------------------
# First-step loss agreement: one fixed batch through our loss and TRL's _compute_loss
# ---------------------------------------------------------------------------------------------

# (TRL loss_type, our algorithm, our loss_agg, TRL scale_rewards, our advantage, ε_lo, ε_hi)
LOSS_PAIRS = (
    ("grpo", "grpo", "seq_mean_token_mean", "group", grpo_advantages, 0.2, 0.2),
    ("dapo", "dapo", "token_mean", "group", grpo_advantages, 0.2, 0.28),
    ("dr_grpo", "drgrpo", "seq_mean_token_sum_norm", "none", drgrpo_advantages, 0.2, 0.2),
)


def agreement_batch(model, tokenizer, prompts: list[Prompt], w: Workload):
    """A rollout batch with reward contrast in every group: half of each group sampled from the
    (random) model, half the oracle answer written in the tag format, all scored by our reward."""
    cfg = PolicyGradientConfig.model_validate(
        {
            "model": {"name": w.model},
            "rollout": {
                "prompts_per_step": w.prompts_per_step,
                "num_rollouts": w.num_generations,
                "max_new_tokens": w.max_new_tokens,
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": 0,
            },
        }
    )
    torch.manual_seed(w.seed)
    chosen = prompts[: w.prompts_per_step]
    sampled = generate_group_batch(model, tokenizer, chosen, cfg)
    stop = end_of_turn_ids(tokenizer)[0]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = sampled.prompt_width
    prompt_rows, completion_rows = [], []
    for row in range(sampled.num_sequences):
        p = sampled.input_ids[row, width - int(sampled.prompt_lens[row]) : width].tolist()
        n = int(sampled.completion_mask[row].sum())
        completion = sampled.input_ids[row, width : width + n].tolist()
        if row % 2 == 1:  # an oracle completion, cut to the length budget
            owner = sampled.prompts[row]
            text = format_response(f"Reversing {owner.answer[::-1]}.", owner.answer)
            completion = (tokenizer.encode(text, add_special_tokens=False) + [stop])[
                : w.max_new_tokens
            ]
        prompt_rows.append(p)
        completion_rows.append(completion)
    ids, attn, lens, cmask = assemble(prompt_rows, completion_rows, pad)
    texts = [
        tokenizer.decode([t for t in c if t != stop], skip_special_tokens=True)
        for c in completion_rows
    ]
    lengths = [len(c) for c in completion_rows]
    rewards = compute_rewards(
        texts, [p.meta for p in sampled.prompts], lengths, format_weight=FORMAT_WEIGHT
    )
    batch = replace(
        sampled,
        input_ids=ids,
        attention_mask=attn,
        prompt_lens=lens,
        completion_mask=cmask,
        texts=texts,
        rewards=rewards,
    )
    return batch


def trl_inputs(batch, advantages: torch.Tensor, old_logps: torch.Tensor | None = None) -> dict:
    width = batch.prompt_width
    inputs = {
        "prompt_ids": batch.input_ids[:, :width],
        "prompt_mask": batch.attention_mask[:, :width],
        "completion_ids": batch.input_ids[:, width:],
        "completion_mask": batch.completion_mask.long(),
        "advantages": advantages,
        "num_items_in_batch": batch.completion_mask.sum(),
    }
    if old_logps is not None:
        inputs["old_per_token_logps"] = old_logps
    return inputs


def trl_advantages(rewards: torch.Tensor, group: int, scale: bool) -> torch.Tensor:
    """TRL 1.16's formula (_generate_and_score_completions, sum_then_normalize): group mean
    baseline, and with scale_rewards="group" division by the unbiased group std + 1e-4."""
    grouped = rewards.view(-1, group)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if not scale:
        return centred
    std = grouped.std(dim=1, keepdim=True).expand_as(grouped).reshape(-1)
    return centred / (std + 1e-4)


def flat_grad(model) -> torch.Tensor:
    grads = [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
    out = torch.cat(grads).clone()
    model.zero_grad(set_to_none=True)
    return out


def compare(ours: torch.Tensor, theirs: torch.Tensor) -> dict[str, float]:
    diff = (ours - theirs).norm()
    scale = torch.maximum(ours.norm(), theirs.norm()).clamp(min=1e-30)
    return {"rel_l2_diff": float(diff / scale), "max_abs_diff": float((ours - theirs).abs().max())}


def trimmed_completion_logps(model, batch) -> tuple[torch.Tensor, int]:
    """Our forward of a rollout batch with its padding trimmed: the completion log-probs and
    the trimmed completion width."""
    ids, attn, width_t, width_p = trim(
        batch.input_ids,
        batch.attention_mask,
        batch.prompt_lens,
        batch.completion_mask,
        batch.prompt_width,
    )
    logp, _ = completion_token_stats(model, ids, attn, width_p)
    return logp, width_t


def our_loss_direct(model, batch, adv_seq, old, pair, max_new: int) -> torch.Tensor:
    """losses.py + aggregate on one micro-batch holding the whole step (π_old given)."""
    trl_type, algorithm, agg, _, _, lo, hi = pair
    logp, width_t = trimmed_completion_logps(model, batch)
    mask = batch.completion_mask[:, :width_t]
    params = PolicyLossParams(clip_eps_lo=lo, clip_eps_hi=hi)
    inputs = PolicyLossInputs(
        logp=logp,
        old_logp=old[:, :width_t] if old is not None else logp.detach(),
        advantages=adv_seq.unsqueeze(-1) * mask,
        mask=mask,
    )
    per_token, _ = POLICY_LOSSES[algorithm](inputs, params)
    return aggregate(
        per_token,
        mask,
        agg,
        step_num_seqs=batch.num_sequences,
        step_num_tokens=float(mask.sum()),
        max_new_tokens=max_new,
    )


def loss_agreement(w: Workload, prompts: list[Prompt]) -> dict[str, Any]:
    """For each coinciding pair: loss value and gradient, ours against TRL's _compute_loss, on
    the first step (π_old = π, ratio 1) and with a perturbed π_old (ratio ≠ 1, clipping live)."""
    from trl import GRPOTrainer

    tokenizer = load_tokenizer(w.model)
    results: dict[str, Any] = {}
    batch = None
    for pair in LOSS_PAIRS:
        trl_type, algorithm, agg, scale_rewards, our_adv_fn, lo, hi = pair
        with tempfile.TemporaryDirectory(prefix="grpo-bench-loss-") as tmp, captured_output():
            model = trl_model(w.model, tokenizer)
            args = trl_config(
                w,
                tmp,
                loss_type=trl_type,
                scale_rewards=scale_rewards,
                epsilon=lo,
                epsilon_high=hi,
                per_device_train_batch_size=w.prompts_per_step * w.num_generations,
                gradient_accumulation_steps=1,
            )
            trainer = GRPOTrainer(
                model=model,
                reward_funcs=[trl_reward(prompts)],
                args=args,
                train_dataset=trl_dataset(prompts, list(range(w.prompts_per_step))),
                processing_class=tokenizer,
            )
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop when training
        model.train()
        if batch is None:
            batch = agreement_batch(model, tokenizer, prompts, w)
        G = w.num_generations
        total = batch.rewards["total"]
        ours_adv = our_adv_fn(total, G)
        theirs_adv = trl_advantages(total, G, scale_rewards == "group")

        # our trainer's own micro-batch path, first step (the π_old shortcut: ratio 1)
        cfg = PolicyGradientConfig.model_validate(
            {
                "algorithm": algorithm,
                "model": {"name": w.model},
                "rollout": {
                    "prompts_per_step": w.prompts_per_step,
                    "num_rollouts": G,
                    "max_new_tokens": w.max_new_tokens,
                },
                "train": {
                    "batch_size": batch.num_sequences,
                    "gradient_accumulation_steps": 1,
                },
                "loss": {"loss_agg": agg, "clip_eps_lo": lo, "clip_eps_hi": hi},
            }
        )
        exp, _ = prepare_update(replace(batch), cfg, model, None, None, torch.device("cpu"))
        rows = list(range(exp.num_sequences))
        step_tokens = float(exp.completion_mask.sum())
        ours_loss, _, _, _ = micro_batch_loss(
            cfg, model, None, exp, rows, len(rows), step_tokens, torch.device("cpu")
        )
        ours_loss.backward()
        g_ours = flat_grad(model)
        theirs_loss = trainer._compute_loss(model, trl_inputs(batch, theirs_adv))
        theirs_loss.backward()
        g_theirs = flat_grad(model)
        shared = trainer._compute_loss(model, trl_inputs(batch, ours_adv))
        shared.backward()
        g_shared = flat_grad(model)

        # the same pair with π_old ≠ π: a fixed perturbation of the current log-probs
        with torch.no_grad():
            logp, _ = trimmed_completion_logps(model, batch)
            gen = torch.Generator().manual_seed(w.seed)
            old = (logp + 0.3 * torch.randn(logp.shape, generator=gen)) * batch.completion_mask
        ours_off = our_loss_direct(model, batch, ours_adv, old, pair, w.max_new_tokens)
        ours_off.backward()
        g_ours_off = flat_grad(model)
        theirs_off = trainer._compute_loss(model, trl_inputs(batch, ours_adv, old))
        theirs_off.backward()
        g_theirs_off = flat_grad(model)

        results[f"ours {algorithm}/{agg} vs TRL loss_type={trl_type}"] = {
            "advantages_max_abs_diff": float((ours_adv - theirs_adv).abs().max()),
            "first_step": {
                "ours_loss": float(ours_loss),
                "trl_loss": float(theirs_loss),
                "trl_loss_with_our_advantages": float(shared),
                "loss_abs_diff": abs(float(ours_loss) - float(theirs_loss)),
                "grad_vs_trl": compare(g_ours, g_theirs),
                "grad_vs_trl_with_our_advantages": compare(g_ours, g_shared),
                "grad_norm": float(g_ours.norm()),
            },
            "perturbed_pi_old": {
                "ours_loss": float(ours_off),
                "trl_loss": float(theirs_off),
                "loss_abs_diff": abs(float(ours_off) - float(theirs_off)),
                "grad_vs_trl": compare(g_ours_off, g_theirs_off),
            },
        }
    assert batch is not None
    results["batch"] = {
        "sequences": batch.num_sequences,
        "completion_lengths": [int(n) for n in batch.completion_mask.sum(-1).tolist()],
        "rewards_total": [round(float(r), 4) for r in batch.rewards["total"].tolist()],
    }
    return results


# ---------------------------------------------------------------------------------------------
# Micro-benchmarks of the fast paths without a trainer switch
# ---------------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any], repeats: int, warmup: bool = True) -> dict[str, float]:
    """Median wall and process-CPU seconds of ``fn`` over ``repeats`` calls."""
    if warmup:
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu)}


def versus(fast: dict[str, float], replaced: dict[str, float], **extra) -> dict[str, Any]:
    return {
        "fast": fast,
        "replaced": replaced,
        "speedup_wall": replaced["wall_s"] / fast["wall_s"],
        "speedup_cpu": replaced["cpu_s"] / fast["cpu_s"],
        **extra,
    }


def prompt_batch(tokenizer, prompts: list[Prompt], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    return left_pad([chat_prompt_ids(tokenizer, p.messages) for p in prompts], pad)


def fast_paths(w: Workload, prompts: list[Prompt], repeats: int) -> dict[str, Any]:
    """The fast paths without a trainer switch, each against the path it replaces on the same
    inputs: KV cache in generation, our sampling loop (one prefill per group) against generate,
    chunked log-probs, per-micro-batch padding trim."""
    tokenizer = load_tokenizer(w.model)
    model = load_causal_lm(w.model, device="cpu", dtype="fp32", attn_implementation="sdpa")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stops = end_of_turn_ids(tokenizer)
    out: dict[str, Any] = {"model": w.model, "repeats": repeats}
    model.eval()

    def generate(ids, mask, tokens: int, cache: bool = True, greedy: bool = False, **kwargs):
        torch.manual_seed(0)
        sampling = {"do_sample": False} if greedy else {"do_sample": True, "top_k": 0}
        with torch.no_grad():
            return model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=tokens,
                min_new_tokens=tokens,  # the same work on both sides of a comparison
                **sampling,
                use_cache=cache,
                pad_token_id=pad,
                eos_token_id=stops,
                **kwargs,
            )

    # 1. KV cache (our rollout generates in eval mode, so the cache is on whether or not
    # training uses gradient checkpointing) against none (what generate falls back to in train
    # mode with checkpointing on). Short: without the cache every token re-reads the prefix.
    rows = w.num_generations // 2
    ids, mask = prompt_batch(tokenizer, prompts[:rows], pad)
    tokens = min(16, w.max_new_tokens)
    out["generate_kv_cache"] = versus(
        timed(lambda: generate(ids, mask, tokens), repeats),
        timed(lambda: generate(ids, mask, tokens, cache=False), repeats, warmup=False),
        rows=rows,
        new_tokens=tokens,
    )

    # 2. Our sampling loop (trainers/core/decoding.py) against generate on the same rows: the G
    # rollouts of a prompt share it, so the loop prefills each prompt once and repeats its KV
    # cache G times; split into that (ours on G copies of each prompt) and the leaner loop.
    # Greedy output is identical to generate's (checked here); no stop token, so every row
    # decodes max_new_tokens on both sides.
    group_rows = [chat_prompt_ids(tokenizer, p.messages) for p in prompts[: w.prompts_per_step]]
    G = w.num_generations
    copies = [row for row in group_rows for _ in range(G)]
    ids, mask = left_pad(copies, pad)

    def ours(rows, repeats: int, greedy: bool = False, stop_ids=()):
        torch.manual_seed(0)
        return sample_tokens(
            model,
            rows,
            max_new_tokens=w.max_new_tokens,
            stop_ids=list(stop_ids),
            pad_id=pad,
            sampling=GREEDY if greedy else Sampling(temperature=1.0),
            repeats=repeats,
        )

    with torch.no_grad():
        greedy_decoding = {
            "max_new_tokens": w.max_new_tokens,
            "do_sample": False,
            "pad_token_id": pad,
            "eos_token_id": stops,
        }
        theirs = model.generate(input_ids=ids, attention_mask=mask, **greedy_decoding)
        theirs = theirs[:, ids.shape[1] :].tolist()
    same = ours(group_rows, G, greedy=True, stop_ids=stops) == [
        cut_after_first_stop(r, set(stops)) for r in theirs
    ]
    loop = timed(lambda: ours(group_rows, G), repeats)
    loop_without_shared_prefill = timed(lambda: ours(copies, 1), repeats)
    hf = timed(lambda: generate(ids, mask, w.max_new_tokens), repeats)
    out["sampling_loop"] = versus(
        loop,
        hf,
        rows=len(copies),
        new_tokens=w.max_new_tokens,
        greedy_identical=same,
        prefill_once_speedup=round(loop_without_shared_prefill["wall_s"] / loop["wall_s"], 3),
        lean_loop_speedup=round(hf["wall_s"] / loop_without_shared_prefill["wall_s"], 3),
    )

    # 2b. Stopped rows leaving the batch: half the rows stop after a few tokens (their stop set
    # is what they drew at step 4 in a free run with the same seed), the others decode on.
    free = ours(group_rows, G)
    early = {row[4] for row in free[: len(free) // 2]}

    def stopping(drop_share: float):
        with mock.patch.object(core_decoding, "DROP_STOPPED_SHARE", drop_share):
            torch.manual_seed(0)
            return sample_tokens(
                model,
                group_rows,
                max_new_tokens=w.max_new_tokens,
                stop_ids=early,
                pad_id=pad,
                sampling=Sampling(temperature=1.0),
                repeats=G,
            )

    lengths_out = [len(r) for r in stopping(core_decoding.DROP_STOPPED_SHARE)]
    out["drop_stopped_rows"] = versus(
        timed(lambda: stopping(core_decoding.DROP_STOPPED_SHARE), repeats),
        timed(lambda: stopping(float("inf")), repeats),
        rows=len(copies),
        completion_lengths=sorted(lengths_out),
        new_tokens=w.max_new_tokens,
    )

    # 3. Log-probs of a full-length micro-batch, forward + backward: our chunked head (LM head
    # per chunk of completion positions under checkpointing, entropy from the same chunk)
    # against full logits -> float32 log_softmax -> gather.
    model.train()
    n = w.micro_batch
    ids, mask = prompt_batch(tokenizer, prompts[:n], pad)
    width = ids.shape[1]
    gen = torch.Generator().manual_seed(w.seed)
    sampled = torch.randint(0, tokenizer.vocab_size, (n, w.max_new_tokens), generator=gen)
    full = torch.cat([ids, sampled], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(sampled)], dim=1)

    def chunked():
        logp, _ = completion_token_stats(model, full, full_mask, width, with_entropy=True)
        logp.sum().backward()
        model.zero_grad(set_to_none=True)

    def full_logits():
        logits = model(
            input_ids=full, attention_mask=full_mask, position_ids=position_ids_of(full_mask)
        ).logits[:, width - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        logp = logprobs.gather(-1, full[:, width:].unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            (-(logprobs.exp() * logprobs).sum(-1)).mean()
        logp.sum().backward()
        model.zero_grad(set_to_none=True)

    vocab = model.get_output_embeddings().weight.shape[0]
    out["chunked_logprobs"] = versus(
        timed(chunked, repeats),
        timed(full_logits, repeats),
        rows=n,
        full_logits_mb_not_built=n * (full.shape[1] - 1) * vocab * 4 / 2**20,
    )

    # 4. Padding: a micro-batch of ragged completions trimmed to its own longest row, against
    # the width the step's longest completion (a row in another micro-batch) would impose.
    lengths = torch.randint(max(1, w.max_new_tokens // 8), w.max_new_tokens, (n,), generator=gen)
    lengths[0] = w.max_new_tokens
    prompt_rows = [chat_prompt_ids(tokenizer, p.messages) for p in prompts[:n]]
    completions = [sampled[i, : int(lengths[i])].tolist() for i in range(n)]
    s_ids, s_attn, s_lens, s_cmask = assemble(prompt_rows, completions, pad)
    width_p = s_ids.shape[1] - s_cmask.shape[1]
    sel = torch.arange(1, n)  # every row but the longest

    def forward_backward(trimmed: bool):
        b_ids, b_attn, wp = s_ids[sel], s_attn[sel], width_p
        if trimmed:
            b_ids, b_attn, _, wp = trim(b_ids, b_attn, s_lens[sel], s_cmask[sel], width_p)
        logp, _ = completion_token_stats(model, b_ids, b_attn, wp, with_entropy=True)
        logp.sum().backward()
        model.zero_grad(set_to_none=True)

    out["padding_trim"] = versus(
        timed(lambda: forward_backward(True), repeats),
        timed(lambda: forward_backward(False), repeats),
        rows=n - 1,
        completion_lengths=[int(x) for x in lengths[1:]],
        step_completion_width=w.max_new_tokens,
    )

    # 5. The training forward + backward of a micro-batch whose rows come from few prompts (a
    # shuffled GRPO micro-batch): each distinct prompt once, its KV cache gathered per row
    # (trainers.core.logprobs.shared_prompt_hidden), against full rows.
    rows = [group_rows[i % len(group_rows)] for i in range(n)]
    completions = [sampled[i, : int(lengths[i])].tolist() for i in range(n)]
    g_ids, g_attn, _, g_cmask = assemble(rows, completions, pad)
    g_width_p = g_ids.shape[1] - g_cmask.shape[1]

    def group_forward_backward(shared: bool):
        with mock.patch.object(core_logprobs, "_checkpointing", lambda decoder: not shared):
            logp, _ = completion_token_stats(model, g_ids, g_attn, g_width_p, with_entropy=True)
        (logp * g_cmask).sum().backward()
        model.zero_grad(set_to_none=True)

    out["shared_prompt_forward"] = versus(
        timed(lambda: group_forward_backward(True), repeats),
        timed(lambda: group_forward_backward(False), repeats),
        rows=n,
        distinct_prompts=len(group_rows),
        prompt_tokens=g_width_p,
        completion_width=g_cmask.shape[1],
    )
    return out
