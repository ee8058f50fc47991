"""Our full GRPO rollout step (generate + score + train) against TRL's ``GRPOTrainer`` with
matched settings, on the built-in presets. Target: our throughput at least 1.5x TRL's.

    uv run python bench/grpo_vs_trl.py                 # tiny and small, ~6 min (one torch thread)
    uv run python bench/grpo_vs_trl.py --quick         # tiny only, short runs, < 1 min
    uv run python bench/grpo_vs_trl.py --models tiny,small --steps 3 --rounds 3
    uv run python bench/grpo_vs_trl.py --threads 2     # both cores; only on an idle machine

Matched: the model (a preset loaded by trainers.core.models, fp32 on the CPU, sdpa attention), the
prompts (our reasoning-gym ``spell_backward`` prompts, chat-templated by the same tokenizer; TRL
gets the same messages as a dataset of {"prompt", "answer", "prompt_index"} in the order our
prompt stream serves them, unshuffled, so step k of both sees the same prompts), the reward
(trainers.policy_gradients.rewards.compute_rewards, correctness + 0.5·format, wrapped in TRL's
reward-function signature), the group size (num_generations = num_rollouts), the completion
length (max_completion_length = max_new_tokens), sampling (temperature 1.0, top_p 1.0, top_k off,
KV cache, the same end-of-turn ids; ours samples with trainers/core/decoding.py, TRL with
``model.generate``), β = 0 (no reference model), one optimizer step per rollout
step (TRL num_iterations 1 and generation batch = micro-batch × accumulation; ours
updates_per_rollout 1 with the whole rollout batch in one optimizer step, so neither runs a π_old
forward), the loss aggregation (ours ``seq_mean_token_mean`` = TRL ``loss_type="grpo"``: each
sequence's token mean, averaged over the step's sequences), group-std advantages (TRL
scale_rewards="group"), ε 0.2, AdamW at the same constant learning rate, max_grad_norm 1.0,
gradient checkpointing off. No evaluation, checkpoints, logging backends or vLLM.

Measured per optimizer step (= rollout step), warm-up steps left out: wall time, process CPU
time, completion tokens (end-of-turn token included) and the phases. Our wall phases are the
trainer's own ``timing/*`` in metrics.jsonl; TRL's come from wrapping its methods on the trainer
instance: generation = ``_generate`` (tokenise, ``model.generate``, decode), scoring =
``_calculate_rewards``, prepare = the rest of ``_generate_and_score_completions`` (padding,
advantages, its logging), training = the rest of the step (log-prob forward, loss, backward,
clip, optimizer step); CPU seconds come from the same kind of wrappers on both. Contenders run in
alternating order (bench/_common.alternate) in this one process; throughput = completion tokens
(or steps) over the timed steps' time, median over rounds. With one torch thread (the default)
the CPU-time figures hardly move with the machine's load; wall times do (on a shared 2-core
machine, two threads each are far slower than one: OpenMP workers wait on each other).

Also: our trainer with a switch flipped (π_old recomputed by an extra forward as if the shortcut
were off; gradient checkpointing on); micro-benchmarks of the fast paths without a switch (KV
cache in generation, our sampling loop with one prefill per group against ``model.generate``,
chunked log-probs, per-micro-batch padding trim); and a loss agreement check on
one fixed rollout batch (sampled and oracle-written completions, scored by our reward): our loss
(the trainer's micro-batch path; losses.py + advantages.py with a perturbed π_old) against TRL's
own ``GRPOTrainer._compute_loss``, loss value and gradient, for each pair of aggregations that
coincide (seq_mean_token_mean / grpo, token_mean / dapo, seq_mean_token_sum_norm / dr_grpo).

Prints tables and writes bench/results/grpo_vs_trl.json. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402
from _common import ROOT, alternate, median_of, print_table, write_results  # noqa: E402
from _versus_trl import trl_common_args  # noqa: E402

from trainers.core import decoding as core_decoding  # noqa: E402
from trainers.core import logprobs as core_logprobs  # noqa: E402
from trainers.core.decoding import (  # noqa: E402
    GREEDY,
    Sampling,
    cut_after_first_stop,
    left_pad,
    sample_tokens,
)
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids  # noqa: E402
from trainers.core.models import load_causal_lm, load_tokenizer  # noqa: E402
from trainers.core.tasks import format_response  # noqa: E402
from trainers.policy_gradients import rollout as pg_rollout  # noqa: E402
from trainers.policy_gradients import train as pg_train  # noqa: E402
from trainers.policy_gradients.advantages import (  # noqa: E402
    drgrpo_advantages,
    grpo_advantages,
)
from trainers.policy_gradients.config import PolicyGradientConfig  # noqa: E402
from trainers.policy_gradients.data import Prompt, PromptStream, load_prompts  # noqa: E402
from trainers.policy_gradients.losses import (  # noqa: E402
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossParams,
    aggregate,
)
from trainers.policy_gradients.rewards import compute_rewards  # noqa: E402
from trainers.policy_gradients.rollout import (  # noqa: E402
    assemble,
    completion_token_stats,
    generate_group_batch,
    position_ids_of,
    prepare_update,
    trim,
)

TARGET_RATIO = 1.5
CONFIG = ROOT / "trainers" / "policy_gradients" / "configs" / "grpo.yaml"
OURS, TRL = "ours", "TRL GRPOTrainer"
OURS_OLD = "ours, π_old recomputed"
OURS_CKPT = "ours, gradient checkpointing"
FORMAT_WEIGHT = 0.5  # ALGORITHMS.md: total = correctness + 0.5·format
MATCHED = (
    "same model files (preset, fp32, CPU, sdpa), prompts in the same order, reward function, "
    "group size, max new tokens, sampling (temperature 1.0, top_p 1.0, top_k off, KV cache), "
    "beta 0 (no reference model), one optimizer step per rollout step (TRL num_iterations 1), "
    "ours seq_mean_token_mean == TRL loss_type grpo, group-std advantages (scale_rewards group), "
    "clip eps 0.2, AdamW with the same constant learning rate, max_grad_norm 1.0, gradient "
    "checkpointing off, no eval / checkpoints / logging backends / vLLM"
)
DIFFERENCES = (
    "TRL's advantage divides by the group std + 1e-4 (ours + 1e-8, and exactly 0 for a group "
    "without contrast): gradients differ by ~1e-4 relative, see loss_agreement",
    "TRL's optimizer is transformers' default adamw_torch_fused; ours torch.optim.AdamW",
    "TRL on CPU applies its fused LM head to every position (prompt included, no Triton "
    "compaction) and passes no position_ids (RoPE is relative, so the log-probs agree); ours "
    "applies the head to completion positions only",
    "TRL pads the whole generation batch to its longest completion; ours trims each "
    "micro-batch to its own longest row (no difference when every completion is full length)",
    "entropy: both compute it from the same logits for logging",
)


# ---------------------------------------------------------------------------------------------
# The workload both trainers run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One rollout step = ``prompts_per_step × num_generations`` sequences, trained in one
    optimizer step of ``micro_batch × grad_accum`` sequences (so both trainers may skip π_old)."""

    model: str
    prompts_per_step: int = 2
    num_generations: int = 8
    max_new_tokens: int = 32
    micro_batch: int = 8
    grad_accum: int = 2
    learning_rate: float = 5e-6
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    warmup_steps: int = 1
    timed_steps: int = 3
    data_size: int = 64
    seed: int = 42

    def __post_init__(self) -> None:
        if self.prompts_per_step * self.num_generations != self.micro_batch * self.grad_accum:
            raise SystemExit("prompts × generations must equal micro_batch × grad_accum")

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.timed_steps


