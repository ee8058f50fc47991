"""The rollout engine (trainers/core/decoding.py) against the loop it replaced and ``generate``.

    uv run python bench/decoding.py                 # SmolLM2 (when pulled) and tiny (~5-10 min)
    uv run python bench/decoding.py --quick         # smoke run (tiny only, < 1 min)
    uv run python bench/decoding.py --grpo-steps 3  # also time LoRA GRPO steps on SmolLM2

Three contenders decode the same left-padded chat prompts, greedy, in fp32 on the CPU:

- ``engine``: ``sample_tokens`` as it is now (preallocated KV cache written in place, a 4-D
  mask that is a view of the rows' valid keys, stopped rows out of the batch);
- ``previous``: the loop ``sample_tokens`` ran before (trainers/core/decoding_oracles.py):
  transformers' ``DynamicCache`` grown by ``torch.cat`` per layer per token, the 2-D mask grown
  per token;
- ``generate``: ``model.generate`` (greedy, same stop tokens).

Each round runs the three once, in alternating order; the figure is the median over rounds of
new tokens / wall second (and per CPU second, the steadier figure on a shared machine). With
``--no-stop`` every row runs to the budget (pure decode throughput); by default rows stop at the
chat's end-of-turn tokens, as in a rollout. The outputs of the three are checked equal.

``--grpo-steps N`` runs the policy-gradient trainer on SmolLM2 for N steps (LoRA, no gradient
checkpointing, 16 completions of at most 128 tokens) and reports its ``timing/*`` metrics.

Where the time goes (torch.profiler, SmolLM2, contended 2-core machine, 2026-11-29): the
previous loop, 32 rows x 32 tokens, 2 threads: matmuls 56%, ``torch.cat`` (the dynamic cache)
13.6%, elementwise mul 8.9%, attention 6.6%, silu 5.7%. The engine, decode only, 16 rows, 1
thread: matmuls 81% (LM head ~1/4 of them), attention 5.3%, ``cat`` 0.6% (rotary embedding's
rotate_half, not the cache). A decode step reads every fp32 weight once (540 MB on SmolLM2)
for ~1 GFLOP per row: at 32 rows it is bound by memory bandwidth (measured 4-6 GB/s under
load), which the engine shares with ``generate``; what it removes is the cache copies (which
grow with the sequence) and the per-token mask building.

Prints a table and writes bench/results/decoding_cpu.json. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, alternate, print_table, write_results

SMOLLM2 = "smollm2-135m-instruct"
QUESTIONS = [
    "What is {a} + {b}?",
    "Spell the word '{w}' backward.",
    "How many letters 'r' are in '{w}'?",
    "Sort these numbers: {a}, {b}, {c}.",
]
WORDS = ["strawberry", "cat", "parallel", "rhythm", "banana", "mirror", "orange", "quartz"]


def chat_prompts(tok, rows: int) -> list[list[int]]:
    """``rows`` distinct short chat prompts of varied lengths (left padding in the batch)."""
    from trainers.core.generation import chat_prompt_ids

    out = []
    for i in range(rows):
        q = QUESTIONS[i % len(QUESTIONS)].format(
            a=3 * i + 1, b=7 * i % 23, c=i * i % 17, w=WORDS[i % len(WORDS)]
        )
        out.append(chat_prompt_ids(tok, [{"role": "user", "content": q}]))
    return out


def timed(fn) -> tuple[Any, dict]:
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = sum(len(r) for r in out)
    return out, {
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "tokens_per_cpu_s": tokens / cpu,
    }


def decode_case(model_name: str, rows: int, new: int, rounds: int, stop: bool) -> dict:
    import torch

    from trainers.core.decoding import sample_tokens
    from trainers.core.decoding_oracles import generate_greedy, previous_sample_tokens
    from trainers.core.generation import end_of_turn_ids
    from trainers.core.models import load_causal_lm, load_tokenizer

    tok = load_tokenizer(model_name)
    model = load_causal_lm(model_name, device="cpu", dtype="fp32", trainable=False)
    prompts = chat_prompts(tok, rows)
    pad_id = tok.pad_token_id
    stops = end_of_turn_ids(tok) if stop else []
    outputs: dict[str, list] = {}

    def run(name, fn):
        def go():
            out, figures = timed(fn)
            outputs[name] = out
            return figures

        return go

    contenders = {
        "engine": run(
            "engine",
            lambda: sample_tokens(
                model, prompts, max_new_tokens=new, stop_ids=stops, pad_id=pad_id
            ),
        ),
        "previous": run(
            "previous",
            lambda: previous_sample_tokens(
                model, prompts, max_new_tokens=new, stop_ids=stops, pad_id=pad_id
            ),
        ),
        "generate": run("generate", lambda: generate_greedy(model, prompts, pad_id, stops, new)),
    }
    with torch.no_grad():
        sample_tokens(model, prompts[:2], max_new_tokens=4, stop_ids=stops, pad_id=pad_id)
        results = alternate(contenders, rounds)
    same = outputs["engine"] == outputs["previous"] == outputs["generate"]
    med = {
        name: {
            key: statistics.median(r[key] for r in runs)
            for key in ("tokens_per_s", "tokens_per_cpu_s", "wall_s", "tokens")
        }
        for name, runs in results.items()
    }
    return {
        "model": model_name,
        "rows": rows,
        "max_new_tokens": new,
        "stop_at_end_of_turn": stop,
        "rounds": rounds,
        "outputs_equal": same,
        "median": med,
        "runs": results,
        "engine_vs_generate": med["engine"]["tokens_per_s"] / med["generate"]["tokens_per_s"],
        "engine_vs_previous": med["engine"]["tokens_per_s"] / med["previous"]["tokens_per_s"],
    }


def grpo_steps(steps: int) -> dict:
    """The policy-gradient trainer on SmolLM2 for ``steps`` steps: LoRA, no gradient
    checkpointing, 2 prompts x 8 completions of at most 128 tokens; its timing metrics."""
    config = ROOT / "trainers" / "policy_gradients" / "configs" / "grpo.yaml"
    overrides = {
        "model.name": SMOLLM2,
        "model.device": "cpu",
        "model.dtype": "fp32",
        "model.lora.enabled": "true",
        "model.gradient_checkpointing": "false",
        "rollout.prompts_per_step": 2,
        "rollout.num_rollouts": 8,
        "rollout.max_new_tokens": 128,
        "train.batch_size": 8,
        "train.gradient_accumulation_steps": 2,
        "train.max_steps": steps,
        "eval.eval_every": 0,
        "checkpoint.save_final_model": "false",
        "checkpoint.save_every": 1000,
    }
    with tempfile.TemporaryDirectory() as run_dir:
        argv = [
            sys.executable,
            "-m",
            "trainers.policy_gradients.train",
            "--config",
            str(config),
            "--run-dir",
            run_dir,
        ]
        for key, value in overrides.items():
            argv += ["--set", f"{key}={value}"]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            return {"error": done.stderr[-3000:], "argv": argv}
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").open()]
    timing = [{k: v for k, v in r.items() if k.startswith("timing/")} for r in rows]
    timing = [t for t in timing if t]
    return {"steps": timing, "overrides": overrides}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny only, 2 rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--no-stop", action="store_true", help="every row runs to the budget")
    parser.add_argument("--grpo-steps", type=int, default=0, help="LoRA GRPO steps on SmolLM2")
    args = parser.parse_args()

    import torch

    from trainers.core.models import pulled_dir

    torch.set_num_threads(args.threads)
    models = ["tiny"]
    smollm2_cached = (pulled_dir(SMOLLM2) / "config.json").is_file()
    if not args.quick and smollm2_cached:
        models.insert(0, SMOLLM2)
    rounds = 2 if args.quick else args.rounds
    cases = [
        decode_case(name, args.rows, args.new_tokens, rounds, stop=not args.no_stop)
        for name in models
    ]
    table = []
    for case in cases:
        med = case["median"]
        table.append(
            [
                case["model"],
                *(med[n]["tokens_per_s"] for n in ("engine", "previous", "generate")),
                case["engine_vs_generate"],
                case["engine_vs_previous"],
                med["engine"]["tokens_per_cpu_s"] / med["generate"]["tokens_per_cpu_s"],
                case["outputs_equal"],
            ]
        )
    print(
        f"{args.rows} rows x {args.new_tokens} new tokens, greedy, {args.threads} threads, "
        f"median of {rounds} rounds (tokens/s)"
    )
    print_table(
        [
            "model",
            "engine",
            "previous",
            "generate",
            "engine/generate",
            "engine/previous",
            "per CPU s",
            "same tokens",
        ],
        table,
    )
    payload: dict[str, Any] = {"threads": args.threads, "cases": cases}
    if not smollm2_cached:
        payload["smollm2"] = f"not pulled: rlhf-lab models pull {SMOLLM2}"
    if args.grpo_steps and smollm2_cached:
        grpo = grpo_steps(args.grpo_steps)
        payload["grpo_lora_smollm2"] = grpo
        steps = [s.get("timing/step_s") for s in grpo.get("steps", [])]
        print(
            "LoRA GRPO step on SmolLM2 (16 completions <= 128 tokens):",
            grpo.get("error") or [round(s, 1) for s in steps if s is not None],
            "median",
            statistics.median(s for s in steps if s is not None) if steps else "-",
        )
    write_results("decoding_cpu", payload)


if __name__ == "__main__":
    main()
