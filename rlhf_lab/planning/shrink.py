"""Turn a full recipe into a quick sanity run, with the diff and the number of optimizer steps
to expect.

The rules follow the reference book's habits for short runs, per family:

* direct alignment: a few hundred pairs (``data.max_samples`` 640), one epoch, shorter sequences,
  an effective batch of 16 so that 10-20 optimizer steps pass early (the acceptance window);
* SFT: the same shape as direct alignment (640 examples, one epoch);
* policy gradients: ``train.max_steps`` 20 rollout steps over a ``data.size`` of exactly that many
  prompts (10 on a tiny preset, with 64 new tokens; preference prompts become the offline
  ``builtin`` set there); ``reward.model`` is kept; against a reward model on a tiny preset, 20
  steps at lr 1e-4 (``RM_PRESET_LR``: 1e-3 diverged); from a trained run of a preset (an SFT warm
  start) a fine-tuning lr (``WARM_START_PG_LR``), 64 held-out prompts and the task that run was
  trained on (:func:`rlhf_lab.runs.lineage.trained_task_specs`) instead of the recipe's;
* reward models: fewer samples (512 pairs / solutions; ORM 128 prompts × 8 completions) and one
  epoch;
* rejection sampling: fewer training prompts, test prompts and completions per prompt, one SFT
  epoch;
* online DPO: direct alignment's rules with fewer prompts and shorter samples (from a trained
  run: the built-in prompts of its task);
* distillation: a few hundred prompts, 64-128 new tokens; on a preset the student's trained task
  (else the teacher's, else the warm start's) and a teacher that is a run of the same preset.

A recipe whose file says ``# lab: cpu_sized`` (:attr:`rlhf_lab.planning.catalog.Recipe.cpu_sized`) is a
CPU run on a preset already: onto a preset it is kept whole.

Everything runs often: evaluation every few steps, metrics every step, no intermediate
checkpoints. The model is kept unless ``model`` is given; a built-in preset (``tiny``,
``tiny-llama``, ``small``) also switches to the offline ``builtin:*`` data sets and to sizes,
lengths and learning rates that suit a ~1M-parameter model (direct alignment: the tested recipe
of ``rlhf_lab/demo.py``; SFT: the warm-start recipe's values). Another run's output
(``run:<id>`` or its ``final_model`` path) is shrunk like the model it was trained from (its
lineage, :func:`rlhf_lab.runs.lineage.base_model`): an SFT run of ``tiny`` counts as ``tiny``.

A pretrained model (neither a preset nor a run trained from one) then gets the rules of
:mod:`rlhf_lab.planning`: hub data that is not cached becomes the built-in set (or is refused with
the override to use), and on a CPU, sizes a 2-core machine finishes, LoRA for 50M+ parameters and
gradient checkpointing only when the memory estimate needs it. ``checkpoint.save_final_model``
stays on for every family whose runs the plan proposes to evaluate.

User ``overrides`` are applied after the rules (and after a base-model ``calibration``), so they
always win.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr

from rlhf_lab.errors import InvalidArgument, NextStep, Unavailable
from rlhf_lab.paths import LabError
from rlhf_lab.planning.catalog import Recipe, family_info, find_recipe
from rlhf_lab.planning.configs import (
    ConfigChange,
    ResolvedConfig,
    apply,
    config_model,
    resolve_config,
)
from rlhf_lab.planning.overrides import Override, format_override, texts
from rlhf_lab.planning.real_model import pretrained_model_rules
from rlhf_lab.planning.steps import (
    StepsEstimate,
    estimate_steps,
    expected_optimizer_steps,
)
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.planning.validation import check_config
from trainers.core.config import apply_overrides
from trainers.core.spec import spec_for

__all__ = [
    "ShrinkResult",
    "StepsEstimate",
    "estimate_steps",
    "expected_optimizer_steps",
    "format_override",
    "shrink_config",
]

_MISSING = object()


class ShrinkResult(BaseModel):
    family: str
    algorithm: str
    recipe: Recipe
    model: str | None = Field(description="model.name of the shrunk config")
    model_swap: str | None = Field(description="the model asked for (None: kept)")
    overrides: list[str] = Field(
        description="every override applied to the recipe, in order: the shrink rules, then the "
        "user's overrides"
    )
    shrink_overrides: list[str]
    user_overrides: list[str]
    config: dict[str, Any] = Field(description="the validated shrunk config")
    diff: list[ConfigChange] = Field(description="changes from the shipped recipe")
    expected_optimizer_steps: int | None
    expected_progress_steps: int | None = Field(
        description="the total_steps the trainer's progress.json will report"
    )
    progress_unit: str = Field(description="what progress.json counts for this family")
    steps_detail: str
    notes: list[str] = Field(default_factory=list)
    _rules: list[Override] = PrivateAttr(default_factory=list)

    @property
    def shrink_rules(self) -> list[Override]:
        """The shrink's own overrides (``shrink_overrides``) as pairs."""
        return list(self._rules)

    @property
    def trainer_config(self) -> TrainerConfig:
        """The shrunk config as the view memory, time and the checks read."""
        return TrainerConfig(self.family, self.config)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _cap(current: Any, limit: int) -> int:
    """``min(current, limit)``; ``None`` (meaning "all") becomes ``limit``."""
    if current is None or not isinstance(current, (int, float)):
        return limit
    return int(min(current, limit))