def load_bench_prompts(w: Workload) -> tuple[list[Prompt], list[int]]:
    """Our training prompts (same specs, size and seed as the trainer builds) and the prompt
    indices our stream serves over the run, step by step."""
    specs = PolicyGradientConfig().data.specs  # the grpo default: spell_backward, words 3-10
    prompts, _ = load_prompts(specs, w.data_size, 0, w.seed)
    stream = PromptStream(len(prompts), w.seed)
    order = [i for _ in range(w.total_steps) for i in stream.take(w.prompts_per_step)]
    return prompts, order


@contextlib.contextmanager
def captured_output() -> Iterator[io.StringIO]:
    """Keep the trainers' per-step prints out of the table; shown if a run fails."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield buffer
    except BaseException:
        sys.stderr.write(buffer.getvalue()[-4000:])
        raise


PHASES = ("generate", "score", "prepare", "train", "step")


class CpuClock:
    """Process CPU seconds of each step and of its phases, from wrappers around the functions
    each trainer calls (same method for both). Wall time on a shared machine moves with the
    neighbours' load; the CPU time a step consumes moves much less (with one torch thread)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self.current: dict[str, float] = {}
        self.started = 0.0

    def begin(self) -> None:
        self.current = {}
        self.started = time.process_time()

    def end(self) -> None:
        self.current["step_cpu_s"] = time.process_time() - self.started
        self.steps.append(self.current)

    def wrap(self, fn: Callable, phase: str, on_result: Callable | None = None) -> Callable:
        def timed_call(*args, **kwargs):
            t0 = time.process_time()
            out = fn(*args, **kwargs)
            key = f"{phase}_cpu_s"
            self.current[key] = self.current.get(key, 0.0) + time.process_time() - t0
            if on_result is not None:
                on_result(self.current, out)
            return out

        return timed_call


