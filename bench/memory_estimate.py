"""The lab's memory estimate (rlhf_lab.planning.memory.estimate_memory) against the peak memory a real
trainer process reaches, for two model sizes and the main algorithm families. Target: the
estimate within ±20 % of the measured peak in every case.

    uv run python bench/memory_estimate.py            # 18 cases, tiny and small (~3.5 min idle)
    uv run python bench/memory_estimate.py --quick    # tiny-dpo, small-sft, small-grpo-kl
    uv run python bench/memory_estimate.py --lora     # the LoRA cases (model.lora.enabled)
    uv run python bench/memory_estimate.py --cases small-dpo,small-rm --threads 0 --jobs 1

What is compared is what rlhf_lab.planning.memory estimates. On the CPU its total is the whole process's peak
resident memory: the Python + torch + transformers runtime (its "process baseline"), weights,
gradients, AdamW state, activations, the LM-head chunk, KV cache, plus 10 % slack. So the
measured figure is the peak RSS (``ru_maxrss`` from ``wait4``) of a fresh ``python -m
trainers.<family>.train --config ... --run-dir ...`` that runs two optimizer steps (the second
is the first with AdamW's state allocated); the RSS of a process that only imports a trainer is
printed too, and "above base" is the run's peak minus it. On a GPU (``--device cuda``, or
``auto`` when NVML sees one) the estimate counts the CUDA context and what the caching allocator
holds, as nvidia-smi shows it, so the measured figure is the child's peak GPU memory polled
through NVML; torch's ``max_memory_allocated`` (from the trainer's summary.json) goes to the JSON.
This GPU path has not been run yet (no GPU where it was written).

Configs come from the lab: ``resolve_config(recipe, overrides)`` on the shipped recipe with the
model swapped and the sizes cut (two steps, no evaluation or sampling; with and without gradient
accumulation, which decides whether the gradients sit beside the activations). ``max_length`` is
64 (96 for SFT, whose built-in demonstrations are 80-106 tokens with ~65 of prompt), at or below
the data's natural length, so batches are padded to it as the estimate assumes (its worst case). Direct-alignment runs start with an empty reference log-prob cache (the model cache
is shared), so the reference pass really runs. Trainers get ``--threads`` intra-op threads
(default 1: on a shared 2-core machine torch's one-per-core default oversubscribes and runs ~20x
slower; more threads add a little memory, ~0.05 GiB at small) and ``--jobs`` cases run at a time
(memory does not depend on CPU contention). Writes bench/results/memory_estimate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from _common import ROOT, machine_info, print_table, write_results

sys.path.insert(0, str(ROOT))

TARGET = 0.20  # relative error allowed, either way
GIB = 2**30

# 48 examples (8 held out), two optimizer steps, no periodic evaluation: what every supervised
# family's case shares.
_SUPERVISED_SHORT = (
    "data.max_samples=48",
    "data.eval_size=8",
    "train.max_steps=2",
    "eval.eval_every=0",
)
# Two optimizer steps, no evaluation, no sampling, no checkpoints: the peak of a training run
# without what only long runs add (eval generation is estimated but switched off here).
FAMILY_QUICK = {
    "direct_alignment": [
        "data.dataset=builtin:reasoning-preferences",
        *_SUPERVISED_SHORT,
        "eval.sample_every=0",
        "eval.num_samples=0",
    ],
    "sft": [
        "data.dataset=builtin:reasoning-sft",
        *_SUPERVISED_SHORT,
        "eval.sample_every=0",
        "eval.num_samples=0",
    ],
    "reward_models": [
        "data.dataset=builtin:reasoning-preferences",
        *_SUPERVISED_SHORT,
        "eval.num_samples=0",
    ],
    "policy_gradients": [
        "data.size=16",
        "data.eval_size=4",
        "rollout.prompts_per_step=2",
        "rollout.num_rollouts=4",
        "rollout.max_new_tokens=32",
        "train.max_steps=2",
        "eval.eval_every=0",
        "eval.eval_batch_size=4",
        "eval.sample_every=0",
        "eval.num_samples=0",
    ],
}
COMMON = [
    "model.device={device}",
    "model.gradient_checkpointing=false",
    "logging.log_every=1",
    "checkpoint.save_every=null",
    "checkpoint.save_final_model=false",
]


@dataclass(frozen=True)
class Case:
    name: str
    recipe: str
    model: str
    overrides: tuple[str, ...] = ()


ONE = "train.gradient_accumulation_steps=1"
TWO = "train.gradient_accumulation_steps=2"  # the recipes accumulate; the gradients then stay
# The built-in demonstrations are 80-106 tokens, ~65 of them system prompt and question: cut at
# 64 half of them keep no trained token and are dropped, so SFT is measured at 96 (5 of 48 cut).
SFT_LENGTH = "data.max_length=96"
CASES = (
    Case("tiny-sft", "sft", "tiny", ("train.batch_size=8", ONE, SFT_LENGTH)),
    Case("tiny-dpo", "dpo", "tiny", ("train.batch_size=4", TWO, "data.max_length=64")),
    Case("tiny-grpo", "grpo", "tiny", ("train.batch_size=8", ONE, "loss.beta=0.0")),
    Case("tiny-grpo-kl", "grpo", "tiny", ("train.batch_size=4", TWO, "loss.beta=0.04")),
    Case("tiny-rm", "preference_rm", "tiny", ("train.batch_size=8", ONE, "data.max_length=64")),
    Case("small-sft", "sft", "small", ("train.batch_size=16", ONE, SFT_LENGTH)),
    Case("small-sft-acc", "sft", "small", ("train.batch_size=8", TWO, SFT_LENGTH)),
    Case("small-dpo", "dpo", "small", ("train.batch_size=8", ONE, "data.max_length=64")),
    Case("small-dpo-acc", "dpo", "small", ("train.batch_size=4", TWO, "data.max_length=64")),
    Case("small-grpo", "grpo", "small", ("train.batch_size=8", ONE, "loss.beta=0.0")),
    Case("small-grpo-kl", "grpo", "small", ("train.batch_size=4", TWO, "loss.beta=0.04")),
    Case("small-rm", "preference_rm", "small", ("train.batch_size=8", ONE, "data.max_length=64")),
    Case(
        "small-rm-acc", "preference_rm", "small", ("train.batch_size=4", TWO, "data.max_length=64")
    ),
)
# LoRA adapters (model.lora): frozen base, fp32 adapters with their gradients and AdamW state,
# the reference as the base with the adapters off (no copy)
LORA = ("model.lora.enabled=true", "model.lora.rank=16")
CASES += (
    Case("small-sft-lora", "sft", "small", ("train.batch_size=16", ONE, SFT_LENGTH, *LORA)),
    Case(
        "small-dpo-lora", "dpo", "small", ("train.batch_size=8", ONE, "data.max_length=64", *LORA)
    ),
    Case(
        "small-grpo-kl-lora", "grpo", "small", ("train.batch_size=4", TWO, "loss.beta=0.04", *LORA)
    ),
    Case("small-ppo-lora", "ppo", "small", ("train.batch_size=4", TWO, *LORA)),
    Case(
        "small-rm-lora",
        "preference_rm",
        "small",
        ("train.batch_size=8", ONE, "data.max_length=64", *LORA),
    ),
)
LORA_CASES = tuple(c.name for c in CASES if c.name.endswith("-lora"))
QUICK_CASES = ("tiny-dpo", "small-sft", "small-grpo-kl")


@dataclass
class Measured:
    peak_gib: float | None = None
    torch_peak_gib: float | None = None
    outcome: str | None = None
    wall_s: float | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Device
# ---------------------------------------------------------------------------------------------


def nvml_device_count() -> int:
    """GPUs NVML sees (0 when there is no driver); no torch import in this process."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except Exception:
        return 0


