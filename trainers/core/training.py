"""Training-loop building blocks shared by every family: seeding, the optimizer and its schedule,
per-step metric aggregation, gradient clipping, and checkpoints that resume exactly."""

from __future__ import annotations

import math
import os
import random
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainers.core.config import ModelSection, OptimSection

# ---------------------------------------------------------------------------------------------
# Seeding
# ---------------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) from one number."""
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The example order of one epoch: a permutation that depends only on (seed, epoch), so a
    resumed run can skip to its data position without replaying the loader."""
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    return torch.randperm(n, generator=g).tolist()


# ---------------------------------------------------------------------------------------------
# Optimizer and schedule
# ---------------------------------------------------------------------------------------------


def lr_multiplier(step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Linear warmup over ``warmup_steps`` then linear decay to 0 at ``total_steps`` (or constant).
    ``step`` counts optimizer steps already taken (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


FUSED_ADAMW_DEVICES = ("cpu", "cuda", "xpu", "mps")


def fused_kernel_exists(param: torch.Tensor) -> bool:
    """Whether torch's fused AdamW kernel takes this parameter (a real float on a device
    with the kernel)."""
    return (
        param.device.type in FUSED_ADAMW_DEVICES
        and param.is_floating_point()
        and not param.is_complex()
    )


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: OptimSection, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with a linear-warmup schedule. ``cfg.fused_adamw`` (the default) asks for torch's
    fused kernel, the same update as the per-tensor loop up to float rounding
    (bench/fused_adamw.py) at a third of its time or less; where the parameters' device or dtype
    has no fused kernel, the loop is used."""
    params = [p for p in params if p.requires_grad]
    hyper = {
        "lr": cfg.learning_rate,
        "betas": (cfg.adam_beta1, cfg.adam_beta2),
        "weight_decay": cfg.weight_decay,
    }
    fused = cfg.fused_adamw and all(fused_kernel_exists(p) for p in params)
    optimizer = torch.optim.AdamW(params, fused=True if fused else None, **hyper)
    warmup = int(total_steps * cfg.warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_multiplier(s, total_steps, warmup, cfg.schedule)
    )
    return optimizer, scheduler


def clip_and_measure(params: Iterable[torch.nn.Parameter], max_norm: float | None) -> float:
    """Clip gradients (if ``max_norm``) and return the true, pre-clip global L2 norm."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    from trainers.core.distributed import local_value

    limit = max_norm if max_norm is not None else float("inf")
    return float(local_value(torch.nn.utils.clip_grad_norm_(params, limit)))


def use_gradient_checkpointing(module: torch.nn.Module, enabled: bool) -> None:
    """Recompute activations in the backward pass instead of keeping them (less memory, about
    a third more compute), when ``enabled``; the non-reentrant variant, as every family uses."""
    if enabled:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def ready_to_train(model: torch.nn.Module, section: ModelSection) -> None:
    """Make a loaded policy ready for its updates: gradient checkpointing when the ``model``
    ``section`` asks for it, FSDP2 sharding under torchrun (nothing on one process), train mode.
    Before the optimizer is built."""
    from trainers.core.distributed import shard_model

    use_gradient_checkpointing(model, section.gradient_checkpointing)
    shard_model(model)
    model.train()


def optimizer_step(
    params: Iterable[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float | None,
) -> tuple[float, float]:
    """Clip, step, advance the schedule, clear the gradients. Returns (the pre-clip gradient
    norm, the learning rate this step used). A step whose gradient norm is not finite leaves
    the weights as they are (one NaN gradient would make every weight NaN through AdamW): the
    NaN norm is returned, so the metrics row shows the skipped step."""
    grad_norm = clip_and_measure(params, max_grad_norm)
    lr = scheduler.get_last_lr()[0]
    if math.isfinite(grad_norm):
        optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, lr


# ---------------------------------------------------------------------------------------------
# Metrics aggregated over every micro-batch of one optimizer step
# ---------------------------------------------------------------------------------------------


@dataclass
class StepMetrics:
    """Weighted means over the micro-batches of one optimizer step (weights = examples or tokens
    per micro-batch), so a step's metric never reflects only its last micro-batch."""

    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    def add(self, metrics: dict[str, Any], weight: float) -> None:
        for key, value in metrics.items():
            value = float(value.item() if hasattr(value, "item") else value)
            self.sums[key] = self.sums.get(key, 0.0) + value * weight
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def mean(self) -> dict[str, float]:
        """The weighted means over every rank's micro-batches (under torchrun a collective:
        every rank calls it at the same point; one process: its own)."""
        from trainers.core.distributed import global_weighted

        sums, weights = global_weighted(self.sums, self.weights)
        return {k: sums[k] / weights[k] for k in sums if weights.get(k, 0) > 0}


# ---------------------------------------------------------------------------------------------
# Checkpoints: model, optimizer, scheduler, RNG, data position
# ---------------------------------------------------------------------------------------------


