"""The building blocks of a memory estimate: small pure functions that size one kind of memory
(weights, gradients, optimizer states, activations, logits, KV cache) in GiB, and the builder
that records them as named components held in named phases.

Sizes are in GiB (2**30 bytes, as nvidia-smi shows them); ``b`` is the byte width of the
training dtype. The rules, in short:

* a trained model holds weights ``P·b``, gradients ``P·b`` and AdamW's two moments ``2·P·b``
  (the trainers keep AdamW's state in the parameter dtype, no fp32 master copy); with
  ``master_weights`` it is mixed precision instead: ``P·(b + 4)`` weights, fp32 gradients and
  fp32 moments. Without gradient accumulation the gradients are written while backward frees
  the activations, so only what they add beyond activations + logits counts
  (:func:`gradients_beyond_activations`);
* a frozen model holds its weights; its no-grad forward about one layer's activations;
* saved activations per layer and token come from
  :func:`~rlhf_lab.planning.memory.architecture.layer_activation_bytes`; all ``L`` layers plus one layer
  of backward buffers without checkpointing, each layer's input plus two layers with it;
* the LM head runs on chunks of at most :data:`LOGP_CHUNK` positions, ``V·(2b + 12)`` bytes a
  position with grad (chunk, fp32 copy, exp buffer, their gradients), ``V·(b + 8)`` without;
* a generation KV cache is ``2·L·kv_heads·head_dim·b`` per token of every sequence, plus the
  fp32 last-position logits and probabilities of each sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from rlhf_lab.planning.memory.architecture import (
    ModelArch,
    kv_cache_bytes_per_token,
    layer_activation_bytes,
)

GIB = 2**30
LOGP_CHUNK = 256  # trainers.core.logprobs.DEFAULT_CHUNK
CUDA_CONTEXT_GB = 0.75  # 0.5-1 GiB per process in practice
CPU_BASELINE_GB = 0.8  # Python + torch + transformers + reasoning-gym, measured RSS
ALLOCATOR_SLACK = 0.10  # on top of the peak phase
DEFAULT_PROMPT_TOKENS = 128  # a reasoning-gym prompt with the system prompt, chat-formatted
MASTER_BYTES = 4  # fp32 master weights, gradients and moments under mixed precision


class MemoryComponent(BaseModel):
    """One named piece of memory, its size and the phases in which it is held."""

    name: str
    gb: float
    phases: list[str] = Field(description="phases in which this memory is held")
    detail: str = ""


# ---------------------------------------------------------------------------------------------
# Model states
# ---------------------------------------------------------------------------------------------


def weights_gb(params: int, b: int) -> float:
    """Weights of ``params`` parameters at ``b`` bytes each."""
    return params * b / GIB


def master_weights_gb(params: int, b: int) -> float:
    """Mixed-precision weights: the ``b``-byte copy plus an fp32 master copy."""
    return params * (b + MASTER_BYTES) / GIB


def gradients_gb(params: int, grad_bytes: int) -> float:
    """One gradient per parameter at ``grad_bytes`` bytes."""
    return params * grad_bytes / GIB


def optimizer_gb(params: int, b: int, master_weights: bool) -> float:
    """AdamW's two moment buffers: fp32 under mixed precision, else in the parameter dtype."""
    if master_weights:
        return params * 2 * MASTER_BYTES / GIB
    return params * 2 * b / GIB


# ---------------------------------------------------------------------------------------------
# Activations, logits, KV cache
# ---------------------------------------------------------------------------------------------


