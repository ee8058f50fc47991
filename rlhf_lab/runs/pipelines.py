"""Pipelines: a chain of runs in one command and one campaign (``rlhf-lab pipeline rlhf --model
tiny``). Torch-free.

A pipeline is data: one YAML file in ``rlhf_lab/runs/pipeline_defs/`` (or any YAML path) with a
description, the question its campaign answers, its stages in order and the request phrases
``plan_experiment`` proposes it for. A stage names a recipe, the overrides it adds, optionally
stages it runs after, and what to check before its output is used. A value ``stage:<name>``
(``model.name=stage:sft``, ``reward.model=stage:rm``) is that stage's final model: when the
pipeline is launched it becomes ``run:<id>`` of the stage's run, and the stage runs after it.

Launching (:func:`rlhf_lab.api.run_pipeline`) first checks every stage, in order, as the launch
would (shrink, config, models, references: runs not created yet stand in under placeholder ids,
:func:`rlhf_lab.runs.lineage.pending_runs`), then queues the stages, each ``after`` the stages it
needs: the queue worker starts a stage once its upstream stages have succeeded, and a failed stage
leaves the later ones ``cancelled``. A stage whose output another uses always saves its final
model (``checkpoint.save_final_model=true``, whatever the shrink says).

User overrides name their stage: ``ppo.train.max_steps=3``; ``*.key=value`` sets it in every
stage.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlhf_lab.errors import InvalidArgument, LabError, NextStep, NotFound
from rlhf_lab.results.gates import GateDef

__all__ = [
    "PIPELINE_DIR",
    "PipelineDef",
    "StageDef",
    "StagePlan",
    "check_stages",
    "find_pipeline",
    "handoffs",
    "list_pipeline_defs",
    "match_pipeline",
    "placeholder",
    "plan_stages",
    "with_run_ids",
]

PIPELINE_DIR = Path(__file__).resolve().parent / "pipeline_defs"
STAGE_REF = "stage:"
SAVE_FINAL = "checkpoint.save_final_model=true"
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


class StageDef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recipe: str = Field(description="the shipped recipe (name or YAML path) this stage runs")
    overrides: list[str] = Field(default_factory=list, description="key=value; stage:<name>")
    after: list[str] = Field(default_factory=list, description="stages it waits for besides refs")
    check: str | None = Field(default=None, description="what to check in its result")
    gate: GateDef | None = Field(
        default=None, description="an upstream stage's held-out metric that must clear a bar"
    )


class PipelineDef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = ""
    description: str
    question: str
    stages: dict[str, StageDef] = Field(min_length=1)
    match: list[str] = Field(default_factory=list, description="request regexes plan matches")
    source: str = ""


class StagePlan(BaseModel):
    """One stage as it will be launched: its overrides still name other stages (``stage:x``)."""

    name: str
    recipe: str
    overrides: list[str]
    after: list[str] = Field(description="stages it waits for (its references first)")
    refs: dict[str, str] = Field(description="config key -> stage whose final model it takes")
    model: str | None = Field(description="the model swap (None: it starts from a stage's output)")
    check: str | None = None
    gate: GateDef | None = None


def _load(path: Path, name: str) -> PipelineDef:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
        defn = PipelineDef.model_validate({**(data or {}), "name": name, "source": str(path)})
    except (OSError, yaml.YAMLError, ValidationError, TypeError) as err:
        first = err.errors()[0] if isinstance(err, ValidationError) else None
        why = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first else str(err)
        raise InvalidArgument(
            f"pipeline file {path} is not a pipeline definition ({why})",
            next=NextStep("list_pipelines"),
        ) from None
    for stage in defn.stages:
        if not _NAME_RE.match(stage):
            raise InvalidArgument(
                f"pipeline {name}: stage name {stage!r} must be lowercase letters, digits and _",
                next=NextStep("list_pipelines"),
            )
    return defn


def list_pipeline_defs() -> list[PipelineDef]:
    """The shipped pipelines, by name."""
    return [_load(p, p.stem) for p in sorted(PIPELINE_DIR.glob("*.yaml"))]


def find_pipeline(name: str) -> PipelineDef:
    """A shipped pipeline by name, or a pipeline YAML file by path."""
    text = str(name).strip()
    shipped = PIPELINE_DIR / f"{text}.yaml"
    if _NAME_RE.match(text.replace("-", "_")) and shipped.is_file():
        return _load(shipped, text)
    path = Path(text).expanduser()
    if text.endswith((".yaml", ".yml")) and path.is_file():
        return _load(path, path.stem)
    names = ", ".join(p.stem for p in sorted(PIPELINE_DIR.glob("*.yaml")))
    raise NotFound(
        f"unknown pipeline {text!r}; pipelines: {names} (or the path of a pipeline YAML file)",
        next=NextStep("list_pipelines"),
    )


def match_pipeline(text: str) -> str | None:
    """The shipped pipeline a free-text request asks for ("an RLHF pipeline", "train a reward
    model then run PPO against it", "r1-zero"), or None."""
    low = " ".join(str(text).lower().split())
    for defn in list_pipeline_defs():
        if any(re.search(pattern, low) for pattern in defn.match):
            return defn.name
    return None


def _split_user(defn: PipelineDef, overrides: list[str]) -> dict[str, list[str]]:
    """User overrides by stage (``stage.key=value``; ``*.key=value`` for every stage)."""
    out: dict[str, list[str]] = {s: [] for s in defn.stages}
    for item in overrides:
        head, _, rest = str(item).partition(".")
        if head == "*" and rest:
            for stage in out:
                out[stage].append(rest)
        elif head in out and rest and "=" in rest:
            out[head].append(rest)
        else:
            raise InvalidArgument(
                f"override {item!r}: start it with the stage it is for ({', '.join(defn.stages)}, "
                f"or * for every stage), e.g. {next(iter(defn.stages))}.train.max_steps=3",
                next=NextStep("list_pipelines", note="the stages of each pipeline"),
            )
    return out


def _refs(stage: str, overrides: list[str], stages: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        value = value.strip()
        if not value.startswith(STAGE_REF):
            continue
        target = value[len(STAGE_REF) :].strip()
        if target not in stages:
            raise InvalidArgument(
                f"stage {stage}: {item} names no stage of this pipeline (stages: "
                f"{', '.join(stages)})",
                next=NextStep("list_pipelines"),
            )
        out[key.strip()] = target
    return out


def _order(name: str, after: dict[str, list[str]]) -> list[str]:
    """Stages in an order where each comes after those it waits for; a cycle is refused."""
    done: list[str] = []
    visiting: list[str] = []

    def visit(stage: str) -> None:
        if stage in done:
            return
        if stage in visiting:
            cycle = [*visiting[visiting.index(stage) :], stage]
            raise InvalidArgument(
                f"pipeline {name} has a dependency cycle: {' -> '.join(cycle)} (each stage waits "
                "for the next); a stage cannot use the output of a stage that waits for it",
                next=NextStep("list_pipelines"),
            )
        visiting.append(stage)
        for up in after[stage]:
            visit(up)
        visiting.pop()
        done.append(stage)

    for stage in after:
        visit(stage)
    return done


def plan_stages(
    defn: PipelineDef, model: str | None = None, overrides: list[str] | None = None
) -> list[StagePlan]:
    """The stages in launch order with their overrides (the definition's, the user's, and
    ``checkpoint.save_final_model=true`` on a stage whose output another stage takes), their
    upstream stages and references. Refuses an override for no stage, a reference to no stage,
    an ``after`` naming no stage, and a cycle."""
    user = _split_user(defn, list(overrides or []))
    overs = {s: [*d.overrides, *user[s]] for s, d in defn.stages.items()}
    refs = {s: _refs(s, overs[s], defn.stages) for s in defn.stages}
    after: dict[str, list[str]] = {}
    for stage, d in defn.stages.items():
        for up in d.after:
            if up not in defn.stages:
                raise InvalidArgument(
                    f"stage {stage} runs after {up!r}, which is no stage of pipeline {defn.name}",
                    next=NextStep("list_pipelines"),
                )
        gated = [d.gate.stage] if d.gate else []
        if d.gate and d.gate.stage not in defn.stages:
            raise InvalidArgument(
                f"stage {stage} is gated on {d.gate.stage!r}, which is no stage of pipeline "
                f"{defn.name}",
                next=NextStep("list_pipelines"),
            )
        after[stage] = list(dict.fromkeys([*refs[stage].values(), *d.after, *gated]))
    order = _order(defn.name, after)
    feeding = {up for r in refs.values() for up in r.values()}
    out = []
    for stage in order:
        d = defn.stages[stage]
        own = overs[stage] + ([SAVE_FINAL] if stage in feeding else [])
        starts_from_stage = "model.name" in refs[stage]
        out.append(
            StagePlan(
                name=stage,
                recipe=d.recipe,
                overrides=own,
                after=after[stage],
                refs=refs[stage],
                model=None if starts_from_stage else model,
                check=d.check,
                gate=d.gate,
            )
        )
    return out


def placeholder(stage: str) -> str:
    """The id a stage's run goes by before it exists: ``<sft-run-id>``."""
    return f"<{stage}-run-id>"


def with_run_ids(overrides: list[str], ids: dict[str, str]) -> list[str]:
    """``stage:<name>`` values replaced by ``run:<id>`` of that stage's run (or placeholder)."""
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and value.strip().startswith(STAGE_REF):
            item = f"{key}=run:{ids[value.strip()[len(STAGE_REF) :].strip()]}"
        out.append(item)
    return out


def handoffs(stages: list[StagePlan]) -> dict[str, list[str]]:
    """Stage -> how its output is handed on: ``final_model → reward.model of ppo``."""
    out: dict[str, list[str]] = {s.name: [] for s in stages}
    for s in stages:
        for key, up in s.refs.items():
            out[up].append(f"final_model → {key} of {s.name}")
    return out


def check_stages(
    stages: list[StagePlan],
    *,
    shrink: bool = True,
    launching: bool = True,
    also: Callable[[str, str, dict], Any] | None = None,
) -> dict:
    """Check every stage as its launch will, before anything is written: each is shrunk (or
    resolved) and validated with the runs of earlier stages standing in under placeholder ids;
    ``also(family, algorithm, config)`` runs more checks in the same context (the memory fit).
    Returns stage -> (family, algorithm, config)."""
    from rlhf_lab.planning.configs import resolve_config
    from rlhf_lab.planning.overrides import as_overrides
    from rlhf_lab.planning.shrink import shrink_config
    from rlhf_lab.planning.trainer_config import TrainerConfig
    from rlhf_lab.planning.validation import check_config
    from rlhf_lab.runs.lineage import Upstream, base_model, pending_runs

    ids = {s.name: placeholder(s.name) for s in stages}
    known: dict[str, Upstream] = {}
    out: dict[str, tuple[str, str, dict]] = {}
    for s in stages:
        overrides = with_run_ids(s.overrides, ids)
        with pending_runs(known):
            try:
                if shrink or s.model:
                    result = shrink_config(s.recipe, as_overrides(overrides), model=s.model)
                    family, algorithm, data = result.family, result.algorithm, result.config
                else:
                    resolved = resolve_config(s.recipe, as_overrides(overrides))
                    family, algorithm, data = resolved.family, resolved.algorithm, resolved.data
                check_config(family, TrainerConfig(family, data), launching=launching)
                if also is not None:
                    also(family, algorithm, data)
            except LabError as err:
                raise type(err)(
                    f"pipeline stage {s.name} ({s.recipe}): {err.message}",
                    next=list(err.next_steps),
                    kind=err.kind,
                ) from None
            model = (data.get("model") or {}).get("name")
            base = base_model(model) if isinstance(model, str) else None
        known[ids[s.name]] = Upstream(
            run_id=ids[s.name], family=family, algorithm=algorithm, state="queued", base_model=base
        )
        out[s.name] = (family, algorithm, data)
    return out
