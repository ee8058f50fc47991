"""Where the test files find the repository, the shared fixtures and each family's configs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def configs_of(family: str) -> Path:
    """The folder of a trainer family's shipped YAML configs, e.g. ``configs_of("sft")``."""
    return ROOT / "trainers" / family / "configs"


# the tests run on a temporary lab cache: a pulled model is looked for where the user's lab keeps it
SMOLLM2_DIR = Path.home() / ".cache" / "rlhf-lab" / "models" / "pulled" / "smollm2-135m-instruct"
