"""Sampling with top-k on: the draw on the k candidates (``trainers.core.decoding.draw``) against
the draw over the whole vocabulary (``draw_dense``: temperature, top-k mask, a sort of every
logit for top-p, softmax and cumulative sum over all of them).

    uv run python bench/sampling_filters.py            # SmolLM2 when pulled, else tiny (~2 min)
    uv run python bench/sampling_filters.py --rounds 7
    uv run python bench/sampling_filters.py --quick    # tiny, one round, 16 tokens (~20 s)

Two figures:

1. one draw, (rows, 49,152) random fp32 logits, at the settings the recipes use (policy
   gradients: T 0.6, top-k 20, top-p 0.95; rejection sampling: T 0.8, top-k 20, top-p 0.95),
   8 and 32 rows: milliseconds per draw (median of 30);
2. the rollout engine end to end (``sample_tokens``) on the model with the policy-gradient
   sampling, 32 rows × 64 new tokens, every row to the budget: new tokens per wall second with
   each draw, alternating rounds, and whether both drew the same tokens from the same seed.

Writes bench/results/sampling_filters.json. A benchmark, not a test (the equality of the two
draws is tested in tests/trainers/core/test_decoding.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from _common import ROOT, alternate, print_table, write_results

sys.path.insert(0, str(ROOT))

SMOLLM2 = "smollm2-135m-instruct"
SETTINGS = {
    "policy gradients": {"temperature": 0.6, "top_k": 20, "top_p": 0.95},
    "rejection sampling": {"temperature": 0.8, "top_k": 20, "top_p": 0.95},
}


def one_draw(rows: int, settings: dict, repeats: int = 30) -> dict:
    import torch

    from trainers.core.decoding import Sampling, draw, draw_dense

    gen = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, 49152, generator=gen) * 3
    uniforms = torch.rand(rows, generator=gen)
    sampling = Sampling(**settings)
    out = {}
    for name, fn in (("whole vocabulary", draw_dense), ("candidates", draw)):
        fn(logits, sampling, uniforms)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn(logits, sampling, uniforms)
            times.append(time.perf_counter() - start)
        out[name] = 1000 * statistics.median(times)
    same = torch.equal(draw(logits, sampling, uniforms), draw_dense(logits, sampling, uniforms))
    return {"rows": rows, "ms": out, "same_tokens": same}


def end_to_end(model_name: str, rows: int, new: int, rounds: int) -> dict:
    import torch
    from decoding import chat_prompts  # bench/decoding.py: this script's folder is on the path

    import trainers.core.decoding as engine
    from trainers.core.decoding import Sampling, sample_tokens
    from trainers.core.models import load_causal_lm, load_tokenizer

    tok = load_tokenizer(model_name)
    model = load_causal_lm(model_name, device="cpu", dtype="fp32", trainable=False)
    prompts = chat_prompts(tok, rows)
    sampling = Sampling(**SETTINGS["policy gradients"])
    fast = engine.draw
    outputs: dict[str, list] = {}

    def contender(name: str, chosen):
        def go() -> dict:
            engine.draw = chosen  # choose_next looks the draw up at call time
            try:
                start = time.perf_counter()
                out = sample_tokens(
                    model,
                    prompts,
                    max_new_tokens=new,
                    stop_ids=[],
                    pad_id=tok.pad_token_id,
                    sampling=sampling,
                    generator=torch.Generator().manual_seed(0),
                )
                wall = time.perf_counter() - start
            finally:
                engine.draw = fast
            outputs[name] = out
            return {"wall_s": wall, "tokens_per_s": sum(len(r) for r in out) / wall}

        return go

    with torch.no_grad():
        results = alternate(
            {
                "whole vocabulary": contender("whole vocabulary", engine.draw_dense),
                "candidates": contender("candidates", fast),
            },
            rounds,
        )
    med = {n: statistics.median(r["tokens_per_s"] for r in runs) for n, runs in results.items()}
    return {
        "model": model_name,
        "rows": rows,
        "max_new_tokens": new,
        "rounds": rounds,
        "tokens_per_s": med,
        "speedup": med["candidates"] / med["whole vocabulary"],
        "same_tokens": outputs["candidates"] == outputs["whole vocabulary"],
        "runs": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny, one round, 16 new tokens")
    args = parser.parse_args()
    import torch

    from trainers.core.models import ModelError, resolve_model

    torch.set_num_threads(args.threads)
    draws = [
        {"settings": name, **one_draw(rows, settings)}
        for name, settings in SETTINGS.items()
        for rows in (8, 32)
    ]
    print_table(
        ["settings", "rows", "whole vocabulary ms", "candidates ms", "same tokens"],
        [
            [
                d["settings"],
                d["rows"],
                round(d["ms"]["whole vocabulary"], 2),
                round(d["ms"]["candidates"], 2),
                d["same_tokens"],
            ]
            for d in draws
        ],
    )
    model = "tiny"
    if not args.quick:
        try:
            resolve_model(SMOLLM2)
            model = SMOLLM2
        except ModelError:
            pass
    rounds, new = (1, 16) if args.quick else (args.rounds, 64)
    loop = end_to_end(model, rows=32, new=new, rounds=rounds)
    print_table(
        ["model", "rows × new", "whole vocabulary tok/s", "candidates tok/s", "speedup", "same"],
        [
            [
                loop["model"],
                f"{loop['rows']} × {loop['max_new_tokens']}",
                round(loop["tokens_per_s"]["whole vocabulary"], 1),
                round(loop["tokens_per_s"]["candidates"], 1),
                round(loop["speedup"], 2),
                loop["same_tokens"],
            ]
        ],
    )
    if args.quick:
        return  # a smoke run: nothing written
    write_results(
        "sampling_filters",
        {"threads": args.threads, "draws": draws, "end_to_end": loop},
    )


if __name__ == "__main__":
    main()
