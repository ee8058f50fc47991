"""Whether a config's batches can be split over ``world_size`` ranks (torchrun), checked before
anything is written. Torch-free, pure.

The convention (the trainers' under torchrun): ``train.batch_size`` is one rank's micro-batch and
the global batch of an optimizer step is micro-batch × ``train.gradient_accumulation_steps`` ×
world size; a rollout step's prompts (``rollout.prompts_per_step``; rejection sampling's
``generation.rollout_batch_size``) are global and split across the ranks by whole prompt groups,
so they must be a multiple of the world size; and the training examples must fill at least one
global batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlhf_lab.errors import InvalidArgument, NextStep

if TYPE_CHECKING:  # pragma: no cover
    from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = ["check_world_size", "global_batch"]

# (config key, what it counts) of the global batches split by whole items across the ranks
SPLIT_BATCHES: dict[str, tuple[str, str]] = {
    "policy_gradients": ("rollout.prompts_per_step", "prompts per step"),
    "rejection_sampling": ("generation.rollout_batch_size", "prompts per generation call"),
}


def global_batch(config: TrainerConfig, world_size: int) -> int:
    """Examples per optimizer step over all ranks: micro-batch × accumulation × world size."""
    micro = int(config.get("train.batch_size", 1) or 1)
    accum = int(config.get("train.gradient_accumulation_steps", 1) or 1)
    return micro * accum * world_size


def _fewer_ranks(key: str, value: int, world_size: int) -> list[NextStep]:
    return [
        NextStep("launch_run", {"nproc": max(1, min(value, world_size))}, note="fewer ranks"),
        NextStep("shrink_config", note=f"or set {key} to a multiple of {world_size}"),
    ]


def _check_rank_micro_batch(config: TrainerConfig, prompts_per_rank: int) -> None:
    """A rank's rollouts (its prompts × ``rollout.num_rollouts``) split into whole
    micro-batches of ``train.batch_size`` (the trainer refuses otherwise)."""
    groups = config.get("rollout.num_rollouts")
    micro = config.get("train.batch_size")
    if not (isinstance(groups, int) and isinstance(micro, int)) or micro < 1:
        return
    sequences = prompts_per_rank * groups
    if sequences % micro:
        raise InvalidArgument(
            f"each rank rolls out {prompts_per_rank} prompts × {groups} rollouts = {sequences} "
            f"sequences, which train.batch_size={micro} (one rank's micro-batch) does not divide",
            next=[NextStep("shrink_config", note="a train.batch_size that divides it")],
        )


def _check_runs_sharded(family: str, config: TrainerConfig, world_size: int) -> None:
    """What the trainer would refuse under torchrun (``trainers.core.spec.one_process_only``,
    the same answer its harness acts on), refused before anything is written."""
    from trainers.core.spec import family_spec, one_process_only

    field_name = family_spec(family).algorithm_field
    why = one_process_only(
        family,
        config.get(field_name) if field_name else None,
        config.get("model.lora.enabled") is True,
    )
    if why is None:
        return
    one_process = [NextStep("launch_run", {"nproc": 1}, note="one process")]
    if why.kind == "lora":
        raise InvalidArgument(
            f"LoRA runs of the {family} trainer run on one process in this version, not on "
            f"{world_size} ranks ({why.subject} shard LoRA runs)",
            next=[
                *one_process,
                NextStep("shrink_config", note="or train in full: model.lora.enabled=false"),
            ],
        )
    raise InvalidArgument(
        f"{why.subject} runs on one process in this version, not on {world_size} ranks "
        "(its sampling step is not split across ranks yet)",
        next=one_process,
    )


def check_world_size(family: str, config: TrainerConfig, world_size: int) -> None:
    """Refuse (InvalidArgument) a world size the config's batches cannot be split over: more
    ranks than a split batch has items, a split batch not divisible by the world size, or
    fewer training examples than one global batch."""
    if world_size <= 1:
        return
    _check_runs_sharded(family, config, world_size)
    split = SPLIT_BATCHES.get(family)
    if split is not None:
        key, what = split
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            if value < world_size:
                raise InvalidArgument(
                    f"{world_size} ranks are more than the global batch allows: {key}={value} "
                    f"{what}, and each rank needs at least one whole prompt group",
                    next=_fewer_ranks(key, value, world_size),
                )
            if value % world_size:
                raise InvalidArgument(
                    f"{key}={value} ({what}) is not divisible by the world size {world_size}: "
                    "the ranks split it by whole prompt groups",
                    next=_fewer_ranks(key, value, world_size),
                )
            if family == "policy_gradients":
                _check_rank_micro_batch(config, value // world_size)
        return
    samples = config.get("data.max_samples")
    if isinstance(samples, int) and not isinstance(samples, bool) and samples > 0:
        eval_size = config.get("data.eval_size", 0)
        train = samples - (eval_size if isinstance(eval_size, int) else 0)
        needed = global_batch(config, world_size)
        if train < needed:
            raise InvalidArgument(
                f"{world_size} ranks are more than the global batch allows: one optimizer step "
                f"takes {needed} examples (train.batch_size per rank × "
                f"train.gradient_accumulation_steps × {world_size} ranks) and the data has "
                f"{train} training examples",
                next=[
                    NextStep("launch_run", {"nproc": 1}, note="fewer ranks"),
                    NextStep("shrink_config", note="more data.max_samples or a smaller batch"),
                ],
            )
