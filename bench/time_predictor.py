"""The lab's wall-time prediction (rlhf_lab.planning.time) against real trainer runs: SFT, DPO,
online DPO, a preference reward model, GRPO, on-policy distillation, rejection sampling
(top_per_prompt, its pool not cached) and an evaluation job, each predicted from the throughput
calibration and then run as a fresh trainer process. Target: predicted/actual within ±30 %.

    uv run python bench/time_predictor.py                  # tiny, the lab's shrunk runs (~4 min)
    uv run python bench/time_predictor.py --smollm2        # + SmolLM2-135M, 3 steps each (~15 min)
    uv run python bench/time_predictor.py --cases sft,grpo --threads 2

Configs come from the lab's shrink (``rlhf_lab.planning.shrink.shrink_config`` on the shipped recipe with
the model swapped; on SmolLM2 ``train.max_steps=3`` and LoRA, as a CPU user would run it). The
calibration is the one ``plan`` uses (cached per model, device, threads and torch version;
``--recalibrate`` measures it again). "Actual" is the wall time of the whole trainer process
(``python -m trainers.<family>.train``, start-up included), as the ledger's actual is. Runs
start with an empty reference log-prob cache (a DPO run computes its reference pass). On a
machine shared with other jobs every figure is contended: the JSON records the load average.
Writes bench/results/time_predictor.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, machine_info, print_table, write_results

from rlhf_lab.planning.trainer_config import EVALUATION, TrainerConfig

sys.path.insert(0, str(ROOT))

TARGET = 0.30
CASES = (
    "sft",
    "dpo",
    "online_dpo",
    "preference_rm",
    "grpo",
    "distill",
    "top_per_prompt",
    "eval",
)
SMOLLM2 = "smollm2-135m-instruct"
# A real model on a CPU: a few LoRA steps (the CPU shrink), short generations.
SMOLLM2_OVERRIDES = {
    "*": ["train.max_steps=3", "model.lora.enabled=true", "model.gradient_checkpointing=false"],
    "online_dpo": ["online.max_new_tokens=48", "data.eval_size=8", "eval.eval_every=0"],
    # rejection sampling has its own sections (no train.*): these replace "*"
    "top_per_prompt": [
        "sft.max_steps=3",
        "model.lora.enabled=true",
        "model.gradient_checkpointing=false",
        "data.max_train_samples=8",
        "data.max_test_samples=8",
        "generation.max_new_tokens=64",
        "eval.eval_max_new_tokens=64",
    ],
    "grpo": ["rollout.max_new_tokens=64", "data.eval_size=8", "eval.eval_every=0"],
    "distill": [
        f"teacher.name={SMOLLM2}",  # the same model: a timing case, not a distillation study
        "rollout.max_new_tokens=64",
        "data.eval_size=8",
        "eval.eval_every=0",
    ],
    "sft": ["data.dataset=builtin:reasoning-sft", "data.max_length=256", "eval.eval_every=0"],
    "dpo": [
        "data.dataset=builtin:reasoning-preferences",
        "data.max_samples=96",
        "data.eval_size=16",
    ],
    "preference_rm": [
        "data.dataset=builtin:reasoning-preferences",
        "data.max_samples=96",
        "data.eval_size=16",
    ],
}
EVAL_OVERRIDES = [
    "prompts.size=16",
    "prompts.tasks=[chain_sum]",
    "sampling.n=4",
    "sampling.max_new_tokens=64",
    "sampling.batch_size=8",
    "reasoning.pass_k=[1,4]",
]


def child_env(workdir: Path, threads: int) -> dict[str, str]:
    """Offline, the shared model cache, an empty reference cache, ``threads`` threads."""
    from trainers.core.tiny import cache_root

    cache = workdir / "cache"
    cache.mkdir(exist_ok=True)
    link = cache / "models"
    if not link.exists():
        link.symlink_to(cache_root() / "models", target_is_directory=True)
    return {
        **os.environ,
        "RLHF_LAB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }


def shrunk(case: str, model: str) -> tuple[str, str, TrainerConfig]:
    """(family, algorithm, resolved config) of a case as the lab shrinks it."""
    from rlhf_lab.planning.overrides import as_overrides
    from rlhf_lab.planning.shrink import shrink_config

    overrides = []
    if model == SMOLLM2:
        shared = [] if case == "top_per_prompt" else SMOLLM2_OVERRIDES["*"]
        overrides = shared + SMOLLM2_OVERRIDES.get(case, [])
    result = shrink_config(case, as_overrides(overrides), model=model)
    return result.family, result.algorithm, result.trainer_config


def eval_config(model: str) -> TrainerConfig:
    from rlhf_lab.evaluation.cost import _config

    cfg = _config("reasoning", EVAL_OVERRIDES).to_data()
    cfg["target"] = model
    return TrainerConfig(EVALUATION, cfg)


def run_process(argv: list[str], env: dict[str, str], log: Path) -> tuple[float, int]:
    start = time.perf_counter()
    with log.open("w") as fh:
        code = subprocess.call(argv, env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    return time.perf_counter() - start, code


def measure(case: str, model: str, threads: int, workdir: Path) -> dict:
    from rlhf_lab.planning.time import predict_evaluation, predict_run

    run_dir = workdir / f"{model}-{case}"
    env = child_env(workdir, threads)
    if case == "eval":
        cfg = eval_config(model)
        estimate = predict_evaluation(model, cfg, policies=1, threads=threads, mode="auto")
        module = "trainers.evaluation.run"
    else:
        family, algorithm, cfg = shrunk(case, model)
        estimate = predict_run(family, algorithm, cfg, threads=threads, mode="auto")
        module = f"trainers.{family}.train"
    config = workdir / f"{model}-{case}.yaml"
    config.write_text(cfg.to_yaml())
    argv = [sys.executable, "-m", module, "--config", str(config), "--run-dir", str(run_dir)]
    actual, code = run_process(argv, env, workdir / f"{model}-{case}.log")
    ratio = estimate.total_s / actual if estimate.total_s and code == 0 else None
    return {
        "case": case,
        "model": model,
        "predicted_s": estimate.total_s,
        "actual_s": round(actual, 1),
        "ratio": round(ratio, 3) if ratio else None,
        "within_target": ratio is not None and abs(ratio - 1) <= TARGET,
        "text": estimate.text,
        "parts": estimate.parts,
        "exit_code": code,
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }


def predict_case(case: str, model: str, threads: int):
    """The prediction of one case from the cached calibration (measured when missing)."""
    from rlhf_lab.planning.time import predict_evaluation, predict_run

    if case == "eval":
        return predict_evaluation(
            model, eval_config(model), policies=1, threads=threads, mode="auto"
        )
    family, algorithm, cfg = shrunk(case, model)
    return predict_run(family, algorithm, cfg, threads=threads, mode="auto")


def repredict(path: Path, threads: int) -> None:
    """Predict the recorded runs of a results file again from today's calibration and code
    (no run): how a change to the work model or the calibration moves the ratios."""
    import json

    rows = json.loads(path.read_text())["rows"]
    table = []
    for row in rows:
        est = predict_case(row["case"], row["model"], threads)
        ratio = est.total_s / row["actual_s"] if est.total_s and row["exit_code"] == 0 else None
        table.append(
            [row["model"], row["case"], row["predicted_s"], est.total_s, row["actual_s"], ratio]
        )
    print_table(
        ["model", "case", "predicted then", "predicted now", "actual s", "ratio now"], table
    )


def calibrate(model: str, threads: int, again: bool) -> dict:
    from rlhf_lab.planning.throughput_cache import get_calibration, throughput_cache_dir

    result = get_calibration(model, "cpu", threads, mode="cached")
    if again and result.key:
        (throughput_cache_dir() / f"{result.key}.json").unlink(missing_ok=True)
    result = get_calibration(model, "cpu", threads, mode="auto")
    if not result.ok:
        raise SystemExit(f"no calibration for {model}: {result.reason}")
    print(
        f"calibration {model}: {'measured now in ' + str(result.seconds) + ' s' if result.measured_now else 'cached'}"
    )
    return {
        "model": model,
        "key": result.key,
        "measured_now": result.measured_now,
        "seconds": result.seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M (3 steps)")
    parser.add_argument("--only-smollm2", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recalibrate", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repredict", type=Path, help="a results file: predict its runs again")
    args = parser.parse_args()
    if args.repredict:
        repredict(args.repredict, args.threads)
        return
    cases = [c for c in args.cases.split(",") if c]
    models = [] if args.only_smollm2 else ["tiny"]
    if args.smollm2 or args.only_smollm2:
        models.append(SMOLLM2)
    rows, calibrations = [], []
    with tempfile.TemporaryDirectory(prefix="time-predictor-") as tmp:
        for model in models:
            calibrations.append(calibrate(model, args.threads, args.recalibrate))
            for case in cases:
                row = measure(case, model, args.threads, Path(tmp))
                print(
                    f"{model} {case}: predicted {row['predicted_s']} s, actual {row['actual_s']} s, ratio {row['ratio']}",
                    flush=True,
                )
                rows.append(row)
    print_table(
        ["model", "case", "predicted s", "actual s", "ratio", "±30%", "exit"],
        [
            [
                r["model"],
                r["case"],
                r["predicted_s"],
                r["actual_s"],
                r["ratio"],
                "yes" if r["within_target"] else "no",
                r["exit_code"],
            ]
            for r in rows
        ],
    )
    write_results(
        "time_predictor",
        {
            "settings": {
                "threads": args.threads,
                "target": TARGET,
                "cases": cases,
                "models": models,
                "contended": os.getloadavg()[0] > args.threads * 0.6,
            },
            "calibrations": calibrations,
            "rows": rows,
            "machine_at_end": machine_info(),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
