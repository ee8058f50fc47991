"""Evaluations as lab jobs: what ``evaluate_model`` checks, the job's config, and its launch.
Torch-free.

An evaluation is a run of the job ``evaluation`` (``python -m trainers.evaluation.run``, see
``trainers/evaluation/README.md``) launched through the same machinery as a training run
(:func:`rlhf_lab.runs.launcher`): a folder ``experiments/<campaign>/runs/<suite>-<stamp>/`` with
``run.json``, ``config.yaml``, ``train.log``, ``progress.json`` and the typed ``eval.json``;
``status``/``run_status`` show it, ``stop``/``resume`` act on it, and its row is recorded into the
campaign's **Evaluation** section when it ends (:mod:`rlhf_lab.evaluation.records`).

Targets (:func:`resolve_target`): a run id or ``run:<id>`` (its ``final_model``; the job lands in
that run's campaign, runs on that run's device, and waits for the run when it has not ended
yet), or a model name the trainers resolve (preset, pulled model, local folder, ``.gguf``, hub
id). ``baseline="auto"`` (the default for a run) is the run's starting model: the job evaluates
it on the same prompts with the same seed and reports the paired difference; its per-model
result is reused from ``experiments/.lab/eval-cache`` when an earlier evaluation of the same
weights ran with the same settings and prompts (``trainers/evaluation/cache.py``).

Everything is checked before anything is written: the suite, the overrides (validated by the
job's own config model), the target and the baseline (a run that failed or will leave no final
model, a name that resolves to nothing), the judge (a reward-model run of kind preference or
orm, or a folder holding a reward model).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf_lab.errors import Conflict, InvalidArgument, LabError, NextStep, NotFound
from rlhf_lab.planning.trainer_config import EVALUATION, TrainerConfig
from rlhf_lab.results.best_of_n_inputs import named_run_id, resolve_scorer_refs

__all__ = [
    "EVAL_FAMILY",
    "EvalJob",
    "EvalTarget",
    "cache_dir",
    "eval_config",
    "prepare_evaluation",
    "resolve_target",
    "suites",
]

EVAL_FAMILY = "evaluation"
AUTO = "auto"
NO_BASELINE = ("none", "")
_FAILED = frozenset({"failed", "stopped", "killed", "died", "cancelled"})


def suites() -> tuple[str, ...]:
    from trainers.evaluation.config import SUITES

    return SUITES


def cache_dir() -> Path:
    """Where per-model results are kept for reuse (``experiments/.lab/eval-cache``)."""
    from rlhf_lab.paths import experiments_dir

    return experiments_dir() / ".lab" / "eval-cache"


def _configs_dir() -> Path:
    from rlhf_lab.planning.catalog import source_root

    return source_root() / "trainers" / "evaluation" / "configs"


@dataclass
class EvalTarget:
    """A model to evaluate, as the job will load it."""

    given: str
    path: str  # what the job's config names: a run folder or a model name
    run_id: str | None = None
    campaign: str | None = None
    device: str | None = None  # the run's device
    state: str | None = None
    family: str | None = None
    algorithm: str | None = None


@dataclass
class EvalJob:
    """One evaluation job, checked and ready to launch."""

    suite: str
    target: EvalTarget
    config: TrainerConfig  # the job's validated config (EvalConfig), scorer runs resolved
    overrides: list[str]
    device: str
    after: list[str] = field(default_factory=list)


def resolve_target(name: str, role: str = "target") -> EvalTarget:
    """The run or model ``name`` names, checked (module doc); NotFound / Conflict otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgument(f"{role}: name a run id or a model (e.g. tiny)")
    name = name.strip()
    run_id = named_run_id(name)
    if run_id is not None:
        return _run_target(name, run_id, role)
    from rlhf_lab.planning.validation import _resolve, model_steps

    try:
        _resolve(role, name)
    except NotFound as err:
        raise NotFound(
            f"{role} {name!r} is neither a run of this lab nor a model that resolves: "
            f"{err.message}",
            next=[NextStep("list_runs"), *model_steps(name)[:1]],
        ) from None
    return EvalTarget(given=name, path=name)


