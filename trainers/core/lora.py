"""LoRA adapters (the ``peft`` library) for every family, as functions the loops call.

``model.lora.enabled=true`` (:class:`trainers.core.config.LoraSection`) changes five things and
nothing else:

1. **What trains.** :func:`add_adapters` freezes the loaded model and puts rank-``r`` adapters
   on the target linear layers (ΔW = (α/r)·B·A, B starting at zero, so the adapted model starts
   equal to its base). A head the family adds on top (the reward model's score head, PPO's
   value head) sits outside the adapted model and stays trainable: peft's ``modules_to_save``
   without the copy. The optimizer, which takes the parameters that require gradients, then
   holds states for the adapters (and head) only.
2. **The reference.** The base with its adapters switched off is the reference
   (:func:`reference_view`): the DPO family's reference log-probs and the KL terms of policy
   gradients read it from the policy's own weights; no second copy is loaded (unless
   ``model.ref_name`` names another model).
3. **Checkpoints** hold the trainable tensors only (:func:`checkpoint_state`; a few MB for a 7B
   model at rank 16) with the optimizer state, so a resume is exact and cheap.
4. **The final model** is written twice (:func:`save_final`): ``final_adapter/`` (peft's adapter
   folder, plus any trained head) and ``final_model/``, the adapters merged into the base, a
   plain model folder that the next stage (``model.name``, ``reward.model``) and ``eval`` load
   like any other.
5. **Bad targets** are refused before anything is written (:func:`check_lora_targets`, from
   the harness): the message names the linear layers the model has.

Default target modules per architecture (:data:`DEFAULT_TARGETS`, which are also every linear
layer of a block there, so the lab checks names against it without torch): the attention and MLP
projections of each block (Llama / Qwen / SmolLM / Mistral / Gemma: ``q_proj k_proj v_proj
o_proj gate_proj up_proj down_proj``; GPT-2: ``c_attn c_proj c_fc``); an architecture not in the
table gets every linear layer but the LM head (peft's ``all-linear``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainers.core.config import ConfigError, LoraSection, ModelSection

if TYPE_CHECKING:
    import torch

ADAPTER_DIR = "final_adapter"
HEAD_FILE = "trained_heads.safetensors"  # trainable tensors outside the adapters (a head)

_LLAMA_STYLE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        (
            "llama",
            "qwen2",
            "qwen3",
            "mistral",
            "gemma",
            "gemma2",
            "gemma3_text",
            "olmo",
            "olmo2",
            "smollm3",
            "granite",
        ),
        _LLAMA_STYLE,
    ),
    "phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    "gpt2": ("c_attn", "c_proj", "c_fc"),
    "gpt_neox": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
    "opt": ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"),
}
# GPT-2 style models keep their projections in transformers' Conv1D, weights stored (in, out)
_FAN_IN_FAN_OUT = frozenset({"gpt2"})


# ---------------------------------------------------------------------------------------------
# Which layers
# ---------------------------------------------------------------------------------------------


def enabled(model_section: ModelSection) -> bool:
    return model_section.lora.enabled


def linear_layer_names(model: torch.nn.Module) -> list[str]:
    """The distinct short names (``q_proj``) of the model's linear layers, the LM head excluded:
    what ``model.lora.target_modules`` may name."""
    import torch
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear | Conv1D) and module is not head
    }
    return sorted(names)


def resolve_targets(lora: LoraSection, model_type: str | None) -> list[str] | str:
    """The target modules of ``lora`` for an architecture: the configured names, or the
    architecture's default (:data:`DEFAULT_TARGETS`), or ``all-linear``."""
    if lora.target_modules is not None:
        return lora.target_modules
    return list(DEFAULT_TARGETS.get(model_type or "", ())) or "all-linear"


def missing_targets(targets: list[str] | str, available: list[str]) -> list[str]:
    """The configured target names that match no linear layer of the model (pure)."""
    if isinstance(targets, str):
        return []  # all-linear
    return [t for t in targets if t not in available]


def targets_error(missing: list[str], available: list[str], model_name: str) -> ConfigError:
    return ConfigError(
        f"model.lora.target_modules: {', '.join(missing)} "
        f"{'is' if len(missing) == 1 else 'are'} not a linear layer of {model_name}. Its "
        f"linear layers: {', '.join(available)}. Name some of those, or leave "
        "model.lora.target_modules unset for the architecture's default"
    )