def gpu_process_gib(pid: int) -> float | None:
    """GPU memory NVML attributes to ``pid`` on GPU 0 (context + allocator cache), in GiB."""
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if proc.pid == pid and proc.usedGpuMemory is not None:
            return proc.usedGpuMemory / GIB
    return None


# ---------------------------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------------------------


def resolve(case: Case, device: str):
    """(resolved config, memory estimate) through the lab, torch-free."""
    from rlhf_lab.planning.configs import resolve_config
    from rlhf_lab.planning.memory import estimate_memory
    from rlhf_lab.planning.overrides import as_overrides

    resolved = resolve_config(case.recipe, as_overrides([f"model.name={case.model}"]))
    overrides = [
        f"model.name={case.model}",
        *(o.format(device=device) for o in COMMON),
        *FAMILY_QUICK[resolved.family],
        *case.overrides,
    ]
    resolved = resolve_config(case.recipe, as_overrides(overrides))
    estimate = estimate_memory(resolved.family, resolved.algorithm, resolved.config, device=device)
    return resolved, estimate


def run_child(
    argv: list[str], env: dict[str, str], log: Path, gpu: bool
) -> tuple[int, float, float]:
    """(exit status, peak RSS GiB, peak NVML GiB or nan) of one child process."""
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    gpu_peak = [float("nan")]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                used = gpu_process_gib(proc.pid)
            except Exception:
                used = None
            if used is not None and not used <= gpu_peak[0]:
                gpu_peak[0] = used
            done.wait(0.05)

    poller = threading.Thread(target=poll, daemon=True) if gpu else None
    if poller:
        poller.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # already reaped; keep Popen quiet
    done.set()
    if poller:
        poller.join()
    return proc.returncode, usage.ru_maxrss * 1024 / GIB, gpu_peak[0]


