"""References to other runs' outputs (``run:<id>``) and the lineage of a model. Torch-free.

A config value ``run:<id>`` names the model another run of this lab leaves in its
``final_model/`` folder: ``model.name=run:<sft>`` (start from an SFT run), ``model.ref_name``,
``reward.model=run:<rm>`` / ``reward.gold_model`` (policy gradients against a learned reward
model), ``scorer.name=run:<rm>`` (rejection sampling) and ``teacher.name=run:<id>``
(distillation: any run that trains a language model). The folder is known before the upstream
run ends (``<run_dir>/final_model``), so a reference is checked when a run is planned or launched
and written into the dependent's config.yaml as that path, while run.json keeps the run id
(``references``) and the dependent waits for the upstream run (``after``).

The checks (:func:`check_ref`): the run exists; for ``reward.model`` / ``reward.gold_model`` it
is a reward-model run of kind preference_rm or orm, for ``scorer.name`` any reward-model run; it
has not ended without succeeding; it saves its final model (or is still queued, so the launch can
make it); a succeeded run's folder really holds ``final_model/``.

Lineage (:func:`base_model`): the model a run's output was trained from, following ``run:``
references and ``<run>/final_model`` paths back to a preset (``tiny``) or a hub id, so a model
that is another run's output is shrunk, estimated and planned like the model it came from.

Trained task (:func:`trained_task_specs`): the reasoning-gym tasks (name, weight, settings) a
model's run was trained on, read from its config.yaml and followed back through the runs in
between, so that a policy-gradient run from an SFT warm start draws its prompts from the warm
start's task instead of its recipe's.

Runs a plan or a pipeline is about to create do not exist yet: :func:`pending_runs` registers
them under placeholder ids for the checks (their family, algorithm and base model are known).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_lab.errors import Conflict, InvalidArgument, NextStep, NotFound
from rlhf_lab.paths import LabError, find_run
from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = [
    "POLICY_KEYS",
    "REF_KEYS",
    "REWARD_KEYS",
    "RUN_REF",
    "Upstream",
    "base_model",
    "check_ref",
    "describe_ref",
    "find_refs",
    "is_ref",
    "pending_runs",
    "ref_id",
    "resolve_refs",
    "run_of_path",
    "stand_in",
    "stored_config",
    "trained_task_specs",
    "upstream",
]

RUN_REF = "run:"
POLICY_KEYS = ("model.name", "model.ref_name")
REWARD_KEYS = ("reward.model", "reward.gold_model")
SCORER_KEYS = ("scorer.name",)
TEACHER_KEYS = ("teacher.name",)  # distillation: a causal LM run (not a reward model)
REF_KEYS = (*POLICY_KEYS, *REWARD_KEYS, *SCORER_KEYS, *TEACHER_KEYS)
# reward-model kinds (algorithm names) a policy-gradient reward can come from
REWARD_ALGORITHMS = ("preference", "preference_rm", "orm")  # spec names (and an alias)
_FAILED = frozenset({"failed", "stopped", "killed", "died", "cancelled"})


@dataclass(frozen=True)
class Upstream:
    """What a dependent needs to know about the run a reference names."""

    run_id: str
    family: str | None
    algorithm: str | None
    state: str
    base_model: str | None = None
    saves_final_model: bool = True
    final_model: Path | None = None
    pending: bool = False

    @property
    def has_output(self) -> bool:
        return self.final_model is not None and (self.final_model / "config.json").is_file()


_PENDING: ContextVar[dict[str, Upstream] | None] = ContextVar("rlhf_lab_pending", default=None)


@contextlib.contextmanager
def pending_runs(runs: dict[str, Upstream]) -> Iterator[None]:
    """Within the block, ``run:<id>`` for an id of ``runs`` names a run about to be created."""
    token = _PENDING.set({**(_PENDING.get() or {}), **runs})
    try:
        yield
    finally:
        _PENDING.reset(token)


def is_ref(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(RUN_REF)


def ref_id(value: str) -> str:
    return value[len(RUN_REF) :].strip()


def find_refs(config: TrainerConfig) -> dict[str, str]:
    """Config key -> upstream run id of every ``run:<id>`` value; a typed error for one in a key
    that takes no model."""
    out: dict[str, str] = {}
    for key, value in config.leaves():
        if not is_ref(value):
            continue
        if key not in REF_KEYS:
            raise InvalidArgument(
                f"{key}={value}: a run:<id> reference names another run's final model and is "
                f"read only in {', '.join(REF_KEYS)}",
                next=NextStep("shrink_config", note="with the reference in one of those keys"),
            )
        out[key] = ref_id(value)
    return out


def run_of_path(name: Any) -> str | None:
    """The run id when ``name`` is the ``final_model`` folder of a lab run (existing or not yet
    written: its run folder holds run.json), else None."""
    if not isinstance(name, str) or is_ref(name) or "/" not in name:
        return None
    path = Path(name).expanduser()
    if path.name != "final_model" or path.parent.parent.name != "runs":
        return None
    return path.parent.name if (path.parent / "run.json").is_file() else None


def stored_config(run_dir: Path, record: dict[str, Any]) -> TrainerConfig:
    """A run's ``config.yaml`` as a view of the family its run.json names (empty when the file
    is missing or unreadable)."""
    from rlhf_lab.planning.trainer_config import read_run_config

    family = str(record.get("family") or "")
    return read_run_config(run_dir, family) or TrainerConfig(family, {})


def upstream(run_id: str) -> Upstream:
    """The run a reference names (a run about to be created, or one on disk); NotFound when
    there is none."""
    pending = (_PENDING.get() or {}).get(run_id)
    if pending is not None:
        return pending
    try:
        run_dir = find_run(run_id)
    except LabError:
        raise NotFound(
            f"run:{run_id} names no run of this lab (no experiments/*/runs/{run_id})",
            next=NextStep("list_runs"),
        ) from None
    from rlhf_lab.runs import run_state
    from rlhf_lab.runs.folder import read_record

    record = read_record(run_dir).data or {}
    try:
        state = run_state(run_id).state
    except LabError:
        state = str(record.get("state") or "died")
    config = stored_config(run_dir, record)
    refs = record.get("references") if isinstance(record.get("references"), dict) else {}
    source = refs.get("model.name")
    model = f"{RUN_REF}{source}" if source else config.get("model.name")
    return Upstream(
        run_id=run_id,
        family=record.get("family"),
        algorithm=record.get("algorithm"),
        state=state,
        base_model=base_model(model) if isinstance(model, str) else None,
        saves_final_model=config.get("checkpoint.save_final_model", True) is not False,
        final_model=run_dir / "final_model",
    )


def base_model(name: str | None, _depth: int = 0) -> str | None:
    """The model ``name`` was trained from: ``run:<id>`` and a run's ``final_model`` path are
    followed back (through every run in between) to a preset or hub id; other names are their
    own base."""
    if not isinstance(name, str) or _depth > 32:
        return name
    run_id = ref_id(name) if is_ref(name) else run_of_path(name)
    if run_id is None:
        return name
    try:
        return upstream(run_id).base_model
    except LabError:
        return None


def stand_in(name: str) -> str:
    """What to read a model's architecture from: a run's output once it exists, else the model
    it is trained from (the same architecture). Other names are returned unchanged."""
    run_id = ref_id(name) if is_ref(name) else run_of_path(name)
    if run_id is None:
        return name
    try:
        up = upstream(run_id)
    except LabError:
        return name
    if up.has_output:
        assert up.final_model is not None
        return str(up.final_model)
    return up.base_model or name


def final_model_not_saved(subject: str, detail: str) -> Conflict:
    """The error for a run that will leave no final model because its config turns saving it
    off (``subject`` names the run, ``detail`` follows the reason), pointing at a relaunch."""
    return Conflict(
        f"{subject} does not save its final model (checkpoint.save_final_model=false){detail}",
        next=NextStep("launch_run", {"overrides": ["checkpoint.save_final_model=true"]}),
    )


def _kind_error(key: str, run_id: str, up: Upstream, wanted: str) -> InvalidArgument:
    return InvalidArgument(
        f"{key}=run:{run_id}: that run is {up.algorithm} ({up.family}), not {wanted}",
        next=NextStep("list_runs", {"state": "succeeded"}, note="finished reward-model runs"),
    )


def check_ref(key: str, run_id: str) -> Upstream:
    """Check one reference (module doc); returns the upstream run. Writes nothing."""
    up = upstream(run_id)
    if key in REWARD_KEYS and (
        up.family != "reward_models" or up.algorithm not in REWARD_ALGORITHMS
    ):
        raise _kind_error(key, run_id, up, "a preference (Bradley-Terry) or outcome reward model")
    if key in SCORER_KEYS and up.family != "reward_models":
        raise _kind_error(key, run_id, up, "a reward model (preference, orm or prm)")
    if key in TEACHER_KEYS and up.family == "reward_models":
        raise _kind_error(key, run_id, up, "a language model (an SFT, DPO, RL or distillation run)")
    if up.state in _FAILED:
        raise Conflict(
            f"{key}=run:{run_id}: that run is {up.state} and will leave no final model; resume "
            "it first (a run referring to it then waits for it)",
            next=[
                NextStep("resume_run", {"run_id": run_id}),
                NextStep("run_status", {"run_id": run_id}, note="why it ended"),
            ],
        )
    if not up.saves_final_model and up.state != "queued":
        raise final_model_not_saved(
            f"{key}=run:{run_id}: that run",
            f" and is {up.state}; launch it again with checkpoint.save_final_model=true",
        )
    if up.state == "succeeded" and not up.has_output:
        raise NotFound(
            f"{key}=run:{run_id}: that run succeeded but {up.final_model} holds no model",
            next=NextStep("run_status", {"run_id": run_id}),
        )
    return up


def resolve_refs(config: TrainerConfig, refs: dict[str, str]) -> TrainerConfig:
    """``config`` with each referenced key set to the upstream's final_model path (a new view;
    ``config`` itself when there is no reference)."""
    if not refs:
        return config
    out = config.to_data()
    for key, run_id in refs.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = str(find_run(run_id) / "final_model")
    return TrainerConfig(config.family, out)


def describe_ref(run_id: str) -> str:
    """``run:<id> (<algorithm>)`` as the ledger shows a referenced model."""
    try:
        algorithm = upstream(run_id).algorithm
    except LabError:
        algorithm = None
    return f"{RUN_REF}{run_id}" + (f" ({algorithm})" if algorithm else "")


def _own_task_specs(config: TrainerConfig) -> list[dict[str, Any]] | None:
    """The reasoning-gym tasks one run's own data came from (``data.specs`` form), or None when
    its data is not a reasoning-gym set (a hub data set, preference prompts, a file)."""
    from trainers.core.builtin_data import (
        default_demonstration_tasks,
        split_builtin_name,
        task_settings,
    )

    family = config.family
    section = config.get("data")
    data = section if isinstance(section, dict) else {}
    if family in ("policy_gradients", "distillation"):
        specs = data.get("specs")
        if data.get("source", "reasoning_gym") != "reasoning_gym" or not specs:
            return None
        return [dict(spec) for spec in specs if isinstance(spec, dict)] or None
    dataset = data.get("dataset")
    if family != "sft" or not isinstance(dataset, str) or not dataset.startswith("builtin:"):
        return None
    named = split_builtin_name(dataset)[1]
    tasks = named or data.get("builtin_tasks") or default_demonstration_tasks(dataset)
    overrides = data.get("builtin_task_configs") or {}
    return [{"name": t, "weight": 1.0, "config": task_settings(t, overrides)} for t in tasks]


def trained_task_specs(name: Any, _depth: int = 0) -> list[dict[str, Any]] | None:
    """The reasoning-gym tasks the model ``name`` was trained on, as a policy-gradient
    ``data.specs`` list (``[{"name", "weight", "config"}]``): for ``run:<id>`` or a run's
    ``final_model`` path, that run's own task (an SFT run on the built-in demonstrations, a
    policy-gradient or distillation run on reasoning-gym prompts), else the task of the model it
    started from, back through the lineage. None for a preset or hub model, a run trained on
    other data all the way back, or a run not created yet."""
    run_id = ref_id(name) if is_ref(name) else run_of_path(name)
    if run_id is None or _depth > 32 or run_id in (_PENDING.get() or {}):
        return None
    try:
        run_dir = find_run(run_id)
    except LabError:
        return None
    from rlhf_lab.runs.folder import read_record

    record = read_record(run_dir).data or {}
    config = stored_config(run_dir, record)
    own = _own_task_specs(config)
    if own is not None:
        return own
    refs = record.get("references") if isinstance(record.get("references"), dict) else {}
    source = refs.get("model.name")
    parent = f"{RUN_REF}{source}" if source else config.get("model.name")
    return trained_task_specs(parent, _depth + 1)