def summarize(steps: list[dict[str, float]]) -> dict[str, Any]:
    """Throughput over the timed steps and the mean seconds per step of each phase (wall and
    process CPU)."""
    wall = sum(s["step_s"] for s in steps)
    cpu = sum(s["step_cpu_s"] for s in steps)
    tokens = sum(s["completion_tokens"] for s in steps)
    out: dict[str, Any] = {
        "steps_per_s": len(steps) / wall,
        "completion_tokens_per_s": tokens / wall,
        "completion_tokens_per_cpu_s": tokens / cpu,
        "completion_tokens_per_step": tokens / len(steps),
    }
    for phase in PHASES:
        for unit in ("s", "cpu_s"):
            key = f"{phase}_{unit}"
            out[key] = statistics.fmean(s.get(key, 0.0) for s in steps)
    out["per_step"] = [{k: round(v, 4) for k, v in s.items()} for s in steps]
    return out


# ---------------------------------------------------------------------------------------------
# Our trainer (trainers.policy_gradients.train, in this process)
# ---------------------------------------------------------------------------------------------


def our_overrides(w: Workload, gradient_checkpointing: bool = False) -> list[str]:
    return [
        f"model.name={w.model}",
        f"model.gradient_checkpointing={str(gradient_checkpointing).lower()}",
        "model.device=cpu",
        "model.dtype=fp32",
        "model.attn_implementation=sdpa",
        f"data.size={w.data_size}",
        "data.eval_size=0",
        f"rollout.prompts_per_step={w.prompts_per_step}",
        f"rollout.num_rollouts={w.num_generations}",
        f"rollout.max_new_tokens={w.max_new_tokens}",
        f"rollout.temperature={w.temperature}",
        f"rollout.top_p={w.top_p}",
        f"rollout.top_k={w.top_k}",
        f"train.batch_size={w.micro_batch}",
        f"train.gradient_accumulation_steps={w.grad_accum}",
        f"train.learning_rate={w.learning_rate}",
        f"train.max_steps={w.total_steps}",
        "train.max_grad_norm=1.0",
        "loss.loss_agg=seq_mean_token_mean",
        "loss.beta=0.0",
        "loss.updates_per_rollout=1",
        "eval.eval_every=0",
        "eval.sample_every=0",
        "checkpoint.save_every=null",
        "checkpoint.save_final_model=false",
        f"seed={w.seed}",
    ]


