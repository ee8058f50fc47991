"""On-policy distillation (Agarwal et al. 2024, GKD with λ = 1: every sequence is the student's).

    python -m trainers.distillation.train --config configs/distill.yaml --run-dir DIR \
        [--set teacher.name=<run>/final_model] [--set loss.divergence=jsd] [--resume]

The loop, per optimizer step:
  1. take the next ``batch_size × gradient_accumulation_steps`` training prompts;
  2. the student samples ``rollout.num_samples`` completions per prompt (no gradient; one
     prefill per prompt, trainers/core/decoding.py), seeded by (seed, step);
  3. per micro-batch of ``batch_size`` prompts: one forward of the student (with gradients) and
     one of the frozen teacher (no gradient) over prompt + sampled completion; at every
     completion position both next-token distributions over the whole vocabulary;
  4. loss = Σ over completion tokens of D(student ‖ teacher) at that token
     (``loss.divergence``: reverse KL by default, forward KL, or GKD's generalised JSD with
     ``loss.beta``) / the step's completion-token count, backward;
  5. clip, step, schedule.
Held out: greedy completions of the held-out prompts scored by the reasoning-gym verifier
(``eval/avg_correctness``, the headline); the teacher's own score on the same prompts is
computed once and logged beside it (``eval/teacher_avg_correctness``).
"""

from __future__ import annotations

import sys

import torch

from trainers.core.config import ConfigError
from trainers.core.decoding import Sampling
from trainers.core.generation import chat_prompt_ids
from trainers.core.harness import raise_if_stopping, trainer_main
from trainers.core.logprobs import forward_left_padded, split_rows
from trainers.core.loop import (
    BestMetric,
    StepTimer,
    TrainingRun,
    data_info,
    step_metrics,
)
from trainers.core.models import (
    ModelError,
    load_causal_lm,
    load_tokenizer,
    pick_runtime,
    resolve_model,
)
from trainers.core.onpolicy import (
    greedy_rollouts,
    pad_id_of,
    rows_of,
    sample_policy,
    step_generator,
)
from trainers.core.prompts import load_run_prompts
from trainers.core.rundir import RunDir
from trainers.core.runfolder import SummaryFile
from trainers.core.tokenization import same_tokenizer
from trainers.core.training import (
    StepMetrics,
    optimizer_step,
    ready_to_train,
    seed_everything,
)
from trainers.core.verifier import compute_rewards
from trainers.distillation.config import DistillationConfig
from trainers.distillation.losses import distillation_loss, token_log_probs

# ---------------------------------------------------------------------------------------------
# Checks before anything is written
# ---------------------------------------------------------------------------------------------


def _vocab_size(name: str, key: str) -> int:
    """The output vocabulary (the LM head's rows) of model ``name``, read from its config."""
    from transformers import AutoConfig

    from trainers.core.models import _pretrained_args
    from trainers.core.tiny import ensure_preset, quiet_hf

    source = resolve_model(name)
    if source.kind == "preset":
        ensure_preset(name)
        source = resolve_model(name)
    try:
        first, kwargs = _pretrained_args(source, ("config.json",))
        kwargs.pop("gguf_file", None)
        with quiet_hf():
            config = AutoConfig.from_pretrained(first, **kwargs)
    except (ModelError, OSError, ValueError) as err:
        raise ConfigError(f"{key}={name!r}: its config cannot be loaded ({err})") from None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.vocab_size)


def check_teacher(student: str, teacher: str) -> None:
    """The teacher must score the student's tokens: same tokenizer (vocabulary, special tokens,
    chat template) and the same output vocabulary size. ConfigError otherwise."""
    if teacher.startswith("run:"):
        raise ConfigError(
            f"teacher.name={teacher!r}: run:<id> references are resolved by the lab (rlhf-lab "
            "launch / launch_run); the trainer needs the folder, e.g. <runs root>/<id>/final_model"
        )
    try:
        resolve_model(teacher)
        s_tok, t_tok = load_tokenizer(student), load_tokenizer(teacher)
    except ModelError as err:
        raise ConfigError(f"teacher.name={teacher!r}: {err}") from None
    if not same_tokenizer(s_tok, t_tok):
        raise ConfigError(
            f"teacher.name={teacher!r} has a different tokenizer from the student "
            f"(model.name={student!r}): per-token distillation compares the two distributions "
            "token by token, so both need the same vocabulary, special tokens and chat "
            "template; pick a teacher of the student's model family"
        )
    s_vocab, t_vocab = _vocab_size(student, "model.name"), _vocab_size(teacher, "teacher.name")
    if s_vocab != t_vocab:
        raise ConfigError(
            f"teacher.name={teacher!r} predicts over {t_vocab} tokens and the student "
            f"(model.name={student!r}) over {s_vocab}: the per-token divergence needs the same "
            "output vocabulary; pick a teacher of the student's model family"
        )


