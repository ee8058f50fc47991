"""Dependencies between runs: a run launched ``after`` other runs stays ``queued`` until every
upstream run has succeeded, and becomes ``cancelled`` (never started, the reason in run.json's
``error``) as soon as one of them ends any other way. Resuming a failed upstream run re-arms its
cancelled dependents (queued again, same ``after``). Torch-free.

Who moves a dependent: the queue worker (``python -m rlhf_lab._queue``) looks at every queued
run in creation order, starts the first whose upstream runs all succeeded and cancels those
whose upstream failed; the recorder of a run that ends (and the worker, for the runs it started)
cancels that run's queued dependents at once, so a cancellation never waits for another job.

What is refused at launch, before anything is written: an upstream id that names no run, and an
upstream that already failed/stopped/was killed/died/was cancelled (a dependent of it could never
start: resume the upstream first). A new run cannot close a cycle (nothing waits for a run that
does not exist yet; pipelines refuse cycles among their stages); queued runs that a hand-edited
run.json makes wait for each other are cancelled by the worker (:func:`queued_cycles`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rlhf_lab.errors import Conflict, NextStep, NotFound
from rlhf_lab.paths import check_run_id, find_run
from rlhf_lab.runs.process import _run_lock
from rlhf_lab.runs.records import (
    UNFINISHED_STATES,
    _atomic_write_json,
    _atomic_write_text,
    _now,
    _read_record,
    _read_run_json,
)
from rlhf_lab.runs.state import _all_run_dirs, _status

if TYPE_CHECKING:  # pragma: no cover
    from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = [
    "FAILED_UPSTREAM_STATES",
    "Verdict",
    "cancel",
    "cancel_dependents_of",
    "check_after",
    "dependency_verdict",
    "ensure_final_model",
    "failed_upstream",
    "queued_cycles",
    "rearm",
    "rearm_dependents",
    "waiting_for",
]

# An upstream run in one of these states will never produce its output (until it is resumed).
FAILED_UPSTREAM_STATES = frozenset({"failed", "stopped", "killed", "died", "cancelled"})

Verdict = tuple[Literal["ready", "waiting", "cancel"], str | None]


def _upstream_state(run_id: str) -> str | None:
    """The derived state of an upstream run, None when it no longer exists."""
    try:
        return _status(find_run(run_id)).state
    except Exception:  # a run folder removed or damaged: the dependent cannot get its output
        return None


def _after_of(record: dict) -> list[str]:
    after = record.get("after")
    return [str(a) for a in after] if isinstance(after, list) else []


def _reaches(graph: dict[str, list[str]], start: str, target: str) -> list[str] | None:
    """A path of ``after`` edges from ``start`` to ``target`` (both included), or None."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        if node == target:
            return path
        if node in seen:
            continue
        seen.add(node)
        for up in graph.get(node, []):
            stack.append((up, [*path, up]))
    return None


def check_after(after: list[str] | None) -> list[str]:
    """The upstream run ids of a new run, checked (each names a run, none has already ended
    without succeeding) and without repeats; a typed error otherwise. Writes nothing."""
    out: list[str] = []
    for item in after or []:
        run_id = str(item).strip()
        if run_id.startswith("run:"):
            run_id = run_id[4:]
        check_run_id(run_id)
        if run_id not in out:
            out.append(run_id)
    for run_id in out:
        try:
            find_run(run_id)
        except NotFound:
            raise NotFound(
                f"cannot run after {run_id}: there is no run with that id",
                next=NextStep("list_runs"),
            ) from None
        state = _upstream_state(run_id)
        if state in FAILED_UPSTREAM_STATES:
            raise Conflict(
                f"cannot run after {run_id}: it is {state}, so a run waiting for it would never "
                "start; resume it first (its dependents then wait for the resumed attempt), or "
                "launch without it",
                next=[
                    NextStep("resume_run", {"run_id": run_id}),
                    NextStep("run_status", {"run_id": run_id}, note="why it ended"),
                ],
            )
    return out


def queued_cycles(queued: list[str]) -> dict[str, str]:
    """Queued runs that wait for each other in a circle (only a hand-edited run.json can do
    that) -> the reason to cancel them: none of them could ever start."""
    graph: dict[str, list[str]] = {}
    for run_id in queued:
        try:
            graph[run_id] = [a for a in _after_of(_read_run_json(find_run(run_id)) or {})]
        except Exception:
            continue
    out: dict[str, str] = {}
    for run_id, after in graph.items():
        for up in after:
            path = _reaches(graph, up, run_id)
            if path is not None:
                out[run_id] = (
                    "cancelled before it started: a dependency cycle "
                    f"({' -> '.join([run_id, *path])}) that no run could ever leave"
                )
                break
    return out


def dependency_verdict(record: dict) -> Verdict:
    """("ready", None) when every upstream run of a queued run has succeeded (or it has none);
    ("waiting", None) while one is still queued, starting or running; ("cancel", reason) when
    one ended any other way (or no longer exists), or when they all succeeded but one of the
    run's ``gates`` is not cleared (:mod:`rlhf_lab.results.gates`)."""
    waiting = False
    for up in _after_of(record):
        state = _upstream_state(up)
        if state == "succeeded":
            continue
        if state in UNFINISHED_STATES:
            waiting = True
            continue
        why = "no longer exists" if state is None else f"ended {state}"
        return "cancel", (
            f"cancelled before it started: upstream run {up} {why}; resume {up} to re-arm this "
            "run (it then waits for the new attempt)"
        )
    if waiting:
        return "waiting", None
    from rlhf_lab.results.gates import gates_reason  # a pipeline stage gated on an upstream metric

    gated = gates_reason(record)
    return ("cancel", gated) if gated else ("ready", None)


