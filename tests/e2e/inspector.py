"""Install the pinned MCP Inspector (and the Node it needs) outside the repository.

``package.json`` and ``package-lock.json`` beside this file pin ``@modelcontextprotocol/inspector``
and ``node`` (the npm package that ships a Node 22 binary: the Inspector needs Node >= 22.19, which
a distribution's own ``node`` may not be). ``npm ci`` installs exactly the lock into a cache folder
named after the lock's digest, ``$RLHF_LAB_CLIENTS_DIR`` or
``${XDG_CACHE_HOME:-~/.cache}/rlhf-lab/mcp-clients/<digest>``, so nothing lands in the work tree and
a second call (or another checkout with the same lock) finds it ready and returns at once.

Run by ``.ci/run`` before the tests (``uv run python tests/e2e/inspector.py``: it prints where the
Inspector is, or with ``--bin`` only its bin folder, and exits non-zero when the install fails)
and imported by ``tests/lab/test_inspector_e2e.py``. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PINNED_FILES = ("package.json", "package-lock.json")
STAMP = ".installed.json"
MIN_NODE = (22, 19)
INSTALL_TIMEOUT_S = 900


class NpmMissing(RuntimeError):
    """npm is not on PATH: the Inspector cannot be installed on this machine."""


class InstallFailed(RuntimeError):
    """npm is here but the pinned install did not produce a working Inspector."""


def pinned_version() -> str:
    """The Inspector version ``package.json`` pins."""
    deps = json.loads((HERE / "package.json").read_text())["dependencies"]
    return deps["@modelcontextprotocol/inspector"]


def digest() -> str:
    """12 hex digits naming the pinned files' contents."""
    h = hashlib.sha256()
    for name in PINNED_FILES:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    return h.hexdigest()[:12]


def install_dir() -> Path:
    """Where this lock's install lives (see the module docstring)."""
    base = os.environ.get("RLHF_LAB_CLIENTS_DIR")
    if base:
        return Path(base).expanduser().resolve() / digest()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser().resolve() / "rlhf-lab" / "mcp-clients" / digest()


def bin_dir(root: Path | None = None) -> Path:
    return (root or install_dir()) / "node_modules" / ".bin"


def command(root: Path | None = None) -> list[str]:
    """The argv prefix that starts the Inspector with the pinned Node (not whatever ``node`` is
    first on PATH: the launcher's ``#!/usr/bin/env node`` would pick that one)."""
    bins = bin_dir(root)
    return [str(bins / "node"), str(bins / "mcp-inspector")]


def _versions(root: Path) -> dict[str, str]:
    """The installed Node and Inspector versions; InstallFailed when either does not answer
    or is not the one pinned."""
    bins = bin_dir(root)
    found: dict[str, str] = {}
    for key, argv in (
        ("node", [str(bins / "node"), "--version"]),
        ("inspector", [*command(root), "--version"]),
    ):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InstallFailed(f"{' '.join(argv)} did not run: {exc}") from exc
        if out.returncode != 0:
            raise InstallFailed(f"{' '.join(argv)} exited {out.returncode}: {out.stderr[-2000:]}")
        found[key] = out.stdout.strip().lstrip("v")
    match = re.match(r"(\d+)\.(\d+)", found["node"])
    if not match or tuple(int(x) for x in match.groups()) < MIN_NODE:
        raise InstallFailed(f"pinned node is {found['node']}, the Inspector needs >= 22.19")
    if found["inspector"] != pinned_version():
        raise InstallFailed(f"installed Inspector {found['inspector']} != {pinned_version()}")
    return found


def installed() -> Path | None:
    """The install folder when this lock is already installed (stamp written after a verified
    install), else None. Cheap: reads one file."""
    root = install_dir()
    try:
        stamp = json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("digest") != digest() or not (bin_dir(root) / "mcp-inspector").exists():
        return None
    return root


def ensure(log=lambda msg: print(msg, file=sys.stderr)) -> Path:
    """The install folder, installing first when needed. Raises NpmMissing when npm is absent
    and InstallFailed when the install does not give the pinned, working Inspector."""
    root = installed()
    if root is not None:
        return root
    npm = shutil.which("npm")
    if npm is None:
        raise NpmMissing("npm is not on PATH (install Node.js and npm to run the Inspector tests)")
    root = install_dir()
    root.parent.mkdir(parents=True, exist_ok=True)
    work = root.parent / f".{root.name}.{os.getpid()}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        for name in PINNED_FILES:
            shutil.copy2(HERE / name, work / name)
        log(f"installing the MCP Inspector {pinned_version()} with npm ci into {root} ...")
        argv = [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"]
        try:
            out = subprocess.run(
                argv, cwd=work, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as exc:
            raise InstallFailed(f"npm ci took over {INSTALL_TIMEOUT_S} s in {work}") from exc
        if out.returncode != 0:
            tail = (out.stdout + out.stderr)[-4000:]
            raise InstallFailed(f"npm ci exited {out.returncode} in {work}:\n{tail}")
        versions = _versions(work)
        (work / STAMP).write_text(json.dumps({"digest": digest(), **versions}) + "\n")
        if root.exists():  # a half-made folder from an interrupted run, or a concurrent winner
            if installed() is not None:
                return root
            shutil.rmtree(root)
        work.rename(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return root


def main(argv: list[str]) -> int:
    """Install (or find) the pinned Inspector; ``--bin`` prints only its bin folder."""
    try:
        root = ensure()
        versions = _versions(root)
    except (NpmMissing, InstallFailed) as exc:
        print(f"error: the MCP Inspector is not installed: {exc}", file=sys.stderr)
        return 1
    if "--bin" in argv:
        print(bin_dir(root))
    else:
        print(f"MCP Inspector {versions['inspector']} on node {versions['node']}: {bin_dir(root)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
