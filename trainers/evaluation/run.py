"""Evaluate a trained model: task accuracy, win rate, generation health, pair accuracy.

    python -m trainers.evaluation.run --config trainers/evaluation/configs/<suite>.yaml \
        --run-dir DIR --set target=RUN_DIR_OR_MODEL [--set baseline=MODEL|auto] \
        [--set judge=RM_FOLDER] [--set key=value ...]

The job runs like a trainer (``trainers.core.harness``): the config and the inputs are checked
first (an unknown suite, a target without a model, a judge that is not a reward model, a
baseline whose tokenizer differs for the KL: one message, exit code 2, nothing written); then
the run folder gets ``config.yaml``, ``progress.json`` (phases ``loading_model``, ``generating``,
``evaluating``, ``saving``, ``done``), ``train.log`` lines, ``samples.jsonl`` (a few completions
side by side), ``items.jsonl`` (one row per prompt), one ``metrics.jsonl`` row (phase ``eval``,
``eval/<metric>``), ``eval.json`` (:class:`~trainers.core.runfolder.EvalFile`) and
``summary.json``. SIGTERM stops it at once wherever it is (an evaluation has nothing to
checkpoint) with outcome ``stopped``; ``--resume`` starts it again from the beginning.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainers.core.config import ConfigError
from trainers.core.harness import StopRequested, set_stop_handler, trainer_main
from trainers.core.models import model_fingerprint
from trainers.core.rundir import RunDir, append_jsonl, atomic_write_json
from trainers.core.runfolder import EvalFile, SummaryFile
from trainers.evaluation.cache import cache_key, settings_of
from trainers.evaluation.config import AUTO, BUILTIN_ARITHMETIC, EvalConfig
from trainers.evaluation.statistics import Estimate
from trainers.evaluation.targets import (
    ModelRef,
    check_judge,
    check_policy,
    resolve_ref,
    same_tokenizer,
    starting_model,
)

EVAL_FILE = "eval.json"
ITEMS_FILE = "items.jsonl"

# ---------------------------------------------------------------------------------------------
# Inputs, checked before anything is written
# ---------------------------------------------------------------------------------------------


def resolve_inputs(cfg: EvalConfig) -> tuple[ModelRef, ModelRef | None, str | None]:
    """(target, baseline, judge folder); ConfigError for anything that cannot be evaluated."""
    if not cfg.target:
        raise ConfigError(
            "target: name the model to evaluate (a run folder, a final_model folder or a model "
            "name), e.g. --set target=experiments/<campaign>/runs/<run-id>"
        )
    target = resolve_ref(cfg.target, "target")
    check_policy(target, "target")
    if cfg.suite == "pair_accuracy" and target.family != "direct_alignment":
        raise ConfigError(
            f"the pair_accuracy suite measures a direct-alignment run's implicit reward; the "
            f"target {cfg.target!r} is "
            + (f"a {target.family} run" if target.family else "not a run folder")
        )
    baseline = None
    if cfg.baseline is not None:
        name = starting_model(target) if cfg.baseline == AUTO else cfg.baseline
        baseline = resolve_ref(name, "baseline")
        if cfg.baseline == AUTO:
            baseline.given = f"auto ({name})"
        check_policy(baseline, "baseline")
    judge = check_judge(cfg.judge)[0] if cfg.suite == "winrate" and cfg.judge else None
    return target, baseline, judge


def preflight(cfg: EvalConfig) -> None:
    target, baseline, _ = resolve_inputs(cfg)
    suite = cfg.suite
    if suite == "pair_accuracy":
        if target.run_config.data.eval_size < 1:
            raise ConfigError(f"the target run {cfg.target!r} held out no pairs (eval_size 0)")
        return
    if suite == "math":
        ds = cfg.math.dataset
        if ds != BUILTIN_ARITHMETIC and ds.startswith("builtin:"):
            raise ConfigError(f"math.dataset {ds!r}: the offline set is {BUILTIN_ARITHMETIC}")
        from trainers.core.datasets import looks_like_path

        if looks_like_path(ds) and not Path(ds).expanduser().exists():
            raise ConfigError(f"math.dataset: file not found: {ds}")
        return
    if suite == "best_of_n":
        from trainers.evaluation.best_of_n_suite import check_inputs

        check_inputs(cfg)
    source = cfg.prompts.source
    if suite in ("winrate", "generation") and source == "auto":
        source = "preference" if target.family == "direct_alignment" else "reasoning_gym"
    if suite in ("reasoning", "best_of_n") or source == "reasoning_gym":
        from trainers.core.prompts import check_specs
        from trainers.evaluation.prompts import reasoning_specs

        check_specs(reasoning_specs(cfg, target))
    elif cfg.prompts.dataset is None and target.family != "direct_alignment":
        raise ConfigError(
            "prompts.source=preference needs prompts.dataset unless the target is a "
            "direct-alignment run (its held-out split is used)"
        )
    if suite == "generation" and cfg.generation.kl and baseline is not None:
        differs = same_tokenizer(target.model, baseline.model)
        if differs:
            raise ConfigError(
                f"generation.kl: the baseline {baseline.given!r} does not share the target's "
                f"tokenizer ({differs}); a sequence KL needs both models to score the same "
                "tokens. Pick a baseline of the same family, or set generation.kl=false"
            )


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


def _metric(e: Estimate) -> dict[str, Any]:
    return e.as_dict()


def _fingerprint(name: str) -> str | None:
    try:
        return model_fingerprint(name)
    except Exception:  # noqa: BLE001 - a fingerprint must not fail an evaluation
        return None


def _line(name: str, e: Estimate) -> str:
    if e.value is None:
        return f"{name} n/a"
    if e.low is None:
        return f"{name} {e.value:.4g}"
    return f"{name} {e.value:.4g} [{e.low:.4g}, {e.high:.4g}]"


def evaluate(cfg: EvalConfig, run: RunDir, resume: bool) -> SummaryFile:
    from trainers.evaluation.jobs import Job
    from trainers.evaluation.suites import SUITE_FUNCTIONS

    started = time.time()
    set_stop_handler(
        lambda stop: (
            f"SIGTERM during {stop.where or run.phase}: the evaluation stopped; nothing "
            "is kept (an evaluation starts again from the beginning)"
        )
    )
    if resume:  # an evaluation keeps no partial state: start over
        run.truncate_metrics_after(-1)
        (run.path / ITEMS_FILE).unlink(missing_ok=True)
    target, baseline, judge = resolve_inputs(cfg)
    print(
        f"evaluation {cfg.suite}: target {target.model}"
        + (f", baseline {baseline.model}" if baseline else "")
        + (f", judge {judge}" if judge else ""),
        flush=True,
    )
    fingerprints = {"target": _fingerprint(target.model)}
    if baseline is not None:
        fingerprints["baseline"] = _fingerprint(baseline.model)
    if judge is not None:
        fingerprints["judge"] = _fingerprint(judge)
    fingerprints = {k: v for k, v in fingerprints.items() if v}
    job = Job(cfg, run, target, baseline, judge)
    job.fingerprints = fingerprints
    result = SUITE_FUNCTIONS[cfg.suite](job)

    job.enter("saving", EVAL_FILE)
    settings = settings_of(cfg)
    per_model_settings = {**settings, "judge": fingerprints.get("judge")}
    cache_keys = {
        role: cache_key(fp, per_model_settings, result.prompt_set)
        for role, fp in fingerprints.items()
        if role in ("target", "baseline")
    }
    if cfg.suite not in ("reasoning", "math"):
        cache_keys = {}  # the numbers depend on both models together (or on the run's data)
    details = {**result.details, "prompt_set": result.prompt_set}
    if target.run_dir is not None:
        details["target_family"] = target.family
    eval_file = EvalFile(
        suite=cfg.suite,
        headline=cfg.headline,
        target=cfg.target or "",
        target_model=target.model,
        target_run=str(target.run_dir) if target.run_dir else None,
        baseline=baseline.given if baseline else None,
        baseline_model=baseline.model if baseline else None,
        judge=judge,
        level=cfg.bootstrap.level,
        settings=settings,
        metrics={k: _metric(v) for k, v in result.metrics.items()},
        baseline_metrics={k: _metric(v) for k, v in result.baseline_metrics.items()},
        difference={k: _metric(v) for k, v in result.difference.items()},
        details=details,
        fingerprints=fingerprints,
        cache_keys=cache_keys,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        wall_time_s=round(time.time() - started, 3),
    )
    for item in result.items:
        append_jsonl(run.path / ITEMS_FILE, item)
    run.log_samples(0, result.samples)
    row = {f"eval/{k}": v.value for k, v in result.metrics.items() if v.value is not None}
    row.update(
        {f"eval/diff/{k}": v.value for k, v in result.difference.items() if v.value is not None}
    )
    run.log_metrics(0, "eval", row)
    atomic_write_json(run.path / EVAL_FILE, eval_file.model_dump(mode="json"))

    for section, values in (
        ("target", result.metrics),
        ("baseline", result.baseline_metrics),
        ("target - baseline", result.difference),
    ):
        if values:
            shown = "  ".join(_line(k, v) for k, v in values.items())
            print(f"eval {cfg.suite} {section}: {shown}", flush=True)
    job.step = job.total
    job.enter("done", EVAL_FILE)
    return SummaryFile(
        outcome="succeeded",
        algorithm=cfg.suite,
        steps=job.total,
        total_steps=job.total,
        final_eval=row,
        detail=f"{EVAL_FILE}: {_line(cfg.headline, result.metrics[cfg.headline])}"
        if cfg.headline in result.metrics
        else EVAL_FILE,
    )


main = trainer_main(__doc__, EvalConfig, preflight, evaluate)

__all__ = ["EVAL_FILE", "ITEMS_FILE", "StopRequested", "evaluate", "main", "preflight"]

if __name__ == "__main__":
    sys.exit(main())