def measure_case(case: Case, device: str, workdir: Path, env: dict[str, str]) -> Measured:
    resolved, _ = resolve(case, device)
    import yaml

    case_dir = workdir / case.name
    case_dir.mkdir(parents=True)
    config = case_dir / "config.yaml"
    config.write_text(yaml.safe_dump(resolved.data, sort_keys=False))
    argv = [
        sys.executable,
        "-m",
        f"trainers.{resolved.family}.train",
        "--config",
        str(config),
        "--run-dir",
        str(case_dir / "run"),
    ]
    start = time.perf_counter()
    code, rss, gpu_peak = run_child(argv, env, case_dir / "stdout.log", device == "cuda")
    out = Measured(wall_s=round(time.perf_counter() - start, 1))
    summary_path = case_dir / "run" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    out.outcome = summary.get("outcome") or f"exit {code}"
    if code != 0 or out.outcome != "succeeded":
        out.error = (case_dir / "stdout.log").read_text()[-800:]
        return out
    out.peak_gib = gpu_peak if device == "cuda" else rss
    out.extra["rss_gib"] = round(rss, 4)
    torch_peak = summary.get("peak_memory_gb")
    if device == "cuda" and isinstance(torch_peak, int | float):
        out.torch_peak_gib = torch_peak * 1e9 / GIB  # the trainers report 1e9-byte GB
    if device == "cuda" and gpu_peak != gpu_peak:  # NaN: NVML never listed the process
        out.peak_gib = None
        out.error = (
            "NVML listed no GPU memory for the trainer's pid (a container's PID namespace can "
            f"hide it); torch max_memory_allocated was {out.torch_peak_gib} GiB"
        )
    return out


def import_baseline(env: dict[str, str], workdir: Path) -> float:
    """Peak RSS (GiB) of a process that only imports a trainer (torch, transformers, datasets,
    reasoning-gym): the runtime every run carries before it loads anything."""
    argv = [sys.executable, "-c", "import trainers.direct_alignment.train"]
    code, rss, _ = run_child(argv, env, workdir / "baseline.log", gpu=False)
    if code != 0:
        raise SystemExit(f"importing the trainer failed: {(workdir / 'baseline.log').read_text()}")
    return rss


