"""Resolve model names and load tokenizers and causal LMs.

A model name resolves, in this order, to:

1. a built-in preset (``tiny``, ``tiny-llama``, ``small``; built on first use, see ``tiny.py``);
2. an existing local folder with a ``config.json`` (a ``save_pretrained`` folder);
3. a ``.gguf`` file, or a folder holding exactly one ``.gguf`` file;
4. a Hugging Face hub id of the shape ``org/name``.

``HF_HUB_OFFLINE=1`` is honoured, and an unreachable hub is reported within seconds with the
offline alternatives, never after a long hang.

Importing this module imports neither torch nor transformers: the lab calls
:func:`resolve_model` and :func:`model_fingerprint` in processes that must stay light. The loaders
and the device helpers import them when called.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlparse

from trainers.core.tiny import (
    BUILDER_VERSION,
    PRESETS,
    cache_root,
    ensure_preset,
    preset_dir,
    quiet_hf,
)

if TYPE_CHECKING:
    import torch

    from trainers.core.config import ModelSection
    from trainers.core.distributed import CudaInfo

ModelKind = Literal["preset", "local", "gguf", "hub"]

PULL_HINT = "rlhf-lab models pull smollm2-135m-instruct"
HUB_TIMEOUT_S = 3.0
# Files whose name, size and mtime identify a local folder's weights.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_TRUE = {"1", "true", "yes", "on"}


class ModelError(Exception):
    """Base class of the errors raised here; the message says what to do."""


class ModelNotFoundError(ModelError):
    """The name is no preset, no usable local path, no GGUF file and no hub id."""


class ModelNotAvailableError(ModelError):
    """A hub id that cannot be fetched now (offline, or the hub is unreachable)."""


class DeviceError(ModelError):
    """The requested device does not exist on this machine."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model name points.

    ``path``: the preset folder (possibly not built yet: :func:`ensure_preset` builds it), the
    local folder, or the folder holding the GGUF file; ``None`` for a hub id.
    ``gguf_file``: the GGUF file's name inside ``path`` (kind ``gguf`` only).
    """

    kind: ModelKind
    path: Path | None
    hub_id: str | None
    gguf_file: str | None
    name: str = ""

    @property
    def gguf_path(self) -> Path | None:
        if self.kind == "gguf" and self.path is not None and self.gguf_file:
            return self.path / self.gguf_file
        return None


def _offline_choices() -> str:
    return (
        f"Offline choices: a built-in preset ({', '.join(PRESETS)}), a local folder with "
        f"config.json, a .gguf file, or fetch a real small model with `{PULL_HINT}`."
    )


def _looks_like_path(name: str) -> bool:
    return (
        name.startswith(("/", "./", "../", "~", ".\\"))
        or name in (".", "..")
        or name.lower().endswith(".gguf")
        or name.count("/") > 1
        or "\\" in name
    )


# Real models that `rlhf-lab models pull` can bring in without the hub: short name -> hub id.
PULLABLE: dict[str, str] = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def pulled_dir(name: str) -> Path:
    """Where a pulled model lives: ``<cache>/models/pulled/<short name>``; a hub id of a pullable
    model maps to the same folder, so configs naming the hub id work offline once pulled."""
    short = {v.lower(): k for k, v in PULLABLE.items()}.get(name.lower(), name.lower())
    safe = re.sub(r"[^a-z0-9._-]+", "--", short)
    return cache_root() / "models" / "pulled" / safe


def resolve_model(name: str) -> ModelSource:
    """Say what ``name`` refers to, without loading anything (and without torch)."""
    if not isinstance(name, str) or not name.strip():
        raise ModelNotFoundError(
            "Empty model name. " + _offline_choices().replace("Offline choices", "Use")
        )
    name = name.strip()
    if name in PRESETS:
        return ModelSource("preset", preset_dir(name), None, None, name)
    pulled = pulled_dir(name)
    if (pulled / "config.json").is_file():  # `rlhf-lab models pull` put it there
        return ModelSource("local", pulled, None, None, name)

    # absolute(), not resolve(): symlinks keep their names (a hub-cache snapshot file is a
    # link to a blob whose name is a hash, without the .gguf suffix)
    path = Path(name).expanduser().absolute()
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource("local", path, None, None, name)
        ggufs = sorted(p.name for p in path.iterdir() if p.suffix.lower() == ".gguf")
        if len(ggufs) == 1:
            return ModelSource("gguf", path, None, ggufs[0], name)
        if len(ggufs) > 1:
            raise ModelNotFoundError(
                f"Folder {str(path)!r} holds {len(ggufs)} .gguf files ({', '.join(ggufs)}); "
                "pass the path of the one to load."
            )
        raise ModelNotFoundError(
            f"Folder {str(path)!r} is not a model folder: it has no config.json and no .gguf "
            "file. Point to a folder written by save_pretrained, or to a .gguf file."
        )
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return ModelSource("gguf", path.parent, None, path.name, name)
        if path.name == "config.json":
            raise ModelNotFoundError(
                f"{str(path)!r} is a file; pass its folder {str(path.parent)!r} instead."
            )
        raise ModelNotFoundError(
            f"{str(path)!r} is a file but not a .gguf model. Pass a model folder (with "
            "config.json) or a .gguf file."
        )
    if _looks_like_path(name):
        raise ModelNotFoundError(f"No such file or folder: {str(path)!r}. " + _offline_choices())
    if _HUB_ID.match(name):
        return ModelSource("hub", None, name, None, name)
    raise ModelNotFoundError(
        f"Unknown model {name!r}: not a built-in preset ({', '.join(PRESETS)}), not an existing "
        "local folder or .gguf file, and not a hub id of the form org/name."
    )


# --------------------------------------------------------------------------------------------
# hub access


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) asks for offline mode."""
    return any(
        os.environ.get(var, "").strip().lower() in _TRUE
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_endpoint() -> tuple[str, int]:
    """Host and port of the hub: ``$HF_ENDPOINT`` if set, else huggingface.co:443."""
    endpoint = os.environ.get("HF_ENDPOINT", "").strip()
    if endpoint:
        url = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        if url.hostname:
            return url.hostname, url.port or (80 if url.scheme == "http" else 443)
    return "huggingface.co", 443


def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """A TCP connect to the hub, bounded by ``timeout`` seconds including name resolution.

    The connect runs in a daemon thread so that a slow DNS lookup (which ignores socket
    timeouts) cannot hold the caller past ``timeout``.
    """
    host, port = hub_endpoint()
    result: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    worker = threading.Thread(target=attempt, name="hub-reachability", daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(result and result[0])


def _hub_cached(hub_id: str, filenames: tuple[str, ...]) -> bool:
    from huggingface_hub import try_to_load_from_cache

    for filename in filenames:
        hit = try_to_load_from_cache(hub_id, filename)
        if isinstance(hit, str):
            return True
    return False


def _hub_kwargs(hub_id: str, filenames: tuple[str, ...]) -> dict[str, Any]:
    """``from_pretrained`` kwargs for a hub id, or a clear error when it cannot be had now."""
    if hub_offline():
        if not _hub_cached(hub_id, filenames):
            raise ModelNotAvailableError(
                f"{hub_id!r} is a hub id, HF_HUB_OFFLINE=1 is set and it is not in the local "
                f"Hugging Face cache. {_offline_choices()}"
            )
        return {"local_files_only": True}
    if hub_reachable():
        return {}
    if _hub_cached(hub_id, filenames):
        return {"local_files_only": True}
    host, port = hub_endpoint()
    raise ModelNotAvailableError(
        f"{hub_id!r} is a hub id but the hub ({host}:{port}) cannot be reached and it is not "
        f"in the local Hugging Face cache. {_offline_choices()} "
        "Set HF_HUB_OFFLINE=1 to skip this check on a machine without network."
    )


def _not_available(hub_id: str, err: Exception) -> ModelNotAvailableError:
    return ModelNotAvailableError(
        f"Could not load {hub_id!r} from the hub or the local cache ({type(err).__name__}: "
        f"{err}). {_offline_choices()}"
    )


def _pretrained_args(
    source: ModelSource, cache_files: tuple[str, ...]
) -> tuple[str, dict[str, Any]]:
    """The first argument and extra kwargs of ``from_pretrained`` for a resolved source."""
    if source.kind == "preset":
        return str(ensure_preset(source.name)), {}
    if source.kind == "local":
        return str(source.path), {}
    if source.kind == "gguf":
        return str(source.path), {"gguf_file": source.gguf_file}
    assert source.hub_id is not None
    return source.hub_id, _hub_kwargs(source.hub_id, cache_files)


# --------------------------------------------------------------------------------------------
# loading


def load_tokenizer(name: str):
    """Load the tokenizer of ``name``; a missing pad token is set to the eos token."""
    from transformers import AutoTokenizer

    source = resolve_model(name)
    first, kwargs = _pretrained_args(source, ("tokenizer_config.json", "config.json"))
    try:
        with quiet_hf():
            tokenizer = AutoTokenizer.from_pretrained(first, **kwargs)
    except OSError as err:
        if source.kind == "hub":
            raise _not_available(source.hub_id or name, err) from err
        raise
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    name: str,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    attn_implementation: str = "auto",
    trainable: bool = True,
):
    """Load ``name`` as a causal LM on ``device`` in ``dtype``.

    ``trainable=True`` returns it in train mode with gradients on; ``False`` in eval mode with
    every parameter frozen (reference and reward models).
    """
    from transformers import AutoModelForCausalLM

    torch_device = pick_device(device)
    torch_dtype = pick_dtype(dtype, torch_device)
    attn = pick_attn_implementation(attn_implementation, torch_device, torch_dtype)

    source = resolve_model(name)
    first, kwargs = _pretrained_args(source, ("config.json",))
    try:
        with quiet_hf():
            model = AutoModelForCausalLM.from_pretrained(
                first, dtype=torch_dtype, attn_implementation=attn, **kwargs
            )
    except OSError as err:
        if source.kind == "hub":
            raise _not_available(source.hub_id or name, err) from err
        raise
    model.to(torch_device)

    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None:
        eos = gen.eos_token_id if gen.eos_token_id is not None else model.config.eos_token_id
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        if eos is not None:
            gen.pad_token_id = eos

    if trainable:
        model.train()
        model.requires_grad_(True)
    else:
        model.eval()
        model.requires_grad_(False)
    return model


def load_reference(model: Any, device: Any, dtype: Any, attn: Any) -> torch.nn.Module:
    """The frozen reference of a config's ``model`` section (``ref_name``, else the starting
    model ``name``), in eval mode."""
    return load_causal_lm(
        model.ref_name or model.name,
        device=device,
        dtype=dtype,
        attn_implementation=attn,
        trainable=False,
    )


def count_parameters(model, *, trainable_only: bool = False) -> int:
    """Number of parameters (shared/tied tensors counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# --------------------------------------------------------------------------------------------
# device, dtype, attention


def pick_device(pref: str | torch.device = "auto", cuda: CudaInfo | None = None) -> torch.device:
    """``auto`` (CUDA if available, else CPU), ``cuda``/``cuda:N``, ``cpu`` or ``mps``. ``cuda``:
    what the machine offers (by default :func:`trainers.core.distributed.query_cuda`)."""
    import torch

    from trainers.core.distributed import query_cuda

    if isinstance(pref, torch.device):
        pref = str(pref)
    choice = (pref or "auto").strip().lower()
    cuda = cuda or query_cuda()
    if choice == "auto":
        return torch.device("cuda" if cuda.count else "cpu")
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda" or choice.startswith("cuda:"):
        if not cuda.count:
            raise DeviceError(
                f"device={pref} was asked for but CUDA is not available on this machine. "
                "Use device=cpu or device=auto."
            )
        dev = torch.device(choice)
        if dev.index is not None and dev.index >= cuda.count:
            raise DeviceError(
                f"device={pref} does not exist: this machine has "
                f"{cuda.count} CUDA device(s). Use device=cuda or device=auto."
            )
        return dev
    if choice == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise DeviceError("device=mps is not available here. Use device=cpu or device=auto.")
        return torch.device("mps")
    raise DeviceError(f"Unknown device {pref!r}. Use auto, cuda, cuda:N or cpu.")


_DTYPE_NAMES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
}


def pick_dtype(
    pref: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    cuda: CudaInfo | None = None,
) -> torch.dtype:
    """``auto``: bf16 on a CUDA device that supports it, else fp32; or bf16/fp16/fp32.
    ``cuda``: what the machine offers (by default :func:`trainers.core.distributed.query_cuda`)."""
    import torch

    if isinstance(pref, torch.dtype):
        return pref
    choice = (pref or "auto").strip().lower()
    if choice == "auto":
        dev = torch.device(device) if device is not None else pick_device("auto", cuda)
        from trainers.core.distributed import query_cuda

        if dev.type == "cuda" and (cuda or query_cuda()).bf16:
            return torch.bfloat16
        return torch.float32
    if choice in _DTYPE_NAMES:
        return getattr(torch, _DTYPE_NAMES[choice])
    raise ValueError(f"Unknown dtype {pref!r}. Use auto, bf16, fp16 or fp32.")


def flash_attn_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def pick_attn_implementation(
    pref: str = "auto",
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    cuda: CudaInfo | None = None,
    flash_attn: bool | None = None,
) -> str:
    """``auto``: ``flash_attention_2`` when flash-attn is installed (``flash_attn``; by default
    :func:`flash_attn_available`), the device is CUDA and the dtype is half precision; else
    ``sdpa``. Any other value is passed through unchanged. ``cuda``: as :func:`pick_dtype`."""
    import torch

    choice = (pref or "auto").strip()
    if choice.lower() != "auto":
        return choice
    dev = torch.device(device) if device is not None else pick_device("auto", cuda)
    torch_dtype = pick_dtype(dtype if dtype is not None else "auto", dev, cuda)
    if dev.type == "cuda" and torch_dtype in (torch.bfloat16, torch.float16):
        if flash_attn_available() if flash_attn is None else flash_attn:
            return "flash_attention_2"
    return "sdpa"


def pick_runtime(model: ModelSection) -> tuple[Any, Any, str]:
    """(device, dtype, attention implementation) the ``model`` section asks for, resolved on
    this machine (``auto`` picks CUDA, bf16 and the fastest attention available). Under
    torchrun: this rank's GPU, and fp32 weights computed in bf16 by FSDP where the run asked
    for bf16 on CUDA (:func:`trainers.core.distributed.plan_precision`)."""
    from trainers.core.distributed import plan_precision, rank_device

    device = rank_device(pick_device(model.device))
    dtype = pick_dtype(model.dtype, device)
    attn = pick_attn_implementation(model.attn_implementation, device, dtype)
    return device, plan_precision(device, dtype), attn


# --------------------------------------------------------------------------------------------
# fingerprints


def _short_hash(*parts: object) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _file_stamp(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return (path.name, st.st_size, st.st_mtime_ns)


def _hub_revision(hub_id: str) -> str | None:
    """The commit the local cache's ``main`` ref points to, if the model is cached."""
    try:
        from huggingface_hub import constants

        ref = (
            Path(constants.HF_HUB_CACHE) / f"models--{hub_id.replace('/', '--')}" / "refs" / "main"
        )
        return ref.read_text().strip() if ref.is_file() else None
    except Exception:  # a fingerprint must never fail on a cache oddity
        return None


def model_fingerprint(name: str) -> str:
    """A short stable hash of what ``name`` loads, for caches keyed by model weights.

    Preset: name + builder version. Local folder: config.json contents + (name, size, mtime) of
    weight files. GGUF: file name + size + mtime. Hub: id + cached revision when known.
    """
    source = resolve_model(name)
    if source.kind == "preset":
        return _short_hash("preset", source.name, BUILDER_VERSION)
    if source.kind == "local":
        assert source.path is not None
        config = (source.path / "config.json").read_bytes()
        weights = sorted(
            _file_stamp(p)
            for p in source.path.iterdir()
            if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES)
        )
        return _short_hash("local", hashlib.sha256(config).hexdigest(), weights)
    if source.kind == "gguf":
        gguf_path = source.gguf_path
        assert gguf_path is not None
        return _short_hash("gguf", _file_stamp(gguf_path))
    assert source.hub_id is not None
    return _short_hash("hub", source.hub_id, _hub_revision(source.hub_id))


# config.json keys that set a model's compute (what a throughput measurement depends on)
_SHAPE_KEYS = (
    "model_type",
    "architectures",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
    "torch_dtype",
    "dtype",
)


def architecture_fingerprint(name: str) -> str:
    """A short hash of ``name``'s shape, not its weights: a local folder's config.json keys that
    set its compute (layers, widths, heads, vocabulary, dtype). A warm start saved from a pulled
    model shares the pulled model's, so a throughput measured once serves both. Any other kind:
    :func:`model_fingerprint`."""
    source = resolve_model(name)
    if source.kind != "local":
        return model_fingerprint(name)
    assert source.path is not None
    config = json.loads((source.path / "config.json").read_text())
    shape = {k: config.get(k) for k in _SHAPE_KEYS}
    return _short_hash("shape", json.dumps(shape, sort_keys=True, default=str))


def describe_source(source: ModelSource) -> dict[str, Any]:
    """A JSON-friendly view of a :class:`ModelSource`."""
    return {
        "kind": source.kind,
        "path": str(source.path) if source.path else None,
        "hub_id": source.hub_id,
        "gguf_file": source.gguf_file,
        "name": source.name,
    }
