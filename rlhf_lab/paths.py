"""Where the lab writes: campaigns under experiments/, run ids, slugs. Torch-free."""

from __future__ import annotations

import datetime as dt
import os
import re
import secrets
from pathlib import Path

SLUG_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
MAX_SLUG = 80


class LabError(ValueError):
    """An expected failure with a message that says what to do."""


def repo_root() -> Path:
    """The project root: $RLHF_LAB_ROOT, else the folder holding this package's pyproject."""
    env = os.environ.get("RLHF_LAB_ROOT")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parent.parent


def experiments_dir() -> Path:
    return repo_root() / "experiments"


def check_slug(slug: str) -> str:
    if not isinstance(slug, str) or len(slug) > MAX_SLUG or not SLUG_RE.match(slug):
        raise LabError(
            f"bad campaign slug {slug!r}: use lowercase letters, digits and single hyphens "
            f"(at most {MAX_SLUG} characters), e.g. simpo-gamma-sweep"
        )
    return slug


def today() -> str:
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
