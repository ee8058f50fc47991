"""A trainer refusing bad input: it checks its config and data before it writes anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from trainers.core.harness import EXIT_CONFIG_ERROR


def assert_refused_before_writing(exit_code: int, run_dir: Path, capsys, message: str) -> None:
    """A trainer's ``main`` into ``run_dir`` returned ``exit_code``: the config-error code, with
    ``message`` on stderr (read from ``capsys``) and no run folder left behind."""
    assert exit_code == EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert message in err, err[-2000:]
    assert not run_dir.exists()


def refused_before_writing_test(cases: list[tuple], start: Callable[..., int]) -> Callable:
    """A test, parametrized over ``cases``, that a trainer refuses bad input before it writes:
    each case holds the arguments ``start`` takes after the run folder (the bad overrides, and
    for a family of several recipes the recipe first), then the message stderr must show.
    ``start(run_dir, *arguments)`` runs the trainer's ``main`` and returns its exit code. Bind
    the result to a ``test_`` name in the test module."""

    @pytest.mark.parametrize("case", cases, ids=[_case_id(case) for case in cases])
    def test(tmp_path, capsys, case):
        *arguments, message = case
        run_dir = tmp_path / "run"
        assert_refused_before_writing(start(run_dir, *arguments), run_dir, capsys, message)

    return test


def _case_id(case: tuple) -> str:
    """A refusal case named by its arguments: the recipe if any, then the bad overrides."""
    return " ".join(a if isinstance(a, str) else " ".join(a) for a in case[:-1])
