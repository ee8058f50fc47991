"""Migration of a campaign to portable paths: its committed files rewritten without machine paths
(the rules of :mod:`rlhf_lab.ledger.portable`; run.json's ``cwd`` -> ``.``) and its markdown
rendered again from the rewritten ledger with the lab's renderer. Run it before committing a
campaign (the campaigns recorded before the rule were migrated with it). Torch-free.

Ledgers of the first round stored the trainer's argv as a run's ``command`` (the field now holds
the lab command, under "Reproduce (lab command)"); the migration moves it to ``trainer_command``
(:func:`rlhf_lab.ledger.commands.trainer_command` of the portable argv).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rlhf_lab.ledger.portable import TEXT_SUFFIXES, portable_argv, portable_text

__all__ = ["make_campaign_portable"]

_CWD = re.compile(r'("cwd"\s*:\s*)"[^"]*"')


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
