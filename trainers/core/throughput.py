"""Measure how fast this machine runs a model: the throughput calibration behind the lab's time
estimates (``rlhf_lab/planning/time.py``).

``python -m trainers.core.throughput --model NAME --device cpu --threads N --json`` prints one
JSON object (:data:`FORMAT_VERSION`):

* ``startup``: seconds to import torch + transformers, to load the model and tokenizer (the
  first load also imports the model's code), to load a second copy (a reference), and to save
  the model (a final model at the end of a run);
* ``train`` and ``lora``: a forward + backward pass of the model's body (the decoder, no LM
  head) at two shapes (a small and a representative one: ``seconds = fixed_s + tokens /
  tokens_per_s``), and the AdamW step over the trainable parameters (full fine-tuning; LoRA
  adapters on the default targets);
* ``forward``: the same two shapes without gradients (reference, old-policy and evaluation
  passes); ``head``: tokens/s through the LM head as the trainers use it (chunked log-probs of
  the tokens a loss needs, with and without gradients) — the trainers never project every
  position onto the vocabulary, so the head is counted only for those tokens;
* ``decode``: the real sampling loop (:func:`trainers.core.decoding.sample_tokens`, greedy, no
  stop token so every row runs to the end) at several row counts: seconds per decode step and
  tokens/s per row count, from the difference between 16 and 4 new tokens (the prefill and the
  loop's set-up cancel), so a faster sampling loop shows up in the predictions; ``prefill``:
  tokens/s of the prompt forward that starts it;
* ``lengths``: token counts of the built-in data through this tokenizer's chat template
  (demonstrations, preference prompts and responses, policy-gradient prompts), mean and 90th
  percentile, so a run's micro-batch length can be predicted without tokenising its data.

Each shape is timed after a warm-up, repeated until ``--min-time`` seconds or ``--max-reps``
passes; the median is kept. The whole measurement takes a few seconds on ``tiny`` and under a
minute on a 135M-parameter model on two CPU cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import Any

FORMAT_VERSION = 3  # 2: decode steps from two loop lengths; 3: the body and the head apart
_START = time.perf_counter()

# Representative shapes: (rows, tokens per row). The small one fixes the per-pass overhead.
TRAIN_SHAPES = ((1, 32), (4, 128))
DECODE_ROWS = (1, 4, 16, 32)
DECODE_PROMPT_TOKENS = 32
DECODE_NEW_TOKENS = 16
DECODE_SHORT_TOKENS = 4  # the same loop, shorter: the difference is decode steps alone
PREFILL_SHAPE = (4, 64)
HEAD_TOKENS = 256
LENGTH_SAMPLES = 32


def _timed(fn, min_time: float, max_reps: int) -> float:
    """Median seconds of ``fn()`` after one warm-up call."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_reps and (not times or time.perf_counter() - start < min_time):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def linear_fit(points: list[tuple[int, float]]) -> dict[str, float]:
    """``seconds = fixed_s + tokens / tokens_per_s`` through two (tokens, seconds) points (the
    fixed part is kept >= 0; one point: no fixed part)."""
    (t1, s1), (t2, s2) = points[0], points[-1]
    if t2 == t1:
        return {"fixed_s": 0.0, "tokens_per_s": t2 / max(s2, 1e-9)}
    per_token = max((s2 - s1) / (t2 - t1), 1e-12)
    fixed = max(s1 - per_token * t1, 0.0)
    if fixed == 0.0:
        per_token = s2 / t2
    return {"fixed_s": fixed, "tokens_per_s": 1.0 / per_token}


def _batch(torch, vocab: int, rows: int, length: int, device):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, length), generator=gen).to(device)
    return ids, torch.ones_like(ids)


def _timed_shapes(torch, vocab, device, run, min_time, max_reps) -> list[tuple[int, float]]:
    """(tokens, median seconds) of ``run(ids, mask)`` on a random batch of each of
    :data:`TRAIN_SHAPES`."""
    points = []
    for rows, length in TRAIN_SHAPES:
        ids, mask = _batch(torch, vocab, rows, length, device)
        seconds = _timed(lambda ids=ids, mask=mask: run(ids, mask), min_time, max_reps)
        points.append((rows * length, seconds))
    return points


