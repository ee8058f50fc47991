"""The environment a test gives an MCP server it starts over stdio."""

from __future__ import annotations

import os
from pathlib import Path


def server_env(root: Path) -> dict[str, str]:
    """What the server needs (a stdio client passes only HOME, PATH, ... plus what it is
    given): the lab root, offline switches, one math thread per trainer, the test session's
    model cache, and the suite's no-measurement switches (a plan in the server reads throughput
    from the cache and probes nothing, as in the test process)."""
    env = {
        "RLHF_LAB_ROOT": str(root),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for key in (
        "RLHF_LAB_CACHE",
        "HF_DATASETS_CACHE",
        "HF_HOME",
        "RLHF_LAB_THROUGHPUT",
        "RLHF_LAB_CALIBRATE",
    ):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env
