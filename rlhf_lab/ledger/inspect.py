"""A run folder as a ledger row: :func:`inspect_run` reads run.json, config.yaml, summary.json,
progress.json, metrics.jsonl and samples.jsonl through the lab's one run-folder reader
(:mod:`rlhf_lab.runs.folder`) and builds a :class:`RunRecord`. Tolerant: a missing, old or damaged
file becomes a warning in the record, never an exception. Writes nothing. Torch-free.
"""

from __future__ import annotations

import importlib
import math
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from rlhf_lab.errors import LabError
from rlhf_lab.evaluation.records import EvalSummary, is_evaluation, read_eval_summary
from rlhf_lab.index.campaign_summary import _int_or_none
from rlhf_lab.ledger.commands import attempts_of, lab_command, recipe_argument, trainer_command
from rlhf_lab.ledger.metrics import (
    _expand_metric_names,
    _metric_keys,
    summarize_metrics,
    summarize_performance,
)
from rlhf_lab.ledger.portable import portable_argv
from rlhf_lab.ledger.schema import (
    ConfigChange,
    HeadlineValue,
    Lineage,
    MetricSummary,
    RunRecord,
    SampleExcerpt,
    SampleTurn,
)
from rlhf_lab.ledger.text import _clip, _first, _first_in_row, _now, _one_line, load_yaml
from rlhf_lab.paths import find_run, repo_root
from rlhf_lab.planning.catalog import FAMILIES as CATALOG_FAMILIES
from rlhf_lab.planning.catalog import source_root
from rlhf_lab.planning.time import predicted_total_s
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.results.diagnosis import run_flags, run_notes
from rlhf_lab.results.headline import (
    headline_for,
    heldout_items,
    noise_interval,
    start_value,
)
from rlhf_lab.results.overoptimisation import overoptimisation
from rlhf_lab.results.plots import as_float
from rlhf_lab.runs.folder import (
    read_json_lines,
    read_progress,
    read_record,
    read_summary,
    tail_text,
)
from rlhf_lab.runs.folder import read_metric_rows as read_metrics_file
from rlhf_lab.runs.log import last_error_mention
from trainers.core.config import config_diff
from trainers.core.runfolder import ACTIVE_STATES, TERMINAL_STATES, SummaryFile

__all__ = ["inspect_run", "read_metric_rows"]

_FAMILY_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_SAMPLES_SHOWN = 2
_PROMPT_CHARS = 300
_COMPLETION_CHARS = 600
_TURNS_SHOWN = 8  # of a multi-turn sample (model turns and tool replies)
_TURN_CHARS = 300
# The config model of each family, from the catalog: (torch-free module, class name).
_CONFIG_CLASSES: dict[str, tuple[str, str]] = {
    name: (info.config_module, info.config_class) for name, info in CATALOG_FAMILIES.items()
}


def _dataset_of(cfg: TrainerConfig | None) -> str | None:
    if cfg is None:
        return None
    if cfg.get("data.source") == "preference":  # a PG run on a preference set's prompts
        value = cfg.get("data.dataset")
        return None if value is None else _one_line(f"{value} (preference prompts)", 200)
    specs = cfg.get("data.specs")
    if isinstance(specs, list) and specs:
        names = [str(s.get("name")) for s in specs if isinstance(s, dict) and s.get("name")]
        if names:
            return ", ".join(names)
    value = _first(cfg, ("data.dataset", "data.name", "data.task", "dataset", "task"))
    return None if value is None else _one_line(value, 200)


def _resolve_source(source: str, cwd: str | None) -> Path | None:
    path = Path(source)
    candidates = [path] if path.is_absolute() else []
    if not path.is_absolute():
        if cwd:
            candidates.append(Path(cwd) / path)
        candidates += [repo_root() / path, source_root() / path]
    return next((c for c in candidates if c.is_file()), None)