def _decoder(model):
    """The transformer body without the LM head (what the trainers run; only the positions a
    loss needs go through the head, :func:`_head`)."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model


def _train_pass(torch, model, vocab, device, min_time, max_reps) -> dict[str, Any]:
    """Forward + backward of the body at each shape, then one optimizer step over what trains."""
    decoder = _decoder(model)

    def step(ids, mask):
        hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
        hidden.float().square().mean().backward()

    points = _timed_shapes(torch, vocab, device, step, min_time, max_reps)
    params = [p for p in model.parameters() if p.requires_grad]
    fused = device.type in ("cpu", "cuda")
    optimizer = torch.optim.AdamW(params, lr=1e-6, fused=fused)

    def opt_step():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    opt_s = _timed(opt_step, min_time / 2, max_reps)
    model.zero_grad(set_to_none=True)
    return {
        **linear_fit(points),
        "optimizer_s": opt_s,
        "trainable_params": sum(p.numel() for p in params),
        "points": [{"tokens": t, "seconds": s} for t, s in points],
    }


def _forward_pass(torch, model, vocab, device, min_time, max_reps) -> dict[str, Any]:
    decoder = _decoder(model)

    def fwd(ids, mask):
        with torch.no_grad():
            decoder(input_ids=ids, attention_mask=mask)

    points = _timed_shapes(torch, vocab, device, fwd, min_time, max_reps)
    return {**linear_fit(points), "points": [{"tokens": t, "seconds": s} for t, s in points]}


def _decode(torch, model, vocab, device, min_time, max_reps, pad_id) -> dict[str, Any]:
    from trainers.core.decoding import GREEDY, sample_tokens

    gen = torch.Generator().manual_seed(1)
    rows_out = []
    for rows in DECODE_ROWS:
        prompts = torch.randint(0, vocab, (rows, DECODE_PROMPT_TOKENS), generator=gen).tolist()
        ids, mask = _batch(torch, vocab, rows, DECODE_PROMPT_TOKENS, device)

        def loop(new: int, prompts=prompts):
            sample_tokens(
                model, prompts, max_new_tokens=new, stop_ids=[], pad_id=pad_id, sampling=GREEDY
            )

        short = _timed(lambda: loop(DECODE_SHORT_TOKENS), min_time / 4, max_reps)
        long = _timed(lambda: loop(DECODE_NEW_TOKENS), min_time / 2, max_reps)
        step = max(long - short, 1e-9) / (DECODE_NEW_TOKENS - DECODE_SHORT_TOKENS)
        rows_out.append({"rows": rows, "step_s": step, "tokens_per_s": rows / step})
    rows, length = PREFILL_SHAPE
    ids, mask = _batch(torch, vocab, rows, length, device)

    def prefill_big():
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, use_cache=True)

    pre = _timed(prefill_big, min_time / 4, max_reps)
    return {
        "rows": rows_out,
        "prefill_tokens_per_s": rows * length / pre,
        "new_tokens": DECODE_NEW_TOKENS,
        "prompt_tokens": DECODE_PROMPT_TOKENS,
    }


def _head(torch, model, vocab, device, min_time, max_reps) -> dict[str, float]:
    """Tokens/s through the LM head as the trainers use it (chunked log-probs of the label
    tokens, :func:`trainers.core.logprobs.hidden_to_logps`), with and without gradients."""
    from trainers.core.logprobs import hidden_to_logps

    lm_head = model.get_output_embeddings()
    width = lm_head.weight.shape[1]
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(1, HEAD_TOKENS, width, generator=gen).to(device, lm_head.weight.dtype)
    labels = torch.randint(0, vocab, (1, HEAD_TOKENS), generator=gen).to(device)
    hidden.requires_grad_(True)

    def train():
        hidden_to_logps(hidden, lm_head, labels).sum().backward()

    def forward():
        with torch.no_grad():
            hidden_to_logps(hidden, lm_head, labels)

    train_s = _timed(train, min_time / 2, max_reps)
    forward_s = _timed(forward, min_time / 2, max_reps)
    model.zero_grad(set_to_none=True)
    return {
        "train_tokens_per_s": HEAD_TOKENS / train_s,
        "forward_tokens_per_s": HEAD_TOKENS / forward_s,
    }


def _stats(values: list[int]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p90": 0.0}
    ordered = sorted(values)
    return {
        "mean": float(statistics.fmean(ordered)),
        "p90": float(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]),
    }


def builtin_lengths(tokenizer) -> dict[str, dict[str, float]]:
    """Token counts of the built-in data through ``tokenizer``'s chat template."""
    from trainers.core.builtin_data import builtin_demonstrations, builtin_preference_records
    from trainers.core.tokenization import chat_template_ids, text_ids

    demos = builtin_demonstrations(LENGTH_SAMPLES, 0, ["chain_sum", "basic_arithmetic"])
    prefs = builtin_preference_records(LENGTH_SAMPLES, 0)
    demo_ids = chat_template_ids(tokenizer, [d.messages for d in demos], False)
    prompt_ids = chat_template_ids(tokenizer, [p.prompt for p in prefs], True)
    chosen = [len(text_ids(tokenizer, p.chosen or "")) + 1 for p in prefs]
    rejected = [len(text_ids(tokenizer, p.rejected or "")) + 1 for p in prefs]
    return {
        "demonstration": _stats([len(x) for x in demo_ids]),
        "prompt": _stats([len(x) for x in prompt_ids]),
        "chosen": _stats(chosen),
        "rejected": _stats(rejected),
    }