def _skeleton(name: str) -> torch.nn.Module | None:
    """The model's modules without its weights (on the meta device), or None when its config
    cannot be read here (the load reports that, in its own words)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainers.core.models import _pretrained_args, resolve_model
    from trainers.core.tiny import quiet_hf

    try:
        source = resolve_model(name)
        if source.kind == "gguf":
            return None
        first, kwargs = _pretrained_args(source, ("config.json",))
        with quiet_hf():
            config = AutoConfig.from_pretrained(first, **kwargs)
            with torch.device("meta"):
                return AutoModelForCausalLM.from_config(config)
    except Exception:
        return None


def check_lora_targets(model_section: ModelSection | None) -> None:
    """Refuse target modules the model does not have, before anything is written (a no-op
    without LoRA, or when the model's config cannot be read here)."""
    if not isinstance(model_section, ModelSection) or not enabled(model_section):
        return
    if model_section.lora.target_modules in (None, "all-linear"):
        return
    skeleton = _skeleton(model_section.name)
    if skeleton is None:
        return
    available = linear_layer_names(skeleton)
    missing = missing_targets(model_section.lora.target_modules, available)
    if missing:
        raise targets_error(missing, available, model_section.name)


# ---------------------------------------------------------------------------------------------
# Adding adapters
# ---------------------------------------------------------------------------------------------


def lora_config(lora: LoraSection, model: torch.nn.Module):
    """peft's ``LoraConfig`` for ``model`` (targets resolved for its architecture)."""
    from peft import LoraConfig

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    targets = resolve_targets(lora, model_type)
    missing = missing_targets(targets, available := linear_layer_names(model))
    if missing:
        raise targets_error(missing, available, model_type or type(model).__name__)
    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        fan_in_fan_out=model_type in _FAN_IN_FAN_OUT,
    )


def add_adapters(model: torch.nn.Module, lora: LoraSection) -> torch.nn.Module:
    """``model`` (a causal LM) frozen, with trainable LoRA adapters: a peft ``PeftModel`` that
    forwards like the model. Returns ``model`` unchanged when LoRA is off."""
    if not lora.enabled:
        return model
    import warnings

    from peft import get_peft_model

    check_shardable_dtype(model)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # a transformers deprecation, in peft
        adapted = get_peft_model(model, lora_config(lora, model))
    adapted.train(model.training)
    sizes = describe(adapted)
    targets = adapted.peft_config["default"].target_modules
    print(
        f"lora: rank {lora.rank}, alpha {lora.alpha:g} on {', '.join(sorted(targets))}: "
        f"{sizes['trainable_params']:,} of {sizes['total_params']:,} parameters train",
        flush=True,
    )
    return adapted


def check_shardable_dtype(model: torch.nn.Module) -> None:
    """Under torchrun, refuse 16-bit base weights: peft keeps adapters in fp32, and FSDP2 cannot
    put fp32 adapters and 16-bit weights in one unit (a bf16 run on CUDA loads fp32 weights and
    computes in bf16 under FSDP, so it is not affected)."""
    import torch

    from trainers.core.distributed import world

    dtype = next(model.parameters()).dtype
    if world().distributed and dtype in (torch.float16, torch.bfloat16):
        raise ConfigError(
            f"LoRA under torchrun with {str(dtype).removeprefix('torch.')} weights: FSDP2 cannot "
            "shard fp32 adapters beside 16-bit weights in one unit; set model.dtype=fp32 (on "
            "CUDA bf16 works: the weights load in fp32 and compute in bf16)"
        )


def has_adapters(module: torch.nn.Module) -> bool:
    """Whether any layer of ``module`` carries peft adapters (peft is not imported for a run
    that never added any)."""
    import sys

    if "peft" not in sys.modules:
        return False
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in module.modules())


def _peft_models(module: torch.nn.Module) -> list[Any]:
    from peft import PeftModel

    return [m for m in module.modules() if isinstance(m, PeftModel)]


@contextlib.contextmanager
def reference_view(
    policy: torch.nn.Module, ref_model: torch.nn.Module | None = None
) -> Iterator[torch.nn.Module]:
    """The reference model to score with: ``ref_model`` when one was loaded, else the policy
    with its adapters switched off for the duration of the ``with`` block (the base weights:
    with LoRA the reference is not a second copy)."""
    if ref_model is not None:
        yield ref_model
        return
    peft_models = _peft_models(policy)
    if not peft_models:
        raise ValueError("reference_view: no reference model and the policy has no adapters")
    with contextlib.ExitStack() as stack:
        for peft_model in peft_models:
            stack.enter_context(peft_model.disable_adapter())
        yield policy


def needs_reference_copy(model_section: ModelSection) -> bool:
    """Whether a reference must be loaded as its own model: always for full fine-tuning; with
    LoRA only when ``model.ref_name`` names a model other than the base."""
    if not enabled(model_section):
        return True
    return model_section.ref_name not in (None, model_section.name)


