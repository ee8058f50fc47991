"""The `rlhf-lab` command line: a thin typer adapter over :mod:`rlhf_lab.api`.

Each command adapts its arguments, calls one function of the lab API and renders the result
(:data:`~rlhf_lab.cli.commands.COMMAND_OPERATIONS`); the CLI imports nothing else of the lab but
:mod:`rlhf_lab.errors` (tests/lab/test_import_contract.py). Reading commands take `--json`.

Start-up: importing this package loads almost nothing. :func:`main` first offers the command
line to :mod:`~rlhf_lab.cli.fast`, which answers the reading commands an agent polls
(`runs`, `status` with no active run, `campaign list`, `version`) without typer, pydantic or
the run modules, and declines anything else (a flag it does not know, `--help`, a bad value, work it cannot do
cheaply); then the typer app (:mod:`~rlhf_lab.cli.commands`, its commands by group in
:mod:`~rlhf_lab.cli.experiments`, :mod:`~rlhf_lab.cli.watching`,
:mod:`~rlhf_lab.cli.campaigns`, :mod:`~rlhf_lab.cli.admin`) handles it. Both print the same
(tests/lab/test_cli_fast.py).

Errors: an expected failure (:class:`~rlhf_lab.errors.LabError`) prints ONE line on stderr,
``error: <message> (next: `rlhf-lab ...`)`` with its next steps rendered as commands
(:func:`~rlhf_lab.cli.steps.render_step`), and exits with code 2 whatever its kind. The kinds
are not mapped to distinct codes on purpose: scripts and the reliability tests rely on "2 = the
lab refused the request"; 1 means a followed run did not succeed (``launch --foreground``);
anything else is a bug in rlhf-lab and keeps its traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = [
    "CLI_OPERATIONS",
    "COMMAND_OPERATIONS",
    "Command",
    "app",
    "error_line",
    "lab_errors",
    "main",
    "render_step",
]

# name -> the module it is loaded from on first use (the typer app costs typer and rich)
_LAZY = {
    "app": "rlhf_lab.cli.commands",
    "emit": "rlhf_lab.cli.commands",
    "COMMAND_OPERATIONS": "rlhf_lab.cli.commands",
    "CLI_OPERATIONS": "rlhf_lab.cli.steps",
    "Command": "rlhf_lab.cli.steps",
    "error_line": "rlhf_lab.cli.steps",
    "lab_errors": "rlhf_lab.cli.steps",
    "render_step": "rlhf_lab.cli.steps",
    "STOP_OR_DETACH": "rlhf_lab.cli.experiments",
    "_stop_or_detach": "rlhf_lab.cli.experiments",
    "_ask": "rlhf_lab.cli.experiments",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in ("CLI_OPERATIONS", "Command", "error_line", "lab_errors", "render_step"):
        importlib.import_module("rlhf_lab.cli.commands")  # every command registered first
    return getattr(importlib.import_module(_LAZY[name]), name)


def main() -> None:
    from rlhf_lab.cli.fast import answer

    code = answer(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from rlhf_lab.cli.commands import app

    app()
