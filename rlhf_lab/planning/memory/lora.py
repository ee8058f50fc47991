"""The memory of a model trained with LoRA adapters (``model.lora.enabled``), torch-free.

What changes against full fine-tuning (``trainers/core/lora.py`` is what the trainers do):

* the base weights are frozen: ``P·b``, no gradients, no optimizer state;
* the adapters, rank ``r`` on each target linear layer of shape (in, out), hold
  ``r·(in + out)`` parameters each; peft keeps them in fp32 (it up-casts adapters of a bf16 or
  fp16 model), so they cost ``4 B`` weights + ``4 B`` gradients + ``8 B`` AdamW moments each;
* activations are those of full fine-tuning (backward still runs through every layer to reach
  the adapters below) plus, per target layer and token, the adapter's input after dropout
  (``in`` values and a 1-byte mask, when dropout > 0), its rank-``r`` intermediate and its
  branch output (``out`` values, see :func:`adapter_activation_bytes`);
* no reference copy: the reference is the base with the adapters off (unless
  ``model.ref_name`` names another model).

Target shapes come from the architecture (:func:`target_shapes`); a name the table does not
know is counted as a hidden × hidden projection, and ``all-linear`` as every attention and MLP
projection.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhf_lab.planning.memory.architecture import ModelArch
from rlhf_lab.planning.memory.blocks import (
    GIB,
    EstimateBuilder,
    Precision,
    TrainingShape,
    activations_gb,
    logits_gb,
)
from rlhf_lab.planning.trainer_config import TrainerConfig

ADAPTER_BYTES = 4  # peft keeps adapter weights in fp32
# trainers.core.lora.DEFAULT_TARGETS, for the architectures the estimate knows
_LLAMA_STYLE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_GPT2 = ("c_attn", "c_proj", "c_fc")


@dataclass(frozen=True)
class LoraPlan:
    """The LoRA settings of a config."""

    rank: int
    dropout: float
    targets: tuple[str, ...] | None  # None: the architecture's default; ("all-linear",)


def lora_plan(config: TrainerConfig) -> LoraPlan | None:
    """The config's LoRA settings, or None for full fine-tuning."""
    if not config.get("model.lora.enabled", False):
        return None
    targets = config.get("model.lora.target_modules")
    if isinstance(targets, str):
        targets = [targets]
    return LoraPlan(
        rank=int(config.get("model.lora.rank", 16) or 16),
        dropout=float(config.get("model.lora.dropout", 0.05) or 0.0),
        targets=tuple(targets) if targets else None,
    )


