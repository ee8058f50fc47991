"""Config loading shared by every family: YAML + dotted overrides, validated by pydantic.

Torch-free on purpose: the lab imports this module to validate configs without loading torch.

A family declares its config as a subclass of :class:`StrictModel` (unknown keys are errors).
``load_config(path, Model, ["train.learning_rate=1e-5"])`` reads the YAML, applies the overrides
and validates. Every failure raises :class:`ConfigError` with one message that names the bad
field and, for a misspelt key, the closest valid names.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

M = TypeVar("M", bound=BaseModel)
# "1e-5", "1.5E3", ".5e1" (YAML 1.1 reads them as strings). A run of digits matches only one
# way here; "\d+\.?\d*" could split it anywhere and took seconds on a long number.
_FLOAT_RE = re.compile(r"^[-+]?(\d+(?:\.\d*)?|\.\d+)[eE][-+]?\d+$")


class ConfigError(ValueError):
    """A config could not be loaded or validated. The message says what to change."""


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are rejected, assignment is validated, and a
    float must be finite (an inf learning rate or a NaN beta only fails later, inside training)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# ---------------------------------------------------------------------------------------------
# Sections shared by several families
# ---------------------------------------------------------------------------------------------


class LoraSection(StrictModel):
    """Low-rank adapters (peft's LoRA) on the model's linear layers instead of full fine-tuning.

    With ``enabled`` the base weights are frozen, only the adapters (and a reward or value
    head) train, the reference is the base with the adapters switched off, and the run saves
    both the adapter and the merged model (``trainers/core/lora.py``)."""

    enabled: bool = Field(default=False, description="train LoRA adapters (default: full)")
    rank: int = Field(default=16, ge=1, description="r, the adapters' rank")
    alpha: float = Field(default=32.0, gt=0, description="scaling numerator: ΔW = (α/r)·BA")
    dropout: float = Field(default=0.05, ge=0, lt=1, description="dropout on the adapters' input")
    target_modules: list[str] | Literal["all-linear"] | None = Field(
        default=None,
        description="linear layers to adapt, by name (q_proj ...); None: the architecture's "
        "default (attention + MLP projections), 'all-linear': every linear but the LM head",
    )

    @model_validator(mode="after")
    def _settings_need_enabled(self) -> LoraSection:
        """A LoRA setting given while LoRA is off would be ignored without a word."""
        fields = type(self).model_fields
        given = sorted(
            k
            for k in self.model_fields_set - {"enabled"}
            if getattr(self, k) != fields[k].get_default(call_default_factory=True)
        )
        if given and not self.enabled:
            keys = ", ".join(f"model.lora.{k}" for k in given)
            raise ValueError(
                f"{keys} given but model.lora.enabled is false: set model.lora.enabled=true to "
                "train LoRA adapters, or drop the LoRA settings for full fine-tuning"
            )
        if isinstance(self.target_modules, list) and not self.target_modules:
            raise ValueError("model.lora.target_modules is empty: name at least one module")
        return self


class ModelSection(StrictModel):
    name: str = Field(description="preset (tiny), local folder, .gguf file or hub id")
    ref_name: str | None = Field(
        default=None, description="reference model; None means the same as `name`"
    )
    device: Literal["auto", "cuda", "cpu"] = "auto"
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = "auto"
    gradient_checkpointing: bool = False
    lora: LoraSection = Field(
        default_factory=LoraSection, description="LoRA adapters instead of full fine-tuning"
    )


# Above this a learning rate is refused: no AdamW fine-tuning uses it and the loss is NaN within
# a few steps. The lab also warns about implausible values below it (rlhf_lab/planning/validation.py).
LEARNING_RATE_MAX = 1.0


class OptimSection(StrictModel):
    learning_rate: float = Field(default=5e-6, gt=0)
    num_epochs: int = Field(default=1, ge=1)
    max_steps: int | None = Field(
        default=None, ge=1, description="stop after this many optimizer steps (None: epochs)"
    )
    batch_size: int = Field(
        default=4, ge=1, description="micro-batch size (examples), per process under torchrun"
    )
    gradient_accumulation_steps: int = Field(
        default=1,
        ge=1,
        description="micro-batches per optimizer step, per process; the global batch is "
        "batch_size x gradient_accumulation_steps x the number of processes",
    )
    schedule: Literal["linear", "constant"] = "linear"
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    fused_adamw: bool = Field(
        default=True,
        description="torch's fused AdamW kernel (TRL's default): ~3-5x faster optimizer step on "
        "CPU, the same update up to float rounding (bench/fused_adamw.py); false: the per-tensor "
        "loop",
    )

    @field_validator("learning_rate")
    @classmethod
    def _learning_rate_at_most_max(cls, value: float) -> float:
        """Inherited by every family's optimizer section, including those that redeclare the
        field with their own default."""
        if value > LEARNING_RATE_MAX:
            raise ValueError(
                f"a learning rate above {LEARNING_RATE_MAX:g} is refused (fine-tuning uses "
                "about 1e-7 to 1e-4; check the exponent)"
            )
        return value


class LoggingSection(StrictModel):
    log_every: int = Field(default=1, ge=1)
    wandb_project: str | None = None
    wandb_entity: str | None = None
    wandb_run_name: str | None = None


class CheckpointSection(StrictModel):
    save_every: int | None = Field(
        default=None, ge=1, description="optimizer steps between checkpoints (None: only at end)"
    )
    keep_last: int = Field(default=1, ge=1)
    save_final_model: bool = Field(
        default=True, description="write the trained model to <run-dir>/final_model"
    )


class DatasetSpecSection(StrictModel):
    name: str = Field(min_length=1, description="reasoning-gym task, e.g. spell_backward")
    weight: float = Field(default=1.0, gt=0)
    config: dict = Field(default_factory=dict, description="the task's reasoning-gym settings")


PromptSource = Literal["reasoning_gym", "preference"]
BUILTIN_PROMPTS = "builtin"
"""``data.dataset`` of the offline prompt set: the prompts of the built-in preference pairs
(reasoning-gym questions, so the verifier can score them)."""


class PromptDataSection(StrictModel):
    """The prompts of a loop that samples from its policy (policy gradients, on-policy
    distillation; read by :mod:`trainers.core.prompts`)."""

    source: PromptSource = Field(
        default="reasoning_gym",
        description="reasoning_gym: a seeded composite of data.specs; preference: the prompts of "
        "a preference dataset (data.dataset)",
    )
    specs: list[DatasetSpecSection] = Field(
        default_factory=lambda: [
            DatasetSpecSection(
                name="spell_backward", config={"min_word_len": 3, "max_word_len": 10}
            )
        ],
        min_length=1,
        description="reasoning-gym `composite` of these tasks (source reasoning_gym)",
    )
    dataset: str | None = Field(
        default=None,
        description="source preference: a hub id or local .jsonl/.json/.parquet/.csv file or "
        "folder of an HH-RLHF-style (chosen/rejected transcripts) or UltraFeedback-style "
        "(`prompt` column or chosen message lists) dataset, or `builtin` (offline: the prompts "
        "of the built-in preference pairs, reasoning-gym questions; builtin:task_a,task_b for "
        "some tasks)",
    )
    split: str = Field(default="train", description="dataset split (source preference)")
    size: int = Field(default=3000, ge=1, description="training prompts (one epoch)")
    eval_size: int = Field(
        default=64, ge=0, description="held-out prompts for the greedy eval/ metrics"
    )

    @property
    def has_verifier(self) -> bool:
        """Whether every prompt carries a reasoning-gym entry the verifier can score."""
        if self.source == "reasoning_gym":
            return True
        ds = self.dataset or ""
        return ds == BUILTIN_PROMPTS or ds.startswith(f"{BUILTIN_PROMPTS}:")

    # The two checks below are called from the family config's own validator, at the point of
    # its checks where they belong, so that their errors keep the config's (root) location.
    def check_source(self) -> None:
        """``dataset`` goes with the preference source and only with it (ValueError)."""
        if self.source == "preference" and not self.dataset:
            raise ValueError(
                "data.dataset is required with data.source=preference: a hub id, a local "
                f".jsonl/.json/.parquet/.csv file or folder, or {BUILTIN_PROMPTS!r} (offline)"
            )
        if self.source == "reasoning_gym" and self.dataset is not None:
            raise ValueError(
                f"data.dataset={self.dataset!r} is read only with data.source=preference (the "
                "reasoning_gym source builds its prompts from data.specs)"
            )

    def check_specs_unique(self) -> None:
        """Each reasoning-gym task appears once in ``specs`` (ValueError)."""
        names = [s.name for s in self.specs]
        if len(names) != len(set(names)):
            raise ValueError(f"data.specs names must be unique (got {names})")


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}. Pass an existing YAML file.")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.learning_rate=1e-5"`` -> (["train", "learning_rate"], 1e-5).

    The value is parsed as YAML so numbers, booleans, null and lists work; a value YAML cannot
    parse stays a string.
    """
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value, e.g. data.max_samples=64")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(p.isidentifier() for p in parts):
        raise ConfigError(f"override key {key!r} must be dotted identifiers, e.g. train.batch_size")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError):
        # Not YAML, or YAML Python cannot hold (an int of thousands of digits, nesting deeper
        # than the recursion limit): keep the text; validation then names the field's type.
        value = raw
    if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
        value = float(value)  # YAML 1.1 reads "1e-5" as a string
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``a.b=c`` override applied (nested dicts created)."""
    import copy

    out = copy.deepcopy(data)
    for text in overrides or []:
        parts, value = parse_override(text)
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return out


def _field_names(model: type[BaseModel], loc: tuple) -> list[str]:
    """Valid keys at the config location ``loc`` (walks nested StrictModel sections)."""
    current: Any = model
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            break
        current = fields[part].annotation
    return list(getattr(current, "model_fields", {}).keys())


def _clip_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters so a huge bad value keeps the message short."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} chars)"


def describe_validation_error(err: ValidationError, model: type[BaseModel], source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"])
        dotted = ".".join(loc) or "<root>"
        if e["type"] == "extra_forbidden":
            valid = _field_names(model, loc[:-1])
            close = difflib.get_close_matches(loc[-1], valid, n=3, cutoff=0.5)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            lines.append(f"  - unknown key '{dotted}'.{hint} Valid keys here: {', '.join(valid)}")
        else:
            got = e.get("input")
            got_text = f" (got {_clip_repr(got)})" if not isinstance(got, dict) else ""
            lines.append(f"  - '{dotted}': {e['msg']}{got_text}")
    return "\n".join(lines)


def validate_config(data: dict[str, Any], model: type[M], source: str = "config") -> M:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe_validation_error(err, model, source)) from None


def load_config(path: str | Path, model: type[M], overrides: list[str] | None = None) -> M:
    """Read ``path``, apply dotted ``overrides`` and validate with ``model``."""
    data = apply_overrides(read_yaml(path), overrides)
    return validate_config(data, model, source=str(path))


def dump_config(cfg: BaseModel) -> str:
    """The fully resolved config as YAML (what the run directory's config.yaml holds)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def config_diff(base: dict[str, Any], new: dict[str, Any], prefix: str = "") -> dict[str, tuple]:
    """Dotted key -> (old, new) for every leaf value that differs."""
    diff: dict[str, tuple] = {}
    for key in sorted(set(base) | set(new)):
        a, b = base.get(key), new.get(key)
        dotted = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            diff.update(config_diff(a, b, prefix=f"{dotted}."))
        elif a != b:
            diff[dotted] = (a, b)
    return diff
