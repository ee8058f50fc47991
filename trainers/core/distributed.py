"""Training on several processes (``torchrun --nproc-per-node N -m trainers.<family>.train``).

Every trainer runs unchanged on one process; under torchrun each process is one *rank* of a
data-parallel group and the helpers here make the loop's step the same step as on one process
with the same global batch:

* :func:`init_from_env` joins the process group torchrun describes in the environment (``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``): NCCL when the run trains on CUDA, gloo on CPU.
* :func:`shard_model` shards a model with FSDP2 (``fully_shard``): one unit per decoder layer, and
  one unit for everything else (embeddings, final norm, LM head, a reward/value head), which
  stays gathered from its forward to its backward because the loops apply the LM head to hidden
  states themselves. On CUDA with bf16 the parameters are kept in fp32 and computed in bf16, with
  fp32 gradient reductions (``MixedPrecisionPolicy``).
* Gradient reduction. Each rank back-propagates *its share of the global objective* (its sum
  divided by the global count: examples, pairs or target tokens of the whole step), and the
  shards' gradients are summed, so the gradient is the global mean — the mean of the per-rank
  means when shares are equal, never their sum (``tests/trainers/core/test_distributed.py``
  checks it against one process).
* :func:`rank_share` gives each rank a disjoint, strided share of a step's examples;
  :func:`gather_sum`, :func:`any_rank` and :class:`~trainers.core.training.StepMetrics` make the
  step's statistics global.
* Rank 0 alone writes the run folder (:class:`~trainers.core.rundir.RunDir` with
  ``writer=False`` elsewhere); every rank's lines reach ``train.log`` prefixed ``[rank r]``.

The one place that asks the machine about CUDA is :func:`query_cuda`; device choice, dtype,
attention implementation and the backend all go through it, and each of those functions takes
the answer as a ``cuda`` parameter instead (:class:`CudaInfo`), which is how tests reach the
CUDA branches on a CPU-only machine; :func:`world_as` sets the world for a block.

Not supported: tensor or pipeline parallelism, several nodes without torchrun's rendezvous,
resuming a sharded checkpoint on a different world size.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# ---------------------------------------------------------------------------------------------
# The device query (the one place that asks torch; the functions that read it take a
# ``cuda`` answer instead, for a machine other than this one)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CudaInfo:
    """What this machine offers: how many CUDA devices, whether they compute in bf16."""

    count: int = 0
    bf16: bool = False


def query_cuda() -> CudaInfo:
    """The CUDA devices visible to this process (none on a CPU-only machine)."""
    import torch

    if not torch.cuda.is_available():
        return CudaInfo()
    return CudaInfo(torch.cuda.device_count(), bool(torch.cuda.is_bf16_supported()))


def backend_for(device_type: str) -> str:
    """The collective backend for a run on ``device_type``: NCCL on CUDA, gloo on CPU."""
    return "nccl" if device_type == "cuda" else "gloo"


# ---------------------------------------------------------------------------------------------
# The world
# ---------------------------------------------------------------------------------------------


@dataclass
class World:
    """This process's place in the run: rank ``rank`` of ``size`` (1: a plain single process)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    backend: str | None = None
    mixed_precision: Any = None  # the bf16 compute dtype under FSDP on CUDA, else None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


_world = World()


def world() -> World:
    """The current world (one process unless :func:`init_from_env` joined a group)."""
    return _world


@contextlib.contextmanager
def world_as(place: World) -> Iterator[World]:
    """The world is ``place`` for the block (what :func:`world` and the functions here read),
    the previous one afterwards: code that runs as a rank of a larger run without joining a
    process group (a check that refuses what torchrun cannot run, a test of it)."""
    global _world
    before, _world = _world, place
    try:
        yield place
    finally:
        _world = before


class WorldError(ValueError):
    """The torchrun environment is inconsistent (a launcher bug, not a config mistake)."""


def world_from_env(env: dict[str, str] | os._Environ[str] = os.environ) -> World:
    """Rank, world size and local rank from torchrun's variables (absent: one process)."""
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError as err:
        raise WorldError(f"RANK / WORLD_SIZE / LOCAL_RANK are not integers: {err}") from None
    if size < 1 or not 0 <= rank < size or local < 0:
        raise WorldError(f"rank {rank} of world size {size} (local rank {local}) is impossible")
    return World(rank=rank, size=size, local_rank=local)


def wants_cuda(device_pref: str, cuda: CudaInfo | None = None) -> bool:
    """Whether a ``model.device`` setting trains on CUDA on this machine (``cuda``: what the
    machine offers; by default :func:`query_cuda`)."""
    pref = str(device_pref).lower()
    if pref == "auto":
        return (cuda or query_cuda()).count > 0
    return pref.startswith("cuda")


