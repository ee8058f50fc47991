"""Memory estimators of the algorithms that sample on-policy and keep a second model resident
while training: online DPO (the frozen reference and the ranker's reward model) and on-policy
distillation (the frozen teacher, whose full-vocabulary logits sit beside the student's).
Registered in :mod:`rlhf_lab.memory.families` (``distillation`` as a family, ``online_dpo`` as
its spec's memory hook)."""

from __future__ import annotations

from rlhf_lab.errors import LabError
from rlhf_lab.memory.architecture import ModelArch, model_facts
from rlhf_lab.memory.blocks import (
    EstimateBuilder,
    forward_gb,
    kv_cache_gb,
    logits_gb,
    packed_positions,
)
from rlhf_lab.memory.families import EstimateInputs, _add_pg_reward_model

GIB = 1024**3


def estimate_online_dpo(inputs: EstimateInputs, bld: EstimateBuilder) -> int:
    """The policy trained on chosen + rejected samples; the frozen starting model resident for
    the whole run (its log-probs of new samples are needed every step, so nothing is cached),
    unless the pair loss is reference-free; the sampling KV cache of two completions per prompt
    of a step; the ranker's reward model (``reward.model``) and its scoring forward."""
    rows = 2 * int(inputs.setting("train.batch_size", 8))
    new = int(inputs.setting("online.max_new_tokens", 64))
    seq = int(inputs.setting("data.max_length", 512))
    prompt = max(seq - new, 1)
    bld.trained(
        "policy",
        inputs.params,
        inputs.arch,
        rows=rows,
        seq=seq,
        logit_positions=packed_positions(rows, seq),
        accumulating=inputs.accumulates(),
        resident=["train", "generate"],
        **inputs.trained_kwargs(),
    )
    pair_loss = inputs.setting("online.loss", "dpo")
    if pair_loss in ("simpo", "orpo"):
        bld.notes.append(f"online.loss={pair_loss} is reference-free: no reference model")
    else:
        bld.frozen("reference", inputs.params, inputs.b, ["train", "generate"])
        if inputs.arch is not None:
            fwd = forward_gb(inputs.arch, inputs.b, rows, seq, inputs.eager)
            bld.add("reference forward (no grad)", fwd, ["train"], f"{rows} rows × {seq} tokens")
        bld.notes.append("online DPO keeps the reference loaded: its samples are new every step")
    if inputs.arch is not None:
        per_step = rows * int(inputs.setting("train.gradient_accumulation_steps", 1))
        gb, how = kv_cache_gb(inputs.arch, inputs.b, per_step, prompt + new)
        bld.add("generation KV cache", gb, ["generate"], how)
    name = inputs.setting("reward.model")
    if isinstance(name, str) and name:
        _add_pg_reward_model(inputs, bld, "reward model", name, seq)
    else:
        bld.notes.append("ranked by the verifier: no reward model")
    return inputs.params


def _full_logits_gb(arch: ModelArch, b: int, positions: int, grad: bool) -> tuple[float, str]:
    """Logits over the whole vocabulary at every position plus the float32 log-softmax (and,
    with ``grad``, what backward keeps): the distillation loss compares whole distributions."""
    gb, how = logits_gb(arch, b, positions, grad)
    extra = positions * arch.vocab_size * (12 if grad else 4) / GIB
    return gb + extra, how + " + fp32 log-softmax"


def estimate_distillation(inputs: EstimateInputs, bld: EstimateBuilder) -> int:
    """The student trained on its own samples, its logits over the whole vocabulary at every
    position; the frozen teacher resident for the whole run with its no-grad forward and its
    full logits; the sampling KV cache of a step's completions."""
    samples = int(inputs.setting("rollout.num_samples", 1))
    rows = int(inputs.setting("train.batch_size", 8)) * samples
    new = int(inputs.setting("rollout.max_new_tokens", 128))
    seq = inputs.prompt_tokens + new
    arch = inputs.arch
    bld.trained(
        "student",
        inputs.params,
        arch,
        rows=rows,
        seq=seq,
        logit_positions=0,
        accumulating=inputs.accumulates(),
        resident=["train", "generate"],
        **inputs.trained_kwargs(),
    )
    if arch is not None:
        gb, how = _full_logits_gb(arch, inputs.b, rows * seq, grad=True)
        bld.add("student logits (full vocabulary)", gb, ["train"], how)
        per_step = rows * int(inputs.setting("train.gradient_accumulation_steps", 1))
        gb, how = kv_cache_gb(arch, inputs.b, per_step, seq)
        bld.add("generation KV cache", gb, ["generate"], how)
    teacher = inputs.setting("teacher.name")
    try:
        facts = model_facts(str(teacher)).params
    except LabError as err:
        bld.notes.append(f"teacher {teacher}: size unknown here ({err.message}); not counted")
        return inputs.params
    bld.frozen("teacher", facts.total, inputs.b, ["train", "generate"])
    if facts.arch is not None:
        fwd = forward_gb(facts.arch, inputs.b, rows, seq, inputs.eager)
        gb, how = _full_logits_gb(facts.arch, inputs.b, rows * seq, grad=False)
        bld.add("teacher forward (no grad)", fwd + gb, ["train"], f"{rows} rows × {seq}; {how}")
    bld.notes.append(f"prompts counted as {inputs.prompt_tokens} tokens")
    return inputs.params