def target_shapes(arch: ModelArch, targets: tuple[str, ...] | None) -> list[tuple[int, int]]:
    """(in, out) of every adapted linear layer of one block."""
    h, i = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    mlp_in = {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    if not arch.mlp_gated:  # GPT-2 style two-layer MLP
        mlp_in = {"up_proj": (h, i), "down_proj": (i, h)}
    shapes = {
        "q_proj": [(h, q)],
        "k_proj": [(h, kv)],
        "v_proj": [(h, kv)],
        "o_proj": [(q, h)],
        **{k: [v] for k, v in mlp_in.items()},
        "qkv_proj": [(h, q + 2 * kv)],
        "gate_up_proj": [(h, 2 * i)],
        "c_attn": [(h, 3 * h)],
        "c_proj": [(h, h), (i, h)],  # GPT-2: attention output and MLP output share the name
        "c_fc": [(h, i)],
    }
    every = [s for k in ("q_proj", "k_proj", "v_proj", "o_proj", *mlp_in) for s in shapes[k]]
    if targets is None:
        targets = (
            _GPT2 if arch.model_type == "gpt2" else tuple(n for n in _LLAMA_STYLE if n in shapes)
        )
    if "all-linear" in targets:
        return every
    return [s for name in targets for s in shapes.get(name, [(h, h)])]


def adapter_params(arch: ModelArch, plan: LoraPlan) -> int:
    """Parameters of all adapters: ``r·(in + out)`` per adapted layer, every block."""
    per_block = sum(plan.rank * (a + b) for a, b in target_shapes(arch, plan.targets))
    return arch.num_layers * per_block


def adapter_activation_bytes(arch: ModelArch, plan: LoraPlan, b: int) -> int:
    """Bytes one block's adapters add per token: the dropped-out input of each adapted layer
    (with its mask) when dropout > 0 and each rank-``r`` intermediate, saved for backward; and
    the adapter branch's output beside the base layer's (``out`` values per adapted layer),
    which the allocator keeps through the forward (measured on ``small``: the forward's peak
    exceeds the saved tensors by about that much, with or without dropout)."""
    shapes = target_shapes(arch, plan.targets)
    dropped = sum(a for a, _ in shapes) * (b + 1) if plan.dropout > 0 else 0
    branch = sum(out for _, out in shapes) * b
    return dropped + branch + len(shapes) * plan.rank * b


def add_lora_trained(
    bld: EstimateBuilder,
    label: str,
    params: int,
    arch: ModelArch | None,
    plan: LoraPlan,
    shape: TrainingShape,
    precision: Precision,
) -> int:
    """A model trained through LoRA adapters: frozen base weights, the adapters' fp32 weights,
    gradients and AdamW moments, and one micro-batch's activations (the base's plus the
    adapters'; adapter gradients are small, so ``shape.accumulating`` changes nothing).
    Returns the adapters' parameter count (1% of ``params`` when the architecture is unknown,
    with a note)."""
    b, ckpt, eager = precision.b, precision.ckpt, precision.eager
    rows, seq, logit_positions = shape.rows, shape.seq, shape.logit_positions
    resident = shape.resident
    if arch is not None:
        adapters = adapter_params(arch, plan)
        how = f"rank {plan.rank} on {len(target_shapes(arch, plan.targets))} layers per block"
    else:
        adapters = max(1, params // 100)
        how = "architecture unknown: counted as 1% of the parameters"
        bld.notes.append(f"{label} LoRA adapters: {how}")
    bld.add(f"{label} base weights (frozen)", params * b / GIB, resident, f"{params:,} × {b} B")
    a = ADAPTER_BYTES
    bld.add(f"{label} LoRA adapters", adapters * a / GIB, resident, f"{adapters:,} × {a} B; {how}")
    bld.add(f"{label} LoRA gradients", adapters * a / GIB, ["train"], f"{adapters:,} × {a} B")
    bld.add(
        f"{label} LoRA optimizer (AdamW)",
        adapters * 2 * a / GIB,
        resident,
        f"{adapters:,} × 2 fp32 moments",
    )
    if arch is None:
        return adapters
    gb, how = activations_gb(arch, b, rows, seq, ckpt, eager)
    extra = adapter_activation_bytes(arch, plan, b)
    if ckpt:  # the one recomputed block (counted twice, as for the base)
        extra_gb = rows * seq * 2 * extra / GIB
        extra_how = "adapter inputs of the recomputed block"
    else:
        extra_gb = rows * seq * arch.num_layers * extra / GIB
        extra_how = f"{rows}×{seq} tokens × {arch.num_layers} blocks × {extra} B"
    bld.add(f"{label} activations", gb, ["train"], how)
    bld.add(f"{label} adapter activations", extra_gb, ["train"], extra_how)
    if logit_positions > 0:
        lg, how = logits_gb(arch, b, logit_positions, grad=True)
        bld.add(f"{label} logits (chunked log-probs)", lg, ["train"], how)
    return adapters


def reference_is_base(config: TrainerConfig, model_name: str | None) -> bool:
    """Whether the reference is the adapted model's base with the adapters off (no copy)."""
    ref = config.get("model.ref_name")
    return lora_plan(config) is not None and ref in (None, model_name)


__all__ = [
    "ADAPTER_BYTES",
    "LoraPlan",
    "add_lora_trained",
    "adapter_activation_bytes",
    "adapter_params",
    "lora_plan",
    "reference_is_base",
    "target_shapes",
]
