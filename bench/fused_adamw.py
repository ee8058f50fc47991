"""Fused AdamW against torch's per-tensor loop: how much do results change, and what does it save?

    uv run python bench/fused_adamw.py              # ~3-4 min on 2 busy cores
    uv run python bench/fused_adamw.py --quick      # smoke run (< 1 min)

The evidence behind ``train.fused_adamw``'s default (issue 18). Two implementations of the same
AdamW update, both ``torch.optim.AdamW``: the per-tensor loop (``foreach=False``, what CPU runs
got before; ``foreach=True`` gives bit-identical results on the CPU) and ``fused=True`` (one
kernel per step; TRL's default through transformers' adamw_torch_fused).

1. **One and ten steps** from the same parameters, gradients and state on ``small``: the largest
   parameter difference, relative to the learning rate (the size of one Adam update).
2. **A training run**: the SFT warm start's setting on ``tiny`` (one-digit chain sums, batch 16,
   lr 3e-3, linear decay, clipping at 1.0) for ``--steps`` steps with each implementation from
   the same start and the same batches. Reported: the largest loss difference along the curve,
   and the parameter difference at the end relative to how far the parameters travelled. The
   yardstick is a third run: the loop again, from the same start nudged by one float32 spacing
   (ulp) per weight, a difference that is rounding by construction. A fused run no farther from
   the loop than that one differs only by rounding.
3. **Time** of one optimizer step on ``small`` (all parameters with gradients), loop vs fused,
   alternating, one torch thread, wall and process CPU seconds.

Prints the figures and writes bench/results/fused_adamw.json. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
from typing import Any

from _common import time_variants, write_results

IMPLEMENTATIONS = {"loop": {"foreach": False}, "fused": {"fused": True}}
RUNS = {"loop": "loop", "fused": "fused", "loop_1ulp_start": "loop"}  # run -> implementation
LR = 3e-3  # the SFT warm start's learning rate (configs/sft_tiny_warmstart.yaml)


def adamw(params, impl: str, lr: float = LR):
    import torch

    return torch.optim.AdamW(
        params, lr=lr, betas=(0.9, 0.999), weight_decay=0.0, **IMPLEMENTATIONS[impl]
    )


def one_step(model_name: str, steps: int) -> dict[str, Any]:
    """``steps`` updates from identical parameters, state and gradients, each implementation."""
    import torch

    from trainers.core.models import load_causal_lm

    torch.manual_seed(0)
    base = load_causal_lm(model_name, device="cpu", dtype="fp32", trainable=True)
    start = [p.detach().clone() for p in base.parameters()]
    grads = [[torch.randn_like(p) * 1e-3 for p in start] for _ in range(steps)]
    finals: dict[str, list] = {}
    for impl in IMPLEMENTATIONS:
        params = [torch.nn.Parameter(p.clone()) for p in start]
        opt = adamw(params, impl)
        for g in grads:
            for p, gi in zip(params, g, strict=True):
                p.grad = gi.clone()
            opt.step()
        finals[impl] = [p.detach() for p in params]
    out = {}
    for impl in ("fused",):
        pairs = list(zip(finals[impl], finals["loop"], strict=True))
        max_abs = max(float((a - b).abs().max()) for a, b in pairs)
        out[impl] = {
            "max_abs_diff": max_abs,
            "max_diff_over_lr": max_abs / LR,
            "identical_tensors": sum(bool(torch.equal(a, b)) for a, b in pairs),
            "tensors": len(pairs),
        }
    return out


def warm_start_batches(n_steps: int, batch_size: int = 16):
    """The warm start's data: one-digit chain sums of 2-3 terms, tokenised for ``tiny``."""
    from trainers.core.models import load_tokenizer
    from trainers.sft.data import builtin_sft_records, collate, tokenize_records
    from trainers.sft.train import WARM_START_TASKS

    tokenizer = load_tokenizer("tiny")
    records = builtin_sft_records(
        n_steps * batch_size, seed=42, tasks=list(WARM_START_TASKS), task_configs=WARM_START_TASKS
    )
    examples, _ = tokenize_records(records, tokenizer, 160)
    batches = [examples[i : i + batch_size] for i in range(0, len(examples), batch_size)]
    return [collate(b, tokenizer.pad_token_id) for b in batches if len(b) == batch_size]


def nudge_by_one_ulp(model, seed: int = 0) -> None:
    """Move every weight one float32 spacing up or down (a random sign per weight)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            up = torch.rand(p.shape, generator=g) < 0.5
            target = torch.where(
                up, torch.full_like(p, float("inf")), torch.full_like(p, -float("inf"))
            )
            p.copy_(torch.nextafter(p, target))


def training_run(run: str, batches, steps: int) -> dict[str, Any]:
    """The warm start's loop (token-mean NLL, clip 1.0, linear decay) with one implementation."""
    import torch

    from trainers.core.models import load_causal_lm
    from trainers.core.training import lr_multiplier
    from trainers.sft.train import token_nll

    impl = RUNS[run]
    torch.manual_seed(42)
    model = load_causal_lm("tiny", device="cpu", dtype="fp32", trainable=True)
    if run == "loop_1ulp_start":
        nudge_by_one_ulp(model)
    start = [p.detach().clone() for p in model.parameters()]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = adamw(params, impl)
    warmup = int(steps * 0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_multiplier(s, steps, warmup, "linear")
    )
    losses = []
    for step in range(steps):
        b = batches[step % len(batches)]
        nll, n, _ = token_nll(model, b["input_ids"], b["attention_mask"], b["loss_mask"])
        loss = nll / n
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    return {
        "losses": losses,
        "params": [p.detach().clone() for p in model.parameters()],
        "start": start,
    }