def cancel(run_dir: Path, reason: str) -> bool:
    """Mark a queued run ``cancelled`` with ``reason`` (under its lock); False when it is no
    longer queued."""
    with _run_lock(run_dir):
        record = _read_run_json(run_dir) or {}
        if record.get("state") != "queued":
            return False
        record.update(state="cancelled", ended_at=_now(), error=reason)
        _atomic_write_json(run_dir / "run.json", record)
    return True


def _dependents(run_id: str, states: frozenset[str]) -> list[Path]:
    """Run folders whose recorded state is in ``states`` and whose ``after`` names ``run_id``."""
    return [
        path for path in _all_run_dirs(states) if run_id in _after_of(_read_run_json(path) or {})
    ]


def cancel_dependents_of(run_id: str) -> list[str]:
    """When ``run_id`` ended without succeeding: cancel its queued dependents, and theirs, at
    once. Returns the ids cancelled (none while it is unfinished or after it succeeded)."""
    done: list[str] = []
    todo = [run_id]
    while todo:
        current = todo.pop()
        if _upstream_state(current) not in FAILED_UPSTREAM_STATES | {None}:
            continue
        for path in _dependents(current, frozenset({"queued"})):
            verdict, reason = dependency_verdict(_read_run_json(path) or {})
            if verdict == "cancel" and cancel(path, reason or "") and path.name not in done:
                done.append(path.name)
                todo.append(path.name)
    return done


def rearm_dependents(run_id: str) -> list[str]:
    """After ``run_id`` was resumed: its cancelled dependents (and theirs) whose upstream runs
    are all succeeded or unfinished again go back to ``queued``. Returns the ids re-armed."""
    done: list[str] = []
    todo = [run_id]
    while todo:
        current = todo.pop()
        for path in _dependents(current, frozenset({"cancelled"})):
            if failed_upstream(_read_run_json(path) or {}) or not rearm(path):
                continue
            done.append(path.name)
            todo.append(path.name)
    return done


def failed_upstream(record: dict) -> tuple[str, str | None] | None:
    """(id, state) of the first upstream run that failed (state None: it is gone), or None."""
    for up in _after_of(record):
        state = _upstream_state(up)
        if state in FAILED_UPSTREAM_STATES or state is None:
            return up, state
    return None


def rearm(run_dir: Path) -> bool:
    """Put a cancelled run back in the queue (its ``after`` unchanged; the cancellation is kept
    under ``rearmed``); False when it is not cancelled any more."""
    with _run_lock(run_dir):
        record = _read_run_json(run_dir) or {}
        if record.get("state") != "cancelled":
            return False
        rearms = [*record.get("rearmed", []), {"at": _now(), "error": record.get("error")}]
        for key in ("ended_at", "error"):
            record.pop(key, None)
        record.update(state="queued", rearmed=rearms)
        _atomic_write_json(run_dir / "run.json", record)
    return True


def _saves_final_model(config: TrainerConfig) -> bool:
    return config.get("checkpoint.save_final_model", True) is not False


def _stored_config(run_dir: Path) -> TrainerConfig:
    """The run's ``config.yaml`` as a view (:func:`rlhf_lab.runs.lineage.stored_config`)."""
    from rlhf_lab.runs.folder import read_record
    from rlhf_lab.runs.lineage import stored_config

    return stored_config(run_dir, read_record(run_dir).data or {})


def ensure_final_model(run_id: str, *, write: bool) -> bool:
    """Make sure upstream run ``run_id`` leaves ``final_model/`` for its dependents.

    A run that saves it already: nothing to do (False). A queued run that would not (the shrink
    turns final models off for large models): with ``write``, its config.yaml gets
    ``checkpoint.save_final_model: true`` and run.json's overrides say so (True). A run that
    already started, or ended, without saving one: a typed error (nothing written)."""
    run_dir = find_run(run_id)
    if (run_dir / "config.yaml").is_file() and _saves_final_model(_stored_config(run_dir)):
        return False
    record = _read_record(run_dir)
    if record.get("state") != "queued" or not (run_dir / "config.yaml").is_file():
        raise Conflict(
            f"run {run_id} does not save its final model (checkpoint.save_final_model=false) "
            f"and is {record.get('state')}, so there is no output to hand on; launch the "
            "upstream again with checkpoint.save_final_model=true",
            next=NextStep("launch_run", {"overrides": ["checkpoint.save_final_model=true"]}),
        )
    if not write:
        return True
    from rlhf_lab.planning.trainer_config import TrainerConfig

    with _run_lock(run_dir):
        record = _read_record(run_dir)
        if record.get("state") != "queued":
            raise Conflict(
                f"run {run_id} started meanwhile without saving its final model; launch it "
                "again with checkpoint.save_final_model=true",
                next=NextStep("run_status", {"run_id": run_id}),
            )
        config = _stored_config(run_dir)
        data = config.to_data()
        data.setdefault("checkpoint", {})["save_final_model"] = True
        _atomic_write_text(run_dir / "config.yaml", TrainerConfig(config.family, data).to_yaml())
        overrides = [
            o
            for o in record.get("overrides", [])
            if not str(o).startswith("checkpoint.save_final_model=")
        ]
        record["overrides"] = [*overrides, "checkpoint.save_final_model=true"]
        _atomic_write_json(run_dir / "run.json", record)
    return True


def waiting_for(record: dict) -> list[str]:
    """The upstream run ids a queued run still waits for (those not succeeded yet)."""
    return [up for up in _after_of(record) if _upstream_state(up) != "succeeded"]
