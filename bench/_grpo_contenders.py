"""The two contenders of bench/grpo_vs_trl.py: the workload both run, our GRPO trainer in this
process with its phases clocked, and TRL's GRPOTrainer with matched settings and its phases
clocked by wrapping its methods."""

from __future__ import annotations

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

from _common import ROOT  # noqa: E402
from _versus_trl import trl_common_args  # noqa: E402

from trainers.core.generation import end_of_turn_ids  # noqa: E402
from trainers.core.models import load_causal_lm, load_tokenizer  # noqa: E402
from trainers.core.prompts import Prompt, PromptStream  # noqa: E402
from trainers.core.prompts import composite_prompts as load_prompts  # noqa: E402
from trainers.core.verifier import compute_rewards  # noqa: E402
from trainers.policy_gradients import rollout as pg_rollout  # noqa: E402
from trainers.policy_gradients import train as pg_train  # noqa: E402
from trainers.policy_gradients.config import PolicyGradientConfig  # noqa: E402

TARGET_RATIO = 2.0
CONFIG = ROOT / "trainers" / "policy_gradients" / "configs" / "grpo.yaml"
OURS, TRL = "ours", "TRL GRPOTrainer"
OURS_OLD = "ours, π_old recomputed"
OURS_CKPT = "ours, gradient checkpointing"
FORMAT_WEIGHT = 0.5  # docs/algorithms.md: total = correctness + 0.5·format
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
