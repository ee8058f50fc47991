"""What the models of an evaluation are: a run folder, a ``final_model`` folder or a model name;
the run's family, config and starting model; a judge that must be a reward model; two tokenizers
that must be the same. Every check here runs before the job writes anything and fails with a
:class:`~trainers.core.config.ConfigError` that names the input.

Torch-free except :func:`same_tokenizer` (which loads two tokenizers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trainers.core.config import ConfigError, read_yaml, validate_config
from trainers.core.models import ModelError, resolve_model

FINAL_MODEL = "final_model"

# family -> (module, config class); the order is the one a config.yaml is tried in when the run
# folder has no run.json (a trainer run without the lab): the configs forbid unknown keys, so
# only the right family validates.
FAMILY_CONFIGS: dict[str, tuple[str, str]] = {
    "policy_gradients": ("trainers.policy_gradients.config", "PolicyGradientConfig"),
    "direct_alignment": ("trainers.direct_alignment.config", "DirectAlignmentConfig"),
    "sft": ("trainers.sft.config", "SFTConfig"),
    "reward_models": ("trainers.reward_models.config", "RewardModelConfig"),
    "rejection_sampling": ("trainers.rejection_sampling.config", "RejectionSamplingConfig"),
}


def family_config_model(family: str) -> type[BaseModel]:
    import importlib

    module, name = FAMILY_CONFIGS[family]
    return getattr(importlib.import_module(module), name)


@dataclass
class ModelRef:
    """A model to load: ``model`` is what the loaders get; ``run_dir`` / ``family`` /
    ``run_config`` describe the run that produced it, when it is a run's."""

    given: str
    model: str
    run_dir: Path | None = None
    family: str | None = None
    run_config: Any = None

    @property
    def is_run(self) -> bool:
        return self.run_dir is not None

    def describe(self) -> dict[str, Any]:
        return {
            "given": self.given,
            "model": self.model,
            "run_dir": str(self.run_dir) if self.run_dir else None,
            "family": self.family,
        }


def _run_family(run_dir: Path) -> tuple[str, Any]:
    """The family of a run folder and its parsed config (run.json names the family when the lab
    launched it; else the config that validates)."""
    data = read_yaml(run_dir / "config.yaml")
    family = None
    run_json = run_dir / "run.json"
    if run_json.is_file():
        try:
            family = json.loads(run_json.read_text()).get("family")
        except (OSError, json.JSONDecodeError):
            family = None
    candidates = [family] if family in FAMILY_CONFIGS else list(FAMILY_CONFIGS)
    for name in candidates:
        try:
            return name, validate_config(data, family_config_model(name), str(run_dir))
        except ConfigError:
            continue
    raise ConfigError(
        f"{run_dir}/config.yaml is not the config of any trainer family here "
        f"({', '.join(FAMILY_CONFIGS)}); pass the model folder itself"
    )


def resolve_ref(given: str, role: str) -> ModelRef:
    """``given`` as a :class:`ModelRef`; ConfigError when it points at nothing loadable."""
    path = Path(given).expanduser()
    run_dir: Path | None = None
    if path.is_dir() and (path / "config.yaml").is_file() and not (path / "config.json").is_file():
        run_dir = path
        model_dir = path / FINAL_MODEL
        if not (model_dir / "config.json").is_file():
            raise ConfigError(
                f"{role} {given!r} is a run folder with no final model ({FINAL_MODEL}/ is "
                "missing: the run has not finished, failed or was stopped, or ran with "
                "checkpoint.save_final_model=false). Evaluate a finished run, or pass a model."
            )
    elif path.name == FINAL_MODEL and (path.parent / "config.yaml").is_file():
        run_dir, model_dir = path.parent, path
    if run_dir is not None:
        family, cfg = _run_family(run_dir)
        return ModelRef(given, str(model_dir.absolute()), run_dir.absolute(), family, cfg)
    try:
        source = resolve_model(given)
    except ModelError as err:
        raise ConfigError(f"{role}: {err}") from None
    if source.kind == "hub":
        from trainers.core.models import _pretrained_args

        try:
            _pretrained_args(source, ("config.json",))  # offline and not cached: say so now
        except ModelError as err:
            raise ConfigError(f"{role}: {err}") from None
    return ModelRef(given, given)


def starting_model(ref: ModelRef) -> str:
    """The model the target run started from (``model.name`` of its config)."""
    if not ref.is_run:
        raise ConfigError(
            f"baseline=auto means the target run's starting model, but the target {ref.given!r} "
            "is a model, not a run folder; name the baseline"
        )
    if ref.family == "reward_models":
        raise ConfigError(f"{ref.given!r} is a reward-model run: it has no starting policy")
    return str(ref.run_config.model.name)


def check_policy(ref: ModelRef, role: str) -> None:
    """A reward model's folder is not a policy to sample from."""
    if ref.family == "reward_models" or (Path(ref.model) / "reward_model.json").is_file():
        raise ConfigError(
            f"{role} {ref.given!r} is a reward model, not a policy; evaluate a policy (pass a "
            "reward model as the judge)"
        )


JUDGE_KINDS = ("preference", "orm")


def saved_reward_model(given: str, label: str, fix: str) -> tuple[Path, dict]:
    """(folder, ``reward_model.json``) of the saved reward model ``given`` names: a reward-model
    run folder or its ``final_model/``. ConfigError, starting with ``label`` and ending with
    ``fix``, when it holds no reward model or its metadata cannot be read."""
    path = Path(given).expanduser()
    if (path / "config.yaml").is_file() and (path / FINAL_MODEL).is_dir():
        path = path / FINAL_MODEL
    meta_path = path / "reward_model.json"
    if not meta_path.is_file():
        raise ConfigError(f"{label} {given!r} is not a reward model (no reward_model.json): {fix}")
    try:
        return path, json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{label} {given!r}: {meta_path} cannot be read ({err})") from None


def check_judge(given: str) -> tuple[str, dict]:
    """The judge's model folder and its ``reward_model.json``; ConfigError unless it is a saved
    scalar reward model (preference or orm)."""
    path, meta = saved_reward_model(
        given,
        "judge",
        "pass a reward-model run folder or its final_model/ (trainers.reward_models, kind "
        "preference or orm)",
    )
    if meta.get("kind") not in JUDGE_KINDS:
        raise ConfigError(
            f"judge {given!r} is a {meta.get('kind')!r} reward model; a judge scores whole "
            f"responses with one number: use a {' or '.join(JUDGE_KINDS)} reward model"
        )
    return str(path.absolute()), meta


def same_tokenizer(a: str, b: str) -> str | None:
    """None when models ``a`` and ``b`` tokenize alike (same vocabulary and special tokens),
    else one line saying how they differ."""
    from trainers.core.models import load_tokenizer

    ta, tb = load_tokenizer(a), load_tokenizer(b)
    va, vb = ta.get_vocab(), tb.get_vocab()
    if va != vb:
        only_a, only_b = len(set(va) - set(vb)), len(set(vb) - set(va))
        return (
            f"vocabularies differ ({len(va)} vs {len(vb)} tokens; {only_a} only in the first, "
            f"{only_b} only in the second, or the same tokens with other ids)"
        )
    if (ta.eos_token_id, ta.bos_token_id) != (tb.eos_token_id, tb.bos_token_id):
        return "special tokens differ (eos/bos)"
    return None
