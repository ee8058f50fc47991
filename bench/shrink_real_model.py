"""What the shrink picks for a pretrained model on this CPU, and what a step of it costs: launches
`grpo` and `sft` shrunk onto the pulled SmolLM2-135M-Instruct through the lab (LoRA, no gradient
checkpointing, 4 prompts x 4 completions of <= 128 new tokens, ...), a few steps each, and
prints the shrink's choices and the per-step timings from metrics.jsonl.

    uv run python bench/shrink_real_model.py [--steps 3] [--recipes grpo,sft] [--quick]

Writes bench/results/shrink_real_model.json (the shrink's overrides and every step's timings).

Needs `uv run rlhf-lab models pull smollm2-135m-instruct`. Runs in a scratch lab root (nothing
is written under experiments/). The held-out evaluation is cut to 4 prompts and the data to
what the steps use, so the numbers are the steps', not the evaluation's. Timings depend on what
else runs on the machine: say so when quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

QUICK = {
    "grpo": ["data.eval_size=4", "eval.eval_every=0", "eval.num_samples=0"],
    "sft": ["data.max_samples=72", "data.eval_size=8", "eval.eval_every=0", "eval.sample_every=0"],
}
STEP_KEYS = {"grpo": "timing/step_s", "sft": None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--recipes", default="grpo,sft")
    parser.add_argument("--quick", action="store_true", help="one grpo step")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.recipes = 1, "grpo"
    os.environ.setdefault("RLHF_LAB_ROOT", tempfile.mkdtemp(prefix="shrink-bench-"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rlhf_lab import api, runs

    results: dict[str, dict] = {}
    for recipe in args.recipes.split(","):
        overrides = [*QUICK.get(recipe, []), f"train.max_steps={args.steps}"]
        shrunk = api.shrink_config(recipe, overrides, model="smollm2-135m-instruct")
        print(f"== {recipe}: shrink overrides")
        for item in shrunk.shrink_overrides:
            print(f"  {item}")
        request = api.RunRequest(
            recipe=recipe,
            overrides=overrides,
            model="smollm2-135m-instruct",
            device="cpu",
            force=True,
        )
        launched = api.launch(request)
        final = runs.wait_for_end(launched.run.id, timeout_s=3600)
        run_dir = Path(launched.run.run_dir)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in rows if r.get("phase", "train") == "train"]
        times = [r[k] for r in train for k in ("timing/step_s", "step_time_s") if k in r]
        print(f"{recipe}: {final.state}, {len(train)} train rows, wall {final.elapsed_s}")
        if times:
            print(f"  step s: {[round(t, 1) for t in times]} median {statistics.median(times):.1f}")
        results[recipe] = {
            "state": final.state,
            "shrink_overrides": shrunk.shrink_overrides,
            "step_s": times,
            "load_average": os.getloadavg(),
        }
        keys = ("timing/generate_s", "timing/train_s", "throughput/tokens_per_s")
        for key in (*keys, "response_length/mean", "frac_reward_zero_std"):
            values = [r[key] for r in rows if key in r]  # rollout and train rows
            results[recipe][key] = values
            if values:
                print(f"  {key}: {[round(v, 1) for v in values]}")
    out = Path(__file__).parent / "results" / "shrink_real_model.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
