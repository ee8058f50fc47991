"""Files that tools write into the repository on a user's machine stay out of commits."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)


@pytest.mark.parametrize(
    "path",
    [
        ".claude/settings.local.json",  # written by Claude Code when the MCP server is approved
        "experiments/2026-01-01-x/runs/r/checkpoints/step-1/model.safetensors",
        "experiments/2026-01-01-x/runs/r/final_model/config.json",
        "experiments/2026-01-01-x/runs/r/final_adapter/tokenizer.json",  # a LoRA run's output
    ],
)
def test_tool_written_files_are_ignored(path):
    out = subprocess.run(
        ["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT, capture_output=True
    )
    assert out.returncode == 0, f"{path} is not git-ignored"


@pytest.mark.parametrize("path", [".mcp.json", "CLAUDE.md", "skills/x/SKILL.md"])
def test_the_shared_claude_files_are_not_ignored(path):
    out = subprocess.run(
        ["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT, capture_output=True
    )
    assert out.returncode == 1, f"{path} is git-ignored but is shared with every user"
