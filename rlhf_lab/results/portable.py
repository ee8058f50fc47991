"""Machine paths out of what a campaign commits: repository-relative paths instead of the
absolute paths of the machine that ran it. Torch-free.

A run records where it ran (the interpreter ``/…/.venv/bin/python``, its folder
``/…/experiments/<campaign>/runs/<id>``, the lab's cache ``/root/.cache/rlhf-lab/…``); committed
as they are, a campaign names one machine's folders and is unreadable anywhere else. The rules
(:func:`portable_path`):

* an interpreter or tool of a virtual environment (``…/.venv/bin/python3``) -> its name
  (``python3``: the command runs under ``uv run`` from the repository root);
* a path through a repository's ``experiments/`` -> ``experiments/…`` (relative to the root);
* a path inside a home folder (``/root/…``, ``/home/<user>/…``, ``/Users/<user>/…``) -> ``~/…``;
* a run's working folder (``cwd`` in run.json) -> ``.`` (the repository root).

Ledgers of the first round stored the trainer's argv as a run's ``command`` (the field now holds
the lab command, under "Reproduce (lab command)"); the migration moves it to ``trainer_command``
(:func:`rlhf_lab.ledger.commands.trainer_command` of the portable argv).

The ledger stores a run's argv this way (:func:`portable_argv`); :func:`make_campaign_portable`
rewrites a campaign's committed files by these rules and renders its markdown again with the
lab's renderer (the migration of the campaigns recorded before the rule). :data:`MACHINE_PATH`
finds what is left (the test over ``experiments/``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "MACHINE_PATH",
    "TEXT_SUFFIXES",
    "make_campaign_portable",
    "portable_argv",
    "portable_path",
    "portable_text",
]

# An absolute path under a folder that belongs to one machine (not a system path such as /usr).
MACHINE_PATH = re.compile(
    r"(?<![\w.~-])/(?:root|home|tmp|work|Users|private|mnt|scratch)(?:/[^\s\"'(),;`<>|]*)?"
)
_HOME = re.compile(r"/(?:root|home/[^/]+|Users/[^/]+)(?:/(.*))?$")
_CWD = re.compile(r'("cwd"\s*:\s*)"[^"]*"')
TEXT_SUFFIXES = frozenset({".json", ".jsonl", ".yaml", ".yml", ".log", ".md", ".txt", ".csv"})


def portable_path(path: str) -> str:
    """``path`` without its machine part by the rules of the module docstring (a path none of
    them applies to is returned as it is)."""
    if "/.venv/bin/" in path:
        return path.rsplit("/", 1)[1]
    if "/experiments/" in path:
        return "experiments/" + path.split("/experiments/", 1)[1]
    home = _HOME.match(path)
    if home is not None:
        return "~/" + (home.group(1) or "")
    return path


def portable_text(text: str) -> str:
    """Every machine path in ``text`` made portable (:func:`portable_path`)."""
    return MACHINE_PATH.sub(lambda m: portable_path(m.group(0)), text)


def portable_argv(argv: Sequence[str]) -> list[str]:
    """A recorded argv with its machine paths made portable (an argument that holds a path,
    ``--config=/…``, too)."""
    return [portable_text(str(a)) for a in argv]


def _portable_file(path: Path) -> bool:
    """Rewrite one file in place; whether it changed."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return False
    new = text
    if path.name == "run.json":
        new = _CWD.sub(r'\1"."', new)
    new = portable_text(new)
    if path.suffix == ".json" and new != text:
        json.loads(new)  # still JSON: a replacement never adds a quote
    if new == text:
        return False
    path.write_text(new)
    return True


def _legacy_commands(path: Path) -> None:
    """A first-round ledger's trainer argv stored as ``command``: moved to ``trainer_command``
    (a lab command starts with ``uv run rlhf-lab``)."""
    from rlhf_lab.ledger.commands import trainer_command

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    moved = False
    for run in data.get("runs") or []:
        command = run.get("command")
        if isinstance(command, str) and not command.startswith("uv run rlhf-lab"):
            argv = portable_argv(run.get("argv") or [])
            run["trainer_command"] = trainer_command(argv) or portable_text(command)
            run["command"] = None
            moved = True
    if moved:
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def make_campaign_portable(campaign: str) -> list[Path]:
    """Rewrite the text files of ``campaign``'s folder (ledger.json, and each run's run.json,
    config.yaml, summary.json, train.log …) without machine paths, then render its markdown
    again from the rewritten ledger with the lab's renderer. Returns the files changed."""
    from rlhf_lab.ledger import render_campaign
    from rlhf_lab.ledger.campaigns import resolve_campaign
    from rlhf_lab.paths import experiments_dir

    name = resolve_campaign(campaign)
    folder = experiments_dir() / name
    _legacy_commands(folder / "ledger.json")
    changed = [
        p
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.suffix in TEXT_SUFFIXES and _portable_file(p)
    ]
    md = experiments_dir() / f"{name}.md"
    before = md.read_text() if md.is_file() else None
    render_campaign(name)  # the markdown again, from the rewritten ledger.json
    _portable_file(md)  # hand-written text outside the markers is kept as it was written
    if md.is_file() and md.read_text() != before:
        changed.append(md)
    return changed
