"""Where the lab writes: campaigns under experiments/, run ids, slugs. Torch-free."""

from __future__ import annotations

import datetime as dt
import os
import re
import secrets
from pathlib import Path

SLUG_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
MAX_SLUG = 80
RUN_ID_RE = SLUG_RE  # run ids use the slug alphabet: dpo-20260101-120000-ab12
MAX_RUN_ID = 120


from rlhf_lab.errors import (  # noqa: E402  (LabError re-exported: older imports name it here)
    Conflict,
    Corrupt,
    InvalidArgument,
    LabError,
    NextStep,
    NotFound,
)

__all__ = [
    "LabError",
    "campaign_name",
    "check_run_id",
    "check_slug",
    "experiments_dir",
    "find_run",
    "new_run_id",
    "repo_root",
    "today",
]


def repo_root() -> Path:
    """The project root: $RLHF_LAB_ROOT, else the folder holding this package's pyproject."""
    env = os.environ.get("RLHF_LAB_ROOT")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parent.parent


def experiments_dir() -> Path:
    """``experiments/`` under the project root: every campaign and run lives there."""
    return repo_root() / "experiments"


def check_slug(slug: str) -> str:
    """``slug`` when it is a valid campaign slug; a typed error otherwise."""
    if not isinstance(slug, str) or len(slug) > MAX_SLUG or not SLUG_RE.fullmatch(slug):
        shown = slug[: MAX_SLUG + 20] if isinstance(slug, str) else slug  # never echo 5000 chars
        raise InvalidArgument(
            f"bad campaign slug {shown!r}: use lowercase letters, digits and single hyphens "
            f"(at most {MAX_SLUG} characters), e.g. simpo-gamma-sweep"
        )
    return slug


def today() -> str:
    """Today's local date as YYYY-MM-DD (a campaign's date prefix)."""
    return dt.datetime.now().strftime("%Y-%m-%d")


def campaign_name(slug: str, date: str | None = None) -> str:
    """'YYYY-MM-DD-<slug>' (the slug is validated; an already dated slug is kept as is)."""
    check_slug(slug)
    if re.match(r"^\d{4}-\d{2}-\d{2}-", slug):
        return slug
    return f"{date or today()}-{slug}"


def new_run_id(algorithm: str) -> str:
    """'<algorithm>-<UTC yyyymmdd-hhmmss>-<4 hex>'."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{check_slug(algorithm.replace('_', '-'))}-{stamp}-{secrets.token_hex(2)}"


def check_run_id(run_id: str) -> str:
    """Reject anything that is not a plain run id (no '..', '/', NUL, absolute path) before it
    reaches the file system."""
    if not isinstance(run_id, str) or len(run_id) > MAX_RUN_ID or not RUN_ID_RE.fullmatch(run_id):
        raise InvalidArgument(
            f"bad run id {str(run_id)[:MAX_RUN_ID]!r}: a run id looks like "
            "dpo-20260101-120000-ab12 (lowercase letters, digits, single hyphens)",
            next=NextStep("list_runs"),
        )
    return run_id


def find_run(run_id: str) -> Path:
    """The folder experiments/<campaign>/runs/<run-id> of a run (ids are globally unique)."""
    check_run_id(run_id)
    root = experiments_dir()
    hits = sorted(p for p in root.glob(f"*/runs/{run_id}") if p.is_dir())
    if not hits:
        raise NotFound(f"no run {run_id!r} under {root}/*/runs/", next=NextStep("list_runs"))
    if len(hits) > 1:
        where = ", ".join(str(p.relative_to(root)) for p in hits)
        raise Conflict(f"run id {run_id!r} is in several campaigns ({where}); keep one of them")
    path = hits[0]
    if not path.resolve().is_relative_to(root.resolve()):
        raise Corrupt(f"run folder {path} points outside {root}; refusing to read it")
    return path
