"""Model FLOPs, the device's measured peak, and a clock for the stages of a step: what every
``mfu/*`` figure a trainer logs is made of.

Model FLOPs follow the bench's convention (bench/_mfu_count.py, bench/README "MFU"): the work the
algorithm needs, not what the kernels happen to execute.

* ``body`` = the matrix parameters a token goes through (attention and MLP projections, a scalar
  reward or value head; the token embedding is a lookup, not a matmul; norms and biases are
  left out), ``head`` = vocabulary × hidden of the LM head (with tied embeddings the same tensor
  as the embedding, counted once as the matmul it is). :func:`matrix_params` counts the first on
  any module, :func:`model_flops` splits a model into the two.
* A token through the body costs ``2·body`` FLOPs forward, a position through the LM head
  ``2·head``; under a gradient three times that (forward, backward for activations, backward for
  weights). Only non-padding tokens count; recomputation under gradient checkpointing, LoRA's
  frozen weights (which skip the weight gradient) and attention scores are not corrected for.

The peak (:func:`measured_peak`) is the best FLOP/s of a short square matmul in the run's dtype
on the run's device: ``n × n @ n × n`` (n = 512 on the CPU, the best of 20 products; n = 8192
on CUDA, the best of 3 timings of 5 products each), after one warm-up product, from a private
random generator (the run's random state is untouched). It is measured once per process and
kept for the process (tens of ms on the CPU or a GPU). It is deliberately not cached on disk: a
peak measured now, under this process's thread setting and the machine's present load, is the
honest denominator for the steps that follow, and a stale file from another load (or another
build of torch) is not.

:class:`StageClock` times the named stages of one step (``with clock.stage("generate"): ...``)
and turns them, with each stage's tokens and FLOPs (:class:`Work`), into the metric row:
``timing/<stage>_s``, ``tokens/<stage>``, ``throughput/<stage>_tokens_per_s`` and
``mfu/<stage>`` (plus ``mfu/step`` over the whole step). Under torchrun the seconds spent
gathering whole weights for generation (:func:`trainers.core.distributed.gather_seconds`) are
taken out of the stage they happened in and shown as ``weight_gather``. On CUDA each stage
boundary synchronises the device, so a stage's seconds are its own.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def matrix_params(module: nn.Module) -> int:
    """Parameters of ``module``'s matrices, each tensor once: every 2-D parameter but the
    weights of embedding lookups (``nn.Embedding``). A tied LM head is the embedding's tensor,
    so it is not in this count (:func:`model_flops` adds it back)."""
    lookups = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    return sum(p.numel() for p in module.parameters() if p.dim() == 2 and id(p) not in lookups)


@dataclass(frozen=True)
class ModelFlops:
    """Model FLOPs of passes through one model (module doc)."""

    body: int  # matrix parameters a token goes through (no embedding lookup, no LM head)
    head: int = 0  # vocabulary × hidden of the LM head (0: no LM head)

    def forward(self, tokens: float, head_positions: float | None = None) -> float:
        """FLOPs of a forward pass over ``tokens`` non-padding tokens, the LM head applied at
        ``head_positions`` of them (all of them when None)."""
        positions = tokens if head_positions is None else head_positions
        return 2.0 * (self.body * tokens + self.head * positions)

    def training(self, tokens: float, head_positions: float | None = None) -> float:
        """FLOPs of a forward and backward pass (three forwards' worth)."""
        return 3.0 * self.forward(tokens, head_positions)


def model_flops(model: nn.Module) -> ModelFlops:
    """``model``'s :class:`ModelFlops`: its LM head (``get_output_embeddings``, when it has one)
    apart, every other matrix in the body but the LM head of a wrapped model that never runs
    it (a reward model's backbone: its hidden states feed a scalar head)."""
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = _output_weight(model)
    unused = {
        id(w): w.numel()
        for sub in model.modules()
        if sub is not model and (w := _output_weight(sub)) is not None and w is not head
    }
    params = {id(p) for p in model.parameters()}
    body = matrix_params(model)
    body -= sum(n for k, n in unused.items() if k in params and k not in lookups)
    if head is None:
        return ModelFlops(body=body)
    if id(head) in params and id(head) not in lookups:  # untied: counted among the matrices
        body -= head.numel()
    return ModelFlops(body=body, head=head.numel())


def _output_weight(module: nn.Module) -> Any:
    """The weight of ``module``'s LM head (None: none)."""
    get = getattr(module, "get_output_embeddings", None)
    out = get() if callable(get) else None
    weight = getattr(out, "weight", None)
    return weight if weight is not None and weight.dim() == 2 else None


# ---------------------------------------------------------------------------------------------
# The device's peak
# ---------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@functools.cache
def _peak(device_type: str, index: int | None, dtype: torch.dtype, threads: int) -> float:
    """Best FLOP/s of square products (module doc); ``threads`` keys the cache only."""
    device = torch.device(device_type, index) if index is not None else torch.device(device_type)
    # CUDA: several products between synchronisations, so launch gaps vanish from the figure
    n, inner, repeats = (8192, 5, 3) if device.type == "cuda" else (512, 1, 20)
    gen = torch.Generator(device=device).manual_seed(0)  # the run's random state is untouched
    a, b = (torch.randn(n, n, generator=gen, device=device, dtype=dtype) for _ in range(2))
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        started = time.perf_counter()
        for _ in range(inner):
            torch.mm(a, b)
        _sync(device)
        best = min(best, (time.perf_counter() - started) / inner)
    return 2.0 * n**3 / max(best, 1e-12)


def measured_peak(device: Any, dtype: torch.dtype) -> float:
    """FLOP/s this process reaches on a dense ``dtype`` matmul on ``device``: measured on the
    first call for a (device, dtype, thread count), then remembered for the process. Under FSDP
    mixed precision (fp32 weights computed in bf16) the compute dtype is measured."""
    from trainers.core.distributed import world

    dtype = world().mixed_precision or dtype
    device = torch.device(device)
    index = device.index if device.type == "cuda" and device.index is not None else None
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return _peak(device.type, index, dtype, torch.get_num_threads())


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation: ``flops / seconds / peak`` (0 when nothing was timed)."""
    if seconds <= 0 or peak <= 0:
        return 0.0
    return flops / seconds / peak


# ---------------------------------------------------------------------------------------------
# The stages of a step
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    """What one stage of a step processed: its tokens and its model FLOPs (0: none counted,
    e.g. a verifier or the advantage arithmetic)."""

    tokens: float = 0.0
    flops: float = 0.0


class StageClock:
    """The seconds of a step's named stages (module doc). Created when the step starts; a
    stage entered several times adds up."""

    def __init__(
        self, device: Any = "cpu", gather_seconds: Callable[[], float] | None = None
    ) -> None:
        self.device = torch.device(device)
        self.gather_seconds = gather_seconds or _default_gather_seconds()
        self.seconds: dict[str, float] = {}
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as stage ``name`` (weight gathering inside it apart)."""
        _sync(self.device)
        gathered, started = self.gather_seconds(), time.perf_counter()
        try:
            yield
        finally:
            _sync(self.device)
            gather = self.gather_seconds() - gathered
            self.add(name, time.perf_counter() - started - gather)
            if gather > 0:
                self.add("weight_gather", gather)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @property
    def dt(self) -> float:
        """Seconds since the step started."""
        return time.perf_counter() - self.start

    def row(self, work: dict[str, Work], peak: float, step_s: float) -> dict[str, float]:
        """The step's stage metrics: each timed stage's seconds, and where ``work`` names it,
        its tokens, tokens per second and MFU against ``peak``; ``mfu/step`` is every stage's
        FLOPs over the step's ``step_s``."""
        out: dict[str, float] = {}
        for name, seconds in self.seconds.items():
            out[f"timing/{name}_s"] = seconds
            done = work.get(name)
            if done is None:
                continue
            if done.tokens:
                out[f"tokens/{name}"] = done.tokens
                out[f"throughput/{name}_tokens_per_s"] = done.tokens / max(seconds, 1e-9)
            if done.flops:
                out[f"mfu/{name}"] = mfu(done.flops, seconds, peak)
        total = sum(w.flops for name, w in work.items() if name in self.seconds)
        out["mfu/step"] = mfu(total, step_s, peak)
        return out


def _default_gather_seconds() -> Callable[[], float]:
    from trainers.core.distributed import gather_seconds

    return gather_seconds


@dataclass(frozen=True)
class StepAccount:
    """What the MFU of a training step is measured with: the trained model's FLOPs, a frozen
    model run over the same tokens in the step (a reference or a teacher; None: none) and the
    device's peak."""

    trained: ModelFlops
    peak: float
    frozen: ModelFlops | None = None

    def flops(self, tokens: float) -> float:
        """Model FLOPs of a step over ``tokens`` tokens: ``6·N·tokens`` for the trained model
        (its LM head at every token) plus ``2·N_frozen·tokens`` for the frozen one."""
        frozen = self.frozen.forward(tokens) if self.frozen is not None else 0.0
        return self.trained.training(tokens) + frozen

    def mfu(self, tokens: float, seconds: float) -> float:
        return mfu(self.flops(tokens), seconds, self.peak)


def step_account(
    model: nn.Module, device: Any, dtype: torch.dtype, frozen: nn.Module | None = None
) -> StepAccount:
    """The :class:`StepAccount` of a family whose step trains ``model`` (and runs ``frozen``
    over the same tokens), on ``device`` in ``dtype``: the peak measured now (once a process),
    times the processes of the run (a step's tokens are every rank's)."""
    from trainers.core.distributed import world

    return StepAccount(
        trained=model_flops(model),
        peak=measured_peak(device, dtype) * world().size,
        frozen=model_flops(frozen) if frozen is not None else None,
    )