def save_checkpoint(
    checkpoints_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    data_position: dict[str, Any],
    extra: dict[str, Any] | None = None,
    keep_last: int = 1,
) -> Path:
    """Write ``checkpoints/step-<N>`` atomically (temp folder + rename) and prune old ones.
    Under torchrun the checkpoint is sharded (:func:`save_sharded_checkpoint`)."""
    from trainers.core.distributed import world

    final = checkpoints_dir / f"step-{step:07d}"
    state = {
        "step": step,
        "scheduler": scheduler.state_dict(),
        "data_position": data_position,
        "extra": extra or {},
    }
    if world().distributed:
        save_sharded_checkpoint(final, model, optimizer, state, keep_last)
        return final
    tmp = _fresh_folder(checkpoints_dir / f".tmp-{final.name}-{os.getpid()}")
    torch.save(model.state_dict(), tmp / "model.pt")
    torch.save({**state, "optimizer": optimizer.state_dict(), "rng": rng_state()}, tmp / "state.pt")
    _publish(tmp, final, keep_last)
    return final


def _fresh_folder(tmp: Path) -> Path:
    """``tmp`` created empty (its parent too), whatever an interrupted save left there."""
    tmp.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def _publish(tmp: Path, final: Path, keep_last: int) -> None:
    """The written checkpoint ``tmp`` renamed to ``final`` (replacing one of the same step),
    then all but the ``keep_last`` newest checkpoints beside it removed."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(final.parent)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """The complete checkpoints (those with a state.pt), oldest first."""
    if not checkpoints_dir.is_dir():
        return []
    done = [p for p in checkpoints_dir.glob("step-*") if (p / "state.pt").is_file()]
    return sorted(done, key=lambda p: int(p.name.split("-")[1]))


def load_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """Restore everything saved by :func:`save_checkpoint`; returns the state dict (step,
    data_position, extra). RNG state is restored last so nothing after it consumes randomness."""
    if (path / SHARDS).is_dir():
        return load_sharded_checkpoint(path, model, optimizer, scheduler)
    model.load_state_dict(torch.load(path / "model.pt", map_location="cpu", weights_only=True))
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state


# Sharded checkpoints (torchrun): torch.distributed.checkpoint -----------------------------------

SHARDS = "shards"  # the DCP folder of model and optimizer shards inside a checkpoint


def _rng_file(rank: int) -> str:
    return f"rng-rank{rank}.pt"


def save_sharded_checkpoint(
    final: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    keep_last: int,
) -> None:
    """The checkpoint ``final`` that every rank writes together: model and optimizer shards
    with ``torch.distributed.checkpoint`` (``shards/``), each rank's random state
    (``rng-rank<r>.pt``), and from rank 0 ``state`` (step, scheduler, data position, family
    state) with the world size (``state.pt``, written last: its presence marks a complete
    checkpoint). Atomic as the single-process one: a temp folder renamed by rank 0 once every
    rank has written."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from trainers.core.distributed import barrier, world
    from trainers.core.lora import sharded_model_state

    w = world()
    tmp = final.parent / f".tmp-{final.name}"
    if w.is_main:
        _fresh_folder(tmp)
    barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_sharded_options(model))
    model_sd = sharded_model_state(model, model_sd)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp / SHARDS))
    torch.save(rng_state(), tmp / _rng_file(w.rank))
    barrier()
    if w.is_main:
        torch.save({**state, "world_size": w.size}, tmp / "state.pt")
        _publish(tmp, final, keep_last)
    barrier()


def load_sharded_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """Restore a :func:`save_sharded_checkpoint` on the same world size (each rank its shards
    and its own random state)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from trainers.core.config import ConfigError
    from trainers.core.distributed import world
    from trainers.core.lora import sharded_model_state

    w = world()
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    saved_size = state.get("world_size", 1)
    if saved_size != w.size:
        raise ConfigError(
            f"--resume: {path.name} was written by {saved_size} processes and this run has "
            f"{w.size}; resume with {saved_size} processes (sharded checkpoints resume on the "
            "same number of processes)"
        )
    options = _sharded_options(model)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    model_sd = sharded_model_state(model, model_sd)
    sd = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(sd, checkpoint_id=str(path / SHARDS))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=sd["model"],
        optim_state_dict=sd["optimizer"],
        options=options,
    )
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(torch.load(path / _rng_file(w.rank), map_location="cpu", weights_only=False))
    return state


def _sharded_options(model: torch.nn.Module) -> Any:
    """The state-dict options of a sharded checkpoint (LoRA: the adapters only)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    from trainers.core.lora import sharded_state_options

    return StateDictOptions(**sharded_state_options(model))


def peak_memory_gb(device: torch.device) -> float:
    """Peak accelerator memory (CUDA) or peak resident set size (CPU), in GB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB -> GB (Linux)
    except Exception:
        return 0.0
