"""Run folders written by hand, shaped as the launcher (run.json) and a trainer (config.yaml,
metrics.jsonl, summary.json, exit.json) leave them: the lab only reads files, so its bookkeeping
can be tested without training anything. A run folder is ``<root>/experiments/<campaign>/runs/
<run id>``: these helpers read the run id and the campaign from its path."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

from trainers.core.runfolder import RunFile

CREATED_AT = "2026-01-01T00:00:00.000+00:00"
# The keys a supervised family's train row carries after its own metrics (trainers/core/loop.py
# step_metrics): what a real SFT run is checked to log, and what hand-written DPO rows carry.
STEP_KEYS = [
    "grad_norm",
    "learning_rate",
    "epoch",
    "throughput/tokens_per_s",
    "timing/step_s",
    "memory/peak_gb",
    "mfu/step",
]


def trainer_command(family: str, run_dir: Path) -> list[str]:
    """The trainer's command line as the launcher records it for ``run_dir``."""
    module = f"trainers.{family}.train"
    config = str(run_dir / "config.yaml")
    return [sys.executable, "-m", module, "--config", config, "--run-dir", str(run_dir)]


def write_run_json(run_dir: Path, family: str, algorithm: str, **fields) -> RunFile:
    """Make ``run_dir`` (and its parents) and write its run.json: the id and the campaign from
    the path, the launcher's command line for ``family`` and device ``cpu`` unless ``fields``
    give ``argv`` or ``device``, then ``fields``, the other RunFile fields (state, created_at,
    overrides, ...). A field none of these sets is not written (readers take its default).
    Returns the record."""
    run_dir.mkdir(parents=True, exist_ok=True)
    campaign = run_dir.parent.parent.name
    fields = {"argv": trainer_command(family, run_dir), "device": "cpu", **fields}
    record = RunFile(
        id=run_dir.name, family=family, algorithm=algorithm, campaign=campaign, **fields
    )
    (run_dir / "run.json").write_text(record.model_dump_json(exclude_unset=True))
    return record


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    """``rows`` as JSON lines (metrics.jsonl, samples.jsonl)."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_ending(run_dir: Path, outcome: str, **summary) -> None:
    """summary.json (``outcome`` and the ``summary`` fields) and exit.json (code 0 for a
    success, 1 otherwise, no signal) as a trainer that ended on its own leaves them."""
    (run_dir / "summary.json").write_text(json.dumps({"outcome": outcome, **summary}))
    code = 0 if outcome == "succeeded" else 1
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": code, "signal": None}))


def write_tiny_final_model(run_dir: Path) -> None:
    """final_model/ as a trainer saves it, holding only its config.json: the tiny preset's
    architecture (all the lab reads of a model it does not load)."""
    from rlhf_lab.planning.memory.architecture import _preset_config

    (run_dir / "final_model").mkdir()
    (run_dir / "final_model" / "config.json").write_text(json.dumps(_preset_config("tiny")))
