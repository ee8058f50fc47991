"""Models the packing tests compare the packed and padded layouts on: the built-in ``tiny`` and
SmolLM2-135M-Instruct where it was pulled into the user's lab cache (skipped otherwise)."""

from __future__ import annotations

from pathlib import Path

import pytest

SMOLLM2_DIR = Path.home() / ".cache" / "rlhf-lab" / "models" / "pulled" / "smollm2-135m-instruct"


def model_names() -> list:
    """``tiny`` and SmolLM2 as pytest parameters (SmolLM2 skipped when not pulled)."""
    pulled = (SMOLLM2_DIR / "config.json").is_file()
    skip = pytest.mark.skipif(not pulled, reason="smollm2-135m-instruct not pulled")
    return [
        pytest.param("tiny", id="tiny"),
        pytest.param(str(SMOLLM2_DIR), id="smollm2", marks=skip),
    ]


def trainable_model(name: str, attn: str = "sdpa", seed: int = 3):
    """``name`` loaded trainable in float32 on the CPU with attention ``attn``, seeded."""
    import torch

    from trainers.core.models import load_causal_lm

    torch.manual_seed(seed)
    return load_causal_lm(
        name, device="cpu", dtype="float32", attn_implementation=attn, trainable=True
    )
