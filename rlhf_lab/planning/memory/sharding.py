"""Per-rank memory of a run sharded with FSDP2 over ``world_size`` ranks (torchrun).

FSDP2 (``fully_shard`` per decoder layer) keeps 1/world of every model's weights, gradients and
AdamW moments on each rank; during a layer's forward and backward the layer is gathered whole,
and the next one is prefetched, so about two decoder layers of each sharded model are unsharded
at a time. Activations, logits and KV caches stay per rank: ``train.batch_size`` is the
micro-batch of one rank (the global batch is micro-batch × accumulation × world size), and the
generation batch of a rollout step is split across the ranks.
"""

from __future__ import annotations

from rlhf_lab.planning.memory.blocks import MemoryComponent

__all__ = ["SHARDED_SUFFIXES", "shard_components"]

# Components FSDP2 splits across the ranks (the builder's names end so).
SHARDED_SUFFIXES = (" weights", " weights (frozen)", " gradients", " optimizer (AdamW)")
SPLIT_MARKERS = ("KV cache",)  # a generation batch divided across the ranks
GATHERED_LAYERS = 2  # the layer being computed plus the prefetched next one


def shard_components(
    components: list[MemoryComponent], world_size: int, num_layers: int | None
) -> list[MemoryComponent]:
    """The components of one rank: sharded states divided by ``world_size``, the generation
    KV caches divided too, plus the gathered layers of each sharded model (when the layer
    count is known). ``world_size`` 1 returns the components unchanged."""
    if world_size <= 1:
        return list(components)
    out: list[MemoryComponent] = []
    gathered = 0.0
    gathered_phases: set[str] = set()
    for comp in components:
        if comp.name.endswith(SHARDED_SUFFIXES):
            out.append(_divided(comp, world_size, "sharded by FSDP2"))
            if comp.name.endswith(("weights", "weights (frozen)")) and num_layers:
                gathered += comp.gb * min(GATHERED_LAYERS, num_layers) / num_layers
                gathered_phases.update(comp.phases)
        elif any(marker in comp.name for marker in SPLIT_MARKERS):
            out.append(_divided(comp, world_size, "generation batch split across ranks"))
        else:
            out.append(comp)
    if gathered > 0:
        out.append(
            MemoryComponent(
                name="FSDP2 gathered layers",
                gb=round(gathered, 4),
                phases=sorted(gathered_phases),
                detail=f"{GATHERED_LAYERS} decoder layers of each sharded model held whole",
            )
        )
    return out


def _divided(comp: MemoryComponent, world_size: int, why: str) -> MemoryComponent:
    detail = f"{comp.detail} / {world_size} ranks ({why})".strip()
    return comp.model_copy(update={"gb": round(comp.gb / world_size, 4), "detail": detail})
