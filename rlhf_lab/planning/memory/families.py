"""One memory estimator per training family, registered in :data:`FAMILY_ESTIMATORS` under the
family's name, and those an algorithm's spec names as its own memory hook
(:data:`HOOK_ESTIMATORS`: online DPO, which keeps its reference loaded while it trains).

An estimator receives the resolved inputs of one estimate (:class:`EstimateInputs`: the config,
the algorithm, the model's size and architecture, dtype width and switches) and an
:class:`~rlhf_lab.planning.memory.blocks.EstimateBuilder`; it adds its components and notes to the
builder and returns the number of trained parameters. What differs between the algorithms of a
family (a reference model or not, PPO's value model, KTO's third sequence) is read from the
algorithm name and the config, as the trainers decide it.

Phases: ``train`` (forward + backward of one micro-batch), ``generate`` (sampling, rollouts),
``reference`` (the direct-alignment reference pass, run once before the policy is loaded) and
``score`` (reward-model scoring of rejection sampling).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlhf_lab.errors import LabError
from rlhf_lab.planning.completion_length import completion_tokens, is_multi_turn
from rlhf_lab.planning.memory.architecture import ModelArch, ParamCount, model_facts
from rlhf_lab.planning.memory.blocks import (
    GIB,
    EstimateBuilder,
    Precision,
    TrainingShape,
    forward_gb,
    kv_cache_gb,
    logits_gb,
    packed_positions,
    per_row_positions,
)
from rlhf_lab.planning.memory.lora import add_lora_trained, lora_plan, reference_is_base
from rlhf_lab.planning.trainer_config import TrainerConfig
from trainers.core.spec import AlgorithmSpec, family_spec


@dataclass(frozen=True)
class EstimateInputs:
    """Everything a family estimator reads, resolved once by ``estimate_memory``."""

    config: TrainerConfig
    algorithm: str | None
    model_name: str | None
    counts: ParamCount | None  # None when only a parameter count was given
    params: int
    b: int  # bytes per value of the training dtype
    ckpt: bool  # gradient checkpointing
    eager: bool  # eager attention (keeps the seq × seq scores)
    master_weights: bool
    reference_cached: bool
    prompt_tokens: int

    @property
    def arch(self) -> ModelArch | None:
        """The model's architecture, when known (activations, logits and KV cache need it)."""
        return self.counts.arch if self.counts is not None else None

    def setting(self, key: str, default: Any = None) -> Any:
        """The config's value at dotted ``key``; ``default`` when it is absent or null."""
        value = self.config.get(key)
        return default if value is None else value

    def accumulates(self, key: str = "train.gradient_accumulation_steps") -> bool:
        """Several micro-batches per optimizer step (an absent setting counts as yes: the
        larger estimate). A key without a dot is looked up anywhere in the config."""
        value = self.config.get(key) if "." in key else self.config.leaf(key)
        return value is None or int(value) > 1

    def precision(self) -> Precision:
        """The precision and activation switches every trained model shares."""
        return Precision(self.b, self.ckpt, self.eager, self.master_weights)


FamilyEstimator = Callable[[EstimateInputs, EstimateBuilder], int]


def _trained(
    inputs: EstimateInputs,
    bld: EstimateBuilder,
    label: str,
    params: int,
    arch: ModelArch | None,
    **shape: Any,
) -> int:
    """A trained model, in full or through LoRA adapters when the config enables them
    (:mod:`rlhf_lab.planning.memory.lora`); returns its trained parameters."""
    plan = lora_plan(inputs.config)
    if plan is None:
        bld.trained(label, params, arch, TrainingShape(**shape), inputs.precision())
        return params
    return add_lora_trained(
        bld, label, params, arch, plan, TrainingShape(**shape), inputs.precision()
    )


def _train_on_packed_rows(
    inputs: EstimateInputs, bld: EstimateBuilder, label: str, rows: int, seq: int
) -> int:
    """The trained model of direct alignment and SFT: ``rows × seq`` tokens a micro-batch,
    completions packed into one row before the LM head, resident while sampling too (and
    during the reference pass when, with LoRA, it is the reference). Returns its trained
    parameters."""
    resident = ["train", "generate"]
    if reference_is_base(inputs.config, inputs.model_name):
        resident.append("reference")
    return _trained(
        inputs,
        bld,
        label,
        inputs.params,
        inputs.arch,
        rows=rows,
        seq=seq,
        logit_positions=packed_positions(rows, seq),
        accumulating=inputs.accumulates(),
        resident=resident,
    )


