"""The harness shared by the "ours against TRL" throughput benchmarks (bench/dpo_vs_trl.py,
bench/rm_vs_trl.py, and TRL's training arguments for bench/grpo_vs_trl.py): a quiet offline
environment, one torch thread setting, a bench-private cache, step stamps on both sides turned
into window throughput, TRL's common TrainingArguments, micro-benchmark timing, the shared
command line, medians, table rows and each model's results block.

Torch, transformers and TRL are imported inside the functions that need them.
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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from _common import alternate, median_of, write_results

TARGET_RATIO = 1.5  # ours >= this x TRL's tokens/s; a script may raise it (set_target)
MAX_LENGTH = 128  # the built-in pairs are at most ~115 tokens: nothing is truncated
SEED = 42


# ---------------------------------------------------------------------------------------------
# Environment shared by both contenders
# ---------------------------------------------------------------------------------------------


def quiet_offline_env() -> None:
    """Offline, no W&B, no progress bars; set before transformers/datasets are imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["WANDB_MODE"] = "disabled"
    os.environ.pop("WANDB_PROJECT", None)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["TQDM_DISABLE"] = "1"
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    os.environ["ACCELERATE_LOG_LEVEL"] = "error"
    warnings.filterwarnings("ignore")


def set_target(ratio: float) -> None:
    """The script's target ratio (issue 18: DPO and GRPO 2x, the reward model 1.5x)."""
    global TARGET_RATIO
    TARGET_RATIO = ratio


def set_threads(threads: int) -> int:
    """One torch thread setting for the whole process, so both contenders get the same. Warns
    when the machine is already busy: more OpenMP threads than idle cores spin-wait and can slow
    a small model's step several-fold, whichever contender happens to run at that moment."""
    import torch

    torch.set_num_threads(threads)
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if threads > 1 and load > cores / 2:
        print(
            f"warning: load average {load:.1f} on {cores} cores with {threads} torch threads; "
            "wall-clock figures will be noisy (the CPU-time columns much less so); --threads 1 "
            "is steadier on a shared machine",
            file=sys.stderr,
        )
    return torch.get_num_threads()


def micro_reps(model: str, quick: bool) -> int:
    """Timed calls per micro-benchmark variant (after one untimed call each)."""
    return 1 if quick else (3 if model == "tiny" else 2)


@contextlib.contextmanager
def private_cache() -> Iterator[Path]:
    """A bench-private ``$RLHF_LAB_CACHE`` whose ``models/`` is the real preset folder: the
    presets are not rebuilt, while our reference log-prob cache starts empty (cold for the first
    run of each model, warm afterwards) and nothing is left in the user's cache."""
    from trainers.core.tiny import cache_root

    real_models = cache_root() / "models"
    real_models.mkdir(parents=True, exist_ok=True)
    before = os.environ.get("RLHF_LAB_CACHE")
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        (Path(tmp) / "models").symlink_to(real_models, target_is_directory=True)
        os.environ["RLHF_LAB_CACHE"] = tmp
        try:
            yield Path(tmp)
        finally:
            if before is None:
                os.environ.pop("RLHF_LAB_CACHE", None)
            else:
                os.environ["RLHF_LAB_CACHE"] = before


def ensure_models(names: list[str]) -> None:
    from trainers.core.tiny import ensure_preset

    for name in names:
        started = time.perf_counter()
        ensure_preset(name)
        if time.perf_counter() - started > 1:
            print(f"built preset {name} in {time.perf_counter() - started:.0f}s", flush=True)


# ---------------------------------------------------------------------------------------------
# Throughput from step timestamps (both contenders)
# ---------------------------------------------------------------------------------------------