@contextlib.contextmanager
def pi_old_shortcut(enabled: bool) -> Iterator[None]:
    """The trainer has no config switch for the π_old shortcut (it applies whenever π = π_old
    holds); to time the step without it, ``needs_old_logps`` is forced True for the run: the
    rollout gets the extra no-grad forward and the loss reads the stored π_old (same math)."""
    if enabled:
        yield
        return
    forced = property(lambda self: True)
    with mock.patch.object(PolicyGradientConfig, "needs_old_logps", forced):
        yield


def our_step_rows(rows: list[dict], sequences: int) -> list[dict[str, float]]:
    """Per rollout step: the trainer's own timing/* (wall) and completion tokens, from
    metrics.jsonl."""
    rollout = {r["step"]: r for r in rows if r.get("phase") == "rollout"}
    train = {r["step"]: r for r in rows if r.get("phase") == "train"}
    steps = []
    for step in sorted(train):
        ro, tr = rollout[step], train[step]
        steps.append(
            {
                "step_s": tr["timing/step_s"],
                "generate_s": ro["timing/generate_s"],
                "score_s": ro["timing/score_s"],
                "prepare_s": ro["timing/prepare_s"],
                "train_s": tr["timing/train_s"],
                "completion_tokens": ro["response_length/mean"] * sequences,
            }
        )
    return steps


@contextlib.contextmanager
def our_cpu_clock(clock: CpuClock) -> Iterator[None]:
    """Wrap the functions our loop calls once per step: rollout_step opens the step, update
    closes it; generate_group_batch and score are the rollout's two parts."""
    rollout_step, update = pg_train.rollout_step, pg_train.update

    def opened(*args, **kwargs):
        clock.begin()
        return rollout_step(*args, **kwargs)

    def closed(*args, **kwargs):
        out = clock.wrap(update, "train")(*args, **kwargs)
        clock.end()
        return out

    with (
        mock.patch.object(
            pg_rollout,
            "generate_group_batch",
            clock.wrap(pg_rollout.generate_group_batch, "generate"),
        ),
        mock.patch.object(pg_rollout, "score", clock.wrap(pg_rollout.score, "score")),
        mock.patch.object(pg_train, "rollout_step", opened),
        mock.patch.object(
            pg_train, "prepare_update", clock.wrap(pg_train.prepare_update, "prepare")
        ),
        mock.patch.object(pg_train, "update", closed),
    ):
        yield


def run_ours(w: Workload, shortcut: bool = True, checkpointing: bool = False) -> dict[str, Any]:
    clock = CpuClock()
    with tempfile.TemporaryDirectory(prefix="grpo-bench-ours-") as tmp:
        run_dir = Path(tmp) / "run"
        argv = ["--config", str(CONFIG), "--run-dir", str(run_dir)]
        for item in our_overrides(w, checkpointing):
            argv += ["--set", item]
        with captured_output() as log, pi_old_shortcut(shortcut), our_cpu_clock(clock):
            code = pg_train.main(argv)
        if code != 0:
            raise SystemExit(f"our trainer exited with {code}:\n{log.getvalue()[-4000:]}")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = our_step_rows(rows, w.prompts_per_step * w.num_generations)
    if len(steps) != w.total_steps or len(clock.steps) != w.total_steps:
        raise SystemExit(f"our trainer logged {len(steps)} steps, expected {w.total_steps}")
    for wall, cpu in zip(steps, clock.steps, strict=True):
        wall.update(cpu)
    return summarize(steps[w.warmup_steps :])


# ---------------------------------------------------------------------------------------------
# TRL's GRPOTrainer (same process, same model files, same prompts and reward)
# ---------------------------------------------------------------------------------------------


def trl_dataset(prompts: list[Prompt], order: list[int]):
    from datasets import Dataset

    return Dataset.from_list(
        [
            {"prompt": prompts[i].messages, "answer": prompts[i].answer, "prompt_index": i}
            for i in order
        ]
    )


