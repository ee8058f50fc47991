"""Test-session environment: offline, no W&B, caches in a temporary folder shared by the
session (the tiny preset is built once per session)."""

from __future__ import annotations

import os
import tempfile

_SESSION_CACHE = tempfile.mkdtemp(prefix="rlhf-lab-test-cache-")

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["WANDB_MODE"] = "disabled"
os.environ.pop("WANDB_PROJECT", None)
os.environ.setdefault("RLHF_LAB_CACHE", _SESSION_CACHE)
os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(_SESSION_CACHE, "datasets"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# One math thread per process: the lab tests run trainer subprocesses beside pytest on 2 cores,
# and oversubscribed OpenMP threads slow a tiny model's step by an order of magnitude.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


import pytest  # noqa: E402  (after the environment above is set)


@pytest.fixture
def record_forward_shapes(monkeypatch):
    """``record(module) -> list``: from then on, the ``input_ids`` shape of every call of
    ``module.forward`` is appended to the returned list (the call itself runs unchanged)."""

    def record(module) -> list[tuple[int, ...]]:
        shapes: list[tuple[int, ...]] = []
        original = module.forward

        def recording(*args, **kwargs):
            shapes.append(tuple(kwargs["input_ids"].shape))
            return original(*args, **kwargs)

        monkeypatch.setattr(module, "forward", recording)
        return shapes

    return record