def window_figures(
    wall: list[float],
    cpu: list[float],
    tokens: list[float],
    warmup: int,
    step_s: list[float] | None = None,
) -> dict[str, Any]:
    """Throughput over steps ``warmup+1 .. N`` from stamps taken at the end of every step (wall
    clock and this process's CPU time) and per-step token counts.

    The window opens at the end of step ``warmup`` and closes at the end of the last step, so it
    holds whole loop iterations (data, forward, backward, optimizer, logging) and nothing else.
    ``cpu_tokens_per_s`` divides by CPU seconds instead: on a shared machine with one torch
    thread it is nearly blind to neighbours, while wall-clock throughput is what a user sees.
    """
    if warmup < 1 or len(wall) <= warmup:
        raise ValueError(f"need more than {warmup} steps (got {len(wall)}) and warmup >= 1")
    window = wall[-1] - wall[warmup - 1]
    cpu_window = cpu[-1] - cpu[warmup - 1]
    timed_steps = len(wall) - warmup
    timed_tokens = sum(tokens[warmup:])
    figures = {
        "tokens_per_s": timed_tokens / window,
        "steps_per_s": timed_steps / window,
        "cpu_tokens_per_s": timed_tokens / cpu_window if cpu_window > 0 else None,
        "timed_steps": timed_steps,
        "timed_tokens": int(round(timed_tokens)),
        "window_s": round(window, 4),
        "cpu_window_s": round(cpu_window, 4),
        "tokens_per_step": timed_tokens / timed_steps,
    }
    if step_s:
        figures["median_step_s"] = statistics.median(step_s[warmup:])
    return figures


@contextlib.contextmanager
def stamp_our_steps() -> Iterator[list[tuple[int, float, float]]]:
    """Stamp the end of each of our training steps (wall clock, process CPU time) when the
    trainer logs the step's metrics row, the last thing of a step before the next one starts.
    A timing hook only: the row is written unchanged."""
    from trainers.core.rundir import RunDir

    stamps: list[tuple[int, float, float]] = []
    original = RunDir.log_metrics

    def log_metrics(self: RunDir, step: int, phase: str, metrics: dict[str, Any]) -> Any:
        if phase == "train":
            stamps.append((step, time.perf_counter(), time.process_time()))
        return original(self, step, phase, metrics)

    RunDir.log_metrics = log_metrics
    try:
        yield stamps
    finally:
        RunDir.log_metrics = original


def ours_figures(run_dir: Path, stamps: list[tuple[int, float, float]], warmup: int) -> dict:
    """Figures of one of our runs from the step stamps, its metrics.jsonl and summary.json."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = sorted((r for r in rows if r.get("phase") == "train"), key=lambda r: r["step"])
    expected = list(range(1, len(train) + 1))
    if [r["step"] for r in train] != expected or [s[0] for s in stamps] != expected:
        raise RuntimeError("need one train row per step (logging.log_every=1)")
    tokens = [r["throughput/tokens_per_s"] * r["timing/step_s"] for r in train]
    figures = window_figures(
        [s[1] for s in stamps],
        [s[2] for s in stamps],
        tokens,
        warmup,
        step_s=[r["timing/step_s"] for r in train],
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    figures["startup_s"] = round(train[0]["time_s"] - train[0]["timing/step_s"], 3)
    figures["first_loss"] = train[0].get("loss")
    for key in ("ref_cache", "timing/reference_s"):
        if key in summary:
            figures[key.replace("timing/", "")] = summary[key]
    return figures


def run_our_trainer(
    main: Callable[[list[str]], int], config: Path, overrides: list[str], warmup: int
) -> dict[str, Any]:
    """One run of our trainer through its command-line entry point, in this process, in a
    temporary run directory; its stdout is captured (and shown only if the run fails)."""
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        run_dir = Path(tmp) / "run"
        argv = ["--config", str(config), "--run-dir", str(run_dir)]
        for item in overrides:
            argv += ["--set", item]
        out = io.StringIO()
        with contextlib.redirect_stdout(out), stamp_our_steps() as stamps:
            code = main(argv)
        if code != 0:
            print(out.getvalue()[-4000:], file=sys.stderr)
            summary = run_dir / "summary.json"
            raise RuntimeError(
                f"our trainer exited {code}: {summary.read_text() if summary.exists() else ''}"
            )
        figures = ours_figures(run_dir, stamps, warmup)
    import torch

    figures["torch_threads"] = torch.get_num_threads()  # unchanged by the trainer, checked
    return figures


def make_step_clock() -> Any:
    """A TrainerCallback that stamps the end of every optimizer step with TRL's running count of
    non-pad training tokens (``trainer._total_train_tokens``, attention-mask sums)."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.trainer = None
            self.times: list[float] = []
            self.cpu: list[float] = []
            self.tokens: list[float] = []
            self.threads: int | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            import torch

            self.threads = torch.get_num_threads()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter())
            self.cpu.append(time.process_time())
            self.tokens.append(float(self.trainer._total_train_tokens))

        def figures(self, warmup: int) -> dict[str, Any]:
            per_step = [b - a for a, b in zip([0.0, *self.tokens], self.tokens, strict=False)]
            figures = window_figures(self.times, self.cpu, per_step, warmup)
            figures["torch_threads"] = self.threads
            return figures

    return StepClock()


