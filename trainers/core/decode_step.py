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
* **Grouped heads without copies** (:func:`grouped_decode_attention`): with a mask, transformers'
  sdpa path repeats each key/value head for every query head of its group (``repeat_kv``: on a
  Qwen3-0.6B shape at 256 rows, a copy of twice the cache per layer per token), because the
  fused kernels take grouped heads only without a mask. A decode step has one query position per
  row, so the query heads of a group can stand in as that group's query positions instead (they
  share the keys, the values and the mask): the same attention, no copy.

Modes (:data:`STEP_MODES`, the engine's ``step`` argument or the ``RLHF_LAB_DECODE_STEP``
environment variable): ``dynamic`` is the eager step over the cache's filled positions (the CPU
default); ``fixed`` runs the fixed-shape step eagerly (what the CPU tests check against
``dynamic`` and ``generate``: the same code a graph records, minus the recording); ``graphs``
records one CUDA graph per bucket the first time the bucket is needed with at least
:data:`STEPS_WORTH_A_CAPTURE` steps of the budget left (a warm-up pass on a side stream, which is
the step itself, then the capture: one eager forward's worth of host time) and replays it
afterwards, until the engine's cache is rebuilt (every ``prefill``); ``auto`` is ``graphs`` on
CUDA, else ``dynamic``. The fixed step runs its own attention function whatever the model was
loaded with (sdpa, eager or flash-attention 2 for the prefill): it passes a 4-D key mask, which
every implementation's dispatch would otherwise treat differently. If a capture fails (a model whose forward synchronises with the
host), the step says so once on stderr and runs ``fixed`` eagerly from then on: same outputs,
no speed-up.

Sampling (temperature, top-k, top-p, min-p and the inverse-CDF draw) stays outside the graph, in
``trainers/core/decoding.py``, so every mode draws by the same rules from the same logits.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

STEP_MODES = ("auto", "dynamic", "fixed", "graphs")
STEP_ENV = "RLHF_LAB_DECODE_STEP"
# A bucket is recorded only when at least this many steps may still run in it: recording costs
# about one eager forward of host time, which a handful of replays does not pay back.
STEPS_WORTH_A_CAPTURE = 8


def resolve_step_mode(requested: str, device: torch.device) -> str:
    """The step the engine runs: ``requested`` (``auto`` defers to :data:`STEP_ENV` when set,
    else picks ``graphs`` on CUDA and ``dynamic`` elsewhere), checked against the device."""
    mode = requested
    if mode == "auto":
        mode = os.environ.get(STEP_ENV, "").strip() or "auto"
    if mode not in STEP_MODES:
        raise ValueError(
            f"unknown decode step {mode!r} (from {STEP_ENV} or the caller): "
            f"choose one of {', '.join(STEP_MODES)}"
        )
    if mode == "auto":
        return "graphs" if device.type == "cuda" else "dynamic"
    if mode == "graphs" and device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device, not {device.type}: use step='fixed'")
    return mode


GROUPED_DECODE = "rlhf_lab_grouped_decode"


def grouped_decode_attention(
    module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask,
    dropout=0.0,
    scaling=None,
    **kw,
):
    """transformers' attention-function interface: for one query position per row and fewer
    key/value heads than query heads, the group's query heads become its query positions (the
    module doc); anything else goes to transformers' sdpa function unchanged."""
    rows, heads, positions, dim = query.shape
    kv_heads = key.shape[1]
    if positions != 1 or heads == kv_heads or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kw
        )
    grouped = query.view(rows, kv_heads, heads // kv_heads, dim)  # head h = kv head h // group
    out = F.scaled_dot_product_attention(
        grouped, key, value, attn_mask=attention_mask, scale=scaling
    )
    return out.reshape(rows, heads, 1, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_DECODE, grouped_decode_attention)


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

    def __call__(self, token: Tensor, positions: Tensor, at: int, steps_left: int) -> Tensor:
        """Feed ``token`` (rows,) at ``positions`` (rows,), writing cache position ``at``; the
        rows' next-token logits (rows, vocab) in fp32, valid until the next call.
        ``steps_left``: how many more steps the budget allows (whether a capture pays)."""
        rows = len(token)
        bucket = bucket_for(rows, self.buckets)
        self.ids[:rows, 0] = token
        self.ids[rows:bucket] = self.pad_id
        self.positions[:rows, 0] = positions
        self.positions[rows:bucket] = 0
        self.write_at.fill_(at)
        self.cache.begin_fixed_steps(self.write_at)
        try:
            if self.graphs is not None and (
                bucket in self.graphs or steps_left >= STEPS_WORTH_A_CAPTURE
            ):
                logits = self._replay(bucket)
            else:
                logits = self._forward(bucket)
        finally:
            self.cache.end_fixed_steps()
        self.cache.advance(1)
        return logits[:rows]

    def _forward(self, bucket: int) -> Tensor:
        config = self.model.config
        attention = config._attn_implementation
        config._attn_implementation = GROUPED_DECODE
        try:
            out = self.model(
                input_ids=self.ids[:bucket],
                attention_mask=self.key_ok[:bucket, None, None, :],
                position_ids=self.positions[:bucket],
                past_key_values=self.cache,
                use_cache=True,
                **self.extra,
            )
        finally:
            config._attn_implementation = attention
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
        """Record the step for ``bucket`` rows: a warm-up pass on a side stream (it computes
        this very step; the replay rewrites the same position with the same values), then the
        capture."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
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
