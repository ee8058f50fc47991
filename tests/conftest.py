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