def _add_sampling_kv_cache(inputs: EstimateInputs, bld: EstimateBuilder, prompt: int) -> None:
    """The KV cache of evaluation samples (``eval.num_samples`` sequences of ``prompt`` +
    ``eval.sample_max_new_tokens`` tokens), when the config samples and the architecture is
    known."""
    arch = inputs.arch
    samples = int(inputs.setting("eval.num_samples", 0))
    if arch is None or samples <= 0:
        return
    length = prompt + int(inputs.setting("eval.sample_max_new_tokens", 128))
    gb, how = kv_cache_gb(arch, inputs.b, samples, length)
    bld.add("sampling KV cache", gb, ["generate"], how)


# ---------------------------------------------------------------------------------------------
# Direct alignment
# ---------------------------------------------------------------------------------------------


def _reference_model(inputs: EstimateInputs, bld: EstimateBuilder) -> tuple[ParamCount | None, int]:
    """The reference model's counts: ``model.ref_name`` when it names another model, else the
    policy's (also when the other model's size cannot be known here, with a note)."""
    ref_name = inputs.setting("model.ref_name")
    if isinstance(ref_name, str) and ref_name != inputs.model_name:
        try:
            ref_pc = model_facts(ref_name).params
            return ref_pc, ref_pc.total
        except LabError as err:
            note = f"reference {ref_name}: {err.message} (counted as the policy's size)"
            bld.notes.append(note)
    return inputs.counts, inputs.params


def estimate_direct_alignment(inputs: EstimateInputs, bld: EstimateBuilder) -> int:
    """The policy trained on chosen + rejected rows (KTO: three); a frozen reference whose pass
    runs once before training, unless the loss is reference-free or its log-probs are cached;
    the sampling KV cache when evaluation samples."""
    algo = inputs.algorithm or inputs.setting("loss", "dpo")
    per_example = 3 if algo == "kto" else 2
    rows = int(inputs.setting("train.batch_size", 1)) * per_example
    seq = int(inputs.setting("data.max_length", 512))
    trainable = _train_on_packed_rows(inputs, bld, "policy", rows, seq)
    lora_base = reference_is_base(inputs.config, inputs.model_name)
    if algo in ("simpo", "orpo"):
        bld.notes.append(f"{algo} is reference-free: no reference model")
    elif inputs.reference_cached:
        bld.notes.append("reference log-probs come from the warm cache: no reference model")
    else:
        ref_pc, ref_params = _reference_model(inputs, bld)
        if not lora_base:
            bld.frozen("reference", ref_params, inputs.b, ["reference"])
        if ref_pc is not None and ref_pc.arch is not None:
            eval_rows = int(inputs.setting("eval.eval_batch_size", 8)) * per_example
            fwd = forward_gb(ref_pc.arch, inputs.b, eval_rows, seq, inputs.eager)
            positions = packed_positions(eval_rows, seq)
            lg, _ = logits_gb(ref_pc.arch, inputs.b, positions, grad=False)
            bld.add(
                "reference forward (no grad)",
                fwd + lg,
                ["reference"],
                f"{eval_rows} rows × {seq} tokens",
            )
        bld.notes.append(
            "LoRA: the reference pass runs on the policy with its adapters off (no copy), "
            "once before training, its log-probs cached"
            if lora_base
            else "the reference pass runs once before the policy is loaded (then it is freed "
            "and its log-probs cached), so it does not add to the training peak"
        )
    prompt = int(inputs.setting("data.max_prompt_length") or min(seq, 512))
    _add_sampling_kv_cache(inputs, bld, prompt)
    return trainable


# ---------------------------------------------------------------------------------------------
# SFT
# ---------------------------------------------------------------------------------------------


def estimate_sft(inputs: EstimateInputs, bld: EstimateBuilder) -> int:
    """The model trained on packed demonstrations; the sampling KV cache when evaluation
    samples."""
    rows = int(inputs.setting("train.batch_size", 1))
    seq = int(inputs.setting("data.max_length", 2048))
    trainable = _train_on_packed_rows(inputs, bld, "model", rows, seq)
    _add_sampling_kv_cache(inputs, bld, int(inputs.setting("eval.sample_max_input_tokens") or seq))
    return trainable


