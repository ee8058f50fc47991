"""A trainer refusing bad input: it checks its config and data before it writes anything."""

from __future__ import annotations

from pathlib import Path

from trainers.core.harness import EXIT_CONFIG_ERROR


def assert_refused_before_writing(exit_code: int, run_dir: Path, capsys, message: str) -> None:
    """A trainer's ``main`` into ``run_dir`` returned ``exit_code``: the config-error code, with
    ``message`` on stderr (read from ``capsys``) and no run folder left behind."""
    assert exit_code == EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert message in err, err[-2000:]
    assert not run_dir.exists()
