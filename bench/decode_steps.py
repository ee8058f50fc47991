"""The rollout engine's decode step modes against each other and ``generate``: tokens/s by rows.

    python bench/decode_steps.py --device cuda --shape qwen3-0.6b --out $OUT/decode_steps.json
    uv run python bench/decode_steps.py --quick          # the CPU dry run (tiny, seconds)

Prompts of ``--prompt-tokens`` random ids (no stop token: every row runs to the budget, the pure
decode throughput), ``--new-tokens`` new tokens per row, greedy, at each row count of
``--rows``; each mode (trainers/core/decode_step.py: ``dynamic``, ``fixed``, ``graphs`` on CUDA)
runs once to warm up and then ``--reps`` times, alternating; the figure is new tokens / median
wall second, the prefill included (it is part of every rollout). ``graphs`` records its graphs
inside each timed call (a new engine per call, as a trainer's rollout has), so the capture cost
is in its figure.

Checks beside the speed: the greedy tokens of each mode against ``dynamic`` (the share of rows
identical, and on the smallest row count against ``model.generate``). In bf16 the fixed step's
attention (the whole capacity, masked) and the dynamic one (the filled keys) may round
differently, so a row can part ways where two tokens' logits tie to bf16 precision: the share is
reported, not asserted. The CPU tests assert identity in fp32 (tests/trainers/core/
test_decode_step.py).

Writes ``--out`` (default bench/results/decode_steps_<device>.json) and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

from _common import ROOT, print_table, write_results

sys.path.insert(0, str(ROOT))


def _sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def load_model(shape: str, device: str, folder: Path):
    import torch

    from trainers.core.models import load_causal_lm, load_tokenizer

    if shape == "qwen3-0.6b":
        from _mfu_setup import build_qwen3

        name = str(build_qwen3(folder / "qwen3", device))
        dtype = "bf16"
    else:
        name, dtype = shape, ("bf16" if device == "cuda" else "fp32")
    tok = load_tokenizer(name)
    model = load_causal_lm(name, device=device, dtype=dtype, trainable=False).eval()
    return model, tok, getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}[dtype])


def prompts_for(rows: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(rows)]


def time_mode(model, prompts, mode: str, args, pad_id: int) -> tuple[float, list[list[int]]]:
    import torch

    from trainers.core.decoding import sample_tokens

    def once():
        _sync(torch, args.device)
        t0 = time.perf_counter()
        out = sample_tokens(
            model, prompts, max_new_tokens=args.new_tokens, stop_ids=[], pad_id=pad_id, step=mode
        )
        _sync(torch, args.device)
        return time.perf_counter() - t0, out

    once()  # warm-up
    runs = [once() for _ in range(args.reps)]
    return statistics.median(t for t, _ in runs), runs[-1][1]


def generate_tokens(model, prompts, new_tokens: int, pad_id: int) -> list[list[int]]:
    from trainers.core.decoding_oracles import generate_greedy

    return generate_greedy(model, prompts, pad_id, set(), new_tokens)


def same_share(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default="tiny", help="qwen3-0.6b (random) or a preset/model")
    parser.add_argument("--rows", default="32,64,256")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument(
        "--modes", default=None, help="default: dynamic,graphs on CUDA, else dynamic,fixed"
    )
    parser.add_argument("--quick", action="store_true", help="4,8 rows x 16 tokens")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.prompt_tokens, args.new_tokens, args.reps = "4,8", 16, 16, 1
    modes = args.modes or ("dynamic,graphs" if args.device == "cuda" else "dynamic,fixed")
    modes = modes.split(",")
    rows_list = [int(r) for r in args.rows.split(",")]

    import torch

    torch.manual_seed(0)
    folder = Path(tempfile.mkdtemp(prefix="decode-steps-"))
    t0 = time.perf_counter()
    model, tok, _ = load_model(args.shape, args.device, folder)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    vocab = model.config.vocab_size
    cases, table = [], []
    print(f"model ready in {time.perf_counter() - t0:.1f}s", flush=True)
    for rows in rows_list:
        prompts = prompts_for(rows, args.prompt_tokens, vocab)
        case: dict = {"rows": rows, "new_tokens": args.new_tokens, "modes": {}}
        outputs = {}
        for mode in modes:
            try:
                seconds, out = time_mode(model, prompts, mode, args, pad_id)
            except Exception as error:  # noqa: BLE001 - record it, go on with the next mode
                traceback.print_exc()
                case["modes"][mode] = {"error": f"{type(error).__name__}: {error}"[:500]}
                continue
            outputs[mode] = out
            tokens = rows * args.new_tokens
            case["modes"][mode] = {"median_s": seconds, "tokens_per_s": tokens / seconds}
            print(f"rows {rows} {mode}: {tokens / seconds:.0f} tokens/s", flush=True)
        if "dynamic" in outputs:
            for mode, out in outputs.items():
                case["modes"][mode]["same_rows_as_dynamic"] = same_share(out, outputs["dynamic"])
        if rows == rows_list[0] and outputs:
            try:
                reference = generate_tokens(model, prompts, args.new_tokens, pad_id)
                for mode, out in outputs.items():
                    case["modes"][mode]["same_rows_as_generate"] = same_share(out, reference)
            except Exception as error:  # noqa: BLE001
                case["generate_error"] = f"{type(error).__name__}: {error}"[:500]
        base = case["modes"].get("dynamic", {}).get("tokens_per_s")
        for mode, found in case["modes"].items():
            if base and "tokens_per_s" in found:
                found["speedup_over_dynamic"] = found["tokens_per_s"] / base
            table.append(
                [
                    rows,
                    mode,
                    found.get("tokens_per_s"),
                    found.get("speedup_over_dynamic"),
                    found.get("same_rows_as_dynamic"),
                    found.get("same_rows_as_generate"),
                    found.get("error"),
                ]
            )
        cases.append(case)
    print_table(
        ["rows", "mode", "tokens/s", "x dynamic", "same as dynamic", "same as generate", "error"],
        table,
    )
    payload = {
        "device": args.device,
        "shape": args.shape,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "reps": args.reps,
        "cases": cases,
    }
    if args.device == "cuda":
        payload["gpu"] = torch.cuda.get_device_name()
        payload["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
    write_results(f"decode_steps_{args.device}", payload, args.out)


if __name__ == "__main__":
    main()
