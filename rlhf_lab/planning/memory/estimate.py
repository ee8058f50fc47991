"""``estimate_memory``: the peak memory of one run, per component, in GiB.

It resolves what every family needs (the model's size and architecture, the device, the dtype
width, checkpointing and attention switches), lets the family's estimator from
:data:`~rlhf_lab.planning.memory.families.FAMILY_ESTIMATORS` add its components, then adds the runtime
(the CUDA context on a GPU; Python + torch + transformers on the CPU) and 10% allocator slack
on top of the largest phase. The total is that largest phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from rlhf_lab.errors import InvalidArgument, NextStep
from rlhf_lab.planning.memory import blocks
from rlhf_lab.planning.memory.architecture import (
    ModelArch,
    ParamCount,
    count_parameters,
    dtype_bytes,
    model_facts,
    offline_model_steps,
)
from rlhf_lab.planning.memory.blocks import EstimateBuilder, MemoryComponent
from rlhf_lab.planning.memory.families import FAMILY_ESTIMATORS, HOOK_ESTIMATORS, EstimateInputs
from rlhf_lab.planning.memory.sharding import shard_components
from rlhf_lab.planning.trainer_config import TrainerConfig

ModelArg = int | ParamCount | ModelArch | str | None


@dataclass(frozen=True)
class Assumptions:
    """What the config does not say and an estimate assumes: a warm reference log-prob cache
    (``reference_cached``: direct alignment loads no reference model), mixed precision with
    fp32 master weights, gradients and moments (``master_weights``), and the prompt length of
    generated sequences (``prompt_tokens``: policy gradients, rejection sampling)."""

    reference_cached: bool = False
    master_weights: bool = False
    prompt_tokens: int = blocks.DEFAULT_PROMPT_TOKENS


class MemoryEstimate(BaseModel):
    """The estimate of one run: its components, the GiB held in each phase and the peak."""

    family: str
    algorithm: str | None
    model: str | None
    device: Literal["cuda", "cpu"]
    dtype: str
    param_count: int
    trainable_params: int
    gradient_checkpointing: bool
    components: list[MemoryComponent]
    phases: dict[str, float] = Field(description="GiB held in each phase")
    peak_phase: str
    total_gb: float
    world_size: int = Field(default=1, description="ranks; >1: the estimate is one rank's")
    notes: list[str] = Field(default_factory=list)


def _resolve_model_arg(
    model: ModelArg, config: TrainerConfig
) -> tuple[ParamCount | None, int, str | None, list[str]]:
    """(param count with arch if known, total params, model name, notes)."""
    notes: list[str] = []
    name = config.get("model.name")
    if isinstance(model, bool):
        raise InvalidArgument(
            "model must be a parameter count, a ParamCount, a ModelArch or a name",
            next=NextStep("estimate_memory", {"model": "tiny"}),
        )
    if isinstance(model, int):
        notes.append(
            "only a parameter count was given: activations, logits and KV cache are not estimated"
        )
        return None, model, name, notes
    if isinstance(model, ModelArch):
        pc = count_parameters(model)
        return pc, pc.total, name, notes
    if isinstance(model, ParamCount):
        return model, model.total, name, notes
    if isinstance(model, str):
        name = model
    if not isinstance(name, str):
        raise InvalidArgument(
            "the config has no model.name and no model was given (a name or a parameter count)",
            next=offline_model_steps(),
        )
    facts = model_facts(name)
    notes.extend(facts.warnings)
    return facts.params, facts.params.total, name, notes


def _pick_device(device: str | None, config: TrainerConfig) -> Literal["cuda", "cpu"]:
    """The device to estimate for: ``device``, else the config's ``model.device``; ``auto``
    counts as a GPU (the accelerator a real run would use)."""
    choice = (device or config.get("model.device") or "auto").lower()
    if choice.startswith("cuda"):
        return "cuda"
    if choice == "cpu":
        return "cpu"
    return "cuda"


def _training_dtype(config: TrainerConfig, dev: Literal["cuda", "cpu"]) -> str:
    """The config's ``model.dtype``; ``auto`` is bf16 on a GPU and fp32 on the CPU, as the
    trainers pick it."""
    preference = str(config.get("model.dtype") or "auto")
    if preference == "auto":
        return "bf16" if dev == "cuda" else "fp32"
    return preference


def _add_runtime(bld: EstimateBuilder, dev: Literal["cuda", "cpu"]) -> None:
    """What every process holds before it loads a model, in every phase."""
    if dev == "cuda":
        bld.add("CUDA context", blocks.CUDA_CONTEXT_GB, ["*"], "0.5-1 GiB per process in practice")
    else:
        bld.add(
            "process baseline",
            blocks.CPU_BASELINE_GB,
            ["*"],
            "Python + torch + transformers + datasets",
        )


def _unknown_family(family: str) -> InvalidArgument:
    from rlhf_lab.planning.catalog import FAMILIES

    return InvalidArgument(
        f"unknown family {family!r}; families: {', '.join(FAMILIES)}",
        next=NextStep("list_recipes"),
    )


def _estimator(family: str, algorithm: str | None):
    """The estimator the algorithm's spec names (its memory hook), else the family's."""
    from trainers.core.spec import spec_for

    table = {**FAMILY_ESTIMATORS, **HOOK_ESTIMATORS}
    if algorithm:
        try:
            spec = spec_for(algorithm)
        except KeyError:
            spec = None
        if spec is not None and spec.family == family and spec.memory_key in table:
            return table[spec.memory_key]
    return table.get(family)


def estimate_memory(
    family: str,
    algorithm: str | None,
    config: TrainerConfig,
    model: ModelArg = None,
    *,
    device: Literal["cuda", "cpu"] | None = None,
    world_size: int = 1,
    assume: Assumptions = Assumptions(),
) -> MemoryEstimate:
    """Peak memory of one run of ``family``/``algorithm`` with ``config`` (the resolved config's
    view, e.g. ``ShrinkResult.trainer_config``), per component, in GiB.

    ``model``: a parameter count, :class:`ParamCount`, :class:`ModelArch` or model name; None
    reads ``model.name`` from the config. ``device``: what to estimate for (None: the config's
    ``model.device``; ``auto`` counts as a GPU). ``world_size``: ranks under torchrun with
    FSDP2; the estimate is then that of ONE rank (:mod:`rlhf_lab.planning.memory.sharding`).
    ``assume``: what the config does not say (:class:`Assumptions`: a cached reference, fp32
    master weights, the prompt length of generated sequences).
    """
    from rlhf_lab.planning.catalog import FAMILIES

    if family not in FAMILIES or _estimator(family, None) is None:
        raise _unknown_family(family)
    pc, params, model_name, notes = _resolve_model_arg(model, config)
    dev = _pick_device(device, config)
    dtype = _training_dtype(config, dev)
    ckpt = bool(config.get("model.gradient_checkpointing", False))
    eager = config.get("model.attn_implementation") == "eager"
    b = dtype_bytes(dtype)
    # EstimateInputs' fields in order: what is estimated, then the precision and switches
    subject = (config, algorithm, model_name, pc, params)
    inputs = EstimateInputs(
        *subject,
        b,
        ckpt,
        eager,
        assume.master_weights,
        assume.reference_cached,
        assume.prompt_tokens,
    )
    bld = EstimateBuilder()
    bld.notes.extend(notes)
    trainable = _estimator(family, algorithm)(inputs, bld)
    if world_size > 1:
        layers = inputs.arch.num_layers if inputs.arch is not None else None
        bld.components = shard_components(bld.components, world_size, layers)
        bld.notes.append(f"per rank of {world_size} (FSDP2: model states / {world_size})")
    _add_runtime(bld, dev)

    phases = blocks.phase_totals(bld.components)
    peak_phase = max(phases, key=lambda k: phases[k])
    slack = blocks.ALLOCATOR_SLACK * phases[peak_phase]
    bld.add("allocator slack (10%)", slack, ["*"], "fragmentation and temporary buffers")
    phases = {k: round(v + slack, 3) for k, v in phases.items()}
    if inputs.arch is not None and inputs.arch.notes:
        bld.notes.extend(inputs.arch.notes)
    return MemoryEstimate(
        family=family,
        algorithm=algorithm,
        model=model_name,
        device=dev,
        dtype=dtype,
        param_count=params,
        trainable_params=trainable,
        gradient_checkpointing=inputs.ckpt,
        components=bld.components,
        phases=phases,
        peak_phase=peak_phase,
        total_gb=round(max(phases.values()), 3),
        world_size=world_size,
        notes=bld.notes,
    )


def fits(estimate_gb: float, free_gb: float, margin: float = 0.1) -> bool:
    """Whether an estimate fits in ``free_gb`` with a relative safety margin."""
    return estimate_gb * (1 + margin) <= free_gb