def activations_gb(
    arch: ModelArch, b: int, rows: int, seq: int, ckpt: bool, eager: bool
) -> tuple[float, str]:
    """Activations one micro-batch of ``rows × seq`` tokens saves for backward, and how.

    Without checkpointing every layer's plus one layer of gradient buffers; with it each
    layer's input (``b·h``) plus the one layer recomputed at a time (counted twice)."""
    tokens = rows * seq
    layer = layer_activation_bytes(arch, b, seq, eager)
    if ckpt:
        per_token = arch.num_layers * arch.hidden_size * b + 2 * layer
        how = f"checkpointed: {rows}×{seq} tokens × (L·h + 2 layers) × {b} B"
    else:
        per_token = (arch.num_layers + 1) * layer
        layers = arch.num_layers + 1
        how = f"{rows}×{seq} tokens × {layers} layers × {layer / b:.0f} values × {b} B"
    return tokens * per_token / GIB, how


def forward_gb(arch: ModelArch, b: int, rows: int, seq: int, eager: bool) -> float:
    """A no-grad forward: about one layer's worth of activations alive at a time."""
    return rows * seq * layer_activation_bytes(arch, b, seq, eager) / GIB


def packed_positions(rows: int, seq: int) -> int:
    """Logit positions alive at once when the completion tokens of a micro-batch are packed
    into one row before the LM head (direct alignment, SFT): one chunk, at most ``rows · seq``
    positions."""
    return min(LOGP_CHUNK, rows * seq)


def per_row_positions(rows: int, completion: int) -> int:
    """Logit positions alive at once when the LM head runs on (rows, completion) chunked along
    the sequence (the policy-gradient trainer): every row's chunk."""
    return rows * min(LOGP_CHUNK, completion)


def logits_gb(arch: ModelArch, b: int, positions: int, grad: bool) -> tuple[float, str]:
    """One LM-head chunk of ``positions`` positions over the vocabulary, and how."""
    per = (2 * b + 12) if grad else (b + 8)
    gb = positions * arch.vocab_size * per / GIB
    return gb, f"{positions} positions (one chunk) × vocab {arch.vocab_size} × {per} B"


def lm_head_grad_gb(arch: ModelArch, grad_bytes: int) -> float:
    """The output projection's gradient (vocab × hidden), the first one backward writes."""
    return arch.vocab_size * arch.hidden_size * grad_bytes / GIB


def kv_cache_gb(arch: ModelArch, b: int, sequences: int, length: int) -> tuple[float, str]:
    """KV cache of ``sequences`` sequences of ``length`` tokens, plus each sequence's fp32
    last-position logits and probabilities; and how."""
    cache = kv_cache_bytes_per_token(arch, b) * sequences * length
    sampling = sequences * arch.vocab_size * 4 * 2
    detail = (
        f"2 × {arch.num_layers} layers × {arch.num_kv_heads} kv heads × {arch.head_dim} × "
        f"{sequences} seqs × {length} tokens × {b} B"
    )
    return (cache + sampling) / GIB, detail


def gradients_beyond_activations(
    grads_gb: float, transient_gb: float, head_gb: float, how: str
) -> tuple[float, str]:
    """With one micro-batch per optimizer step the gradients (set to None after every step) are
    written while backward frees that micro-batch's activations and logits, so the train peak is
    ``weights + optimizer + max(activations + logits + LM-head gradient, all gradients)``. This
    returns the part of the gradients that adds to activations + logits: the LM head's gradient
    (written first) or whatever the full gradients exceed them by, whichever is larger."""
    extra = max(head_gb, grads_gb - transient_gb)
    return extra, (
        f"{how} = {grads_gb:.3f} GiB, written while backward frees {transient_gb:.3f} GiB of "
        f"activations and logits (one micro-batch per step): adds {extra:.3f} GiB"
    )


# ---------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------


def phase_totals(components: list[MemoryComponent]) -> dict[str, float]:
    """GiB held in each named phase; a component in phase ``*`` counts in every phase. With no
    named phase at all, one ``train`` phase."""
    names = sorted({p for c in components for p in c.phases if p != "*"}) or ["train"]
    return {
        name: sum(c.gb for c in components if name in c.phases or "*" in c.phases) for name in names
    }