def _run_target(given: str, run_id: str, role: str) -> EvalTarget:
    from rlhf_lab.paths import find_run
    from rlhf_lab.runs.folder import read_record
    from rlhf_lab.runs.lineage import final_model_not_saved, upstream

    up = upstream(run_id)  # NotFound for an unknown id
    if up.family == EVAL_FAMILY:
        raise InvalidArgument(
            f"{role} {run_id} is an evaluation, not a trained model; name the run it evaluated",
            next=NextStep("list_runs", {"state": "succeeded"}),
        )
    if up.family == "reward_models":
        raise InvalidArgument(
            f"{role} {run_id} is a reward model ({up.algorithm}); a policy is evaluated, a "
            "reward model can be the judge of the winrate suite",
            next=NextStep("list_runs", {"state": "succeeded"}),
        )
    steps = [
        NextStep("run_status", {"run_id": run_id}, note="why it ended"),
        NextStep("resume_run", {"run_id": run_id}),
    ]
    if up.state in _FAILED:
        raise Conflict(
            f"{role} {run_id} is {up.state}: it has no final model to evaluate; resume it first",
            next=steps,
        )
    if not up.saves_final_model:
        raise final_model_not_saved(
            f"{role} {run_id}",
            "; there is nothing to evaluate. Launch it again with checkpoint.save_final_model=true",
        )
    if up.state == "succeeded" and not up.has_output:
        raise NotFound(
            f"{role} {run_id} succeeded but {up.final_model} holds no model",
            next=steps[:1],
        )
    run_dir = find_run(run_id)
    record = read_record(run_dir).data or {}
    return EvalTarget(
        given=given,
        path=str(run_dir),
        run_id=run_id,
        campaign=run_dir.parent.parent.name,
        device=record.get("device") if isinstance(record.get("device"), str) else None,
        state=up.state,
        family=up.family,
        algorithm=up.algorithm,
    )