def init_from_env(device_pref: str = "auto") -> World:
    """Join the process group torchrun set up (no-op on a single process or when joined):
    NCCL when ``device_pref`` trains on CUDA, gloo otherwise. Idempotent: a process that runs
    several trainers in turn keeps one group (left when the process exits)."""
    global _world
    found = world_from_env()
    if not found.distributed:
        _world = found
        return _world
    import torch.distributed as dist

    backend = backend_for("cuda" if wants_cuda(device_pref) else "cpu")
    if not dist.is_initialized():
        if backend == "nccl":
            import torch

            torch.cuda.set_device(found.local_rank)
        dist.init_process_group(backend)
        atexit.register(shutdown)
    else:
        backend = dist.get_backend()
    found.backend = backend
    _world = found
    return _world


def shutdown() -> None:
    """Leave the process group (end of a run); the world is one process again."""
    global _world
    if _world.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    _world = World()


def rank_device(device: torch.device, cuda: CudaInfo | None = None) -> torch.device:
    """The device of this rank: ``cuda:<local rank>`` for a CUDA run under torchrun (each rank
    its own GPU, the ones torchrun's ``CUDA_VISIBLE_DEVICES`` leaves visible), else ``device``
    (``cuda``: what the machine offers; by default :func:`query_cuda`)."""
    import torch

    if _world.distributed and device.type == "cuda":
        count = (cuda or query_cuda()).count
        if _world.local_rank >= count:
            raise WorldError(
                f"local rank {_world.local_rank} has no GPU: {count} CUDA device(s) visible; "
                "start at most one process per GPU"
            )
        return torch.device("cuda", _world.local_rank)
    return device