# ---------------------------------------------------------------------------------------------
# The builder
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    """How a trained model's values are held: ``b`` bytes per value of the training dtype,
    gradient checkpointing (``ckpt``), eager attention (the seq × seq scores kept) and fp32
    master weights, gradients and moments (``master_weights``)."""

    b: int
    ckpt: bool
    eager: bool
    master_weights: bool = False


@dataclass(frozen=True)
class TrainingShape:
    """One micro-batch of a trained model: ``rows × seq`` tokens, ``logit_positions`` positions
    through the LM head (0: none counted here), whether several micro-batches make an optimizer
    step (``accumulating``) and the phases its weights stay resident in."""

    rows: int
    seq: int
    logit_positions: int
    accumulating: bool
    resident: list[str]


class EstimateBuilder:
    """Collects the components and notes of one estimate, in the order they are added."""

    def __init__(self) -> None:
        self.components: list[MemoryComponent] = []
        self.notes: list[str] = []

    def add(self, name: str, gb: float, phases: list[str], detail: str = "") -> None:
        """One component, rounded to 0.1 MiB."""
        self.components.append(
            MemoryComponent(name=name, gb=round(gb, 4), phases=phases, detail=detail)
        )

    def trained(
        self,
        label: str,
        params: int,
        arch: ModelArch | None,
        shape: TrainingShape,
        precision: Precision,
    ) -> None:
        """A trained model: weights, gradients and AdamW state, plus (with ``arch``) the
        activations of one micro-batch and, when ``shape.logit_positions`` > 0, its LM-head
        chunk. ``shape.accumulating``: several micro-batches per optimizer step, so the gradients
        of the first stay alive through the next forward; otherwise they only fill in as
        backward frees the activations (see :func:`gradients_beyond_activations`)."""
        b, ckpt, eager, master_weights = (
            precision.b,
            precision.ckpt,
            precision.eager,
            precision.master_weights,
        )
        rows, seq, logit_positions = shape.rows, shape.seq, shape.logit_positions
        accumulating, resident = shape.accumulating, shape.resident
        grad_bytes = MASTER_BYTES if master_weights else b
        grads_gb = gradients_gb(params, grad_bytes)
        grads_how = f"{params:,} × {grad_bytes} B" + (" (fp32)" if master_weights else "")
        transient: list[tuple[str, float, str]] = []
        if arch is not None:
            gb, how = activations_gb(arch, b, rows, seq, ckpt, eager)
            transient.append((f"{label} activations", gb, how))
            if logit_positions > 0:
                gb, how = logits_gb(arch, b, logit_positions, grad=True)
                transient.append((f"{label} logits (chunked log-probs)", gb, how))
            if not accumulating:
                head = lm_head_grad_gb(arch, grad_bytes) if logit_positions > 0 else 0.0
                grads_gb, grads_how = gradients_beyond_activations(
                    grads_gb, sum(t[1] for t in transient), head, grads_how
                )
        if master_weights:
            weights_how = f"{params:,} params × ({b} B + 4 B fp32 master copy)"
            self.add(f"{label} weights", master_weights_gb(params, b), resident, weights_how)
            optimizer_how = f"{params:,} × 2 fp32 moments × 4 B"
        else:
            self.add(
                f"{label} weights", weights_gb(params, b), resident, f"{params:,} params × {b} B"
            )
            optimizer_how = f"{params:,} × 2 moments × {b} B (kept in the parameter dtype)"
        self.add(f"{label} gradients", grads_gb, ["train"], grads_how)
        self.add(
            f"{label} optimizer (AdamW)",
            optimizer_gb(params, b, master_weights),
            resident,
            optimizer_how,
        )
        for name, gb, how in transient:
            self.add(name, gb, ["train"], how)

    def frozen(self, label: str, params: int, b: int, phases: list[str]) -> None:
        """A frozen model's weights (its forward is added separately where it is known)."""
        self.add(
            f"{label} weights (frozen)", weights_gb(params, b), phases, f"{params:,} params × {b} B"
        )
