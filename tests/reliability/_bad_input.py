"""What the bad-input tests (test_bad_input_*.py) share: the quick config, the fuzzing settings,
the hostile config overrides hypothesis draws, the snapshot of every place the lab must never write, and the check that an error is one clear
message, and their fixtures (``lab_root``, ``no_trainer``), which each file imports by name: a
conftest.py here would be imported as the top-level module ``conftest`` and shadow
tests/conftest.py for every ``from conftest import ...`` in the suite."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from rlhf_lab.paths import LabError
from rlhf_lab.planning.catalog import FAMILIES
from rlhf_lab.planning.configs import config_model
from tests._lab_processes import kill_live_runs

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
FINISHED = "dpo-20260301-120000-aaaa"  # the finished run the MCP and path tests name
QUICK = [
    "data.max_samples=64",
    "data.eval_size=16",
    "train.batch_size=8",
    "train.max_steps=4",
    "eval.eval_every=0",
    "eval.num_samples=0",
    "checkpoint.save_final_model=false",
]
FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure is reproducible, never flaky
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def tree(root: Path) -> dict[str, tuple[int, int] | None]:
    """Every path under ``root`` with (size, mtime) for files."""
    out: dict[str, tuple[int, int] | None] = {}
    if not root.exists():
        return out
    for path in root.rglob("*"):
        st_ = path.lstat()
        out[str(path)] = (st_.st_size, st_.st_mtime_ns) if path.is_file() else None
    return out


def outside_experiments(lab: Path) -> dict[str, tuple[int, int] | None]:
    """Where the lab must never write: the test's folder outside <lab>/experiments, the names in
    the folders around it and around the checkout (the run index at <lab>/.rlhf-lab is allowed), the checkout's own experiments/ and the files
    the lab knows how to write there (.mcp.json, .claude/). Source files are left out on purpose:
    other work may edit them while this runs, and nothing the fuzzer sends names them."""
    test_dir = lab.parent
    # experiments/ and the run index beside it (<lab>/.rlhf-lab: a cache of the run folders)
    allowed = (lab / "experiments", lab / ".rlhf-lab")
    seen = {
        k: v
        for k, v in tree(test_dir).items()
        if not any(Path(k).is_relative_to(place) for place in allowed)
    }
    for folder in (test_dir.parent, REPO, REPO.parent):
        seen.update({str(p): None for p in folder.iterdir()})
    seen.update(tree(REPO / "experiments"))
    seen.update(tree(REPO / ".claude"))
    if (REPO / ".mcp.json").exists():
        st_ = (REPO / ".mcp.json").stat()
        seen[str(REPO / ".mcp.json")] = (st_.st_size, st_.st_mtime_ns)
    return seen


def assert_one_clear_message(text: str) -> None:
    assert text.strip(), "an error needs a message"
    assert "Traceback" not in text and 'File "' not in text, text[-1500:]


def lab_tree(lab: Path) -> dict:
    return tree(lab.parent)


# Hostile config overrides: keys from every config schema and junk, values YAML and Python
# cannot hold (drawn by the config fuzzing and by the MCP fuzzing's ``overrides`` argument).


def schema_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted leaf key of a config model (sections walked, list items named too)."""
    keys = []
    for name, field in model.model_fields.items():
        inner = [field.annotation, *typing.get_args(field.annotation)]
        section = next((t for t in inner if isinstance(t, type) and issubclass(t, BaseModel)), None)
        if section is None:
            keys.append(prefix + name)
        else:
            keys.extend(schema_keys(section, f"{prefix}{name}."))
    return keys


SCHEMA_KEYS = sorted({k for family in FAMILIES for k in schema_keys(config_model(family))})


YAML_SPECIAL = [
    "",
    " ",
    "null",
    "~",
    "yes",
    "off",
    ".inf",
    "-.inf",
    ".nan",
    "1e999",
    "-1e-999",
    "0x1F",
    "0o17",
    "1_000",
    "2026-01-01",
    "12:30:00",
    "!!binary aGk=",
    "!!python/object/apply:os.system ['echo pwned']",
    "!!set {a, b}",
    "&a [*a]",
    "{a: &x [*x]}",
    "[1, 2",
    "{a: 1",
    "'unterminated",
    '"\\ud800"',
    "- - -",
    ": :",
    "[" * 700,  # deeper than the recursion limit allows the YAML parser
    "[" * 200 + "]" * 200,
    "9" * 4400,  # more digits than int() converts
    "-" + "9" * 40,
    "a\x00b",
    "\x00",
    "é" * 300,
    "tiny",
    "builtin:reasoning-preferences",
    "/nonexistent/path",
    "../../etc",
    "[tiny, 1, null]",
    "{name: tiny}",
]
JUNK_KEYS = ["", ".", "a..b", "train.", ".train", "1abc", "tr ain", "ü", "train.lerning_rate"]
JUNK_KEYS += ["model.name.extra", "__class__", "data.specs.0.name", "x" * 300, "a\x00b"]

key_strategy = st.one_of(
    st.sampled_from(SCHEMA_KEYS),
    st.sampled_from(SCHEMA_KEYS),  # a branch listed twice is drawn twice as often
    st.sampled_from(JUNK_KEYS),
    st.lists(
        st.sampled_from(["train", "data", "model", "x", "loss", "é"]), min_size=1, max_size=4
    ).map(".".join),
    st.text(max_size=12),
)
value_strategy = st.one_of(
    st.sampled_from(YAML_SPECIAL),
    st.sampled_from(YAML_SPECIAL),
    st.sampled_from(YAML_SPECIAL),
    st.integers().map(str),
    st.integers(min_value=-(10**80), max_value=10**80).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.lists(st.integers(-5, 5), max_size=4).map(str),
    st.text(max_size=40),
)
pair_strategy = st.builds(lambda k, v: f"{k}={v}", key_strategy, value_strategy)
override_strategy = st.one_of(
    pair_strategy,
    pair_strategy,
    pair_strategy,
    st.text(max_size=30),  # no '=' at all, or junk around it
)


@pytest.fixture
def lab_root(tmp_path, monkeypatch):
    """The lab writes under tmp_path/lab only; no trainer outlives the test."""
    root = tmp_path / "lab"
    root.mkdir()
    monkeypatch.setenv("RLHF_LAB_ROOT", str(root))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield root
    kill_live_runs(root)


@pytest.fixture
def no_trainer(supervise, no_queue_worker):
    """Launches get as far as starting the trainer, which is refused instead (and the queue
    worker is never spawned): fuzzing must not start training jobs."""

    def refuse(run_id: str):
        raise LabError(f"not started: trainers are disabled in this test ({run_id})")

    supervise(start_run=refuse)