def preflight(cfg: DistillationConfig) -> None:
    """Checks that load no weights: fail before anything is written."""
    check_teacher(cfg.model.name, cfg.teacher.name)
    if not cfg.data.has_verifier:
        raise ConfigError(
            f"data.dataset={cfg.data.dataset!r}: the held-out headline is the verifier's "
            "correctness; use reasoning-gym prompts (data.source=reasoning_gym) or "
            "data.dataset=builtin"
        )


# ---------------------------------------------------------------------------------------------
# Sampling and per-token distributions
# ---------------------------------------------------------------------------------------------


def student_sampling(cfg: DistillationConfig) -> Sampling:
    """How the student samples its training completions (``rollout.*``)."""
    r = cfg.rollout
    return Sampling(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)


def completion_logits(model, ids, attn, width_p: int):
    """The model's next-token logits at every completion position (N, T_c, V) of
    ``[left-padded prompt | right-padded completion]`` rows (``split_rows``): position j
    predicts completion token j."""
    device = next(model.parameters()).device
    logits = forward_left_padded(model, ids.to(device), attn.to(device)).logits
    return logits[:, width_p - 1 : -1]


def micro_batch_loss(cfg, student, teacher, prompts, completions, pad_id, step_tokens: int):
    """The distillation loss of one micro-batch, as a share of the step's tokens, and metrics
    (the divergence, the reverse KL, and both models' log-prob of the sampled tokens)."""
    ids, attn, cmask, width_p = split_rows(prompts, completions, pad_id)
    s_logits = completion_logits(student, ids, attn, width_p)
    mask = cmask.to(s_logits.device)
    with torch.no_grad():
        t_logits = completion_logits(teacher, ids, attn, width_p)
    loss, metrics = distillation_loss(
        s_logits,
        t_logits,
        mask,
        divergence=cfg.loss.divergence,
        beta=cfg.loss.beta,
        temperature=cfg.loss.temperature,
        n_tokens=step_tokens,
    )
    with torch.no_grad():
        sampled = ids[:, width_p:].to(mask.device).unsqueeze(-1)
        n = max(int(mask.sum()), 1)
        for name, logits in (("teacher_logp", t_logits), ("student_logp", s_logits)):
            logp = token_log_probs(logits).gather(-1, sampled).squeeze(-1)
            metrics[name] = float((logp * mask).sum()) / n
    return loss, metrics, int(mask.sum())


# ---------------------------------------------------------------------------------------------
# Held-out evaluation
# ---------------------------------------------------------------------------------------------


def evaluate(cfg: DistillationConfig, model, tokenizer, held_out, prefix: str = "eval/"):
    """Greedy completions of the held-out prompts, scored by the verifier:
    ``<prefix>avg_correctness``, ``<prefix>avg_format``, ``<prefix>response_length/mean``."""

    max_new = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    out = greedy_rollouts(model, tokenizer, held_out, max_new, cfg.eval.eval_batch_size)
    r = compute_rewards(out["texts"], [p.meta for p in held_out], out["lengths"])
    n = max(len(held_out), 1)
    metrics = {
        f"{prefix}avg_correctness": float(r["correctness"].mean()),
        f"{prefix}avg_format": float(r["format"].mean()),
        f"{prefix}response_length/mean": sum(out["lengths"]) / n,
    }
    samples = [
        {"kind": "eval", "question": p.question, "answer": p.answer, "completion": t}
        for p, t in zip(held_out, out["texts"], strict=True)
    ][: cfg.eval.num_samples]
    return metrics, samples


# ---------------------------------------------------------------------------------------------
# The training loop
# ---------------------------------------------------------------------------------------------


