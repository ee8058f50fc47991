"""The rollout engine's one-token decode step at fixed shapes, replayed as a CUDA graph on a GPU.

On a GPU a decode step of a sub-billion-parameter model is a few hundred small kernels whose
launch, from Python through transformers' modules, takes far longer than their work: measured on
an H200 (bench/README), 32 rows of a Qwen3-0.6B-shaped model decoded at ~900 tokens/s. A CUDA
graph records the step's kernels once and replays them with one launch, but it replays exactly
what it recorded: the same shapes, the same memory, no Python. So the step here is written at
fixed shapes:

* **Rows come in buckets** (:func:`buckets_for`: powers of two up to the engine's slots). A step
  over ``rows`` rows runs the smallest bucket that holds them: the rows past ``rows`` feed
  padding at position 0 and their outputs are dropped (they are stopped rows not yet set aside,
  rows kept for a later turn, or free slots; their keys at this position stay masked, so no
  row ever sees what they wrote). When the engine sets stopped rows aside
  (``DROP_STOPPED_SHARE``), later steps fall into a smaller bucket.
* **Inputs live in static buffers**: the token ids and position ids are copied into preallocated
  tensors before the step, and the position the step writes in the KV cache is a one-element
  device tensor (``trainers/core/kv_cache.py``, fixed-shape steps), so nothing a graph recorded
  depends on a host value that changes per token.
* **Attention covers the cache's whole capacity**, the positions not yet written (and each row's
  padding and sat-out steps) hidden by the engine's key mask, a static buffer read in place.

Modes (:data:`STEP_MODES`, the engine's ``step`` argument or the ``RLHF_LAB_DECODE_STEP``
environment variable): ``dynamic`` is the eager step over the cache's filled positions (the CPU
default); ``fixed`` runs the fixed-shape step eagerly (what the CPU tests check against
``dynamic`` and ``generate``: the same code a graph records, minus the recording); ``graphs``
records one CUDA graph per bucket the first time the bucket is needed (a warm-up pass on a side
stream, then the capture) and replays it afterwards; ``auto`` is ``graphs`` on CUDA with sdpa
attention, else ``dynamic``. If a capture fails (a model whose forward synchronises with the
host), the step says so once on stderr and runs ``fixed`` eagerly from then on: same outputs,
no speed-up.

Sampling (temperature, top-k, top-p, min-p and the inverse-CDF draw) stays outside the graph, in
``trainers/core/decoding.py``, so every mode draws by the same rules from the same logits.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import Tensor

STEP_MODES = ("auto", "dynamic", "fixed", "graphs")
STEP_ENV = "RLHF_LAB_DECODE_STEP"


def resolve_step_mode(requested: str, device: torch.device, attention: str | None) -> str:
    """The step the engine runs: ``requested`` (``auto`` defers to :data:`STEP_ENV` when set),
    checked against what the device and the attention implementation allow."""
    mode = requested
    if mode == "auto":
        mode = os.environ.get(STEP_ENV, "").strip() or "auto"
    if mode not in STEP_MODES:
        raise ValueError(
            f"unknown decode step {mode!r} (from {STEP_ENV} or the caller): "
            f"choose one of {', '.join(STEP_MODES)}"
        )
    fixed_ok = attention == "sdpa"
    if mode == "auto":
        return "graphs" if device.type == "cuda" and fixed_ok else "dynamic"
    if mode in ("fixed", "graphs") and not fixed_ok:
        raise ValueError(
            f"the {mode!r} decode step needs sdpa attention (it passes a 4-D key mask); this "
            f"model uses {attention!r}: use step='dynamic'"
        )
    if mode == "graphs" and device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device, not {device.type}: use step='fixed'")
    return mode


def buckets_for(slots: int) -> tuple[int, ...]:
    """The row counts a step runs at: every power of two below ``slots``, and ``slots``."""
    sizes = {slots}
    size = 1
    while size < slots:
        sizes.add(size)
        size *= 2
    return tuple(sorted(sizes))


def bucket_for(rows: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``rows`` rows."""
    for size in buckets:
        if size >= rows:
            return size
    raise ValueError(f"{rows} rows exceed the largest bucket ({buckets[-1]})")


class FixedShapeStep:
    """One decode step at a bucket's fixed shapes over ``cache`` (a ``BufferCache``) with the
    engine's key mask ``key_ok`` (slots, capacity): eager (``graphs=False``) or recorded and
    replayed as one CUDA graph per bucket. Rebuild it whenever the cache or ``key_ok`` is
    reallocated (the graphs hold their addresses)."""

    def __init__(self, model, cache, key_ok: Tensor, *, pad_id: int, graphs: bool, extra: dict):
        self.model, self.cache, self.key_ok, self.pad_id = model, cache, key_ok, pad_id
        self.extra = extra  # e.g. logits_to_keep=1
        self.buckets = buckets_for(cache.slots)
        device = key_ok.device
        self.ids = torch.full((cache.slots, 1), pad_id, dtype=torch.long, device=device)
        self.positions = torch.zeros((cache.slots, 1), dtype=torch.long, device=device)
        self.write_at = torch.zeros(1, dtype=torch.long, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] | None = {} if graphs else None
        self.outputs: dict[int, Tensor] = {}
        self.captures = 0  # graphs recorded (the bench reports it)

    def __call__(self, token: Tensor, positions: Tensor, at: int) -> Tensor:
        """Feed ``token`` (rows,) at ``positions`` (rows,), writing cache position ``at``; the
        rows' next-token logits (rows, vocab) in fp32, valid until the next call."""
        rows = len(token)
        bucket = bucket_for(rows, self.buckets)
        self.ids[:rows, 0] = token
        self.ids[rows:bucket] = self.pad_id
        self.positions[:rows, 0] = positions
        self.positions[rows:bucket] = 0
        self.write_at.fill_(at)
        self.cache.begin_fixed_steps(self.write_at)
        try:
            logits = self._replay(bucket) if self.graphs is not None else self._forward(bucket)
        finally:
            self.cache.end_fixed_steps()
        self.cache.advance(1)
        return logits[:rows]

    def _forward(self, bucket: int) -> Tensor:
        out = self.model(
            input_ids=self.ids[:bucket],
            attention_mask=self.key_ok[:bucket, None, None, :],
            position_ids=self.positions[:bucket],
            past_key_values=self.cache,
            use_cache=True,
            **self.extra,
        )
        return out.logits[:, -1].float()

    def _replay(self, bucket: int) -> Tensor:
        graph = self.graphs.get(bucket)
        if graph is None:
            graph = self._capture(bucket)
            if graph is None:  # the capture failed: eager from now on
                return self._forward(bucket)
        graph.replay()
        return self.outputs[bucket]

    def _capture(self, bucket: int):
        """Record the step for ``bucket`` rows: warm-up passes on a side stream (they compute
        this very step: rewriting the same position with the same values), then the capture."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(bucket)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.outputs[bucket] = self._forward(bucket)
        except Exception as error:  # noqa: BLE001 - any capture failure falls back the same way
            print(
                f"rollout engine: CUDA graph capture failed ({type(error).__name__}: "
                f"{str(error)[:200]}); decoding without graphs from here",
                file=sys.stderr,
                flush=True,
            )
            self.graphs = None
            return None
        self.graphs[bucket] = graph
        self.captures += 1
        return graph
