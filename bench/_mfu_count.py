"""Model-FLOP accounting and step timers for bench/mfu.py.

Model FLOPs (the "MFU" convention: work the algorithm needs, not what the kernels happen to
execute — recomputation under checkpointing, padding and attention are not in the headline):

* ``N_body`` = the matrix parameters of the decoder body (attention and MLP projections; the
  token embedding is a lookup, not a matmul; norms and biases are left out; counted by
  ``trainers.core.flops.matrix_params``, the count the trainers' ``mfu/*`` metrics use), ``N_head`` =
  vocabulary x hidden (the LM head; with tied embeddings the same tensor as the embedding).
* A token that goes through the body costs ``2·N_body`` FLOPs forward; a position that goes
  through the LM head costs ``2·N_head``. Under a gradient (training) each costs three times
  that (forward + backward for activations + backward for weights): ``6·N``.
* Only the tokens each path really computes are counted: the body's tokens are the non-padding
  positions of the ``input_ids`` handed to the decoder in each call (so a prompt forwarded once
  for a GRPO group or a preference pair counts once, and each decoding step counts its rows
  once), the head's positions are the rows of hidden states multiplied by the head weight (our
  trainers project completion positions only; generation projects the last position).

Attention score FLOPs (``QK^T`` and ``A·V``: ``4·heads·head_dim`` per layer per
(query, key) pair, causal, on the padded shapes) are counted separately and reported as an
"incl. attention" figure, never folded into the headline.

How the counts are taken: the decoder class's ``forward`` (e.g. ``Qwen2Model.forward``) and
``torch.nn.functional.linear`` (for the head weight only, recognised by its (vocab, hidden)
shape) are wrapped for the duration of a measurement. Calls made inside a backward pass
(activation-checkpoint recomputation) are not counted. The wrappers keep per-phase counters
(a phase is a label the bench sets, e.g. ``rollout`` / ``prepare`` / ``update`` for GRPO) split
by whether gradients were enabled (training: 6x) or not (reference, generation: 2x). Non-padding
counts stay device tensors until read, so counting adds no device synchronisation.

With ``timers=True`` the same wrappers time the decoder forward and the head matmul, and
``torch.autograd.backward`` and every optimizer step are timed too (on CUDA each timer
synchronises the device, so the per-phase profile is exact and the timed run is slightly
slower; the headline MFU run takes no timers).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP formulas need from a causal LM."""

    body_params: int  # matrix parameters of the decoder body (no embedding, no head)
    vocab: int
    hidden: int
    layers: int
    heads: int
    head_dim: int
    decoder_class: str  # e.g. "Qwen2Model"

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    def body_flops(self, tokens: float, train: bool) -> float:
        return (6 if train else 2) * self.body_params * tokens

    def head_flops(self, positions: float, train: bool) -> float:
        return (6 if train else 2) * self.head_params * positions

    def attention_flops(self, pairs: float, train: bool) -> float:
        """Score and value FLOPs for ``pairs`` (query, key) pairs summed over all calls."""
        return (3 if train else 1) * 4 * self.layers * self.heads * self.head_dim * pairs


def shape_of(config: Any) -> ModelShape:
    """The shape of a transformers config, counting the body's matrices on the meta device."""
    import torch
    from transformers import AutoModel

    from trainers.core.flops import matrix_params  # the trainers' own count (mfu/* metrics)

    with torch.device("meta"):
        body = AutoModel.from_config(config)
    matrices = matrix_params(body)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ModelShape(
        body_params=int(matrices),
        vocab=config.vocab_size,
        hidden=config.hidden_size,
        layers=config.num_hidden_layers,
        heads=heads,
        head_dim=head_dim,
        decoder_class=type(body).__name__,
    )


def _in_backward() -> bool:
    import torch

    return torch._C._current_graph_task_id() != -1


class _Bucket:
    """Counts of one (phase, gradient mode)."""

    def __init__(self) -> None:
        self.body_positions = 0  # computed positions, padding included
        self.body_nonpad: list[Any] = []  # device tensors / ints, summed when read
        self.head_positions = 0
        self.attention_pairs = 0
        self.calls = 0

    def read(self) -> dict[str, float]:
        nonpad = sum(int(t) for t in self.body_nonpad)
        self.body_nonpad = [nonpad]  # keep the list short
        return {
            "body_tokens": nonpad,
            "body_positions": self.body_positions,
            "head_positions": self.head_positions,
            "attention_pairs": self.attention_pairs,
            "decoder_calls": self.calls,
        }