def _config_model(family: str | None) -> type[BaseModel] | None:
    """The family's pydantic config class (the catalog names its module and class), imported
    lazily; for a family the catalog does not know, the one ``*Config`` model of
    ``trainers.<family>.config``. None when unavailable."""
    if not family or not _FAMILY_RE.fullmatch(family):
        return None
    module_name, class_name = _CONFIG_CLASSES.get(family, (f"trainers.{family}.config", None))
    try:
        module = importlib.import_module(module_name)
    except Exception:  # a family still being written, or none at all
        return None
    cls = getattr(module, class_name, None) if class_name else None
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return cls
    found = [
        obj
        for obj_name, obj in vars(module).items()
        if isinstance(obj, type)
        and issubclass(obj, BaseModel)
        and obj.__module__ == module.__name__
        and obj_name.endswith("Config")
    ]
    return found[0] if len(found) == 1 else None


def _config_changes(
    family: str | None,
    source: str | None,
    cwd: str | None,
    used: TrainerConfig | None,
    warnings: list[str],
) -> list[ConfigChange]:
    if used is None or not source:
        return []
    path = _resolve_source(source, cwd)
    if path is None:
        warnings.append(f"shipped config {source} not found; changed values not computed")
        return []
    try:
        shipped = load_yaml(path)
    except LabError as err:
        warnings.append(f"shipped config unreadable: {err}")
        return []
    model = _config_model(family)
    if model is not None:
        try:
            shipped = model.model_validate(shipped).model_dump(mode="json")
        except ValidationError:
            warnings.append(
                f"shipped config {source} does not validate as {model.__name__}; "
                "changed values compare the raw YAML"
            )
    diff = config_diff(shipped, used.to_data())
    return [ConfigChange(key=k, shipped=a, used=b) for k, (a, b) in diff.items()]


# Where each family's samples.jsonl keeps the prompt (policy gradients: ``question``).
_PROMPT_KEYS = ("prompt", "question", "input", "instruction", "query")


def _prompt_text(row: dict) -> str:
    for key in _PROMPT_KEYS:
        prompt = row.get(key)
        if isinstance(prompt, list) and prompt:  # chat messages
            last = prompt[-1]
            prompt = last.get("content", "") if isinstance(last, dict) else last
        if prompt not in (None, "", []):
            return str(prompt)
    return ""


def _sample_turns(row: dict) -> list[SampleTurn]:
    """A multi-turn sample's ``turns`` (``{"role": "model"|"tool", "text": ...}``), each clipped,
    the first :data:`_TURNS_SHOWN` of them; [] for a single-turn sample or a malformed list."""
    turns = row.get("turns")
    if not isinstance(turns, list):
        return []
    out = []
    for turn in turns[:_TURNS_SHOWN]:
        if not isinstance(turn, dict) or turn.get("role") not in ("model", "tool"):
            return []
        text = _clip(str(turn.get("text") or ""), _TURN_CHARS)
        out.append(SampleTurn(role=turn["role"], text=text))
    if len(turns) > _TURNS_SHOWN:
        out.append(SampleTurn(role="more", text=f"{len(turns) - _TURNS_SHOWN} more turns"))
    return out


def _sample_excerpts(rows: list[dict]) -> list[SampleExcerpt]:
    """The latest step's samples (its held-out ones first when it logged both kinds)."""
    if not rows:
        return []
    last_step = rows[-1].get("step")
    latest = [r for r in rows if r.get("step") == last_step]
    latest.sort(key=lambda r: r.get("kind") != "eval")
    picked = latest[:_SAMPLES_SHOWN]
    out = []
    for row in picked:
        prompt = _prompt_text(row)
        completion = _first_in_row(row, ("completion", "response", "text", "output")) or ""
        scores = {}
        for key, value in row.items():
            if key in ("step", "completion", *_PROMPT_KEYS) or isinstance(value, bool):
                continue
            number = as_float(value) if isinstance(value, int | float) else None
            if number is not None and len(scores) < 4:
                scores[key] = number
        kind = row.get("kind")
        out.append(
            SampleExcerpt(
                step=_int_or_none(row.get("step")),
                kind=kind if isinstance(kind, str) else None,
                prompt=_one_line(prompt, _PROMPT_CHARS),
                completion=_clip(str(completion), _COMPLETION_CHARS),
                scores=scores,
                turns=_sample_turns(row),
            )
        )
    return out