# ---------------------------------------------------------------------------------------------
# Checkpoints: the trainable tensors only
# ---------------------------------------------------------------------------------------------


def trainable_names(module: torch.nn.Module) -> list[str]:
    return [name for name, p in module.named_parameters() if p.requires_grad]


def checkpoint_state(module: torch.nn.Module) -> dict[str, Any]:
    """What a checkpoint keeps of ``module``: its trainable tensors when it has adapters (the
    frozen base is the model the run started from), else its whole state dict."""
    if not has_adapters(module):
        return module.state_dict()
    return {name: p.detach() for name, p in module.named_parameters() if p.requires_grad}


def load_checkpoint_state(module: torch.nn.Module, state: dict[str, Any]) -> None:
    """Restore what :func:`checkpoint_state` saved; the adapters' tensors must all be there."""
    if not has_adapters(module):
        module.load_state_dict(state)
        return
    expected = set(trainable_names(module))
    if set(state) != expected:
        missing = sorted(expected - set(state))[:3]
        extra = sorted(set(state) - expected)[:3]
        raise ConfigError(
            "--resume: the checkpoint does not hold this run's LoRA adapters (missing "
            f"{missing}, unexpected {extra}); resume with the config the run started with"
        )
    module.load_state_dict(state, strict=False)


class CheckpointView:
    """``state_dict`` / ``load_state_dict`` of a module as :func:`checkpoint_state` sees it, for
    the checkpoint writer, which calls those two on the model it is given."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        return checkpoint_state(self.module)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_checkpoint_state(self.module, state)


def checkpointable(model: Any) -> Any:
    """``model`` itself, or its :class:`CheckpointView` when it has adapters (one process; a
    sharded checkpoint takes the model and leaves its frozen base out itself:
    :func:`sharded_state_options`)."""
    import torch

    from trainers.core.distributed import world

    if world().distributed:
        return model
    if isinstance(model, torch.nn.Module) and has_adapters(model):
        return CheckpointView(model)
    return model


# ---------------------------------------------------------------------------------------------
# The final model: the adapter, and the adapter merged into the base
# ---------------------------------------------------------------------------------------------


def merge_adapters(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every peft wrapper replaced by its base with the adapters merged in (in
    place where the wrapper is a submodule); the returned model has no adapter left."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        return model.merge_and_unload()
    for name, child in list(model.named_children()):
        merged = merge_adapters(child)
        if merged is not child:
            setattr(model, name, merged)
    return model


def save_adapter(model: torch.nn.Module, tokenizer: Any, folder: Path) -> Path:
    """peft's adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) with the
    tokenizer, and any trainable tensor outside the adapters (a reward head) in
    :data:`HEAD_FILE`."""
    from safetensors.torch import save_file

    from trainers.core.tiny import quiet_hf

    peft_models = _peft_models(model)
    if len(peft_models) != 1:
        raise ValueError(f"expected one adapted model inside {type(model).__name__}")
    adapted = peft_models[0]
    with quiet_hf():
        adapted.save_pretrained(folder)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
    inside = {id(p) for p in adapted.parameters()}
    heads = {
        name: p.detach().float().cpu().contiguous()
        for name, p in model.named_parameters()
        if p.requires_grad and id(p) not in inside
    }
    if heads:
        save_file(heads, str(folder / HEAD_FILE))
    return folder


def save_final(model: torch.nn.Module, tokenizer: Any, path: Path, save=None) -> torch.nn.Module:
    """Write ``<run>/final_adapter/`` next to ``path``, then merge the adapters into the base
    and write ``path`` as a plain model folder (``save(model, tokenizer, path)`` for a model
    that is not a plain transformers one). Returns the merged model (``model`` is merged in
    place where the adapters sit in a submodule: use the returned one afterwards)."""
    from trainers.core.tiny import quiet_hf

    save_adapter(model, tokenizer, path.parent / ADAPTER_DIR)
    merged = merge_adapters(model)
    if save is not None:
        save(merged, tokenizer, path)
    else:
        with quiet_hf():
            merged.save_pretrained(path)
            tokenizer.save_pretrained(path)
    return merged


def describe(model: torch.nn.Module) -> dict[str, Any]:
    """The summary's ``lora`` block: trainable and total parameters."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"trainable_params": trainable, "total_params": total}