def trl_common_args(out_dir: str, batch_size: int, steps: int, learning_rate: float) -> dict:
    """TrainingArguments shared by the TRL contenders: CPU, fp32, no checkpointing of any kind,
    no eval, no W&B, log every step (ours logs every step too), no progress bar."""
    return {
        "output_dir": out_dir,
        "per_device_train_batch_size": batch_size,
        "gradient_accumulation_steps": 1,
        "max_steps": steps,
        "learning_rate": learning_rate,
        "lr_scheduler_type": "linear",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "gradient_checkpointing": False,
        "bf16": False,
        "fp16": False,
        "use_cpu": True,
        "report_to": [],
        "logging_steps": 1,
        "save_strategy": "no",
        "eval_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "seed": SEED,
    }


def first_logged_loss(trainer: Any) -> float | None:
    """TRL's logged training loss of step 1 (logging_steps=1)."""
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    return losses[0] if losses else None


# ---------------------------------------------------------------------------------------------
# Micro-benchmarks
# ---------------------------------------------------------------------------------------------


def micro_report(seconds: dict[str, dict], baseline: str) -> dict[str, Any]:
    """Median seconds and time relative to ``baseline`` (> 1: slower than it), wall and CPU."""
    return {
        "median_s": {k: round(v, 4) for k, v in seconds["wall"].items()},
        "median_cpu_s": {k: round(v, 4) for k, v in seconds["cpu"].items()},
        "time_vs_ours": {
            k: round(v / seconds["wall"][baseline], 3) for k, v in seconds["wall"].items()
        },
        "cpu_time_vs_ours": {
            k: round(v / seconds["cpu"][baseline], 3) for k, v in seconds["cpu"].items()
        },
    }


def checkpointing_report(off_runs: list[dict], on_run: dict) -> dict[str, Any]:
    """Gradient checkpointing on (one run) against the benchmark's runs with it off."""
    off = median_of(off_runs, "tokens_per_s")
    off_cpu = median_of(off_runs, "cpu_tokens_per_s")
    return {
        "off_tokens_per_s": off,
        "on_tokens_per_s": on_run["tokens_per_s"],
        "on_over_off": on_run["tokens_per_s"] / off,
        "off_cpu_tokens_per_s": off_cpu,
        "on_cpu_tokens_per_s": on_run["cpu_tokens_per_s"],
        "on_over_off_cpu": on_run["cpu_tokens_per_s"] / off_cpu,
        "note": "memory for time; off is the benchmark setting (and TRL's setting here)",
    }


def micro_lines(mb: dict[str, Any]) -> list[str]:
    """Printed lines of a micro-benchmark: each variant's fwd+bwd time relative to ours."""
    lines = [f"fwd+bwd of one micro-batch {mb['batch_shape']}, time relative to ours (wall, CPU):"]
    for name, rel in mb["time_vs_ours"].items():
        lines.append(f"  {rel:5.2f}x {mb['cpu_time_vs_ours'][name]:5.2f}x  {name}")
    return lines


# ---------------------------------------------------------------------------------------------
# Command line, medians, table and results
# ---------------------------------------------------------------------------------------------


