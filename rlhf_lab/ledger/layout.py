"""Where a campaign lives: its name (``YYYY-MM-DD-<slug>``), its markdown ledger, its asset
folder and its ``ledger.json``, and the lock writers hold. Torch-free."""

from __future__ import annotations

from pathlib import Path

from filelock import AcquireReturnProxy, FileLock
from filelock import Timeout as LockTimeout

from rlhf_lab.errors import Conflict, InvalidArgument, NextStep
from rlhf_lab.index.campaigns import CAMPAIGN_RE
from rlhf_lab.paths import check_slug, experiments_dir

__all__ = ["LOCK_TIMEOUT_S", "check_campaign_slug"]

_CAMPAIGN_RE = CAMPAIGN_RE

LOCK_TIMEOUT_S = 120.0


def check_campaign_slug(slug: str) -> str:
    """paths.check_slug, plus a whole-string match (its pattern lets a trailing newline through)."""
    return check_slug(slug)


def _check_campaign_name(name: str) -> tuple[str, str]:
    m = _CAMPAIGN_RE.fullmatch(name) if isinstance(name, str) else None
    if not m:
        raise InvalidArgument(
            f"bad campaign name {name!r}: expected YYYY-MM-DD-<slug>",
            next=NextStep("list_campaigns"),
        )
    return m.group(1), m.group(2)


def _md_path(name: str) -> Path:
    return experiments_dir() / f"{name}.md"


def _asset_dir(name: str) -> Path:
    return experiments_dir() / name


def _data_path(name: str) -> Path:
    return _asset_dir(name) / "ledger.json"


def _lock(name: str) -> FileLock:
    return FileLock(str(experiments_dir() / f".{name}.md.lock"), timeout=LOCK_TIMEOUT_S)


def _exists(name: str) -> bool:
    return _md_path(name).is_file() or _data_path(name).is_file()


def _locked(name: str) -> FileLock:
    experiments_dir().mkdir(parents=True, exist_ok=True)
    return _lock(name)


def _acquire(lock: FileLock, name: str) -> AcquireReturnProxy:
    """Take ``lock`` (a context manager); a typed error when another writer holds it too long."""
    try:
        return lock.acquire()
    except LockTimeout:
        raise Conflict(
            f"campaign {name} is locked by another writer for more than {LOCK_TIMEOUT_S:.0f} s "
            f"({lock.lock_file}); try again, or remove the lock file if no lab process is running"
        ) from None
