"""Gates between pipeline stages: a stage does not start unless an upstream stage's held-out
metric clears a bar. Torch-free.

The rlhf pipeline gates its RL stage on the reward model: PPO against a reward model whose
held-out accuracy is at chance optimises noise. The rule (:func:`gate_reason`): the upstream
run's final held-out ``metric`` (``eval/accuracy``: the share of held-out pairs it ranks
correctly), read from its summary.json (else its last eval row), must have the lower end of its
95% Wilson interval over the ``n`` held-out pairs (summary's ``data.n_eval``, else the config's
``data.eval_size``) *above* ``above`` (0.5, chance). 0.75 on 64 pairs passes (lower bound
0.63); 0.56 on 64 does not (0.44). A missing metric also stops the stage.

A pipeline stage declares it (``gate: {stage: rm, metric: eval/accuracy, above: 0.5}``); the
pipeline writes it into the stage run's run.json as ``gates`` (``run`` = the upstream run id);
the queue worker checks it when the upstream runs have succeeded and cancels the run with the
reason instead of starting it (:func:`rlhf_lab.runs.deps.dependency_verdict`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GateDef", "gate_reason", "gates_reason", "held_out_metric"]

CHANCE = 0.5


class GateDef(BaseModel):
    """A stage's gate in a pipeline definition."""

    model_config = ConfigDict(extra="forbid")

    stage: str = Field(description="the upstream stage whose held-out metric is checked")
    metric: str = Field(default="eval/accuracy", description="a held-out proportion")
    above: float = Field(default=CHANCE, ge=0.0, lt=1.0, description="its Wilson lower bound's bar")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def held_out_metric(run_dir: Path, metric: str) -> tuple[float | None, int | None]:
    """(the run's final held-out ``metric``, the number of held-out items) from its
    summary.json (``final_eval``, ``data.n_eval``), else its last eval row and config."""
    value: float | None = None
    n: int | None = None
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    if isinstance(summary, dict):
        value = _number((summary.get("final_eval") or {}).get(metric))
        n_eval = _number((summary.get("data") or {}).get("n_eval"))
        n = int(n_eval) if n_eval else None
    if value is None:
        from rlhf_lab.runs.folder import read_metric_rows

        rows = [r for r in read_metric_rows(run_dir / "metrics.jsonl").rows if metric in r]
        value = _number(rows[-1][metric]) if rows else None
    if n is None:
        from rlhf_lab.planning.trainer_config import read_run_config

        config = read_run_config(run_dir)
        size = _number(config.get("data.eval_size")) if config is not None else None
        n = int(size) if size else None
    return value, n


def gate_reason(run_dir: Path, metric: str = "eval/accuracy", above: float = CHANCE) -> str | None:
    """Why the run at ``run_dir`` does not clear the gate (see the rule above), or None."""
    from rlhf_lab.results.stats import wilson_interval

    value, n = held_out_metric(run_dir, metric)
    name = run_dir.name
    if value is None or not n or not 0.0 <= value <= 1.0:
        return f"{name} logged no held-out {metric} (a proportion) to check against {above:g}"
    low = wilson_interval(value, n).low
    if low > above:
        return None
    return (
        f"{name}'s held-out {metric} is {value:.3f} on {n} items: the lower end of its 95% "
        f"Wilson interval, {low:.3f}, is not above {above:g} (chance), so the next stage would "
        "optimise noise; train a better reward model (more pairs or steps), then launch the "
        "stage against it"
    )


def gates_reason(record: dict) -> str | None:
    """The first gate in a run.json's ``gates`` that its upstream run does not clear, as the
    reason to cancel the run, or None (no gates, or all cleared)."""
    from rlhf_lab.paths import LabError, find_run

    for gate in record.get("gates") or []:
        if not isinstance(gate, dict) or not gate.get("run"):
            continue
        try:
            run_dir = find_run(str(gate["run"]))
        except LabError:
            return f"cancelled before it started: gated run {gate['run']} no longer exists"
        why = gate_reason(
            run_dir, str(gate.get("metric", "eval/accuracy")), gate.get("above", CHANCE)
        )
        if why is not None:
            return f"cancelled before it started: {why}"
    return None