# ---------------------------------------------------------------------------------------------
# Policy gradients
# ---------------------------------------------------------------------------------------------


def _pg_spec(algorithm: str) -> AlgorithmSpec | None:
    """The policy-gradient algorithm's spec (None for a name the family lacks)."""
    try:
        return family_spec("policy_gradients").algorithm(algorithm)
    except KeyError:
        return None


def _rollout_kv_cache(
    inputs: EstimateInputs, arch: ModelArch, new_tokens: int, per_step: int
) -> tuple[float, str]:
    """The larger generation KV cache of a rollout batch and an evaluation batch (ReMax's
    greedy baseline batch, one row per prompt in calls no larger than the rollout's, never
    exceeds the rollout batch)."""
    prompt = inputs.prompt_tokens
    gen_rows = int(inputs.setting("rollout.generation_batch_size") or per_step)
    eval_rows = int(inputs.setting("eval.eval_batch_size", 32))
    eval_turn = inputs.setting("eval.max_new_tokens")
    eval_new = new_tokens if eval_turn is None else completion_tokens(inputs.config, eval_turn)
    sequences, length = max(
        (gen_rows, prompt + new_tokens),
        (eval_rows, prompt + eval_new),
        key=lambda t: t[0] * t[1],
    )
    return kv_cache_gb(arch, inputs.b, sequences, length)


