"""The extra stages of bench/mfu.py for a GPU run (they also run on the CPU, for testing):
our sampling loop against transformers' ``generate`` on the same prompts, and the lab's memory
estimate against ``torch.cuda.max_memory_allocated`` of the phases' trainer runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

from _mfu_count import FlopMeter, model_flops
from _mfu_setup import RECIPES, WORDS, Sizes


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def generation_versus_generate(
    folder: Path, args: argparse.Namespace, sizes: Sizes, ctx: dict
) -> dict[str, Any]:
    """Tokens/s of our sampling loop (one prefill per prompt, its KV cache repeated for the
    group) against ``model.generate`` on the group's copies of the prompts; both sample at
    temperature 1 with no filter and decode exactly ``grpo_new_tokens`` per row (no stop token),
    alternating over 3 timed repetitions after one warm-up each. MFU of our loop from the
    counted FLOPs (prefill + decode, 2·N per token)."""
    import torch

    from trainers.core.decoding import Sampling, left_pad, sample_tokens
    from trainers.core.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(str(folder))
    model = load_causal_lm(str(folder), device=args.device, dtype=args.dtype)
    model.eval()
    pad = tokenizer.pad_token_id
    rng = random.Random(0)
    prompt_tokens = 128 if args.shape == "qwen3-0.6b" else 48
    prompts = []
    for _ in range(sizes.grpo_prompts):
        ids = tokenizer(" ".join(rng.choice(WORDS) for _ in range(prompt_tokens)))["input_ids"]
        prompts.append(ids[:prompt_tokens])
    group, new = sizes.grpo_rollouts, sizes.grpo_new_tokens
    copies = [p for p in prompts for _ in range(group)]
    device = next(model.parameters()).device
    ids, mask = (t.to(device) for t in left_pad(copies, pad))
    meter = FlopMeter(ctx["shape"], timers=False, cuda=args.device == "cuda")

    def ours() -> int:
        torch.manual_seed(0)
        with meter.in_phase("ours"):
            rows = sample_tokens(
                model,
                prompts,
                max_new_tokens=new,
                stop_ids=[],
                pad_id=pad,
                sampling=Sampling(temperature=1.0),
                repeats=group,
            )
        return sum(len(r) for r in rows)

    def theirs() -> int:
        torch.manual_seed(0)
        with torch.no_grad(), meter.in_phase("generate"):
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
                pad_token_id=pad,
            )
        return (out.shape[1] - ids.shape[1]) * out.shape[0]

    times: dict[str, list[float]] = {"ours": [], "generate": []}
    tokens: dict[str, int] = {}
    contenders = {"ours": ours, "generate": theirs}
    with meter.installed():
        for fn in contenders.values():
            fn()  # warm-up
        before = meter.snapshot()
        for rep in range(3):
            for name in contenders if rep % 2 == 0 else reversed(list(contenders)):
                _sync(args.device)
                started = time.perf_counter()
                tokens[name] = contenders[name]()
                _sync(args.device)
                times[name].append(time.perf_counter() - started)
        after = meter.snapshot()
    counts = {
        k: {n: v / 3 for n, v in c.items()}
        for k, c in after["counts"].items()
        if k.startswith("ours/")
    }
    for k in counts:
        for n in counts[k]:
            counts[k][n] -= before["counts"].get(k, {}).get(n, 0) / 3
    ours_s, hf_s = statistics.median(times["ours"]), statistics.median(times["generate"])
    flops = model_flops(ctx["shape"], counts, "ours")
    return {
        "rows": len(copies),
        "prompts": len(prompts),
        "group": group,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new,
        "median_s": {"ours": ours_s, "generate": hf_s},
        "ours_tokens_per_s": tokens["ours"] / ours_s,
        "generate_tokens_per_s": tokens["generate"] / hf_s,
        "ours_over_generate": hf_s / ours_s,
        "ours_model_flops": flops[0],
        "ours_mfu": flops[0] / ours_s / ctx["peak"],
        "ours_counts_per_call": counts,
    }


def lab_estimate(phase: str, overrides: list[str], device: str) -> dict[str, Any]:
    """The lab's estimate (``rlhf_lab.planning.memory.estimate_memory``) of ``phase``'s run, resolved
    from the recipe with the same overrides the trainer ran with."""
    from rlhf_lab.planning.configs import resolve_config
    from rlhf_lab.planning.memory import estimate_memory
    from rlhf_lab.planning.overrides import as_overrides

    resolved = resolve_config(RECIPES[phase], as_overrides(overrides))
    est = estimate_memory(resolved.family, resolved.algorithm, resolved.config, device=device)
    return {
        "estimate_gib": est.total_gb,
        "peak_phase": est.peak_phase,
        "components": {c.name: c.gb for c in est.components},
        "param_count": est.param_count,
    }


def memory_versus_estimate(
    model: str,
    args: argparse.Namespace,
    sizes: Sizes,
    data: dict | None,
    done: dict[str, Any],
    measure_phase,
    ctx: dict,
) -> dict[str, Any]:
    """The estimate against the peaks of the phases already run (SFT, DPO, GRPO), plus a LoRA
    DPO run (rank 16, default targets) measured here for two steps."""
    from _mfu_setup import phase_overrides

    out: dict[str, Any] = {}
    cases = [(p, done[p]) for p in ("sft", "dpo", "rm", "grpo") if p in done]
    lora = Sizes(**{**vars(sizes), "steps": 1, "warmup": 1})
    lora_overrides = [
        *phase_overrides("dpo", model, args.device, args.dtype, lora, data),
        "model.lora.enabled=true",
        "model.lora.rank=16",
    ]
    try:
        lora_run = measure_phase("dpo", model, args, lora, data, ctx, overrides=lora_overrides)
        cases.append(("dpo-lora", lora_run))
    except Exception as err:
        out["dpo-lora"] = {"error": f"{type(err).__name__}: {err}"[-1500:]}
    for name, figures in cases:
        try:
            est = lab_estimate(name.removesuffix("-lora"), figures["overrides"], args.device)
        except Exception as err:
            out[name] = {"error": f"estimate: {type(err).__name__}: {err}"[-1500:]}
            continue
        measured = figures.get("cuda_memory") or {}
        allocated = measured.get("max_allocated_gib")
        out[name] = {
            **est,
            **measured,
            "estimate_over_max_allocated": est["estimate_gib"] / allocated if allocated else None,
            "estimate_over_max_reserved": est["estimate_gib"] / measured["max_reserved_gib"]
            if measured.get("max_reserved_gib")
            else None,
        }
    return out