# ---------------------------------------------------------------------------------------------
# Under torchrun: the adapted model sharded with FSDP2
# ---------------------------------------------------------------------------------------------
#
# The families add adapters first and shard afterwards (peft's wrapper, then ``fully_shard`` per
# decoder layer: a layer's frozen base weights and trainable adapters share one FSDP unit, which
# FSDP2 allows; only the adapters get gradients and optimizer states). The reference stays the
# same sharded model with its adapters switched off. A sharded checkpoint holds the trainable
# tensors and their optimizer state only (``sharded_state_options``); the final adapter and the
# merged model are written by rank 0 from the consolidated state dict
# (:func:`save_final_from_state`), with the merge done on those tensors (:func:`merged_state`).


def sharded_state_options(model: Any) -> dict[str, Any]:
    """Keyword arguments of ``torch.distributed.checkpoint.state_dict.StateDictOptions`` for a
    sharded checkpoint of ``model``: with adapters, the frozen base is left out (it is the
    model the run started from) and loading does not ask for it."""
    if has_adapters(model):
        return {"ignore_frozen_params": True, "strict": False}
    return {}


def sharded_model_state(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    """What a sharded checkpoint keeps of ``model``'s state dict ``state``: with adapters, the
    trainable tensors only (a frozen weight tied to another, like a tied LM head, is not
    reached by ``ignore_frozen_params``, which goes by parameter); else all of it."""
    if not has_adapters(model):
        return state
    keep = set(trainable_names(model))
    return {k: v for k, v in state.items() if k in keep}


def _peft_path(model: torch.nn.Module) -> tuple[str, Any]:
    """(prefix of the state-dict keys under the one peft wrapper in ``model``, that wrapper)."""
    from peft import PeftModel

    found = [(name, m) for name, m in model.named_modules() if isinstance(m, PeftModel)]
    if len(found) != 1:
        raise ValueError(f"expected one adapted model inside {type(model).__name__}")
    name, adapted = found[0]
    return (f"{name}." if name else ""), adapted


def merged_state(state: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """The state dict of ``model`` with its LoRA adapters merged into the base weights, from
    ``state`` (``model``'s own consolidated state dict, adapters included): each adapted layer's
    weight becomes W + scaling·B·A (transposed for GPT-2's Conv1D layers), the adapter tensors
    go, and the keys are those of the model without peft (``backbone.model.layers.0...``)."""
    from peft.tuners.lora import LoraLayer

    prefix, adapted = _peft_path(model)
    adapter = adapted.active_adapter
    out = dict(state)
    for name, layer in model.named_modules():
        if not isinstance(layer, LoraLayer) or adapter not in layer.lora_A:
            continue
        weight = f"{name}.base_layer.weight"
        a = state[f"{name}.lora_A.{adapter}.weight"].float()
        b = state[f"{name}.lora_B.{adapter}.weight"].float()
        delta = (b @ a) * layer.scaling[adapter]
        if layer.fan_in_fan_out:
            delta = delta.T
        out[weight] = (state[weight].float() + delta).to(state[weight].dtype)
    plain: dict[str, Any] = {}
    for key, value in out.items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        if key.startswith(prefix + "base_model.model."):
            key = prefix + key[len(prefix + "base_model.model.") :]
        plain[key] = value
    return plain


@contextlib.contextmanager
def without_peft(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` with its peft wrapper replaced by the model it wraps for the duration (the
    object a plain save is called on: its config and class, not its tensors, matter)."""
    prefix, adapted = _peft_path(model)
    if not prefix:
        yield adapted.get_base_model()
        return
    parent_name, _, attr = prefix[:-1].rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    parent._modules[attr] = adapted.get_base_model()
    try:
        yield model
    finally:
        parent._modules[attr] = adapted


def save_final_from_state(
    model: torch.nn.Module, tokenizer: Any, path: Path, state: dict[str, Any], save=None
) -> None:
    """:func:`save_final` for a sharded model, on rank 0, from ``state`` (the consolidated
    state dict, CPU tensors): ``final_adapter/`` (peft's folder from the adapter tensors, plus
    any trained head) and ``path``, the merged model. ``model`` itself is left as it is."""
    from safetensors.torch import save_file

    from trainers.core.tiny import quiet_hf

    prefix, adapted = _peft_path(model)
    folder = path.parent / ADAPTER_DIR
    own = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    with quiet_hf():
        adapted.save_pretrained(folder, state_dict=own)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
    inside = {id(p) for p in adapted.parameters()}
    heads = {
        name: state[name].detach().float().cpu().contiguous()
        for name, p in model.named_parameters()
        if p.requires_grad and id(p) not in inside and name in state
    }
    if heads:
        save_file(heads, str(folder / HEAD_FILE))
    merged = merged_state(state, model)
    with without_peft(model) as plain:
        if save is not None:
            save(plain, tokenizer, path, state_dict=merged)
        else:
            with quiet_hf():
                plain.save_pretrained(path, state_dict=merged)
                tokenizer.save_pretrained(path)