def calibrate(
    model_name: str, device_name: str, threads: int | None, min_time: float, max_reps: int
) -> dict[str, Any]:
    """The measurement (see the module doc) as a JSON-ready dict."""
    t0 = time.perf_counter()
    import torch

    if threads:
        torch.set_num_threads(threads)
    import transformers  # noqa: F401  (its import is part of every trainer's start)

    from trainers.core.config import LoraSection
    from trainers.core.lora import add_adapters
    from trainers.core.models import load_causal_lm, load_tokenizer, model_fingerprint, pick_device

    import_s = time.perf_counter() - t0 + (t0 - _START)
    device = pick_device(device_name)
    t1 = time.perf_counter()
    tokenizer = load_tokenizer(model_name)
    model = load_causal_lm(model_name, device=device, dtype="auto", trainable=True)
    load_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    del_me = load_causal_lm(model_name, device=device, dtype="auto", trainable=False)
    reload_s = time.perf_counter() - t2  # a second model: a reference, a reward model
    del del_me
    vocab = int(model.config.vocab_size)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    params = sum(p.numel() for p in model.parameters())

    train = _train_pass(torch, model, vocab, device, min_time, max_reps)
    model.eval()
    forward = _forward_pass(torch, model, vocab, device, min_time, max_reps)
    head = _head(torch, model, vocab, device, min_time, max_reps)
    decode = _decode(torch, model, vocab, device, min_time, max_reps, pad_id)
    save_s = _save_seconds(model)
    model.train()
    lora_model = add_adapters(model, LoraSection(enabled=True))
    lora = _train_pass(torch, lora_model, vocab, device, min_time, max_reps)
    return {
        "format_version": FORMAT_VERSION,
        "model": model_name,
        "fingerprint": model_fingerprint(model_name),
        "device": str(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "torch": torch.__version__,
        "params": params,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "startup": {
            "import_s": import_s,
            "load_s": load_s,
            "reload_s": reload_s,
            "save_s": save_s,
        },
        "train": train,
        "lora": lora,
        "forward": forward,
        "head": head,
        "decode": decode,
        "lengths": builtin_lengths(tokenizer),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "seconds": time.perf_counter() - _START,
    }


def _save_seconds(model) -> float:
    """Seconds to write the model's weights (``save_pretrained`` into a temporary folder)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model.save_pretrained(tmp)
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds per shape, about")
    parser.add_argument("--max-reps", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    with contextlib.redirect_stdout(sys.stderr):  # stdout holds the JSON only
        result = calibrate(args.model, args.device, args.threads, args.min_time, args.max_reps)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