def trl_reward(prompts: list[Prompt]) -> Callable[..., list[float]]:
    """Our reward (correctness + 0.5·format) in TRL's reward-function signature; the extra
    dataset column ``prompt_index`` finds the reasoning-gym entry the answer is scored against."""

    def reward(completions, completion_ids, prompt_index, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rewards = compute_rewards(
            texts,
            [prompts[i].meta for i in prompt_index],
            [len(c) for c in completion_ids],
            format_weight=FORMAT_WEIGHT,
        )
        return rewards["total"].tolist()

    reward.__name__ = "correctness_plus_format"
    return reward


def trl_config(w: Workload, output_dir: str, **overrides):
    """GRPOConfig matched to our trainer: the TrainingArguments every ours-vs-TRL benchmark
    shares (CPU, fp32, no checkpointing, no eval, log every step) with GRPO's sampling, loss and
    batch settings and a constant learning rate."""
    from trl import GRPOConfig

    common = trl_common_args(output_dir, w.micro_batch, w.total_steps, w.learning_rate)
    settings = {
        **common,
        "lr_scheduler_type": "constant",
        "gradient_accumulation_steps": w.grad_accum,
        "seed": w.seed,
        "dataloader_pin_memory": False,
        "num_generations": w.num_generations,
        "max_completion_length": w.max_new_tokens,
        "temperature": w.temperature,
        "top_p": w.top_p,
        "top_k": w.top_k,
        "beta": 0.0,
        "num_iterations": 1,
        "loss_type": "grpo",
        "scale_rewards": "group",
        "epsilon": 0.2,
        "shuffle_dataset": False,
    }
    settings.update(overrides)
    return GRPOConfig(**settings)


def trl_model(name: str, tokenizer):
    """The preset as our trainer loads it; every end-of-turn id stops generation (ours stops on
    the same set, trainers.core.generation.end_of_turn_ids)."""
    model = load_causal_lm(name, device="cpu", dtype="fp32", attn_implementation="sdpa")
    model.generation_config.eos_token_id = end_of_turn_ids(tokenizer)
    return model


def phase_clock():
    """A TrainerCallback timing each optimizer step (wall and CPU), plus wrappers of the
    trainer's own rollout methods (instance attributes shadow the class's) that split it."""
    from transformers import TrainerCallback

    class PhaseClock(TrainerCallback):
        def __init__(self):
            self.cpu = CpuClock()
            self.steps: list[dict[str, float]] = []
            self.wall: dict[str, float] = {}
            self.started = 0.0

        def attach(self, trainer) -> None:
            for name, phase in (
                ("_generate", "generate"),
                ("_calculate_rewards", "score"),
                ("_generate_and_score_completions", "rollout"),
            ):
                timed_wall = self._wall(getattr(trainer, name), phase)
                setattr(trainer, name, self.cpu.wrap(timed_wall, phase, self._count))

        def _wall(self, method, phase):
            def timed_call(*args, **kwargs):
                t0 = time.perf_counter()
                out = method(*args, **kwargs)
                self.wall[phase] = self.wall.get(phase, 0.0) + time.perf_counter() - t0
                return out

            return timed_call

        @staticmethod
        def _count(current, out):
            if isinstance(out, tuple):  # _generate: (prompt_ids, completion_ids, ...)
                current["completion_tokens"] = sum(len(c) for c in out[1])

        def on_step_begin(self, args, state, control, **kwargs):
            self.wall = {}
            self.cpu.begin()
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_s = time.perf_counter() - self.started
            self.cpu.end()
            cpu, wall = self.cpu.steps[-1], self.wall
            gen, score, rollout = (wall.get(k, 0.0) for k in ("generate", "score", "rollout"))
            c_gen, c_score, c_rollout = (
                cpu.get(f"{k}_cpu_s", 0.0) for k in ("generate", "score", "rollout")
            )
            self.steps.append(
                {
                    "step_s": step_s,
                    "generate_s": gen,
                    "score_s": score,
                    "prepare_s": rollout - gen - score,
                    "train_s": step_s - rollout,
                    "completion_tokens": cpu.get("completion_tokens", 0.0),
                    "step_cpu_s": cpu["step_cpu_s"],
                    "generate_cpu_s": c_gen,
                    "score_cpu_s": c_score,
                    "prepare_cpu_s": c_rollout - c_gen - c_score,
                    "train_cpu_s": cpu["step_cpu_s"] - c_rollout,
                }
            )

    return PhaseClock()


def run_trl(w: Workload, prompts: list[Prompt], order: list[int]) -> dict[str, Any]:
    from trl import GRPOTrainer

    clock = phase_clock()
    with tempfile.TemporaryDirectory(prefix="grpo-bench-trl-") as tmp, captured_output():
        tokenizer = load_tokenizer(w.model)
        trainer = GRPOTrainer(
            model=trl_model(w.model, tokenizer),
            reward_funcs=[trl_reward(prompts)],
            args=trl_config(w, tmp),
            train_dataset=trl_dataset(prompts, order),
            processing_class=tokenizer,
            callbacks=[clock],
        )
        clock.attach(trainer)
        trainer.train()
    if len(clock.steps) != w.total_steps:
        raise SystemExit(f"TRL ran {len(clock.steps)} steps, expected {w.total_steps}")
    return summarize(clock.steps[w.warmup_steps :])


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
        ours_loss, _, _, _ = pg_train.micro_batch_loss(
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


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def workloads(args) -> list[Workload]:
    base = dict(
        prompts_per_step=args.prompts,
        num_generations=args.generations,
        max_new_tokens=args.max_new_tokens,
        micro_batch=args.micro_batch,
        grad_accum=args.prompts * args.generations // args.micro_batch,
        timed_steps=args.steps,
        warmup_steps=args.warmup,
    )
    return [Workload(model=m, **base) for m in args.models]


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


MEDIAN_KEYS = (
    "completion_tokens_per_s",
    "steps_per_s",
    "completion_tokens_per_cpu_s",
    "completion_tokens_per_step",
    *(f"{phase}_{unit}" for phase in PHASES for unit in ("s", "cpu_s")),
)


def benchmark_model(w: Workload, rounds: int, variants: bool) -> dict[str, Any]:
    """Alternating runs of the contenders on one model; medians and ours/TRL ratios."""
    load_causal_lm(w.model, device="cpu")  # builds the preset on first use, untimed
    prompts, order = load_bench_prompts(w)
    contenders = {
        OURS: lambda: run_ours(w),
        TRL: lambda: run_trl(w, prompts, order),
    }
    if variants:
        contenders[OURS_OLD] = lambda: run_ours(w, shortcut=False)
        contenders[OURS_CKPT] = lambda: run_ours(w, checkpointing=True)
    print(f"[{w.model}] {len(contenders)} contenders x {rounds} rounds ...", flush=True)
    runs = alternate(contenders, rounds)
    medians = {
        name: {key: median_of(rows, key) for key in MEDIAN_KEYS} for name, rows in runs.items()
    }
    ours, trl = medians[OURS], medians[TRL]
    tok_ratio = ratio(ours["completion_tokens_per_s"], trl["completion_tokens_per_s"])
    cpu_ratio = ratio(ours["completion_tokens_per_cpu_s"], trl["completion_tokens_per_cpu_s"])
    return {
        "workload": asdict(w),
        "runs": runs,
        "medians": medians,
        "ratio_ours_over_trl": {
            "completion_tokens_per_s": tok_ratio,
            "steps_per_s": ratio(ours["steps_per_s"], trl["steps_per_s"]),
            "completion_tokens_per_cpu_s": cpu_ratio,
            **{
                f"{phase}_speedup": ratio(trl[f"{phase}_s"], ours[f"{phase}_s"])
                for phase in ("generate", "train", "step")
            },
        },
        "target_ratio": TARGET_RATIO,
        "target_met": bool(tok_ratio and tok_ratio >= TARGET_RATIO),
        "target_met_cpu_basis": bool(cpu_ratio and cpu_ratio >= TARGET_RATIO),
    }


def print_throughput(results: dict[str, Any], args) -> None:
    print(
        f"\nGRPO step, median over {args.rounds} alternating rounds of {args.steps} timed steps "
        f"(+{args.warmup} warm-up), {torch.get_num_threads()} torch thread(s); seconds per step; "
        f"target ours/TRL >= {TARGET_RATIO}"
    )
    rows = []
    for model, r in results.items():
        trl = r["medians"][TRL]
        for name, m in r["medians"].items():
            rows.append(
                [
                    model,
                    name,
                    m["completion_tokens_per_s"],
                    m["steps_per_s"],
                    ratio(m["completion_tokens_per_s"], trl["completion_tokens_per_s"]),
                    m["generate_s"],
                    m["score_s"],
                    m["prepare_s"],
                    m["train_s"],
                    m["completion_tokens_per_cpu_s"],
                    ratio(m["completion_tokens_per_cpu_s"], trl["completion_tokens_per_cpu_s"]),
                ]
            )
    print_table(
        [
            "model",
            "trainer",
            "tok/s",
            "steps/s",
            "vs TRL",
            "gen s",
            "score s",
            "prep s",
            "train s",
            "tok/CPU-s",
            "vs TRL (CPU)",
        ],
        rows,
    )
    print("(CPU-s: process CPU seconds, less sensitive to a busy machine than wall time)")
    for model, r in results.items():
        q = r["ratio_ours_over_trl"]
        verdict = {True: "met", False: "NOT met"}
        print(
            f"{model}: ours/TRL {q['completion_tokens_per_s']:.2f}x completion tokens/s, "
            f"{q['steps_per_s']:.2f}x steps/s -> {TARGET_RATIO}x target "
            f"{verdict[r['target_met']]}; CPU-time basis {q['completion_tokens_per_cpu_s']:.2f}x "
            f"-> {verdict[r['target_met_cpu_basis']]}"
        )


def print_agreement(agreement: dict[str, Any]) -> None:
    print("\nLoss agreement on one fixed batch (tiny): |ours − TRL| of the loss, relative L2")
    print("difference of the gradients (TRL's own advantages / identical advantages)")
    rows = []
    for name, r in agreement.items():
        if name == "batch":
            continue
        first, off = r["first_step"], r["perturbed_pi_old"]
        rows.append(
            [
                name,
                first["ours_loss"],
                first["loss_abs_diff"],
                first["grad_vs_trl"]["rel_l2_diff"],
                first["grad_vs_trl_with_our_advantages"]["rel_l2_diff"],
                off["ours_loss"],
                off["loss_abs_diff"],
                off["grad_vs_trl"]["rel_l2_diff"],
            ]
        )
    print_table(
        [
            "pair",
            "loss",
            "loss diff",
            "grad diff",
            "grad diff same A",
            "π_old≠π loss",
            "loss diff",
            "grad diff",
        ],
        rows,
    )


def print_fast_paths(paths: dict[str, Any], results: dict[str, Any]) -> None:
    print(f"\nFast paths ({paths['model']}; micro-benchmarks: median of {paths['repeats']})")
    rows = []
    for model, r in results.items():
        med = r["medians"]
        if OURS_OLD in med:
            trainer_variants = (
                ("skip the π_old forward", OURS_OLD, "step"),
                ("no gradient checkpointing", OURS_CKPT, "train"),
            )
            for label, replaced, phase in trainer_variants:
                fast, slow = med[OURS], med[replaced]
                rows.append(
                    [
                        f"{model}: {label} ({phase})",
                        fast[f"{phase}_s"],
                        slow[f"{phase}_s"],
                        slow[f"{phase}_s"] / fast[f"{phase}_s"],
                        slow[f"{phase}_cpu_s"] / fast[f"{phase}_cpu_s"],
                        "trainer runs",
                    ]
                )
    notes = {
        "generate_kv_cache": (
            "generate with KV cache",
            lambda p: f"{p['rows']} rows x {p['new_tokens']} new tokens",
        ),
        "chunked_logprobs": (
            "chunked log-probs (fwd+bwd)",
            lambda p: f"fp32 logits not built: {p['full_logits_mb_not_built']:.0f} MB",
        ),
        "padding_trim": (
            "trim padding per micro-batch",
            lambda p: (
                "completions "
                f"{min(p['completion_lengths'])}-{max(p['completion_lengths'])} of "
                f"{p['step_completion_width']} tokens"
            ),
        ),
        "shared_prompt_forward": (
            "one prompt forward per group (fwd+bwd)",
            lambda p: (
                f"{p['rows']} rows, {p['distinct_prompts']} prompts of {p['prompt_tokens']} tokens, "
                f"completions {p['completion_width']}"
            ),
        ),
        "drop_stopped_rows": (
            "stopped rows leave the batch",
            lambda p: (
                f"{p['rows']} rows, lengths {p['completion_lengths'][0]}-"
                f"{p['completion_lengths'][-1]} of {p['new_tokens']}"
            ),
        ),
        "sampling_loop": (
            "our sampling loop vs generate",
            lambda p: (
                f"{p['rows']} rows; prefill once x{p['prefill_once_speedup']:.2f}, "
                f"lean loop x{p['lean_loop_speedup']:.2f}; "
                f"greedy identical: {p['greedy_identical']}"
            ),
        ),
    }
    for key, (label, note) in notes.items():
        p = paths[key]
        rows.append(
            [
                label,
                p["fast"]["wall_s"],
                p["replaced"]["wall_s"],
                p["speedup_wall"],
                p["speedup_cpu"],
                note(p),
            ]
        )
    print_table(["path", "fast s", "replaced s", "speedup", "speedup (CPU)", "note"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny only, short runs (< 1 min)")
    parser.add_argument("--models", default=None, help="comma-separated presets (tiny,small)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first steps per run")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="group size G")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (0: torch's default, all cores)"
    )
    parser.add_argument(
        "--variants",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time our trainer with π_old recomputed and with gradient checkpointing "
        "(default: on, off with --quick)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    quick = args.quick
    args.models = (args.models or ("tiny" if quick else "tiny,small")).split(",")
    args.steps = args.steps or (2 if quick else 3)
    args.rounds = args.rounds or (2 if quick else 3)
    args.prompts = args.prompts or (1 if quick else 2)
    args.max_new_tokens = args.max_new_tokens or (16 if quick else 32)
    if args.variants is None:
        args.variants = not quick
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    started = time.perf_counter()

    results = {w.model: benchmark_model(w, args.rounds, args.variants) for w in workloads(args)}
    print_throughput(results, args)

    # tiny, 2 prompts x 4 generations in one micro-batch of 8, 24 new tokens
    agreement_w = Workload("tiny", 2, 4, max_new_tokens=24, micro_batch=8, grad_accum=1)
    agreement = loss_agreement(agreement_w, load_bench_prompts(agreement_w)[0])
    print_agreement(agreement)

    fast_w = workloads(args)[-1]
    paths = fast_paths(fast_w, load_bench_prompts(fast_w)[0], repeats=2 if quick else 3)
    print_fast_paths(paths, results)

    write_results(
        "grpo_vs_trl",
        {
            "quick": quick,
            "settings": {
                "models": args.models,
                "rounds": args.rounds,
                "timed_steps": args.steps,
                "warmup_steps": args.warmup,
                "torch_threads": torch.get_num_threads(),
                "matched": MATCHED,
                "differences_left": DIFFERENCES,
            },
            "results": results,
            "loss_agreement": agreement,
            "fast_paths": paths,
            "wall_s": round(time.perf_counter() - started, 1),
        },
        out=args.out,
    )


if __name__ == "__main__":
    main()