def train(cfg: DistillationConfig, run: RunDir, resume: bool) -> SummaryFile:
    """Sample from the student, score every token with the teacher, minimise the divergence;
    see the module doc."""
    seed_everything(cfg.seed)
    device, dtype, attn = pick_runtime(cfg.model)
    tokenizer = load_tokenizer(cfg.model.name)
    pad_id = pad_id_of(tokenizer)

    run.update_phase("tokenizing")
    train_prompts, held_out, data_stats = load_run_prompts(cfg.data, cfg.seed)
    prompt_ids = [chat_prompt_ids(tokenizer, p.messages) for p in train_prompts]
    info = data_info(data_stats, len(train_prompts), len(held_out), teacher=cfg.teacher.name)
    loop = TrainingRun.over_epochs(run, cfg, len(train_prompts))

    run.update_phase("loading_model", loop.total_steps)
    teacher = load_causal_lm(
        cfg.teacher.name, device=device, dtype=dtype, attn_implementation=attn, trainable=False
    )
    teacher.eval()
    student = load_causal_lm(
        cfg.model.name, device=device, dtype=dtype, attn_implementation=attn, trainable=True
    )
    ready_to_train(student, cfg.model)  # one process: no sharding
    optimizer, scheduler, state = loop.optimizer_and_resume(
        student, student.parameters(), cfg.train, resume
    )
    loop.start_tracker(cfg.logging, cfg.model_dump(mode="json"), f"distill-{run.path.name}")
    best = BestMetric("eval/avg_correctness")

    teacher_eval: dict[str, float] = {}
    if held_out:  # the ceiling the student is read against
        loop.progress("evaluating")
        teacher_eval, _ = evaluate(cfg, teacher, tokenizer, held_out, prefix="eval/teacher_")
        teacher_eval.pop("eval/teacher_response_length/mean", None)
        print(f"teacher held-out: {teacher_eval}", flush=True)

    def run_eval() -> None:
        loop.progress("evaluating")
        metrics, samples = evaluate(cfg, student, tokenizer, held_out)
        loop.last_eval = {**metrics, **teacher_eval}
        loop.log("eval", loop.last_eval)
        loop.log_samples(samples)
        best.update(loop.last_eval)

    def after_step() -> None:
        if loop.every(cfg.eval.eval_every) and held_out:
            run_eval()

    if not resume and cfg.eval.eval_every > 0 and held_out:  # the starting point
        loop.progress("evaluating")
        start, _ = evaluate(cfg, student, tokenizer, held_out)
        loop.log_start({**start, **teacher_eval})
    if loop.redo_events:
        after_step()

    position = state["data_position"] if state else None
    k = cfg.rollout.num_samples
    for pos in loop.epoch_steps(len(train_prompts), cfg.train, cfg.seed, position):
        timer = StepTimer()
        # 1-2. the student samples (on-policy)
        loop.progress("generating")
        prompts = [prompt_ids[i] for i in pos.ids]
        completions = sample_policy(
            student,
            tokenizer,
            prompts,
            max_new_tokens=cfg.rollout.max_new_tokens,
            sampling=student_sampling(cfg),
            repeats=k,
            generator=step_generator(device, cfg.seed, loop.step),
        )
        rows = rows_of(prompts, k)
        # 3-4. the teacher scores every sampled token; divergence per token, mean over the step
        loop.progress("training", epoch=pos.epoch)
        step_tokens = max(sum(len(c) for c in completions), 1)
        agg = StepMetrics()
        per_micro = cfg.train.batch_size * k
        for m in range(0, len(rows), per_micro):
            raise_if_stopping("micro_batch")
            sl = slice(m, m + per_micro)
            loss, metrics, n_tok = micro_batch_loss(
                cfg, student, teacher, rows[sl], completions[sl], pad_id, step_tokens
            )
            loss.backward()
            agg.add(metrics, weight=n_tok)
        # 5. update
        grad_norm, lr = optimizer_step(
            student.parameters(), optimizer, scheduler, cfg.train.max_grad_norm
        )
        lengths = [len(c) for c in completions]
        row = step_metrics(
            {**agg.mean(), "completion_length": sum(lengths) / len(lengths)},
            grad_norm,
            lr,
            step_tokens,
            timer,
            device,
            epoch=pos.epoch_progress,
        )
        loop.step_done(row, step_tokens, cfg.logging.log_every)
        loop.end_step(after_step, epoch=pos.epoch)

    loop.save_final_model(student, tokenizer)
    loop.finish()
    return loop.summary(cfg.algorithm, best, device, **info)


# One process only in this version (``multi_process=False`` in spec.py): the harness refuses
# torchrun with one clear error.
main = trainer_main(__doc__, DistillationConfig, preflight, train)


if __name__ == "__main__":
    sys.exit(main())