def _is_preset(model: str | None) -> bool:
    """Whether ``model`` is a built-in preset, or another run's output trained from one (its
    lineage: ``run:<id>`` or a run's ``final_model`` path, followed back to the first model)."""
    if not model:
        return False
    from rlhf_lab.runs.lineage import base_model
    from trainers.core.tiny import PRESETS

    return base_model(model) in PRESETS


class _Rules:
    """Collects ``key -> value`` rules against the config they shrink (``base``), keeping only
    keys the config has and values that change something."""

    def __init__(self, base: TrainerConfig) -> None:
        self.base = base
        self.items: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.items.get(key, self.base.get(key, default))

    def set(self, key: str | None, value: Any) -> None:
        if key is None or not self.base.has(key):
            return
        self.items[key] = value

    def cap(self, key: str | None, limit: int) -> None:
        if key is None:
            return
        self.set(key, _cap(self.base.get(key), limit))

    def cap_all(self, limits: dict[str, int]) -> None:
        for key, limit in limits.items():
            self.cap(key, limit)

    def overrides(self) -> list[Override]:
        return [Override.of(k, v) for k, v in self.items.items() if self.base.get(k, _MISSING) != v]

    def preview(self, *extra: Override) -> TrainerConfig:
        """The config with the rules so far and ``extra`` applied (unvalidated: a rule's
        estimate; a ConfigError where an override lands under a value)."""
        data = apply_overrides(self.base.to_data(), texts([*self.overrides(), *extra]))
        return TrainerConfig(self.base.family, data)


def _common_quiet(r: _Rules, big_model: bool) -> None:
    r.set("logging.log_every", 1)
    r.set("checkpoint.save_every", None)
    if big_model:
        r.set("checkpoint.save_final_model", False)


def _swap_model(r: _Rules, model: str, preset: bool) -> None:
    r.set("model.name", model)
    r.set("model.ref_name", None)  # the reference is the starting model (an SFT run's output)
    if preset:
        r.set("model.gradient_checkpointing", False)
        if r.base.get("model.chat_template_source") is not None:
            r.set("model.chat_template_source", None)  # presets ship a chat template


# ---------------------------------------------------------------------------------------------
# Per-family rules
# ---------------------------------------------------------------------------------------------


def _supervised_schedule(r: _Rules) -> None:
    """One epoch, an evaluation every 10 steps and two samples every 20 (direct alignment, SFT)."""
    r.set("train.num_epochs", 1)
    r.set("eval.eval_every", 10)
    r.set("eval.sample_every", 20)
    r.cap("eval.num_samples", 2)


