"""Parameter counts from a model's ``config.json`` (no weights loaded, nothing downloaded) and a
per-family training-memory estimate, torch-free.

* :mod:`~rlhf_lab.planning.memory.architecture`: where a model's architecture comes from, parameter
  counts, dtype widths and per-token sizes (:func:`model_facts`, :func:`count_parameters`);
* :mod:`~rlhf_lab.planning.memory.blocks`: the sizes an estimate is built from (weights, gradients,
  optimizer states, activations, logits, KV cache) and the component builder;
* :mod:`~rlhf_lab.planning.memory.families`: one estimator per family in :data:`FAMILY_ESTIMATORS`;
* :mod:`~rlhf_lab.planning.memory.estimate`: :func:`estimate_memory`, which dispatches on the family,
  and :func:`fits`.

``hub_cache_lookup`` is the seam for the Hugging Face cache: inside ``with
hub_cache_lookup(fake):`` every look-up of a hub model's files asks ``fake`` instead.
"""

from __future__ import annotations

from rlhf_lab.planning.memory.architecture import (
    KNOWN_ARCHITECTURES,
    OFFLINE_CHOICES,
    ModelArch,
    ModelFacts,
    ParamCount,
    arch_from_config,
    count_parameters,
    dtype_bytes,
    hub_cache_lookup,
    kv_cache_bytes_per_token,
    layer_activation_bytes,
    model_facts,
    offline_model_steps,
)
from rlhf_lab.planning.memory.blocks import (
    ALLOCATOR_SLACK,
    CPU_BASELINE_GB,
    CUDA_CONTEXT_GB,
    DEFAULT_PROMPT_TOKENS,
    GIB,
    LOGP_CHUNK,
    EstimateBuilder,
    MemoryComponent,
)
from rlhf_lab.planning.memory.estimate import Assumptions, MemoryEstimate, estimate_memory, fits
from rlhf_lab.planning.memory.families import FAMILY_ESTIMATORS, EstimateInputs, FamilyEstimator

__all__ = [
    "ALLOCATOR_SLACK",
    "CPU_BASELINE_GB",
    "CUDA_CONTEXT_GB",
    "DEFAULT_PROMPT_TOKENS",
    "FAMILY_ESTIMATORS",
    "GIB",
    "KNOWN_ARCHITECTURES",
    "LOGP_CHUNK",
    "OFFLINE_CHOICES",
    "Assumptions",
    "EstimateBuilder",
    "EstimateInputs",
    "FamilyEstimator",
    "MemoryComponent",
    "MemoryEstimate",
    "ModelArch",
    "ModelFacts",
    "ParamCount",
    "hub_cache_lookup",
    "arch_from_config",
    "count_parameters",
    "dtype_bytes",
    "estimate_memory",
    "fits",
    "kv_cache_bytes_per_token",
    "layer_activation_bytes",
    "model_facts",
    "offline_model_steps",
]