def estimate_policy_gradients(inputs: EstimateInputs, bld: EstimateBuilder) -> int:
    """The policy trained on micro-batches of rollouts (a shared prompt forwarded once when
    checkpointing is off); a frozen reference when the KL term needs one; PPO's value model,
    trained beside the policy; the generation KV cache of rollouts or evaluation; the frozen
    reward model and gold reward model (``reward.model``, ``reward.gold_model``) with their
    scoring forward."""
    algo = inputs.algorithm or inputs.setting("algorithm", "grpo")
    prompt_tokens = inputs.prompt_tokens
    # a multi-turn trajectory holds its tool replies too (context with loss mask 0)
    new_tokens = completion_tokens(inputs.config)
    seq = prompt_tokens + new_tokens
    rows = int(inputs.setting("train.batch_size", 2))
    prompts = int(inputs.setting("rollout.prompts_per_step", 4))
    per_step = prompts * int(inputs.setting("rollout.num_rollouts", 8))
    # micro-batches per optimizer step: the rollout batch split into train.batch_size rows,
    # gradient_accumulation_steps of them per step (fewer when the batch is smaller)
    micro = min(int(inputs.setting("train.gradient_accumulation_steps", 4)), -(-per_step // rows))
    if not inputs.ckpt:
        # rows of a micro-batch that share a prompt forward it once
        # (trainers.core.logprobs.shared_prompt_hidden): at most min(rows, prompts_per_step)
        # distinct prompts, so the activations hold that many prompts plus every completion
        distinct = min(rows, prompts)
        seq = -(-(distinct * prompt_tokens + rows * new_tokens) // rows)
        bld.notes.append(
            f"training activations: at most {distinct} distinct prompt(s) per micro-batch of "
            f"{rows} rows, each prompt forwarded once"
        )
    shape = dict(rows=rows, seq=seq, accumulating=micro > 1, resident=["train", "generate"])
    logits = per_row_positions(rows, new_tokens)
    trainable = _trained(
        inputs, bld, "policy", inputs.params, inputs.arch, logit_positions=logits, **shape
    )
    spec = _pg_spec(str(algo))
    beta = float(inputs.setting("loss.beta", 0.0))
    if beta > 0 and (spec is None or spec.kl != "none"):  # DAPO, MaxRL: no KL, no reference
        if reference_is_base(inputs.config, inputs.model_name):
            bld.notes.append("LoRA: the reference is the policy with its adapters off (no copy)")
        else:
            bld.frozen("reference", inputs.params, inputs.b, ["train", "generate"])
    if spec is not None and spec.greedy_baseline:
        bld.notes.append(
            f"{algo}: one greedy completion per prompt each step as the baseline ({prompts} more "
            f"generations and reward scorings per step besides the {per_step} samples; generated "
            "after them, so their KV cache never adds to the rollout batch's)"
        )
    if spec is not None and spec.needs_value_model:
        trainable += _trained(
            inputs, bld, "value model", inputs.params, inputs.arch, logit_positions=0, **shape
        )
    if inputs.arch is not None:
        gb, how = _rollout_kv_cache(inputs, inputs.arch, new_tokens, per_step)
        bld.add("generation KV cache", gb, ["generate"], how)
    for key, label in (
        ("reward.model", "reward model"),
        ("reward.gold_model", "gold reward model"),
    ):
        name = inputs.setting(key)
        if isinstance(name, str) and name:
            _add_pg_reward_model(inputs, bld, label, name, prompt_tokens + new_tokens)
    bld.notes.append(f"prompts counted as {prompt_tokens} tokens (system prompt + question)")
    if is_multi_turn(inputs.config):
        bld.notes.append(
            f"multi-turn (env.name={inputs.setting('env.name')}): sequences of up to "
            f"{new_tokens} tokens after the prompt, model turns and tool replies together"
        )
    return trainable


def _add_pg_reward_model(
    inputs: EstimateInputs, bld: EstimateBuilder, label: str, name: str, seq: int
) -> None:
    """A policy-gradient run's frozen reward model: its weights, resident for the whole run,
    and its no-grad forward over ``reward.score_batch_size`` sequences, counted with generation
    (scoring follows it; an upper bound, the KV cache is freed by then). A name this machine
    cannot size (e.g. a ``run:`` reference not resolved yet) is a note."""
    try:
        rm = model_facts(name).params
    except LabError as err:
        bld.notes.append(f"{label} {name}: size unknown here ({err.message}); not counted")
        return
    bld.frozen(label, rm.total, inputs.b, ["train", "generate"])
    if rm.arch is not None:
        rows = int(inputs.setting("reward.score_batch_size", 16))
        fwd = forward_gb(rm.arch, inputs.b, rows, seq, inputs.eager)
        bld.add(f"{label} forward (no grad)", fwd, ["generate"], f"{rows} rows × {seq} tokens")


# ---------------------------------------------------------------------------------------------
# Reward models
# ---------------------------------------------------------------------------------------------


def estimate_reward_models(inputs: EstimateInputs, bld: EstimateBuilder) -> int:
    """The body (no LM head) trained with a scalar head on chosen + rejected rows (one row per
    example for outcome / process RMs); with ``freeze_backbone`` the body is frozen and only its
    no-grad forward counts."""
    kind = inputs.algorithm or inputs.setting("kind", "preference")
    per_example = 2 if kind == "preference" else 1
    rows = int(inputs.setting("train.batch_size", 2)) * per_example
    seq = int(inputs.setting("data.max_length", 512))
    pc, arch = inputs.counts, inputs.arch
    body = inputs.params - (pc.lm_head if pc is not None else 0)
    if pc is not None and pc.arch is not None and pc.lm_head == 0 and pc.arch.tie_word_embeddings:
        bld.notes.append("tied embeddings: the body keeps the embedding, the LM head is unused")
    if inputs.setting("freeze_backbone", False):
        bld.frozen("backbone", body, inputs.b, ["train"])
        if arch is not None:
            fwd = forward_gb(arch, inputs.b, rows, seq, inputs.eager)
            bld.add("backbone forward (no grad)", fwd, ["train"])
        bld.notes.append("freeze_backbone: only the head trains (its state is negligible)")
        return 0
    return _trained(
        inputs,
        bld,
        "reward model",
        body,
        arch,
        rows=rows,
        seq=seq,
        logit_positions=0,
        accumulating=inputs.accumulates(),
        resident=["train"],
    )


# ---------------------------------------------------------------------------------------------
# Rejection sampling
# ---------------------------------------------------------------------------------------------


def _scorer_model(config: TrainerConfig) -> str | None:
    """The reward model that scores completions, if any (a ``verifier`` scorer needs none)."""
    name = config.get("scorer.name")
    scorer = name if isinstance(name, str) and name != "verifier" else None
    return (
        scorer
        or config.get("reward_model.name")
        or config.leaf("reward_model_name")
        or config.leaf("reward_model")
    )


def _add_reward_model(inputs: EstimateInputs, bld: EstimateBuilder, name: str, seq: int) -> None:
    """The scoring reward model's weights and no-grad forward (a note when its size is
    unknown here)."""
    try:
        rm = model_facts(name).params
        bld.frozen("reward model", rm.total, inputs.b, ["score"])
        if rm.arch is not None:
            batch = int(inputs.config.leaf("score_batch_size", 2))
            fwd = forward_gb(rm.arch, inputs.b, batch, seq, inputs.eager)
            bld.add("reward model forward (no grad)", fwd, ["score"])
    except LabError as err:
        bld.notes.append(f"reward model {name}: size unknown here ({err.message})")


def estimate_rejection_sampling(inputs: EstimateInputs, bld: EstimateBuilder) -> int:
    """Three stages one after another: the policy generates (weights + KV cache), a reward
    model or a verifier scores, then the policy is fine-tuned on the selection (SFT)."""
    config, arch = inputs.config, inputs.arch
    new_tokens = int(config.leaf("max_new_tokens", 512))
    n = int(config.leaf("num_completions_per_prompt", 8))
    gen_prompts = int(config.leaf("rollout_batch_size", 8))
    bld.frozen("policy (generation)", inputs.params, inputs.b, ["generate"])
    if arch is not None:
        length = inputs.prompt_tokens + new_tokens
        gb, how = kv_cache_gb(arch, inputs.b, gen_prompts * n, length)
        bld.add("generation KV cache", gb, ["generate"], how)
    rm_name = _scorer_model(config)
    if isinstance(rm_name, str) and rm_name:
        _add_reward_model(inputs, bld, rm_name, inputs.prompt_tokens + new_tokens)
    else:
        bld.notes.append("scored by a verifier: no reward model")
    rows = int(config.leaf("batch_size", 1))
    seq = int(config.leaf("max_seq_length", 0) or config.leaf("max_length", 1024))
    trainable = _trained(
        inputs,
        bld,
        "policy (SFT)",
        inputs.params,
        arch,
        rows=rows,
        seq=seq,
        logit_positions=packed_positions(rows, seq),
        accumulating=inputs.accumulates("gradient_accumulation_steps"),
        resident=["train"],
    )
    bld.notes.append("stages run one after another: generate, score, then SFT on the selection")
    return trainable


# ---------------------------------------------------------------------------------------------
# Online DPO (a direct-alignment algorithm with its own memory hook) and distillation: a second
# model stays resident while training
# ---------------------------------------------------------------------------------------------


def estimate_online_dpo(inputs: EstimateInputs, bld: EstimateBuilder) -> int:
    """The policy trained on chosen + rejected samples; the frozen starting model resident for
    the whole run (its log-probs of new samples are needed every step, so nothing is cached),
    unless the pair loss is reference-free; the sampling KV cache of ``online.num_samples``
    completions per prompt of a step; the ranker's reward model (``reward.model``) and its
    scoring forward."""
    rows = 2 * int(inputs.setting("train.batch_size", 8))
    new = int(inputs.setting("online.max_new_tokens", 64))
    seq = int(inputs.setting("data.max_length", 512))
    prompt = max(seq - new, 1)
    shape = TrainingShape(
        rows=rows,
        seq=seq,
        logit_positions=packed_positions(rows, seq),
        accumulating=inputs.accumulates(),
        resident=["train", "generate"],
    )
    bld.trained("policy", inputs.params, inputs.arch, shape, inputs.precision())
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
        k = int(inputs.setting("online.num_samples", 2))
        prompts = int(inputs.setting("train.batch_size", 8))
        per_step = k * prompts * int(inputs.setting("train.gradient_accumulation_steps", 1))
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
    shape = TrainingShape(
        rows=rows,
        seq=seq,
        logit_positions=0,
        accumulating=inputs.accumulates(),
        resident=["train", "generate"],
    )
    bld.trained("student", inputs.params, arch, shape, inputs.precision())
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


FAMILY_ESTIMATORS: dict[str, FamilyEstimator] = {
    "direct_alignment": estimate_direct_alignment,
    "policy_gradients": estimate_policy_gradients,
    "reward_models": estimate_reward_models,
    "rejection_sampling": estimate_rejection_sampling,
    "sft": estimate_sft,
    "distillation": estimate_distillation,
}

# Estimators an algorithm's spec names as its own memory hook (instead of its family's).
HOOK_ESTIMATORS: dict[str, FamilyEstimator] = {
    "online_dpo": estimate_online_dpo,
}