def summarise(runs: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    return {
        name: {
            "median_tokens_per_s": median_of(rows, "tokens_per_s"),
            "median_steps_per_s": median_of(rows, "steps_per_s"),
            "median_cpu_tokens_per_s": median_of(rows, "cpu_tokens_per_s"),
            "median_tokens_per_step": median_of(rows, "tokens_per_step"),
            "median_startup_s": median_of(rows, "startup_s"),
        }
        for name, rows in runs.items()
    }


def parse_args(
    argv: list[str] | None,
    doc: str,
    defaults: dict[str, dict[str, int]],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The command line shared by the *_vs_trl benchmarks (``add_arguments`` adds a script's own)."""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny, 1 round, 3 steps")
    parser.add_argument("--models", default=None, help=f"comma list of {', '.join(defaults)}")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps (>= 1)")
    parser.add_argument("--rounds", type=int, default=None, help="runs per contender")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    parser.add_argument("--out", type=Path, default=None, help="results JSON path")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    models = args.models.split(",") if args.models else (["tiny"] if args.quick else list(defaults))
    unknown = [m for m in models if m not in defaults]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {list(defaults)}")
    args.models = models
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.warmup = args.warmup or (1 if args.quick else 2)
    return args


TABLE_HEADERS = [
    "model",
    "contender",
    "tokens/s",
    "steps/s",
    "CPU tokens/s",
    "ours/TRL",
    "ours/TRL (CPU)",
    "meets target",
]


def table_rows(model: str, medians: dict, ratio: float) -> list[list]:
    """Two table rows (ours, TRL) of one model; ratios on ours' row."""
    cpu_ratio = (
        medians["ours"]["median_cpu_tokens_per_s"] / medians["trl"]["median_cpu_tokens_per_s"]
    )
    rows = []
    for name in ("ours", "trl"):
        med = medians[name]
        mine = name == "ours"
        rows.append(
            [
                model,
                name,
                med["median_tokens_per_s"],
                med["median_steps_per_s"],
                med["median_cpu_tokens_per_s"],
                ratio if mine else None,
                cpu_ratio if mine else None,
                ("yes" if ratio >= TARGET_RATIO else "NO") if mine else None,
            ]
        )
    return rows


def model_result(
    runs: dict[str, list[dict]],
    medians: dict[str, dict[str, Any]],
    bs: int,
    total: int,
    args: argparse.Namespace,
    steps: int,
    agreement: dict[str, Any],
    fast: dict[str, Any],
    extra_settings: dict[str, Any],
) -> dict:
    """One model's block of the results JSON (shared with bench/rm_vs_trl.py)."""
    ratio = medians["ours"]["median_tokens_per_s"] / medians["trl"]["median_tokens_per_s"]
    cpu_ratio = (
        medians["ours"]["median_cpu_tokens_per_s"] / medians["trl"]["median_cpu_tokens_per_s"]
    )
    return {
        "settings": {
            "batch_size_pairs": bs,
            "steps_per_run": total,
            "warmup_steps": args.warmup,
            "timed_steps": steps,
            "max_length": MAX_LENGTH,
            "dtype": "fp32",
            "device": "cpu",
            "gradient_checkpointing": False,
            "gradient_accumulation_steps": 1,
            **extra_settings,
        },
        "runs": runs,
        "medians": medians,
        "ratio_tokens_per_s": ratio,
        "ratio_steps_per_s": medians["ours"]["median_steps_per_s"]
        / medians["trl"]["median_steps_per_s"],
        "ratio_cpu_tokens_per_s": cpu_ratio,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
        "meets_target_cpu_time": cpu_ratio >= TARGET_RATIO,
        "loss_agreement": agreement,
        "fast_paths": fast,
    }


# ---------------------------------------------------------------------------------------------
# The contenders' settings and the benchmark loop
# ---------------------------------------------------------------------------------------------


def matched_cpu_overrides(
    model: str,
    batch_size: int,
    steps: int,
    learning_rate: float,
    *,
    leading: Sequence[str] = (),
    after_data: Sequence[str] = (),
    evaluation: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> list[str]:
    """Our trainer's ``--set`` overrides matched to TRL's arguments (:func:`trl_common_args`):
    CPU, fp32, no checkpointing, the built-in preference pairs, one micro-batch per step,
    linear decay without warm-up, no weight decay, clipping at 1.0, a metrics row every step and
    no final model. ``leading`` / ``after_data`` / ``evaluation`` hold a family's own keys at
    their place in the list; ``extra`` comes last."""
    return [
        *leading,
        f"model.name={model}",
        "model.device=cpu",
        "model.dtype=fp32",
        "model.gradient_checkpointing=false",
        "data.dataset=builtin:reasoning-preferences",
        f"data.max_samples={batch_size * steps}",
        "data.eval_size=0",
        f"data.max_length={MAX_LENGTH}",
        *after_data,
        f"train.learning_rate={learning_rate}",
        f"train.batch_size={batch_size}",
        "train.gradient_accumulation_steps=1",
        f"train.max_steps={steps}",
        "train.num_epochs=1",
        "train.schedule=linear",
        "train.warmup_ratio=0.0",
        "train.weight_decay=0.0",
        "train.max_grad_norm=1.0",
        *evaluation,
        "logging.log_every=1",
        "checkpoint.save_final_model=false",
        f"seed={SEED}",
        *extra,
    ]


def run_trl_timed(build: Callable[[str], Any], warmup: int, prefix: str) -> dict[str, Any]:
    """One TRL run: ``build(output_dir)`` makes the trainer (timed as start-up), a step clock
    stamps every optimizer step, TRL's stdout is swallowed."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        started = time.perf_counter()
        clock = make_step_clock()
        trainer = build(tmp)
        clock.trainer = trainer
        trainer.add_callback(clock)
        setup_s = time.perf_counter() - started
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.train()
    figures = clock.figures(warmup)
    figures["startup_s"] = round(setup_s, 3)
    figures["first_loss"] = first_logged_loss(trainer)
    return figures


Contender = Callable[[str, int, int], dict]  # (model, batch size, steps) -> figures


def benchmark_models(
    args: argparse.Namespace,
    defaults: dict[str, dict[str, int]],
    steps_for: Callable[[str, argparse.Namespace], int],
    contenders: dict[str, Contender],
    agreement: Callable[[str, int], dict[str, Any]],
    fast_paths: Callable[..., dict[str, Any]],
    extra_settings: dict[str, Any],
) -> tuple[dict[str, Any], list[list]]:
    """Per model of ``args.models``: ``ours`` and ``trl`` alternating for ``args.rounds``
    rounds in a bench-private cache, their medians, the loss agreement on the first batch and
    our fast paths. Returns (results per model, table rows)."""
    results: dict[str, Any] = {}
    table: list[list] = []
    with private_cache():
        for model in args.models:
            bs, steps = defaults[model]["batch_size"], steps_for(model, args)
            total = steps + args.warmup
            print(f"[{model}] {args.rounds} round(s) x {total} steps, batch {bs} pairs", flush=True)
            runs = alternate(
                {
                    name: lambda run=run, m=model, b=bs, t=total: run(m, b, t)
                    for name, run in contenders.items()
                },
                args.rounds,
            )
            medians = summarise(runs)
            ratio = medians["ours"]["median_tokens_per_s"] / medians["trl"]["median_tokens_per_s"]
            print(f"[{model}] loss agreement on the first batch", flush=True)
            agreed = agreement(model, bs)
            fast = fast_paths(model, bs, total, args, runs["ours"])
            results[model] = model_result(
                runs, medians, bs, total, args, steps, agreed, fast, extra_settings
            )
            table += table_rows(model, medians, ratio)
    return results, table


def loss_line(model: str, label: str, losses: dict[str, float], suffix: str = "") -> str:
    """One printed line of the loss agreement: both losses and their difference."""
    return (
        f"{model}: loss {label}: ours {losses['ours']:.6f}  TRL {losses['trl']:.6f}  "
        f"|diff| {losses['abs_diff']:.2e}{suffix}"
    )


def checkpointing_line(report: dict[str, Any]) -> str:
    """The printed line of :func:`checkpointing_report`."""
    return (
        f"gradient checkpointing on/off tokens/s: {report['on_over_off']:.2f} wall, "
        f"{report['on_over_off_cpu']:.2f} CPU"
    )


def write_versus_results(
    name: str,
    trl_trainer: str,
    args: argparse.Namespace,
    threads: int,
    results: dict[str, Any],
    notes: list[str],
    settings: dict[str, Any],
) -> Path:
    """``bench/results/<name>.json`` of an ours-vs-TRL benchmark (``settings``: the script's
    own, after the shared ones)."""
    return write_results(
        name,
        {
            "target": f"ours >= {TARGET_RATIO}x TRL {trl_trainer} tokens/s (optimizer steps, "
            "fp32 CPU)",
            "meets_target": all(r["meets_target"] for r in results.values()),
            "settings": {
                "models": args.models,
                "rounds": args.rounds,
                "quick": args.quick,
                "torch_threads": threads,
                "alternating": True,
                **settings,
            },
            "notes": notes,
            "results": results,
        },
        out=args.out,
    )


def micro_batch_facts(
    model: str, pairs: int, reps: int, input_ids: Any, attention_mask: Any
) -> dict[str, Any]:
    """The first fields of a micro-benchmark's report: the batch timed and its padding."""
    rows, width = input_ids.shape
    return {
        "model": model,
        "pairs": pairs,
        "reps": reps,
        "batch_shape": [rows, width],
        "non_pad_share": round(int(attention_mask.sum()) / (rows * width), 3),
    }
