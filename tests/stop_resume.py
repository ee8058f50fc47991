"""The stop-and-resume check every trainer family's tests make: a run stopped by a real SIGTERM
at the end of a step, then resumed, writes the history an uninterrupted run writes."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from trainers.core.rundir import read_jsonl

Run = Callable[[Path, bool], int]
"""``run(run_dir, resume) -> exit code``: one trainer run of the test's config."""


def outcome(run_dir: Path) -> str:
    return json.loads((run_dir / "summary.json").read_text())["outcome"]


def stop_at_step_then_resume(run: Run, run_dir: Path, sigterm_at, step: int) -> None:
    """``run`` into ``run_dir`` with a real SIGTERM at the end of step ``step`` (the
    ``sigterm_at`` fixture): exit 143, outcome ``stopped``, nothing logged after that step; then
    ``--resume`` to the end: exit 0, outcome ``succeeded``."""
    sigterm_at(f"step_end:{step}")
    assert run(run_dir, False) == 143
    assert outcome(run_dir) == "stopped"
    assert read_jsonl(run_dir / "metrics.jsonl")[-1]["step"] == step
    sigterm_at(None)
    assert run(run_dir, True) == 0
    assert outcome(run_dir) == "succeeded"


def assert_same_history(
    straight: Path,
    resumed: Path,
    keys: Sequence[str],
    sample_field: str | None = None,
    rel: float = 1e-4,
    abs_tol: float = 1e-6,
) -> None:
    """The two runs logged the same (step, phase) rows with the same ``keys`` (where a row has
    them, within ``rel``/``abs_tol``) and, with ``sample_field``, samples with the same values of
    that field."""
    a, b = read_jsonl(straight / "metrics.jsonl"), read_jsonl(resumed / "metrics.jsonl")
    assert [(r["step"], r["phase"]) for r in a] == [(r["step"], r["phase"]) for r in b]
    for x, y in zip(a, b, strict=True):
        for key in keys:
            if key in x:
                assert x[key] == pytest.approx(y[key], rel=rel, abs=abs_tol), (x["step"], key)
    if sample_field is not None:
        samples_a = read_jsonl(straight / "samples.jsonl")
        samples_b = read_jsonl(resumed / "samples.jsonl")
        assert [s[sample_field] for s in samples_a] == [s[sample_field] for s in samples_b]


def assert_resume_equals_straight_run(
    run: Run,
    tmp_path: Path,
    sigterm_at,
    step: int,
    keys: Sequence[str],
    sample_field: str | None = None,
) -> Path:
    """The check itself: ``run`` once straight into ``tmp_path/straight`` and once stopped at
    the end of ``step`` and resumed into ``tmp_path/half`` (:func:`stop_at_step_then_resume`);
    the two histories must be the same (:func:`assert_same_history`). The resumed run's folder."""
    straight, half = tmp_path / "straight", tmp_path / "half"
    assert run(straight, False) == 0
    stop_at_step_then_resume(run, half, sigterm_at, step)
    assert_same_history(straight, half, keys, sample_field)
    return half