def _check_suite(suite: str) -> str:
    known = suites()
    if suite in known:
        return suite
    close = difflib.get_close_matches(str(suite), known, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise InvalidArgument(
        f"unknown evaluation suite {suite!r}{hint}; suites: {', '.join(known)}",
        next=NextStep("evaluate_model", {"suite": ["reasoning"]}),
    )


def _judge_path(judge: str) -> str:
    """A judge run id (``run:<id>`` or bare) -> its final_model folder, checked to be a scalar
    reward model; a folder is passed on (the job checks it before writing anything)."""
    from rlhf_lab.runs.lineage import check_ref

    run_id = named_run_id(judge)
    if run_id is None:
        if not Path(judge).expanduser().is_dir():
            raise NotFound(
                f"judge {judge!r} is neither a reward-model run of this lab nor a folder",
                next=NextStep("list_runs", {"state": "succeeded"}, note="reward-model runs"),
            )
        return judge
    try:
        up = check_ref("reward.model", run_id)
    except LabError as err:
        message = err.message.replace(f"reward.model=run:{run_id}", f"judge {run_id}")
        raise type(err)(message, next=err.next_steps) from None
    assert up.final_model is not None
    return str(up.final_model)


# A pretrained model evaluated on a CPU: one sample per prompt, 128 prompts of at most 128 new
# tokens per policy. The shipped suites (8 samples of 256 tokens per prompt, up to 200 prompts)
# sample ~0.5M tokens for a run and its baseline: hours at the ~100-200 tokens/s a 135M model
# decodes here. One greedy-free sample per prompt still gives pass@1 with a Wilson interval of
# about ±9 points at n = 128.
CPU_EVAL_PROMPTS = 128
CPU_EVAL_NEW_TOKENS = 128


def shipped_suite(suite: str) -> TrainerConfig:
    """A suite's shipped config (``trainers/evaluation/configs/<suite>.yaml``) as read off disk,
    before the job's models and overrides are set."""
    import yaml

    data = yaml.safe_load((_configs_dir() / f"{suite}.yaml").read_text()) or {}
    return TrainerConfig(EVALUATION, data)


def cpu_sized_overrides(shipped: TrainerConfig, model: str | None, device: str) -> list[str]:
    """The overrides that size a sampling suite's ``shipped`` config for a pretrained model on a
    CPU (none on a GPU, for a built-in preset or its runs, or where the suite already asks for
    less); the caller applies its own overrides after these, so they win."""
    if device != "cpu" or not model or not _pretrained(model):
        return []
    g = shipped.get
    out = []
    if int(g("sampling.n", 1) or 1) > 1 and g("suite") != "best_of_n":  # n is n_max
        out.append("sampling.n=1")
        if shipped.has("reasoning.pass_k"):
            out.append("reasoning.pass_k=[1]")
    if int(g("sampling.max_new_tokens", 0) or 0) > CPU_EVAL_NEW_TOKENS:
        out.append(f"sampling.max_new_tokens={CPU_EVAL_NEW_TOKENS}")
    if int(g("prompts.size", 0) or 0) > CPU_EVAL_PROMPTS:
        out.append(f"prompts.size={CPU_EVAL_PROMPTS}")
    return out


def _pretrained(model: str) -> bool:
    """Whether ``model`` (a name, a run folder, its final_model or ``run:<id>``) was trained from
    a pretrained model rather than a built-in preset; an unknown lineage counts as not."""
    from pathlib import Path

    from rlhf_lab.runs.lineage import base_model
    from trainers.core.tiny import PRESETS

    if (Path(model).expanduser() / "run.json").is_file():  # a run folder: its output
        model = str(Path(model).expanduser() / "final_model")
    try:
        base = base_model(model)
    except LabError:
        return False
    return base is not None and base not in PRESETS


def eval_config(
    suite: str,
    target: EvalTarget,
    baseline: str | None,
    judge: str | None,
    overrides: list[str],
    device: str,
) -> dict[str, Any]:
    """The job's resolved config: the suite's shipped YAML, the models, the device, the cache
    folder and the overrides, validated by ``EvalConfig``; InvalidArgument otherwise."""
    from trainers.core.config import ConfigError, apply_overrides
    from trainers.evaluation.config import EvalConfig

    shipped = shipped_suite(suite)
    fixed = {"target", "baseline", "judge", "suite", "cache_dir"}
    clash = sorted({o.split("=", 1)[0].strip() for o in overrides} & fixed)
    if clash:
        raise InvalidArgument(
            f"overrides: {', '.join(clash)} are set by the evaluation itself; pass the target, "
            "baseline, judge or suite as arguments",
            next=NextStep("evaluate_model", {"overrides": []}),
        )
    dev = "cpu" if device == "cpu" else "cuda"
    sized = cpu_sized_overrides(shipped, target.path, dev)  # yours come after: they win
    try:
        data = apply_overrides(shipped.to_data(), [*sized, *overrides])
    except ConfigError as err:
        raise InvalidArgument(f"overrides: {err}") from None
    data.update(
        target=target.path,
        baseline=baseline,
        judge=judge,
        device=dev,
        cache_dir=str(cache_dir()),
    )
    try:
        return EvalConfig.model_validate(data).model_dump(mode="json")
    except ValueError as err:
        raise InvalidArgument(
            f"the {suite} evaluation's settings do not validate: {_config_errors(err)}",
            next=NextStep("evaluate_model", {"suite": [suite]}, note="with other overrides"),
        ) from None


def _preflight(config: TrainerConfig, suite: str) -> None:
    """The job's own checks before anything is written (tasks, data files, tokenizers, the
    kind of run), in this process: torch-free, but it imports reasoning-gym (seconds)."""
    from trainers.core.config import ConfigError
    from trainers.evaluation.run import preflight

    model = config.model  # EvalConfig
    try:
        preflight(model)
    except ConfigError as err:
        message = re.sub(r"-{2}set[ =]", "the override ", str(err))
        raise InvalidArgument(
            f"the {suite} evaluation cannot run: {message}",
            next=NextStep("evaluate_model", {"overrides": ["prompts.tasks=[chain_sum]"]})
            if "prompts.tasks" in message
            else NextStep("evaluate_model", {"suite": [suite]}, note="with other overrides"),
        ) from None


def _config_errors(err: ValueError) -> str:
    """A config validation error as ``key: what is wrong`` lines joined by '; '."""
    errors = getattr(err, "errors", None)
    if not callable(errors):
        return str(err)
    parts = []
    for e in errors():
        where = ".".join(str(p) for p in e.get("loc", ()))
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def _baseline(value: str | None, target: EvalTarget, suite: str) -> str | None:
    """What the job compares with: ``auto`` (the target run's starting model), another run's
    final model or a model name, or None."""
    if value is None:
        value = AUTO if target.run_id is not None else NO_BASELINE[0]
    value = value.strip()
    if value.lower() in NO_BASELINE:
        return None
    if value == AUTO:
        if target.run_id is None:
            raise InvalidArgument(
                f"baseline auto is the target run's starting model, but {target.given!r} is a "
                "model, not a run; name the baseline model",
                next=NextStep("evaluate_model", {"baseline": "tiny"}),
            )
        return AUTO
    base = resolve_target(value, "baseline")
    if base.run_id is not None:
        from rlhf_lab.paths import find_run

        return str(find_run(base.run_id) / "final_model")
    return base.path


def prepare_evaluation(
    target: str,
    suite: str,
    *,
    baseline: str | None = None,
    judge: str | None = None,
    overrides: list[str] | None = None,
    device: str | None = None,
) -> EvalJob:
    """Check everything and build the job (writes nothing)."""
    from rlhf_lab.runs import resolve_device

    suite = _check_suite(suite)
    tgt = resolve_target(target)
    # best_of_n compares selectors on the target's own samples: no baseline unless one is named
    base = None if suite == "best_of_n" and baseline is None else _baseline(baseline, tgt, suite)
    judge_path = _judge_path(judge) if judge else None
    dev = resolve_device(device or tgt.device or "auto")
    overrides = [str(o) for o in overrides or []]
    data = eval_config(suite, tgt, base, judge_path, overrides, dev)
    scorers = resolve_scorer_refs(data)  # best_of_n: its ORM and PRM runs -> final models
    config = TrainerConfig(EVALUATION, data)
    runs_used = [tgt.run_id, named_run_id(baseline or ""), named_run_id(judge or ""), *scorers]
    after = list(dict.fromkeys(r for r in runs_used if r))
    if not any(_unfinished(r) for r in after):  # else the job checks when it starts
        _preflight(config, suite)
    return EvalJob(suite, tgt, config, overrides, dev, after)


def _unfinished(run_id: str) -> bool:
    from rlhf_lab.runs.lineage import upstream

    return upstream(run_id).state != "succeeded"