def _failure(
    path: Path, state: str, outcome: str | None, meta: dict, summary: SummaryFile | None
) -> str | None:
    """How a run that did not succeed ended, in one line (None for a succeeded or active run)."""
    ended = state in TERMINAL_STATES or state == "killed"
    if state == "succeeded" or not (ended or outcome in ("failed", "stopped")):
        return None
    parts: list[str] = []
    if summary and summary.error:
        parts.append(_one_line(summary.error, 300))
    elif summary and outcome == "stopped" and summary.detail:
        parts.append(_one_line(summary.detail, 300))
    if isinstance(meta.get("error"), str) and meta["error"]:
        parts.append(_one_line(meta["error"], 300))
    elif state == "died":
        parts.append("the process ended without an exit status (SIGKILL, OOM killer or reboot)")
    elif state == "killed":
        parts.append(
            "killed by the lab: no checkpoint or summary was written for the stop, so the work "
            "since the last checkpoint is lost"
        )
    elif state == "stopped" and not parts and summary is None and not meta.get("pid"):
        parts.append("stopped on request before it started: it never ran")
    elif state == "stopped" and not parts:
        steps = _int_or_none(summary.steps) if summary else None
        at = f" at step {steps}" if steps is not None else ""
        parts.append(f"stopped on request{at}; resuming it continues from its checkpoint")
    if meta.get("signal") not in (None, "", 0):
        parts.append(f"signal {meta.get('signal')}")
    if meta.get("exit_code") not in (None, 0):
        parts.append(f"exit code {meta.get('exit_code')}")
    if state in ("failed", "died", "killed") and not (summary and summary.error):
        line = last_error_mention(tail_text(path / "train.log"))
        if line:
            parts.append(f"last log line: {line}")
    return "; ".join(parts) or state


def _state_of(
    meta: dict, outcome: str | None, summary: SummaryFile | None, warnings: list[str]
) -> str:
    """The run's state for the ledger: run.json's, unless the trainer's summary says it ended
    while run.json still calls it active; disagreements become warnings."""
    state = meta.get("state") if isinstance(meta.get("state"), str) else None
    if outcome in TERMINAL_STATES and (state is None or state in ACTIVE_STATES):
        state = outcome
    state = state or "unknown"
    if outcome in TERMINAL_STATES and state in TERMINAL_STATES and outcome != state:
        warnings.append(f"run.json says {state} but summary.json says {outcome}")
    if summary is None and state in TERMINAL_STATES | {"unknown"}:
        warnings.append("no summary.json (the run may have died before writing one)")
    return state


def _read_config(path: Path, family: str | None, warnings: list[str]) -> TrainerConfig | None:
    """The run's resolved config.yaml as the view (None, with a warning, when missing or
    unreadable)."""
    if not (path / "config.yaml").exists():
        warnings.append("config.yaml is missing")
        return None
    try:
        return TrainerConfig(family or "", load_yaml(path / "config.yaml"))
    except LabError as err:
        warnings.append(f"config.yaml unreadable: {err}")
        return None


def _steps(summary: SummaryFile | None, progress: Any, rows: list[dict]) -> int | None:
    """Steps done: the summary's, else progress.json's, else the last logged step."""
    steps = _int_or_none(summary.steps) if summary else None
    if steps is None and progress is not None:
        steps = _int_or_none(progress.step)
    if steps is None and rows:
        steps = max(
            (s for r in rows if (s := _int_or_none(r.get("step"))) is not None), default=None
        )
    return steps


def inspect_run(run_id: str) -> RunRecord:
    """Build a run's record from its folder without writing anything (no plot)."""
    return _build_record(find_run(run_id), run_id)


