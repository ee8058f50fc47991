"""Where a step's time goes, stage by stage, through the trainers' own metrics.

Runs a short GRPO run (stages generate, score, reference, old log-probs, advantages, update; weight
gather under torchrun) and short SFT and DPO runs (the step and its ``mfu/step``) on one device,
then prints, per run, the median over the steps after the warm-up of each stage's seconds, share
of the step, tokens per second and MFU (trainers/core/flops.py: model FLOPs over the peak the
trainer measured in its own process), as JSON on stdout and in ``--out``. The trainers' own
output goes to stderr. Nothing is patched or wrapped: the figures are the ones a run logs in
metrics.jsonl, which ``rlhf-lab status`` and the ledger read (README "Where the time goes").

    uv run python bench/stage_breakdown.py --device cpu --quick --out /tmp/stages.json
    python3 bench/stage_breakdown.py --device cuda --out $OUT/stage_breakdown.json

Models: ``--shape tiny`` (the preset; the default on the CPU) or ``qwen3-0.6b`` (a randomly
initialised Qwen3-0.6B-shaped model with a preset's tokenizer, as bench/mfu.py builds it; the
default on CUDA), in fp32 on the CPU and bf16 on CUDA; the batch sizes are bench/mfu.py's
(bench/_mfu_setup.py ``sizes_for``). Compare the CPU and GPU files side by side: the shares say
which stage to make faster on each.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, write_json  # noqa: E402
from _mfu_setup import (  # noqa: E402
    CONFIGS,
    build_qwen3,
    phase_overrides,
    sizes_for,
    write_synthetic_data,
)

PHASES = ("grpo", "sft", "dpo")
_WHOLE = {"step", "train", "prepare"}  # the step itself and sums of stages


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--shape", choices=("tiny", "qwen3-0.6b"), default=None)
    p.add_argument("--quick", action="store_true", help="fewer, smaller steps")
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated: grpo,sft,dpo")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    args.shape = args.shape or ("qwen3-0.6b" if args.device == "cuda" else "tiny")
    args.phases = [x for x in args.phases.split(",") if x]
    unknown = sorted(set(args.phases) - set(PHASES))
    if unknown:
        p.error(f"--phases: unknown {unknown}; choose from {', '.join(PHASES)}")
    return args


def trainer_main(phase: str) -> Callable[[list[str]], int]:
    if phase == "sft":
        from trainers.sft.train import main
    elif phase == "dpo":
        from trainers.direct_alignment.train import main
    else:
        from trainers.policy_gradients.train import main
    return main


def train_rows(run_dir: Path) -> list[dict[str, Any]]:
    from trainers.core.rundir import read_jsonl

    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("phase") == "train"]


def breakdown(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the step's seconds and MFU and, per stage, of its seconds, share of the step,
    tokens per second and MFU over ``rows`` (train rows after the warm-up)."""
    from rlhf_lab.results.stages import stage_names, time_split

    def median(key: str) -> float | None:
        found = [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]
        return statistics.median(found) if found else None

    medians = {k: median(k) for r in rows for k in r if k.startswith(("timing/", "mfu/"))}
    step_s = medians.get("timing/step_s") or 0.0
    stages = {}
    for name in stage_names(medians):
        seconds = medians[f"timing/{name}_s"] or 0.0
        stages[name] = {
            "seconds": seconds,
            "share": seconds / step_s if step_s else None,
            "tokens_per_s": median(f"throughput/{name}_tokens_per_s"),
            "mfu": medians.get(f"mfu/{name}"),
        }
    return {
        "steps": [r["step"] for r in rows],
        "step_s": step_s,
        "mfu_step": medians.get("mfu/step"),
        "tokens_per_s": median("throughput/tokens_per_s"),
        "stages": stages,
        "line": time_split(medians),
    }


def run_phase(phase: str, model: str, args: argparse.Namespace, data: dict | None) -> dict:
    """One short run of ``phase`` through its trainer's CLI entry point, in this process."""
    sizes = sizes_for(args.shape, args.quick)
    dtype = "bf16" if args.device == "cuda" else "fp32"
    overrides = phase_overrides(phase, model, args.device, dtype, sizes, data)
    with tempfile.TemporaryDirectory(prefix=f"stages-{phase}-") as tmp:
        run_dir = Path(tmp) / "run"
        argv = ["--config", str(CONFIGS[phase]), "--run-dir", str(run_dir)]
        for item in overrides:
            argv += ["--set", item]
        with contextlib.redirect_stdout(sys.stderr):
            code = trainer_main(phase)(argv)
        if code != 0:
            return {"error": f"the {phase} trainer exited with {code} (its log is on stderr)"}
        rows = train_rows(run_dir)
    return {"overrides": overrides, **breakdown(rows[sizes.warmup :] or rows)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from _versus_trl import private_cache, quiet_offline_env

    quiet_offline_env()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    report: dict[str, Any] = {
        "benchmark": "stage_breakdown",
        "device": args.device,
        "shape": args.shape,
        "quick": args.quick,
        "machine": machine_info(),
        "sizes": vars(sizes_for(args.shape, args.quick)),
        "phases": {},
    }
    with tempfile.TemporaryDirectory(prefix="stages-") as tmp, private_cache():
        model, data = "tiny", None
        if args.shape == "qwen3-0.6b":
            model = str(build_qwen3(Path(tmp) / "model", args.device))
            sizes = sizes_for(args.shape, args.quick)
            rows = max(sizes.sft_rows, sizes.pairs) * (sizes.steps + sizes.warmup) + 16
            data = write_synthetic_data(Path(tmp) / "data", rows, sizes.max_length or 128)
        for phase in args.phases:
            print(f"[{phase}] ...", file=sys.stderr, flush=True)
            report["phases"][phase] = run_phase(phase, model, args, data)
            if args.out:  # a phase that fails later leaves the ones before it
                write_json(args.out, report)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