def plan_precision(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype to load weights in. Under FSDP on CUDA a bf16 run keeps fp32 parameters and
    computes in bf16 (:func:`shard_model` applies the policy); elsewhere ``dtype`` itself."""
    import torch

    _world.mixed_precision = None
    if _world.distributed and device.type == "cuda" and dtype == torch.bfloat16:
        _world.mixed_precision = torch.bfloat16
        return torch.float32
    return dtype


# ---------------------------------------------------------------------------------------------
# Batches and seeds (pure)
# ---------------------------------------------------------------------------------------------


def rank_share(items: Sequence[Any], rank: int | None = None, size: int | None = None) -> list:
    """This rank's disjoint share of a step's ``items``: every ``size``-th one from ``rank``
    (the shares differ in length by at most one; together they are ``items``)."""
    rank = _world.rank if rank is None else rank
    size = _world.size if size is None else size
    return list(items[rank::size])


def even_length(n: int, size: int | None = None) -> int:
    """``n`` rounded down to a multiple of the world size: a step's examples that every rank
    can share equally (an epoch's last partial step drops fewer than ``size`` examples)."""
    size = _world.size if size is None else size
    return n - n % size


def check_divisible(n: int, what: str, size: int | None = None, unit: str = "") -> None:
    """One clear error when ``n`` (a per-step count the config sets) cannot be split evenly
    over the ranks."""
    from trainers.core.config import ConfigError

    size = _world.size if size is None else size
    if size > 1 and n % size:
        fits = [k for k in range(1, size + 1) if n % k == 0]
        raise ConfigError(
            f"{what} is {n}{unit}, which {size} processes cannot share evenly: use a multiple "
            f"of {size}, or run with a number of processes that divides it ({fits})"
        )


def rank_block(n: int, rank: int | None = None, size: int | None = None) -> list[int]:
    """This rank's contiguous block of ``range(n)`` for work split once and gathered
    (:func:`gather_blocks`): ``ceil(n / size)`` indices each, the last block padded by
    repeating its last index so that every rank runs as many forward passes."""
    rank = _world.rank if rank is None else rank
    size = _world.size if size is None else size
    per = -(-n // size)
    block = list(range(rank * per, min(n, (rank + 1) * per)))
    last = block[-1] if block else n - 1
    return block + [last] * (per - len(block))


def gather_blocks(values: Any, n: int) -> Any:
    """The first ``n`` rows of every rank's :func:`rank_block` results, in order (a tensor
    whose first dimension is the block; collective)."""
    if not _world.distributed:
        return values[:n]
    import torch

    parts = gather_objects(values.cpu())
    return torch.cat(parts)[:n]


def rank_chunk(items: Sequence[Any], rank: int | None = None, size: int | None = None) -> list:
    """This rank's contiguous ``len(items) / size`` of ``items`` (the caller has checked that
    they divide: :func:`check_divisible`): concatenated in rank order the chunks are ``items``
    in order (policy-gradient prompts: a rank's groups are whole and the global batch keeps
    one process's order)."""
    rank = _world.rank if rank is None else rank
    size = _world.size if size is None else size
    per = len(items) // size
    return list(items[rank * per : (rank + 1) * per])


def rank_span(n: int, rank: int | None = None, size: int | None = None) -> range:
    """This rank's contiguous part of ``range(n)`` when the parts need not be equal (work with
    no collective inside: generation on whole, unsharded weights): the first ``n % size`` ranks
    take one more."""
    rank = _world.rank if rank is None else rank
    size = _world.size if size is None else size
    per, extra = divmod(n, size)
    start = rank * per + min(rank, extra)
    return range(start, start + per + (rank < extra))


def rank_seed(seed: int, rank: int | None = None) -> int:
    """The sampling seed of ``rank``: ``seed + rank`` (rank 0 samples as a single process).
    Every rank first builds identical weights from the config's seed; a loop that samples its
    own share (policy-gradient rollouts, once they run under torchrun) reseeds with this."""
    return seed + (_world.rank if rank is None else rank)


def describe() -> dict[str, Any]:
    """What the summary records about the world (empty on one process)."""
    if not _world.distributed:
        return {}
    out: dict[str, Any] = {"world_size": _world.size, "backend": _world.backend}
    if _world.mixed_precision is not None:
        out["mixed_precision"] = "bf16 params, fp32 reductions"
    return out


# ---------------------------------------------------------------------------------------------
# Collectives on numbers (no-ops on one process)
# ---------------------------------------------------------------------------------------------


def _all_reduce(values: Sequence[float], op: str) -> list[float]:
    """``values`` reduced element-wise over the ranks in float64 with ``torch.distributed``'s
    ``ReduceOp.<op>`` (the values as floats on one process)."""
    if not _world.distributed:
        return [float(v) for v in values]
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    return t.cpu().tolist()


def gather_sum(values: Sequence[float]) -> list[float]:
    """Element-wise sum of ``values`` over the ranks (float64)."""
    return _all_reduce(values, "SUM")


def sum_over_ranks(value: float) -> float:
    return gather_sum([value])[0]


def gather_max(values: Sequence[float]) -> list[float]:
    """Element-wise maximum of ``values`` over the ranks (float64)."""
    return _all_reduce(values, "MAX")


def global_moments(values: torch.Tensor) -> tuple[float, float] | None:
    """(mean, population std) of ``values`` (1-D) pooled over every rank, or None when the
    pooled values are all equal (or there are none); collective. Two passes in float64 (the
    sum, then the squared deviations from the pooled mean), as exact as one process's."""
    x = values.detach().double().flatten().cpu()
    n, total = gather_sum([x.numel(), float(x.sum())])
    hi, neg_lo = gather_max(
        [float(x.max()), float(-x.min())] if x.numel() else [-float("inf"), -float("inf")]
    )
    mean = total / n if n else 0.0
    squares = gather_sum([float(((x - mean) ** 2).sum())])[0]
    if n == 0 or hi == -neg_lo:
        return None
    return mean, (squares / n) ** 0.5


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (a stop request, a DAPO refill)."""
    return sum_over_ranks(1.0 if flag else 0.0) > 0


def gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (small Python objects: metric dicts)."""
    if not _world.distributed:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * _world.size
    dist.all_gather_object(out, obj)
    return out


def merge_weighted(
    parts: list[tuple[dict[str, float], dict[str, float]]],
) -> tuple[dict[str, float], dict[str, float]]:
    """Sum (sums, weights) pairs of several ranks key by key (pure)."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for s, w in parts:
        for k, v in s.items():
            sums[k] = sums.get(k, 0.0) + v
        for k, v in w.items():
            weights[k] = weights.get(k, 0.0) + v
    return sums, weights


def global_weighted(
    sums: dict[str, float], weights: dict[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """The step's (sums, weights) over every rank: each metric weighted by the examples or
    tokens it was measured on, whichever ranks saw them."""
    if not _world.distributed:
        return sums, weights
    return merge_weighted(gather_objects((sums, weights)))


def barrier() -> None:
    if _world.distributed:
        import torch.distributed as dist

        dist.barrier()


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not _world.distributed:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _collective_device() -> Any:
    import torch

    if _world.backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# FSDP2
# ---------------------------------------------------------------------------------------------


def decoder_layers(module: Any) -> list[Any]:
    """The decoder's layer modules (the first ``ModuleList`` named ``layers`` or ``h``)."""
    import torch

    for name, child in module.named_modules():
        if name.rsplit(".", 1)[-1] in ("layers", "h") and isinstance(child, torch.nn.ModuleList):
            return list(child)
    return []


def _decoder_of(module: Any) -> Any:
    for candidate in (module, getattr(module, "backbone", None), getattr(module, "body", None)):
        if candidate is not None and hasattr(candidate, "get_decoder"):
            return candidate.get_decoder()
        if candidate is not None and hasattr(candidate, "layers"):
            return candidate
    return None


def outer_modules(module: Any, layers: list[Any]) -> list[Any]:
    """The modules that hold every parameter outside the decoder layers, and that the loops
    call: the decoder body (embeddings, final norm), the LM head, any reward/value head."""
    decoder = _decoder_of(module)
    inside = {id(p) for layer in layers for p in layer.parameters()}
    group: list[Any] = []
    if decoder is not None:
        group.append(decoder)
        inside |= {id(p) for p in decoder.parameters()}
    heads = []
    for owner in (module, getattr(module, "backbone", None)):
        if owner is not None and hasattr(owner, "get_output_embeddings"):
            head = owner.get_output_embeddings()
            if head is not None and head not in heads:
                heads.append(head)
    for head in heads:
        group.append(head)
        inside |= {id(p) for p in head.parameters()}
    for sub in module.modules():
        own = [p for p in sub.parameters(recurse=False) if id(p) not in inside]
        if own:
            group.append(sub)
            inside |= {id(p) for p in own}
    return group


def shard_model(module: Any) -> Any:
    """Shard ``module`` over the ranks with FSDP2 (module doc); no-op on one process. Call it
    after loading and before building the optimizer. Returns ``module``."""
    if not _world.distributed:
        return module
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (
        MixedPrecisionPolicy(param_dtype=_world.mixed_precision, reduce_dtype=_fp32())
        if _world.mixed_precision is not None
        else MixedPrecisionPolicy()
    )
    layers = decoder_layers(module)
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(outer_modules(module, layers), mp_policy=policy, reshard_after_forward=False)
    fully_shard(module, mp_policy=policy)  # the root (it holds no parameter of its own)
    # The loops call the decoder and the LM head directly (they never build whole-vocabulary
    # logits), so the root's forward may never run: settle the root now, not at its forward.
    module._get_fsdp_state()._lazy_init()
    for unit in fsdp_units(module):
        unit.set_gradient_divide_factor(1.0)  # shares of the global mean are summed (doc)
        unit.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return module


def _fp32() -> Any:
    import torch

    return torch.float32


def fsdp_units(module: Any) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(module: Any) -> Iterator[None]:
    """Every sharded parameter of ``module`` gathered for the duration (generation: then each
    rank decodes on its own, as many tokens as it needs, with no collective per token)."""
    units = fsdp_units(module) if _world.distributed else []
    if not units:
        yield
        return
    layer_ids = {id(layer) for layer in decoder_layers(module)}
    with _gathering_clock():
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
    try:
        yield
    finally:
        with _gathering_clock():
            for unit in units:  # back as shard_model left them: layers reshard after forward
                unit.reshard()
                unit.set_reshard_after_forward(id(unit) in layer_ids, recurse=False)


_GATHER_S = [0.0]  # seconds this process spent gathering and releasing weights in gathered()


def gather_seconds() -> float:
    """Seconds this process has spent so far gathering whole weights (and releasing them) in
    :func:`gathered`: 0 in one process (trainers.core.flops.StageClock's ``weight_gather``)."""
    return _GATHER_S[0]


@contextlib.contextmanager
def _gathering_clock() -> Iterator[None]:
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    started = time.perf_counter()
    yield
    if cuda:  # the all-gathers run on their own streams: wait for them
        torch.cuda.synchronize()
    _GATHER_S[0] += time.perf_counter() - started


def full_state_dict(module: Any) -> dict[str, Any] | None:
    """The whole model's state dict on rank 0 (CPU tensors), None on the others; collective."""
    if not _world.distributed:
        return module.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(
        module, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    for name in tied_names(module):  # an ordinary folder stores a tied weight once
        sd.pop(name, None)
    return sd if _world.is_main else None


def tied_names(module: Any) -> list[str]:
    """Names of parameters that are another parameter (a tied LM head), after the first."""
    seen: set[int] = set()
    tied = []
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.append(name)
        seen.add(id(p))
    return tied


def local_value(tensor: Any) -> Any:
    """A plain tensor from a DTensor result (a global gradient norm), else ``tensor``."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


# ---------------------------------------------------------------------------------------------
# Output: every rank's lines reach train.log, prefixed
# ---------------------------------------------------------------------------------------------


class RankPrefixed(io.TextIOBase):
    """A text stream that starts every line with ``[rank r] ``."""

    def __init__(self, stream: Any, rank: int) -> None:
        self.stream, self.prefix, self.at_line_start = stream, f"[rank {rank}] ", True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self.at_line_start:
                out.append(self.prefix)
            out.append(piece)
            self.at_line_start = piece.endswith("\n")
        self.stream.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return False


def prefix_output(rank: int) -> None:
    """Prefix this process's stdout and stderr lines with its rank (once)."""
    if not isinstance(sys.stdout, RankPrefixed):
        sys.stdout = RankPrefixed(sys.stdout, rank)
        sys.stderr = RankPrefixed(sys.stderr, rank)