def _direct_alignment(r: _Rules, algorithm: str, preset: bool, notes: list[str]) -> None:
    _supervised_schedule(r)
    if preset:
        # the tested recipe of rlhf_lab/demo.py (DPO_SANITY_OVERRIDES)
        r.set("data.dataset", family_info("direct_alignment").builtin_datasets["*"])
        r.set("data.max_samples", 640)
        r.set("data.eval_size", 128)
        r.set("data.max_length", 160)
        r.set("train.batch_size", 16)
        r.set("train.gradient_accumulation_steps", 1)
        r.set("train.learning_rate", 3.0e-4)
        r.set("eval.sample_max_new_tokens", 48)
        if algorithm != "dpo":
            notes.append(
                f"the tiny-model settings (lr 3e-4, batch 16) were tested with dpo; {algorithm} "
                "may want a different learning rate"
            )
    else:
        r.cap_all(
            {
                "data.max_samples": 640,
                "data.eval_size": 64,
                "data.max_length": 512,
                "train.batch_size": 4,
                "train.gradient_accumulation_steps": 4,
                "eval.sample_max_new_tokens": 128,
            }
        )
    _common_quiet(r, big_model=not preset)


_TOOL_SFT = "builtin:tool-sft"  # trainers.sft.config.TOOL_DATASET


def _sft(r: _Rules, algorithm: str, preset: bool, notes: list[str]) -> None:
    _supervised_schedule(r)
    if preset:
        # the values of the tiny warm-start recipe (trainers.sft.train.warm_start_overrides)
        tools = str(r.get("data.dataset") or "").startswith(_TOOL_SFT)
        r.set("data.dataset", family_info("sft").builtin_datasets["*"])
        r.set("data.max_samples", 640)
        r.set("data.eval_size", 64)
        # tool demonstrations carry the tool's instructions: up to ~255 tokens with tiny's tokenizer
        r.set("data.max_length", 320 if tools else 160)
        r.set("train.batch_size", 16)
        r.set("train.gradient_accumulation_steps", 1)
        r.set("train.learning_rate", 3.0e-3)
        r.set("train.warmup_ratio", 0.05)
        r.set("eval.sample_max_new_tokens", 64)
    else:
        r.cap_all(
            {
                "data.max_samples": 640,
                "data.eval_size": 64,
                "data.max_length": 1024,
                "train.gradient_accumulation_steps": 4,
                "eval.sample_max_new_tokens": 128,
            }
        )
    _common_quiet(r, big_model=not preset)


# Against a learned reward model on a tiny preset (the rlhf pipeline's PPO/GRPO stage): lr 1e-3
# drove PPO's kl_ref from 0 to 100+ in 20 steps (degenerate samples); at 1e-4 over 20 steps PPO
# and GRPO raised the reward model's held-out score with kl_ref below ~6 nats (tiny, seed 42).
RM_PRESET_LR = 1.0e-4
RM_PRESET_STEPS = 20


def _policy_gradients(r: _Rules, algorithm: str, preset: bool, notes: list[str]) -> None:
    reward_model = r.get("reward.model")
    against_rm = preset and isinstance(reward_model, str) and bool(reward_model)
    steps = RM_PRESET_STEPS if against_rm else 10 if preset else 20
    prompts = int(r.get("rollout.prompts_per_step", 4) or 4)
    r.set("train.num_epochs", 1)
    r.cap("train.max_steps", steps)
    r.cap("data.size", prompts * steps)
    r.cap("data.eval_size", 16 if preset else 32)
    r.set("eval.eval_every", 5)
    r.cap("eval.num_samples", 2)
    if preset:
        r.set("rollout.max_new_tokens", 64)
        r.set("eval.max_new_tokens", None)
        if against_rm:
            r.set("train.learning_rate", RM_PRESET_LR)
            notes.append(
                "lr 1e-4 against a learned reward model on tiny (lr 1e-3 made PPO's kl_ref blow "
                "up and its samples degenerate); watch kl_ref and the samples"
            )
        elif _from_run(r.get("model.name")):
            _warm_start(r, notes)
        else:
            r.set("train.learning_rate", 1.0e-3)  # what the PG train tests use on tiny
            notes.append(
                _cold_start(r.get("model.name"))
                + "lr 1e-3 (the value the policy-gradient tests use on tiny) is a starting point, "
                "not a tuned value"
            )
        if r.get("data.source") == "preference":
            r.set("data.dataset", "builtin")  # the offline prompts of the built-in pairs
    elif _from_run(r.get("model.name")) and not against_rm:
        # a warm start of a pretrained model: its trained task, the model's own sizes and lr
        _trained_task(r, notes)
    if _greedy_baseline(algorithm):
        notes.append(
            f"{algorithm} also generates and scores one greedy completion per prompt each rollout "
            "step (its baseline): prompts_per_step × (num_rollouts + 1) generations per step"
        )
    if isinstance(reward_model, str) and reward_model:
        notes.append(
            f"reward.model={reward_model} is kept (a shrink never swaps the reward model)"
            + (
                ": on a tiny preset pass a tiny reward model, e.g. the preference_rm recipe "
                "shrunk on tiny, then the override reward.model=run:<its run id>"
                if preset
                else ""
            )
        )
    _common_quiet(r, big_model=not preset)