def _build_record(path: Path, run_id: str) -> RunRecord:
    warnings: list[str] = []
    campaign = path.parent.parent.name
    found = read_record(path)
    if found.data is None and found.warning:
        warnings.append(found.warning)
    elif found.data is None:
        warnings.append("run.json is missing (the run was not started by the lab?)")
    meta = found.data or {}
    summary, warning = read_summary(path)
    warnings += [warning] if warning else []
    progress, warning = read_progress(path)
    warnings += [warning] if warning else []
    family = meta.get("family") if isinstance(meta.get("family"), str) else None
    cfg = _read_config(path, family, warnings)
    metric_lines = read_metrics_file(path / "metrics.jsonl")
    rows = metric_lines.rows
    warnings += [metric_lines.warning] if metric_lines.warning else []
    sample_lines = read_json_lines(path / "samples.jsonl")
    warnings += [sample_lines.warning] if sample_lines.warning else []

    if meta.get("id") not in (None, run_id):
        warnings.append(f"run.json id {meta.get('id')!r} differs from the folder name")
    if meta.get("campaign") not in (None, campaign):
        warnings.append(f"run.json campaign {meta.get('campaign')!r} differs from the folder's")

    algorithm = meta.get("algorithm") or _first(
        cfg, ("algorithm", "loss", "kind", "selection.strategy", "strategy")
    )
    if algorithm is not None and not isinstance(algorithm, str):
        algorithm = str(algorithm)
    outcome = summary.outcome if summary else None
    state = _state_of(meta, outcome, summary, warnings)

    argv = meta.get("argv")
    argv = [str(a) for a in argv] if isinstance(argv, list) else []
    overrides = meta.get("overrides") if isinstance(meta.get("overrides"), list) else []
    source = meta.get("config_source") if isinstance(meta.get("config_source"), str) else None
    cwd = meta.get("cwd") if isinstance(meta.get("cwd"), str) else None
    changes = _config_changes(family, source, cwd, cfg, warnings)
    lineage = _lineage(meta)
    if lineage is not None:  # a referenced model is shown as the run it came from, not a path
        refs = lineage.references
        changes = [
            c.model_copy(update={"used": f"run:{refs[c.key]}"}) if c.key in refs else c
            for c in changes
        ]

    names = _expand_metric_names(_metric_keys(family))
    summary_data = summary.model_dump() if summary else None
    metrics = summarize_metrics(rows, names, summary_data, family)
    total = (_int_or_none(summary.total_steps) if summary else None) or (
        _int_or_none(progress.total_steps) if progress else None
    )
    wandb = meta.get("wandb_url") or (summary.wandb_url if summary else None)
    model = _first(cfg, ("model.name", "model_name"))
    if lineage is not None and "model.name" in lineage.references:
        from rlhf_lab.runs.lineage import describe_ref

        model = describe_ref(lineage.references["model.name"])
    root = repo_root()
    attempts = attempts_of(path, meta, state, run_id)
    walls = [a.wall_time_s for a in attempts if a.wall_time_s is not None]
    flags = run_flags(family, algorithm, rows, sample_lines.rows, cfg)
    gamed = overoptimisation(rows) if "overoptimisation" in flags else None
    return RunRecord(
        run_id=run_id,
        campaign=campaign,
        family=family,
        algorithm=algorithm,
        state=state,
        outcome=outcome,
        failure=_failure(path, state, outcome, meta, summary),
        command=lab_command(meta),
        trainer_command=trainer_command(argv),
        argv=portable_argv(argv),  # no machine paths in a committed ledger
        overrides=[str(o) for o in overrides],
        model=None if model is None else _one_line(model, 200),
        dataset=_dataset_of(cfg),
        seed=_int_or_none(_first(cfg, ("seed", "train.seed"))),
        config_source=source,
        recipe=recipe_argument(source),
        settings=_settings(family, cfg),
        config_file=os.path.relpath(path / "config.yaml", root) if cfg is not None else None,
        changes=changes,
        metrics=metrics,
        performance=summarize_performance(rows),
        steps=_steps(summary, progress, rows),
        total_steps=total,
        wall_time_s=sum(walls) if walls else None,
        predicted_wall_s=predicted_total_s(meta),
        attempts=attempts,
        headline=_headline(family, algorithm, metrics, rows, cfg),
        flags=list(flags),
        gold_peak_step=gamed.gold_peak_step if gamed else None,
        wandb_url=str(wandb) if wandb else None,
        samples=_sample_excerpts(sample_lines.rows),
        diagnostics=_diagnose(family, state, rows, metrics, flags),
        warnings=warnings,
        run_dir=os.path.relpath(path, root),
        recorded_at=_now(),
        lineage=lineage,
        evaluation=_evaluation(path, family, warnings),
        calibration=_calibration(path),
    )