def run_distance(a: list, b: list) -> float:
    import torch

    return float(torch.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(a, b, strict=True))))


def trajectories(steps: int) -> dict[str, Any]:
    batches = warm_start_batches(min(steps, 150))
    runs = {run: training_run(run, batches, steps) for run in RUNS}
    loop = runs["loop"]
    travelled = run_distance(loop["params"], loop["start"])
    out: dict[str, Any] = {
        "steps": steps,
        "loop_first_last_loss": [loop["losses"][0], loop["losses"][-1]],
        "parameter_distance_travelled": travelled,
    }
    for impl in ("fused", "loop_1ulp_start"):
        r = runs[impl]
        diffs = [abs(a - b) for a, b in zip(r["losses"], loop["losses"], strict=True)]
        out[impl] = {
            "first_step_loss_equal": r["losses"][0] == loop["losses"][0],
            "first_loss_diff_step": next((i + 1 for i, d in enumerate(diffs) if d > 0), None),
            "max_abs_loss_diff": max(diffs),
            "final_loss": r["losses"][-1],
            "final_loss_diff": diffs[-1],
            "param_diff_over_travelled": run_distance(r["params"], loop["params"]) / travelled,
        }
    return out


def step_time(model_name: str, reps: int) -> dict[str, Any]:
    """Median seconds of one optimizer step over every parameter of ``model_name``."""
    import torch

    from trainers.core.models import load_causal_lm

    model = load_causal_lm(model_name, device="cpu", dtype="fp32", trainable=True)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opts = {impl: adamw(params, impl) for impl in ("loop", "fused")}
    # one untimed step each first: the optimizer state is allocated outside the timing
    seconds = time_variants({name: opt.step for name, opt in opts.items()}, reps)
    med, med_cpu = seconds["wall"], seconds["cpu"]
    return {
        "parameters": sum(p.numel() for p in params),
        "tensors": len(params),
        "median_s": med,
        "median_cpu_s": med_cpu,
        "loop_over_fused_cpu": med_cpu["loop"] / med_cpu["fused"],
    }


def main(argv: list[str] | None = None) -> None:
    import _versus_trl as harness

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--steps", type=int, default=None, help="training-run steps (300)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", default=None, help="results JSON path")
    args = parser.parse_args(argv)
    harness.quiet_offline_env()
    threads = harness.set_threads(args.threads)
    harness.ensure_models(["tiny"] if args.quick else ["tiny", "small"])
    big = "tiny" if args.quick else "small"
    steps = args.steps or (20 if args.quick else 300)

    print(f"[{big}] one step and ten steps from identical state", flush=True)
    single = {n: one_step(big, n) for n in (1, 10)}
    print(f"[tiny] warm-start training, {steps} steps x 3 implementations", flush=True)
    runs = trajectories(steps)
    print(f"[{big}] optimizer step time, {threads} thread(s)", flush=True)
    timing = step_time(big, 5 if args.quick else 21)

    print()
    for n, res in single.items():
        for impl, r in res.items():
            print(
                f"{big}, {n} step(s) from identical state: {impl:7s} vs loop: max |diff| "
                f"{r['max_abs_diff']:.2e} ({r['max_diff_over_lr']:.1e} of one update), "
                f"{r['identical_tensors']}/{r['tensors']} tensors bit-identical"
            )
    print(
        f"tiny warm start, {steps} steps: loop loss {runs['loop_first_last_loss'][0]:.4f} -> "
        f"{runs['loop_first_last_loss'][1]:.4f}"
    )
    for impl in ("fused", "loop_1ulp_start"):
        r = runs[impl]
        print(
            f"  {impl:15s} vs loop: max |loss diff| {r['max_abs_loss_diff']:.2e} (first at step "
            f"{r['first_loss_diff_step']}), final loss {r['final_loss']:.4f}, parameter diff "
            f"{r['param_diff_over_travelled']:.2e} of the distance travelled"
        )
    print(
        f"{big} optimizer step ({timing['parameters'] / 1e6:.1f}M parameters, "
        f"{timing['tensors']} tensors): loop {1e3 * timing['median_cpu_s']['loop']:.1f} ms CPU, "
        f"fused {1e3 * timing['median_cpu_s']['fused']:.1f} ms CPU "
        f"({timing['loop_over_fused_cpu']:.1f}x)"
    )
    from pathlib import Path

    write_results(
        "fused_adamw",
        {
            "settings": {"quick": args.quick, "torch_threads": threads, "lr": LR},
            "one_step": {str(k): v for k, v in single.items()},
            "training_run": runs,
            "step_time": timing,
        },
        out=Path(args.out) if args.out else None,
    )


if __name__ == "__main__":
    main()