# A policy-gradient run from a trained run of a preset (an SFT warm start) on a verifier task.
# lr 1e-3 (the random-init value below) took every arm of the campaign
# experiments/2026-11-26-new-pg-algorithms-tiny.md from the warm start's held-out correctness
# 0.44 to at most 0.09 in 10 steps. Measured on the tiny warm start (greedy held-out correctness,
# 64 prompts, 10 steps, seed 42; reinforce_pp, reinforce_pp_baseline, remax, gmpo, grpo): from
# 0.44 to 0.25-0.36 at lr 1e-4 and to 0.27-0.34 at 3e-5 (every arm), 0.44 kept at lr ~0; at 1e-5
# the runs hold it (experiments/2026-11-26-new-pg-algorithms-warmstart.md).
WARM_START_PG_LR = 1.0e-5
# Held-out prompts of such a run: a warm start answers some (0.44 on the tiny warm start), so
# its held-out correctness is the result, and 16 prompts leave a ±0.23 interval on a change.
WARM_START_EVAL_SIZE = 64


def _warm_start(r: _Rules, notes: list[str]) -> None:
    """A policy-gradient run from a trained run of a preset: a fine-tuning learning rate, and
    prompts from the task the run was trained on (its lineage) rather than the recipe's."""
    model = r.get("model.name")
    r.set("train.learning_rate", WARM_START_PG_LR)
    r.set("data.eval_size", WARM_START_EVAL_SIZE)
    notes.append(
        f"{model} is a trained run: lr {WARM_START_PG_LR:g}, a fine-tuning rate (on the tiny SFT "
        "warm start 1e-3, the value for a random-init preset, undid its held-out correctness in "
        "10 steps, and 1e-4 and 3e-5 still lowered it)"
    )
    _trained_task(r, notes)


def _trained_task(r: _Rules, notes: list[str]) -> None:
    """Prompts from the task the run in ``model.name`` was trained on (its lineage), for a warm
    start of a preset or of a pretrained model alike."""
    from rlhf_lab.runs.lineage import trained_task_specs

    model = r.get("model.name")
    if r.get("data.source", "reasoning_gym") != "reasoning_gym":
        return
    specs = trained_task_specs(model)
    if specs is None:
        configured = ", ".join(str(s.get("name")) for s in r.get("data.specs") or [])
        notes.append(
            f"the task {model} was trained on cannot be read (not a reasoning-gym set, or the run "
            f"is not created yet): data.specs stays as configured ({configured})"
        )
        return
    r.set("data.specs", specs)
    names = ", ".join(str(spec.get("name")) for spec in specs)
    notes.append(f"prompts from the task {model} was trained on ({names}), read from its lineage")


def _reward_models(r: _Rules, algorithm: str, preset: bool, notes: list[str]) -> None:
    r.set("train.num_epochs", 1)
    r.set("eval.eval_every", 10)
    if preset:
        builtin = family_info("reward_models").builtin_datasets.get(algorithm)
        r.set("data.dataset", builtin)
        r.set("train.batch_size", 16)
        r.set("train.gradient_accumulation_steps", 1)
        r.set("train.learning_rate", 3.0e-4)
        if algorithm == "orm":
            r.set("data.max_samples", 400)
            r.set("data.eval_size", 64)
            r.set("data.rollouts_per_prompt", 4)
            r.set("data.max_length", 256)
        else:
            r.set("data.max_samples", 640)
            r.set("data.eval_size", 64)
            r.set("data.max_length", 256 if algorithm == "prm" else 160)
        notes.append("lr 3e-4 for a tiny reward model is a starting point, not a tuned value")
    elif algorithm == "orm":
        r.cap("data.max_samples", 128)
        r.cap("data.eval_size", 16)
        r.cap("data.rollouts_per_prompt", 8)
    else:
        r.cap("data.max_samples", 512)
        r.cap("data.eval_size", 64)
    _common_quiet(r, big_model=not preset)