def _calibration(path: Path) -> list[str]:
    """The run's difficulty calibration (calibration.json) as markdown lines; [] without one."""
    from rlhf_lab.planning.calibration_apply import read_calibration, render_table

    cal = read_calibration(path)
    return render_table(cal, markdown=True) if cal is not None else []


def _evaluation(path: Path, family: str | None, warnings: list[str]) -> EvalSummary | None:
    """An evaluation job's numbers from its eval.json (rlhf_lab.evaluation.records)."""
    if not is_evaluation(family):
        return None
    summary, warning = read_eval_summary(path)
    warnings += [warning] if warning else []
    return summary


def _lineage(meta: dict) -> Lineage | None:
    """The run's upstream runs and pipeline stage from run.json (None for a run with neither)."""
    after = meta.get("after") if isinstance(meta.get("after"), list) else []
    refs = meta.get("references") if isinstance(meta.get("references"), dict) else {}
    stage = meta.get("stage") if isinstance(meta.get("stage"), str) else None
    if not (after or refs or stage):
        return None
    pipeline = meta.get("pipeline") if isinstance(meta.get("pipeline"), str) else None
    return Lineage(
        after=[str(a) for a in after],
        references={str(k): str(v) for k, v in refs.items()},
        pipeline=pipeline,
        stage=stage,
    )


def _diagnose(
    family: str | None,
    state: str,
    rows: list[dict],
    metrics: list[MetricSummary],
    flags: dict[str, str],
) -> list[str]:
    """The ledger row's diagnostics: the lab's end-of-run notes (:func:`rlhf_lab.results.diagnosis.run_notes`,
    the diagnosis' rules for a finished run's metrics, with its held-out and sample findings)."""
    finals = {m.name: m.final for m in metrics}
    return run_notes(family, state, rows, [m.name for m in metrics], finals, flags)


def _headline(
    family: str | None,
    algorithm: str | None,
    metrics: list[MetricSummary],
    rows: list[dict],
    cfg: TrainerConfig | None,
) -> HeadlineValue | None:
    """The run's held-out headline (:func:`rlhf_lab.results.headline.headline_for` with its config and
    rows: the gold reward for a run optimising a learned reward model): final value, items it
    was measured on, Wilson interval."""
    head = headline_for(family, algorithm, cfg, rows)
    if head is None:
        return None
    summary = next((m for m in metrics if m.name == head.metric), None)
    value = summary.final if summary else None
    if value is not None and not math.isfinite(value):
        value = None
    count = heldout_items(family, cfg, rows)
    noise = noise_interval(head, value, count.n) if value is not None else None
    signal = next((m for m in metrics if m.name == head.training_signal), None)
    start = start_value([r for r in rows if r.get("phase") in ("eval", None)], head.metric)
    return HeadlineValue(
        metric=head.metric,
        label=head.label,
        higher_is_better=head.higher_is_better,
        value=value,
        step=summary.final_step if summary else None,
        n=count.n,
        n_source=count.source,
        low=noise.low if noise else None,
        high=noise.high if noise else None,
        training_signal=head.training_signal,
        training_value=signal.final if signal else None,
        start_value=start[1] if start else None,
        start_step=start[0] if start and isinstance(start[0], int) else None,
    )


def read_metric_rows(run_id: str) -> list[dict]:
    """metrics.jsonl rows of a run (unreadable lines skipped)."""
    return read_metrics_file(find_run(run_id) / "metrics.jsonl").rows


def _settings(family: str | None, cfg: TrainerConfig | None) -> dict[str, Any]:
    """The config values the Next section's follow-ups change (learning rate, steps, KL)."""
    if cfg is None or family not in CATALOG_FAMILIES:
        return {}
    from trainers.core.spec import FAMILY_NAMES, family_spec

    if family not in FAMILY_NAMES:
        return {}
    spec = family_spec(family)
    keys = [spec.learning_rate_key, spec.steps_key, spec.kl_key, "loss.kl_estimator"]
    return {k: cfg.get(k) for k in keys if k and cfg.get(k) is not None}
