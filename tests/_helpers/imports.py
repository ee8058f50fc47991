"""What a fresh interpreter imports: the checks that the lab (and the trainers' torch-free
modules) stay light at import time run their code in a subprocess and read the answer here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_output(code: str, *, env=None, timeout: float = 120) -> str:
    """Run ``code`` in a fresh interpreter from the repository root (it must succeed); its
    standard output."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def modules_left_imported(code: str, names, *, env=None, timeout: float = 120) -> list[str]:
    """Run ``code`` in a fresh interpreter from the repository root (it must succeed); the
    modules of ``names`` that are in ``sys.modules`` afterwards."""
    listed = f"[m for m in {list(names)!r} if m in sys.modules]"
    script = f"{code}\nimport json, sys\nprint(json.dumps({listed}))"
    out = python_output(script, env=env, timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])


def cli_import_trace(argv: list[str], env: dict) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``python -X importtime -m rlhf_lab.cli *argv`` (it must succeed): the finished process
    and every module it imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rlhf_lab.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {
        line.split("|")[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    return done, imported


def within(imported: set[str], packages) -> list[str]:
    """The modules of ``imported`` that belong to one of ``packages``, sorted."""
    return sorted(m for m in imported if any(m == p or m.startswith(p + ".") for p in packages))