def _rejection_sampling(r: _Rules, algorithm: str, preset: bool, notes: list[str]) -> None:
    find = r.base.find_key
    r.cap(find("max_train_samples"), 64)
    r.cap(find("max_test_samples"), 32)
    r.cap(find("num_completions_per_prompt"), 4)
    r.cap(find("top_k"), 64)
    r.set(find("num_epochs"), 1)
    if preset:
        r.cap(find("max_new_tokens"), 64)
        r.cap(find("eval_max_new_tokens"), 64)
        r.set("data.dataset", family_info("rejection_sampling").builtin_datasets["*"])
        if not _from_run(r.get("model.name")):
            notes.append(
                "a random-init preset gets nothing right, so there is nothing to select: warm-start "
                "it first (trainers/sft/configs/sft_tiny_warmstart.yaml, then override "
                "model.name=run:<its run id>)"
            )
    _common_quiet(r, big_model=not preset)


def _online_dpo(r: _Rules, algorithm: str, preset: bool, notes: list[str]) -> None:
    """Direct alignment's rules, then shorter samples; on a preset the verifier ranks the
    built-in prompts, which only a warm-started policy answers differently twice."""
    _direct_alignment(r, "dpo", preset, notes)  # its learning rate is set below
    r.set("eval.sample_every", 10)
    if preset:
        r.set("data.max_samples", 256)
        r.set("data.eval_size", 32)
        r.set("online.max_new_tokens", 48)
        r.set("train.learning_rate", 1.0e-4)
        _task_of_lineage_as_pairs(r, notes)
        if not _from_run(r.get("model.name")):
            notes.append(
                "a random-init preset gets every answer wrong, so the verifier ties nearly every "
                "pair (tie_frac near 1): start from an SFT warm start (the sft_tiny_warmstart "
                "recipe, then the override model.name=run:<its run id>)"
            )
    else:
        r.cap("online.max_new_tokens", 128)
        r.cap("data.max_samples", 256)


def _task_of_lineage_as_pairs(r: _Rules, notes: list[str]) -> None:
    """Online DPO from a trained run: the built-in prompts of the task that run was trained on
    (its lineage), with its settings (``data.builtin_task_configs``)."""
    from rlhf_lab.runs.lineage import trained_task_specs

    model = r.get("model.name")
    specs = trained_task_specs(model) if _from_run(model) else None
    if not specs:
        return
    names = [str(spec["name"]) for spec in specs]
    r.set(
        "data.dataset", f"{family_info('direct_alignment').builtin_datasets['*']}:{','.join(names)}"
    )
    r.set("data.builtin_task_configs", {str(s["name"]): dict(s.get("config") or {}) for s in specs})
    notes.append(
        f"prompts from the task {model} was trained on ({', '.join(names)}), read from its lineage"
    )


def _warm_start_specs() -> list[dict[str, Any]]:
    """The reasoning-gym tasks and settings of the tiny SFT warm start, read from its shipped
    recipe (its ``data.builtin_task_configs``), as a distillation ``data.specs`` list."""
    config = resolve_config(find_recipe("sft_tiny_warmstart"), []).config
    tasks = config.get("data.builtin_task_configs") or {}
    return [{"name": name, "config": conf} for name, conf in tasks.items()]


def _distillation_specs(student: Any, teacher: Any) -> list[dict[str, Any]]:
    """The task a distillation on a preset draws its prompts from: the student's trained task
    (its lineage), else the teacher's, else the tiny SFT warm start's."""
    from rlhf_lab.runs.lineage import trained_task_specs

    return trained_task_specs(student) or trained_task_specs(teacher) or _warm_start_specs()


