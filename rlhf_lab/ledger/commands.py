"""Commands and attempts of a run, as a reader elsewhere needs them: the lab-level command that
reproduces a run (``uv run rlhf-lab launch <recipe> --set ... --campaign ...``, rebuilt from what
the launcher records in run.json: the shipped config, every applied override — the shrink's and
the user's — and the campaign), the trainer's command with repository-relative paths, and one
:class:`~rlhf_lab.ledger.schema.Attempt` per launch or resume. Torch-free; reads only.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
from pathlib import Path
from typing import Any

from rlhf_lab.index.campaign_summary import _int_or_none
from rlhf_lab.ledger.schema import Attempt
from rlhf_lab.ledger.text import _one_line
from rlhf_lab.paths import repo_root
from rlhf_lab.planning.catalog import list_recipes, source_root
from rlhf_lab.results.plots import as_float
from rlhf_lab.runs.folder import read_summary

__all__ = ["attempts_of", "lab_command", "recipe_argument", "trainer_command"]

LAB = ["uv", "run", "rlhf-lab"]


def _relative(path: str) -> str:
    """``path`` relative to the project root (or the source root) when it lies under one."""
    if not os.path.isabs(path):
        return path
    for root in (repo_root(), source_root()):
        try:
            rel = Path(path).resolve().relative_to(Path(root).resolve())
        except ValueError:
            continue
        return rel.as_posix()
    return path


def recipe_argument(config_source: str | None) -> str | None:
    """How ``launch`` names the recipe a run started from: the shipped recipe's name (its
    ``<family>/<name>`` id when the name is shared), else the YAML's path."""
    if not config_source:
        return None
    rel = _relative(config_source)
    try:
        recipes = list_recipes()
    except Exception:  # an unreadable recipe folder: the path still names it
        return rel
    hits = [r for r in recipes if r.config_path == rel]
    if hits:
        same_name = [r for r in recipes if r.name == hits[0].name]
        return hits[0].name if len(same_name) == 1 else hits[0].id
    return rel


def lab_command(meta: dict[str, Any], overrides: list[str] | None = None) -> str | None:
    """``uv run rlhf-lab launch <recipe> --set k=v ... --campaign <campaign>`` for a run.json
    (``overrides``: replace the recorded ones). Replays every applied override, so it runs the
    same config without ``--shrink``. None when run.json names no config."""
    recipe = recipe_argument(meta.get("config_source"))
    if recipe is None:
        return None
    items = meta.get("overrides") if overrides is None else overrides
    args = [*LAB, "launch", recipe]
    for item in items if isinstance(items, list) else []:
        args += ["--set", str(item)]
    refs = meta.get("references") if isinstance(meta.get("references"), dict) else {}
    after = meta.get("after") if isinstance(meta.get("after"), list) else []
    for run_id in after:  # a run:<id> value already implies waiting for that run
        if run_id not in refs.values():
            args += ["--after", str(run_id)]
    if isinstance(meta.get("campaign"), str) and meta["campaign"]:
        args += ["--campaign", meta["campaign"]]
    return shlex.join(args)


def trainer_command(argv: list[str]) -> str | None:
    """The trainer's argv as a command to run from the repository root: ``uv run python -m
    trainers.<family>.train --config experiments/.../config.yaml --run-dir experiments/...``
    (no interpreter path, paths relative to the repository, no ``--resume``)."""
    if not argv:
        return None
    rest = list(argv)
    first = Path(rest[0]).name
    if first.startswith("python") or first in ("py", "uv"):
        rest = rest[1:]
    out = ["uv", "run", "python"]
    out += [_relative(a) for a in rest if a != "--resume"]
    return shlex.join(out)


def _seconds_between(start: Any, end: Any) -> float | None:
    try:
        a = dt.datetime.fromisoformat(str(start).replace("Z", "+00:00"))
        b = dt.datetime.fromisoformat(str(end).replace("Z", "+00:00"))
    except ValueError:
        return None
    seconds = (b - a).total_seconds()
    return seconds if seconds >= 0 else None


def _summary_fields(folder: Path) -> tuple[str | None, int | None, float | None, str | None]:
    summary, _ = read_summary(folder)
    if summary is None:
        return None, None, None, None
    detail = summary.error or summary.detail
    return (
        summary.outcome,
        _int_or_none(summary.steps),
        as_float(summary.wall_time_s),
        None if not detail else _one_line(detail, 200),
    )


def attempts_of(path: Path, meta: dict[str, Any], state: str, run_id: str) -> list[Attempt]:
    """One attempt per start of the run: those before each resume (run.json ``resumes``, their
    files in ``attempts/<n>/``) and the current one (the run folder's own files)."""
    resumes = meta.get("resumes") if isinstance(meta.get("resumes"), list) else []
    resumes = [e if isinstance(e, dict) else {} for e in resumes]
    first = lab_command(meta)
    out: list[Attempt] = []
    for i, entry in enumerate(resumes, start=1):
        outcome, steps, wall, detail = _summary_fields(path / "attempts" / str(i))
        if wall is None:
            wall = _seconds_between(entry.get("started_at"), entry.get("ended_at"))
        if detail is None and entry.get("error"):
            detail = _one_line(entry["error"], 200)
        out.append(
            Attempt(
                number=i,
                state=entry.get("state") or outcome,
                steps=steps,
                resumed_from_step=None if i == 1 else _int_or_none(resumes[i - 2].get("from_step")),
                wall_time_s=wall,
                command=first if i == 1 else shlex.join([*LAB, "resume", run_id]),
                detail=detail,
            )
        )
    outcome, steps, wall, detail = _summary_fields(path)
    if wall is None and state not in ("queued", "starting", "running"):
        wall = _seconds_between(meta.get("started_at"), meta.get("ended_at"))
    n = len(resumes) + 1
    out.append(
        Attempt(
            number=n,
            state=state,
            steps=steps,
            resumed_from_step=_int_or_none(resumes[-1].get("from_step")) if resumes else None,
            wall_time_s=wall,
            command=first if n == 1 else shlex.join([*LAB, "resume", run_id]),
            detail=detail,
        )
    )
    return out