class FlopMeter:
    """Counters and timers (module doc). Use as a context manager around the measured code."""

    def __init__(self, shape: ModelShape, timers: bool = False, cuda: bool = False) -> None:
        self.shape = shape
        self.phase = "main"
        self.timers = timers
        self.cuda = cuda
        self.buckets: dict[tuple[str, bool], _Bucket] = defaultdict(_Bucket)
        self.seconds: dict[str, float] = defaultdict(float)  # "<phase>/<what>" -> seconds
        self._undo: list[Any] = []

    # -- timing helpers ------------------------------------------------------------------------

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    @contextlib.contextmanager
    def timed(self, what: str) -> Iterator[None]:
        if not self.timers:
            yield
            return
        self._sync()
        started = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[f"{self.phase}/{what}"] += time.perf_counter() - started

    @contextlib.contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before

    # -- counting ------------------------------------------------------------------------------

    def _count_body(self, args: tuple, kwargs: dict) -> None:
        import torch

        ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        dims = tuple(ids.shape[:2]) if ids is not None else tuple(embeds.shape[:2])
        rows, new = (dims[0], dims[1]) if len(dims) == 2 else (1, dims[0])
        mask = kwargs.get("attention_mask")
        bucket = self.buckets[(self.phase, torch.is_grad_enabled())]
        bucket.calls += 1
        bucket.body_positions += rows * new
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] >= new:
            bucket.body_nonpad.append(mask[:, -new:].sum())
            past = mask.shape[1] - new
        else:
            bucket.body_nonpad.append(rows * new)
            past = 0
        bucket.attention_pairs += rows * (new * past + new * (new + 1) // 2)

    @contextlib.contextmanager
    def installed(self) -> Iterator[FlopMeter]:
        """Wrap the decoder class's forward, ``F.linear``, autograd's backward and optimizer
        steps for the duration of the block."""
        import torch
        import torch.nn.functional as F
        import transformers
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        decoder_cls = getattr(transformers, self.shape.decoder_class)
        original_forward = decoder_cls.forward
        original_linear = F.linear
        original_backward = torch.autograd.backward
        meter = self
        vocab, hidden = self.shape.vocab, self.shape.hidden

        def forward(module, *args, **kwargs):
            if _in_backward():
                return original_forward(module, *args, **kwargs)
            meter._count_body(args, kwargs)
            with meter.timed("decoder_forward"):
                return original_forward(module, *args, **kwargs)

        def linear(input, weight, bias=None):
            if weight.dim() == 2 and weight.shape[0] == vocab and weight.shape[1] == hidden:
                if not _in_backward():
                    bucket = meter.buckets[(meter.phase, torch.is_grad_enabled())]
                    bucket.head_positions += input.numel() // input.shape[-1]
                    with meter.timed("head_matmul"):
                        return original_linear(input, weight, bias)
            return original_linear(input, weight, bias)

        def backward(*args, **kwargs):
            with meter.timed("backward"):
                return original_backward(*args, **kwargs)

        step_started: list[float] = []

        def before_step(optimizer, args, kwargs):
            if meter.timers:
                meter._sync()
                step_started.append(time.perf_counter())

        def after_step(optimizer, args, kwargs):
            if meter.timers and step_started:
                meter._sync()
                meter.seconds[f"{meter.phase}/optimizer"] += (
                    time.perf_counter() - step_started.pop()
                )

        decoder_cls.forward = forward
        F.linear = linear
        torch.autograd.backward = backward
        handles = [
            register_optimizer_step_pre_hook(before_step),
            register_optimizer_step_post_hook(after_step),
        ]
        try:
            yield self
        finally:
            decoder_cls.forward = original_forward
            F.linear = original_linear
            torch.autograd.backward = original_backward
            for handle in handles:
                handle.remove()

    # -- reading -------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Plain numbers of every counter and timer so far (synchronises the device)."""
        return {
            "counts": {
                f"{phase}/{'grad' if grad else 'nograd'}": bucket.read()
                for (phase, grad), bucket in self.buckets.items()
            },
            "seconds": dict(self.seconds),
        }


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``after − before`` of two snapshots (counters that appear only in ``after`` kept whole)."""
    counts = {}
    for key, now in after["counts"].items():
        then = before["counts"].get(key, {})
        counts[key] = {k: v - then.get(k, 0) for k, v in now.items()}
    seconds = {k: v - before["seconds"].get(k, 0.0) for k, v in after["seconds"].items()}
    return {"counts": counts, "seconds": seconds}


def model_flops(shape: ModelShape, counts: dict[str, dict[str, float]], phase: str | None = None):
    """(model FLOPs, FLOPs incl. attention, FLOPs on padded positions) of the counters of
    ``phase`` (all phases when None)."""
    total = with_attention = padded = 0.0
    for key, c in counts.items():
        if not c:
            continue
        name, mode = key.rsplit("/", 1)
        if phase is not None and name != phase:
            continue
        train = mode == "grad"
        core = shape.body_flops(c["body_tokens"], train) + shape.head_flops(
            c["head_positions"], train
        )
        total += core
        with_attention += core + shape.attention_flops(c["attention_pairs"], train)
        padded += shape.body_flops(c["body_positions"], train) + shape.head_flops(
            c["head_positions"], train
        )
    return total, with_attention, padded