def _distillation(r: _Rules, algorithm: str, preset: bool, notes: list[str]) -> None:
    """A few hundred prompts, 64 new tokens; on a preset the warm start's task, and a teacher
    that must come from a run of the same preset (another model cannot score its tokens)."""
    r.set("train.num_epochs", 1)
    r.set("eval.eval_every", 10)
    r.cap("eval.num_samples", 2)
    r.cap("data.eval_size", 64 if preset else 32)
    r.cap("rollout.max_new_tokens", 64 if preset else 128)
    if preset:
        r.set("data.source", "reasoning_gym")
        r.set("data.dataset", None)
        r.set("data.specs", _distillation_specs(r.get("model.name"), r.get("teacher.name")))
        r.set("data.size", 640)
        r.set("train.batch_size", 16)
        r.set("train.gradient_accumulation_steps", 1)
        r.set("train.learning_rate", 1.0e-3)
        teacher = r.get("teacher.name")
        if not _from_run(teacher):
            r.set("teacher.name", r.get("model.name"))
            notes.append(
                f"teacher.name={teacher} cannot score a preset's tokens (another tokenizer): set "
                "to the student's preset for a smoke run; a real one distils a trained run of "
                "that preset (the sft_tiny_warmstart recipe, then the override "
                "teacher.name=run:<its run id>)"
            )
    else:
        r.cap("data.size", 320)
        r.cap("train.gradient_accumulation_steps", 2)
    _common_quiet(r, big_model=not preset)


def _from_run(model: Any) -> bool:
    """``model`` is another run's output (``run:<id>`` or a run's final_model path)."""
    from rlhf_lab.runs.lineage import is_ref, run_of_path

    return is_ref(model) or run_of_path(model) is not None


def _cold_start(model: Any) -> str:
    """The policy-gradient note on a random-init preset ("" when it starts from a run's output,
    an SFT warm start)."""
    if _from_run(model):
        return ""
    return (
        "a tiny preset is randomly initialised: expect little reward contrast "
        "(frac_reward_zero_std near 1) unless it starts from an SFT warm start (run the "
        "sft_tiny_warmstart recipe, then override model.name=run:<its run id>, or run the "
        "r1-zero pipeline); "
    )


def _greedy_baseline(algorithm: str) -> bool:
    """Whether the algorithm's spec adds a greedy rollout per prompt (ReMax)."""
    try:
        return spec_for(algorithm).greedy_baseline
    except KeyError:
        return False


def _shrink_hook(family: str, algorithm: str) -> str:
    """The shrink rule set of ``algorithm`` as its spec names it (the family's by default)."""
    try:
        spec = spec_for(algorithm)
    except KeyError:
        return family
    return spec.shrink_key if spec.family == family else family


# Shrink rule sets by the specs' shrink hook (each family's spec names its own by default).
_RULES = {
    "direct_alignment": _direct_alignment,
    "sft": _sft,
    "policy_gradients": _policy_gradients,
    "reward_models": _reward_models,
    "rejection_sampling": _rejection_sampling,
    "online_dpo": _online_dpo,
    "distillation": _distillation,
}


# ---------------------------------------------------------------------------------------------
# Shrinking
# ---------------------------------------------------------------------------------------------


def _user_model(overrides: list[Override]) -> str | None:
    """The last ``model.name`` the overrides set to a name (None: none)."""
    model = None
    for o in overrides:
        if o.key == "model.name" and isinstance(o.value, str):
            model = o.value
    return model


def _keep_final_model(rules: _Rules, family: str) -> None:
    """The plan proposes an evaluation of every run of a family with evaluation suites: its
    final model is kept for it (an override of the user's still wins)."""
    from rlhf_lab.evaluation.cost import suites_for_family

    if suites_for_family(family):
        rules.set("checkpoint.save_final_model", True)


def _pre_shrink_base(
    recipe: Recipe, user: list[Override]
) -> tuple[ResolvedConfig, LabError | None]:
    """The config the shrink rules read: the recipe with the user's values. A value valid only
    beside what the shrink changes (``data.builtin_task_configs`` needs the offline set the shrink
    picks for a hub dataset this machine does not have) is refused by the recipe alone; then the
    rules read the recipe with the user's values laid over it unchecked, and the refusal is
    returned, to be raised as it was if the shrunk config does not validate either."""
    try:
        return resolve_config(recipe, user), None
    except LabError as err:
        refused = err
    try:
        plain = resolve_config(recipe, [])
        data = apply(plain.data, user)
    except LabError:
        raise refused from None
    unchecked = plain.model_copy(update={"data": data, "overrides": texts(user)})
    unchecked._validated = None  # the user's values are laid over it unchecked
    return unchecked, refused


