"""Applying the difficulty calibration (:mod:`rlhf_lab.planning.calibration`): the policy plan
and ``launch --shrink`` run it under (on/off, the probe, the cache), the shrink with the
calibration's overrides between the shrink rules and the user's, the run folder's
``calibration.json``, and the table plan and the ledger show."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_lab.planning.calibration import (
    Calibration,
    ProbeFn,
    calibrate,
    calibration_enabled,
    run_probe,
)
from rlhf_lab.planning.overrides import Override, as_overrides

# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


def render_table(cal: Calibration, markdown: bool = False) -> list[str]:
    """The probe as a table (task/difficulty, pass rate, contrast, format, p90 length, chosen)
    and the choice, one line each."""
    s = cal.settings
    chosen = cal.choice.chosen if cal.choice else None
    head = (
        f"calibration of {cal.model}: {s.prompts} prompts × {s.samples} samples per candidate, "
        f"temperature {s.temperature:g}, ≤{s.max_new_tokens} new tokens"
        + (" (cached)" if cal.cached else f" ({cal.seconds:.0f} s)" if cal.seconds else "")
    )
    cols = ["task/difficulty", "pass rate", "contrast", "format", "p90 length", "chosen"]
    body = [
        [
            r.id,
            f"{r.pass_rate:.2f} ({r.counts()})",
            f"{r.contrast:.2f}",
            f"{r.format_rate:.2f}",
            f"{r.length_p90}" + (" (clipped)" if r.clipped > 0.1 else ""),
            "yes" if r.id == chosen else "",
        ]
        for r in cal.rows
    ]
    if markdown:
        lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
    else:
        widths = [max(len(x) for x in col) for col in zip(cols, *body, strict=False)]
        lines = [head, "  " + "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
        lines += [
            "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in body
        ]
    tail = []
    if cal.choice:
        tail += cal.choice.reasons
    if cal.generation_limit is not None:
        tail.append(f"generation limit {cal.generation_limit} new tokens")
    tail += [f"applied: {o}" for o in cal.overrides]
    tail += cal.notes
    tail += [f"warning: {w}" for w in cal.warnings]
    if markdown:
        return [*lines, "", *[f"- {t}" for t in tail]]
    return [*lines, *[f"  {t}" for t in tail]]


# ---------------------------------------------------------------------------------------------
# Applying it: plan and launch --shrink
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationPolicy:
    """Whether and how plan/launch calibrate: ``probe`` runs the probe (the subprocess by
    default), ``cache_dir`` keeps its results (``"default"``: experiments/.lab/calibration-cache,
    None: no cache)."""

    enabled: bool = True
    probe: ProbeFn = run_probe
    cache_dir: Path | str | None = "default"


_POLICY: ContextVar[CalibrationPolicy | None] = ContextVar("calibration_policy", default=None)


def default_policy(enabled: bool = True) -> CalibrationPolicy:
    """The subprocess probe with the lab's cache, off when ``enabled`` is False or the
    environment says ``RLHF_LAB_CALIBRATE=0``."""
    return CalibrationPolicy(enabled=calibration_enabled(enabled))


@contextmanager
def using(policy: CalibrationPolicy | None) -> Iterator[None]:
    """Plan every run inside the block under ``policy`` (None: the default policy)."""
    token = _POLICY.set(policy)
    try:
        yield
    finally:
        _POLICY.reset(token)


def current_policy() -> CalibrationPolicy:
    return _POLICY.get() or default_policy()


def shrink_calibrated(
    shrink_config: Callable[..., Any],
    recipe: Any,
    overrides: Sequence[Override],
    model: str | None,
    policy: CalibrationPolicy | None = None,
) -> tuple[Any, Calibration | None]:
    """``shrink_config`` (:func:`rlhf_lab.planning.shrink.shrink_config`, passed in: the shrink reads
    planning's rules, so planning does not import it back), then the calibration of the shrunk
    run, whose overrides go after the shrink rules and before ``overrides`` (which win); the run
    shrunk again with them. Returns (the shrink result, the calibration or None)."""
    policy = policy or current_policy()
    shrunk = shrink_config(recipe, overrides, model=model)
    if not policy.enabled:
        return shrunk, None
    # a task the shrink rules chose on purpose (a warm start's trained task, read from its
    # lineage) counts as requested, as the user's own does
    chosen_by_rules = [o for o in shrunk.shrink_rules if o.key in TASK_KEYS]
    cal = calibrate(
        shrunk.family,
        shrunk.algorithm,
        shrunk.trainer_config,
        [*chosen_by_rules, *overrides],
        probe=policy.probe,
        cache_dir=policy.cache_dir,
    )
    if cal is not None and cal.overrides:
        measured = as_overrides(cal.overrides)
        shrunk = shrink_config(recipe, overrides, model=model, calibration=measured)
    return shrunk, cal


TASK_KEYS = ("data.specs", "data.dataset", "data.builtin_task_configs")
"""Keys that name a run's task (in any family the calibration concerns)."""
CALIBRATION_FILE = "calibration.json"
"""Where a launched run keeps its calibration (read back by the ledger)."""


def write_calibration(run_dir: str | Path, cal: Calibration | None) -> None:
    if cal is None:
        return
    path = Path(run_dir) / CALIBRATION_FILE
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(cal.model_dump_json(indent=2))
    os.replace(tmp, path)


def read_calibration(run_dir: str | Path) -> Calibration | None:
    try:
        return Calibration.model_validate_json((Path(run_dir) / CALIBRATION_FILE).read_text())
    except (OSError, ValueError):
        return None