def child_env(workdir: Path, threads: int | None) -> dict[str, str]:
    """The trainers' environment: offline, shared model cache, an empty reference cache, and
    ``threads`` intra-op threads (None: torch's default)."""
    from trainers.core.tiny import cache_root

    cache = workdir / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(cache_root() / "models", target_is_directory=True)
    (cache_root() / "models").mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "RLHF_LAB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def ensure_models(models: set[str]) -> None:
    """Build the presets once before measuring (the first build of `small` is slow and its
    memory would otherwise land in a measured run)."""
    from trainers.core.tiny import is_complete, preset_dir

    missing = [m for m in sorted(models) if not is_complete(preset_dir(m))]
    if missing:
        print(f"building presets {missing} (cached for later runs) ...", flush=True)
        code = "from trainers.core.tiny import ensure_preset\n"
        code += "".join(f"ensure_preset({m!r})\n" for m in missing)
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_CASES)}")
    parser.add_argument("--lora", action="store_true", help="only the LoRA cases")
    parser.add_argument("--cases", help="comma list of case names (default: all)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--jobs", type=int, default=2, help="cases measured at the same time")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads per trainer (0: torch's default, one per core; on a shared "
        "machine that oversubscribes the cores and runs many times slower)",
    )
    parser.add_argument("--out", type=Path, default=None, help="results file")
    args = parser.parse_args()

    gpus = nvml_device_count()
    device = args.device if args.device != "auto" else ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        raise SystemExit("--device cuda: NVML sees no GPU here")
    wanted = args.cases.split(",") if args.cases else QUICK_CASES if args.quick else None
    wanted = LORA_CASES if args.lora and not args.cases else wanted
    cases = [c for c in CASES if wanted is None or c.name in wanted]
    unknown = set(wanted or []) - {c.name for c in cases}
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; cases: {[c.name for c in CASES]}")

    estimates = {c.name: resolve(c, device)[1] for c in cases}  # fails fast on a bad config
    ensure_models({c.model for c in cases})
    load_before = machine_info()["load_avg_1m"]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memory-estimate-") as tmp:
        workdir = Path(tmp)
        env = child_env(workdir, args.threads or None)
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            baseline_job = pool.submit(import_baseline, env, workdir)
            jobs = {c.name: pool.submit(measure_case, c, device, workdir, env) for c in cases}
            baseline = baseline_job.result()
            measured = {name: job.result() for name, job in jobs.items()}
    wall = time.perf_counter() - start

    rows, results = [], {}
    for case in cases:
        est, got = estimates[case.name], measured[case.name]
        rel = None if got.peak_gib is None else est.total_gb / got.peak_gib - 1
        ok = rel is not None and abs(rel) <= TARGET
        run_part = None if got.peak_gib is None else got.peak_gib - baseline
        results[case.name] = {
            "recipe": case.recipe,
            "model": case.model,
            "family": est.family,
            "algorithm": est.algorithm,
            "overrides": list(case.overrides),
            "param_count": est.param_count,
            "estimate_gib": est.total_gb,
            "estimate_peak_phase": est.peak_phase,
            "estimate_components": {c.name: c.gb for c in est.components},
            "measured_peak_gib": None if got.peak_gib is None else round(got.peak_gib, 4),
            "measured_above_import_baseline_gib": None if run_part is None else round(run_part, 4),
            "torch_max_allocated_gib": got.torch_peak_gib,
            "relative_error": None if rel is None else round(rel, 4),
            "within_target": ok,
            "outcome": got.outcome,
            "wall_s": got.wall_s,
            "error": got.error,
            **got.extra,
        }
        rows.append(
            [
                case.name,
                f"{est.param_count / 1e6:.1f}M",
                est.peak_phase,
                est.total_gb,
                got.peak_gib,
                run_part,
                None if rel is None else f"{rel:+.1%}",
                "ok" if ok else ("NOT MEASURED" if got.peak_gib is None else "MISS"),
            ]
        )

    what = "peak GPU memory (NVML)" if device == "cuda" else "peak RSS"
    print(
        f"\nmemory estimate vs measured {what} on {device}, GiB; target ±{TARGET:.0%}; "
        f"import-only baseline {baseline:.3f} GiB; {wall:.0f} s; load average {load_before}"
    )
    if device == "cpu":
        print("GPU not measured: NVML sees no GPU on this machine (run with --device cuda there)")
    print_table(
        ["case", "params", "phase", "estimate", "measured", "above base", "error", ""],
        rows,
    )
    for name, res in results.items():
        if res["error"]:
            print(f"\n{name} failed:\n{res['error']}")
    write_results(
        "memory_estimate",
        {
            "target_relative_error": TARGET,
            "device": device,
            "measured": what,
            "import_baseline_gib": round(baseline, 4),
            "jobs": args.jobs,
            "threads_per_trainer": args.threads or "torch default",
            "wall_s": round(wall, 1),
            "load_avg_1m_before": load_before,
            "results": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