def shrink_config(
    recipe_or_file: str | Path | Recipe,
    overrides: Sequence[Override] = (),
    model: str | None = None,
    *,
    calibration: Iterable[Override] | None = None,
) -> ShrinkResult:
    """Shrink a recipe into a quick sanity run.

    ``model``: swap the model (None keeps the recipe's; a preset such as ``tiny`` also switches
    to the offline data sets and tiny-model sizes). ``overrides``: the user's ``--set`` items as
    pairs (parsed at the surface: :func:`~rlhf_lab.planning.overrides.as_overrides`), applied
    last. Raises :class:`LabError` for an unknown recipe, a family whose config model
    does not exist yet, a shrunk config that does not validate, a model that cannot be resolved
    or a length above the model's context (:func:`rlhf_lab.planning.validation.check_config`); an
    implausible learning rate is a note. ``calibration``: overrides measured on the base model
    (e.g. ``rollout.max_new_tokens`` from its response lengths), applied after the shrink rules
    and before the user's.
    """
    recipe = find_recipe(recipe_or_file)
    user = list(overrides)
    config_model(recipe.family)  # a clear LabError when the family has no config model yet
    base, refused = _pre_shrink_base(recipe, user)  # the rules see the user's values
    swap = model or _user_model(user)
    preset = _is_preset(swap)  # a run's output trained from a preset counts as that preset

    notes: list[str] = []
    rules = _Rules(base.config)
    if model:
        _swap_model(rules, model, preset)
    elif preset:  # model.name=<preset> came with --set: treat it as the swap
        _swap_model(rules, swap, preset=True)
    hook = _shrink_hook(recipe.family, base.algorithm)
    family_rules = _RULES.get(hook)
    if family_rules is None:
        raise Unavailable(
            f"no shrink rules for family {recipe.family}",
            next=NextStep("launch_run", {"recipe": recipe.id}, note="without shrinking"),
        )
    kept_whole = recipe.cpu_sized and (preset or not swap)
    if kept_whole:
        notes.append(
            f"{recipe.id} is already sized for a CPU run on a preset: its length and data are "
            "kept (a shorter warm start leaves the answer format unlearnt)"
        )
    else:
        family_rules(rules, base.algorithm, preset, notes)
    if not kept_whole and not _is_preset(rules.get("model.name")):
        pretrained_model_rules(rules, recipe.family, base.algorithm, user, notes)
    _keep_final_model(rules, recipe.family)
    shrink = rules.overrides() + list(calibration or [])
    shrink_texts, user_texts = texts(shrink), texts(user)

    try:
        final = resolve_config(recipe, shrink + user)
    except LabError as err:
        if refused is not None:  # the user's values were refused before the shrink: say that
            raise refused from None
        raise InvalidArgument(
            f"the shrunk {recipe.id} config does not validate: {err.message}\n(shrink "
            f"overrides: {' '.join(shrink_texts) or 'none'}; yours: "
            f"{' '.join(user_texts) or 'none'}). Adjust the overrides.",
            next=NextStep(
                "shrink_config",
                {"recipe": recipe.id, "overrides": user_texts},
                note="with overrides that fix the values named above",
            ),
        ) from None
    # models that resolve, lengths within the model's context, plausible learning rates
    notes.extend(check_config(recipe.family, final.config).warnings)
    steps = estimate_steps(recipe.family, final.config)
    name = final.config.get("model.name")
    if not model and not preset:
        swap = None  # a non-preset model.name given with --set is an ordinary override
    result = ShrinkResult(
        family=recipe.family,
        algorithm=final.algorithm,
        recipe=recipe,
        model=name if isinstance(name, str) else None,
        model_swap=swap,
        overrides=shrink_texts + user_texts,
        shrink_overrides=shrink_texts,
        user_overrides=user_texts,
        config=final.data,
        diff=final.diff,
        expected_optimizer_steps=steps.optimizer_steps,
        expected_progress_steps=steps.progress_steps,
        progress_unit=steps.progress_unit,
        steps_detail=steps.detail,
        notes=notes,
    )
    result._rules = shrink
    return result
