"""Bad input: nonsense from a person or an agent gets one clear message and nothing is
written outside the lab root's experiments/ (docs/architecture.md, "Engineering rules").

* config overrides fuzzed with hypothesis through api.resolve_config and shrink_config: a valid,
  finite, YAML-writable config or a LabError / ConfigError with a message, never another error;
* MCP tool arguments fuzzed through the in-memory client: a result matching the tool's output
  schema or a tool error with text, never the "unexpected exception" path and never a write
  outside experiments/ (trainers are never started: the start is replaced by a refusal);
* path-like slugs and run ids refused by paths checks, the api and the CLI, nothing written;
* impossible shapes (batch not divisible, one rollout for a group method, prompt budget above
  max_length, unknown algorithm, missing model, hub offline, cuda without a GPU);
* the MCP HTTP transport: loopback by default, a public bind only with --allow-remote.

tests/lab/test_ledger.py and tests/mcp/test_wiring.py hold the basic cases; this file adds the
fuzzing and the entry points they do not reach.
"""

from __future__ import annotations

import json
import math
import re
import typing
from pathlib import Path

import _synthetic as synthetic
import anyio.from_thread
import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from pydantic import BaseModel
from typer.testing import CliRunner

from rlhf_lab import api, mcp_server, paths, runs
from rlhf_lab.cli import app
from rlhf_lab.mcp_server import check_bind_host, server
from rlhf_lab.paths import LabError
from rlhf_lab.planning.catalog import FAMILIES
from rlhf_lab.planning.configs import config_model, validate_data
from tests._lab_processes import kill_live_runs
from trainers.core.config import ConfigError
from trainers.policy_gradients.spec import FAMILY as PG_FAMILY

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
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


@pytest.fixture(autouse=True)
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


# ---------------------------------------------------------------------------------------------
# Config overrides fuzzed
# ---------------------------------------------------------------------------------------------


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
RECIPES = ["dpo", "kto", "simpo", "grpo", "ppo", "rloo", "preference_rm", "prm", "sft"]
RECIPES += ["top_per_prompt", "random_k_overall"]
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


def assert_usable_config(family: str, data: dict) -> None:
    """A config the lab accepted is what a trainer can run: it validates again, every float is
    finite, and it survives the YAML and JSON round trips the run folder uses."""

    def floats(node):
        if isinstance(node, dict):
            for v in node.values():
                yield from floats(v)
        elif isinstance(node, list):
            for v in node:
                yield from floats(v)
        elif isinstance(node, float):
            yield node

    assert all(math.isfinite(x) for x in floats(data))
    validate_data(family, data)
    assert yaml.safe_load(yaml.safe_dump(data, sort_keys=False)) == data
    json.dumps(data, allow_nan=False)


def resolve_or_refuse(call, *args, **kwargs):
    """The result, or None for a LabError / ConfigError with a message; anything else raises."""
    try:
        return call(*args, **kwargs)
    except (LabError, ConfigError) as err:
        assert_one_clear_message(str(err))
        return None


@FUZZ
@given(
    recipe=st.sampled_from(RECIPES),
    overrides=st.lists(override_strategy, min_size=1, max_size=4),
    model=st.sampled_from([None, "tiny"]),
)
def test_fuzzed_overrides_give_a_valid_config_or_one_lab_error(recipe, overrides, model):
    resolved = resolve_or_refuse(api.resolve_config, recipe, overrides)
    if resolved is not None:
        assert_usable_config(resolved.family, resolved.data)
    shrunk = resolve_or_refuse(api.shrink_config, recipe, overrides, model=model)
    if shrunk is not None:
        assert_usable_config(shrunk.family, shrunk.config)


# One key per kind of field (int, float, str, bool, optional list, section, top-level int).
TYPED_KEYS = [
    "train.batch_size",
    "train.learning_rate",
    "model.name",
    "checkpoint.save_final_model",
    "data.builtin_tasks",
    "train",
    "seed",
]


@pytest.mark.parametrize("value", YAML_SPECIAL, ids=lambda v: repr(v)[:30])
def test_every_hostile_value_on_every_kind_of_field(value):
    """The deterministic half of the fuzzing: each hostile value on each kind of field."""
    for key in TYPED_KEYS:
        resolved = resolve_or_refuse(api.resolve_config, "dpo", [f"{key}={value}"])
        if resolved is not None:
            assert_usable_config(resolved.family, resolved.data)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("train.learning_rate=" + "9" * 4400, "finite number"),  # int() refuses 4300+ digits
        ("train.batch_size=" + "[" * 700, "valid integer"),  # deeper than the recursion limit
        ("train.learning_rate=.inf", "finite number"),
        ("beta=.nan", "finite number"),
        ("gamma=1e999", "finite number"),
        ("train.batch_size=&a [*a]", "train.batch_size"),  # a list that contains itself
        ("seed=!!python/object/apply:os.system ['echo pwned']", "seed"),
    ],
)
def test_override_values_yaml_or_python_cannot_hold_are_config_errors(override, needle):
    """Found by the fuzzer: these used to escape as ValueError / RecursionError or were accepted
    as inf / nan learning rates."""
    with pytest.raises(LabError) as err:
        api.resolve_config("dpo", [override])
    text = str(err.value)
    assert needle in text and len(text) < 6000 + len(override), text[:500]
    assert_one_clear_message(text)


# ---------------------------------------------------------------------------------------------
# MCP tool arguments fuzzed
# ---------------------------------------------------------------------------------------------

FINISHED = "dpo-20260301-120000-aaaa"
CAMPAIGN = "2026-03-01-fuzz"
FUZZED_TOOLS = [
    "list_recipes",
    "plan_experiment",
    "shrink_config",
    "estimate_memory",
    "launch_run",
    "run_status",
    "tail_logs",
    "get_metrics",
    "stop_run",
    "resume_run",
    "list_runs",
    "compare_runs",
    "record_results",
    "list_campaigns",
]


class SyncClient:
    """The in-memory MCP client driven from sync code (hypothesis runs the examples), with each
    tool's argument names and output schema as the server lists them."""

    def __init__(self, portal, client):
        self.portal, self.client = portal, client
        tools = self.list_tools()
        self.arguments = {t.name: list(t.input_schema.get("properties", {})) for t in tools}
        self.required = {t.name: list(t.input_schema.get("required", [])) for t in tools}
        self.output_schemas = {t.name: t.output_schema for t in tools}

    def call(self, name: str, args: dict):
        return self.portal.call(self.client.call_tool, name, args)

    def list_tools(self):
        return self.portal.call(self.client.list_tools).tools


@pytest.fixture
def mcp(lab_root, no_trainer):
    """One in-memory client for every example, with a finished run on disk to aim at."""
    finished_run(FINISHED)
    with anyio.from_thread.start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Client(server)) as client:
            yield SyncClient(portal, client)


def finished_run(run_id: str) -> Path:
    """A succeeded DPO run (its real shrunk config) as the launcher and a trainer leave it."""
    config = api.shrink_config("dpo", QUICK, model="tiny").config
    return synthetic.finished_run(
        api.experiments_dir() / CAMPAIGN / "runs" / run_id,
        config_text=yaml.safe_dump(config, sort_keys=False),
    )


def mcp_values(tmp_root: Path) -> dict[str, st.SearchStrategy]:
    """Plausible and hostile values per argument name (paths aim inside the test folder, so a
    write through them would be seen)."""
    escape = str(tmp_root / "escape")
    path_like = ["../escape", "../../escape", escape, escape + ".yaml", "", " ", "\x00", "a\x00b"]
    path_like += ["ü", "x" * 300, "..", "/", "C:\\escape", "~/escape", "%2e%2e%2fescape"]
    run_ids = st.sampled_from([FINISHED, "dpo-20990101-000000-dead", *path_like])
    slugs = st.one_of(st.none(), st.sampled_from(["fuzz", "fuzz-2", "Bad Slug", *path_like]))
    recipes = st.sampled_from(["dpo", "grpo", "sft", "prm", "dpoo", "direct_alignment/dpo"])
    texts = st.text(max_size=60)
    return {
        "family": st.one_of(st.none(), st.sampled_from([*FAMILIES, "alchemy"])),
        "request": st.one_of(st.none(), texts, st.sampled_from(["dpo sanity", "compare dpo ipo"])),
        "algorithm": st.one_of(st.none(), recipes, st.sampled_from(path_like)),
        "recipe": st.one_of(recipes, st.sampled_from(path_like), texts),
        "model": st.one_of(st.none(), st.sampled_from(["tiny", "nobody/none", *path_like])),
        "campaign": slugs,
        "record_in": slugs,
        "question": st.one_of(st.none(), texts),
        "overrides": st.lists(st.one_of(override_strategy, st.sampled_from(QUICK)), max_size=3),
        "device": st.sampled_from(["auto", "cpu", "cuda", "cuda:0", "cuda:999", "tpu", "cuda:-1"]),
        "run_id": run_ids,
        "run_ids": st.lists(run_ids, max_size=3),
        # in range: numbers out of range are the wrong-kind test's job (any integer there)
        "lines": st.integers(1, 2000),
        "cursor": st.one_of(st.none(), st.integers(0, 4000), st.integers(0, 10**12)),
        "max_bytes": st.integers(256, 64_000),
        "keys": st.one_of(st.none(), st.lists(st.sampled_from(["loss", "accuracy", "", "ü"]))),
        "phase": st.one_of(st.none(), st.sampled_from(["train", "eval", "rollout", "test"])),
        "max_points": st.integers(1, 2000),
        "grace_s": st.floats(0, 1),
        "limit": st.integers(1, 500),
        "shrink": st.booleans(),
        "queue": st.booleans(),
        "force": st.booleans(),
        "state": st.one_of(st.none(), st.sampled_from(["running", "succeeded", "exploded"])),
        "note": st.one_of(st.none(), texts, st.just("<!-- rlhf-lab:end runs -->")),
    }


junk = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def call_and_check(mcp: SyncClient, lab_root: Path, name: str, args: dict) -> None:
    """One tool call: a schema-valid result or a tool error with a message that did not come
    from an unexpected exception; nothing written outside experiments/; the server still up."""
    before = outside_experiments(lab_root)
    result = mcp.call(name, args)
    text = "\n".join(c.text for c in result.content if getattr(c, "text", None))
    if result.is_error:
        assert_one_clear_message(text)
        assert "bug in rlhf-lab" not in text, text  # the unexpected-exception path
    else:
        assert result.structured_content is not None, name
        jsonschema.validate(result.structured_content, mcp.output_schemas[name])
    assert outside_experiments(lab_root) == before, f"{name}({args!r}) wrote outside experiments/"
    assert {t.name for t in mcp.list_tools()} >= set(FUZZED_TOOLS)  # the server still answers


@FUZZ
@given(data=st.data())
def test_fuzzed_mcp_arguments_give_a_result_or_a_tool_error(mcp, lab_root, data):
    """Arguments of the right JSON type with hostile contents: these reach the lab's code."""
    values = mcp_values(lab_root.parent)
    name = data.draw(st.sampled_from(FUZZED_TOOLS), label="tool")
    props, required = mcp.arguments[name], mcp.required[name]
    fields = {p: values.get(p, junk) for p in props}
    args = data.draw(
        st.fixed_dictionaries(
            {p: fields[p] for p in required},
            optional={p: fields[p] for p in props if p not in required},
        ),
        label="args",
    )
    call_and_check(mcp, lab_root, name, args)


@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_mcp_arguments_of_the_wrong_kind_are_tool_errors(mcp, lab_root, data):
    """Any JSON value for any argument, missing required ones, unknown keys."""
    name = data.draw(st.sampled_from(FUZZED_TOOLS), label="tool")
    keys = st.one_of(st.sampled_from(mcp.arguments[name] or ["x"]), st.text(max_size=8))
    args = data.draw(st.dictionaries(keys, junk, max_size=4), label="args")
    call_and_check(mcp, lab_root, name, args)


# ---------------------------------------------------------------------------------------------
# Path-like slugs and run ids at every entry point
# ---------------------------------------------------------------------------------------------

BAD_SLUGS = [
    "..",
    "../evil",
    "a/b",
    "/abs",
    "/tmp/evil",
    "a\x00b",
    "\x00",
    "x" * 81,
    "x" * 5000,
    "café",
    "ß",
    "１２３",  # fullwidth digits
    "",
    " ",
    "\t",
    "slug\n",
    "simpo gamma",
    "Upper",
    "a_b",
    "-a",
    "a-",
    "a--b",
    "a.b",
    "~",
    "$HOME",
]
BAD_RUN_IDS = ["..", "../x", "a/b", "/etc/passwd", "a/../b", "x\x00", "\x00", "x" * 121]
BAD_RUN_IDS += ["x" * 5000, "", " ", "dpo-1\n", "Dpo-1", ".hidden", "*", "run/", "dpo_1", "ü"]
BAD_RUN_IDS += ["dpo--1", "-dpo", "１２３"]


def lab_tree(lab: Path) -> dict:
    return tree(lab.parent)


@pytest.mark.parametrize("slug", BAD_SLUGS, ids=repr)
def test_bad_slugs_are_refused_by_every_entry_point(lab_root, no_trainer, slug):
    before = lab_tree(lab_root)
    with pytest.raises(LabError, match="bad campaign slug"):
        paths.check_slug(slug)
    calls = {
        "create_campaign": lambda: api.create_campaign(slug, "q?"),
        "launch": lambda: api.launch(
            api.RunRequest(recipe="dpo", overrides=QUICK, model="tiny", campaign=slug)
        ),
        "sweep": lambda: api.sweep(
            api.SweepRequest(recipes=["dpo", "ipo"], overrides=QUICK, model="tiny", campaign=slug)
        ),
        "plan_experiment": lambda: api.plan_experiment(algorithm="dpo", campaign=slug),
        "show_campaign": lambda: api.show_campaign(slug),
        "list_runs": lambda: api.list_runs(campaign=slug),
        "compare_runs": lambda: api.compare_runs([FINISHED], record_in=slug),
    }
    for name, fn in calls.items():
        with pytest.raises(LabError, match="bad campaign slug") as err:
            fn()
        assert_one_clear_message(str(err.value))
        assert len(str(err.value)) < 400, name  # a 5000-character slug is not echoed whole
    commands = [  # the slug last, after "--" where it is an argument: "-a" is no option then
        ["campaign", "new", "--question", "q?", "--", slug],
        ["campaign", "show", "--", slug],
        ["launch", "dpo", "--model", "tiny", "--campaign", slug],
        ["sweep", "dpo,ipo", "--model", "tiny", "--campaign", slug],
        ["plan", "dpo sanity", "--campaign", slug],
        ["runs", "--campaign", slug],
    ]
    for argv in commands:
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        assert result.output.count("error: bad campaign slug") == 1, (argv, result.output)
        assert_one_clear_message(result.output)
    assert lab_tree(lab_root) == before


@pytest.mark.parametrize("run_id", BAD_RUN_IDS, ids=repr)
def test_bad_run_ids_are_refused_by_every_entry_point(lab_root, no_trainer, run_id):
    api.create_campaign("ids", "Are path-like run ids refused?")
    before = lab_tree(lab_root)
    with pytest.raises(LabError, match="bad run id"):
        paths.check_run_id(run_id)
    calls = {
        "run_status": lambda: api.run_status(run_id),
        "record_run": lambda: api.record_run(run_id, "note"),
        "resume_run": lambda: api.resume_run(run_id),
        "stop_run": lambda: api.stop_run(run_id, grace_s=0),
        "tail_log": lambda: api.tail_log(run_id),
        "read_metrics": lambda: api.read_metrics(run_id),
        "compare_runs": lambda: api.compare_runs([run_id]),
    }
    for name, fn in calls.items():
        with pytest.raises(LabError, match="bad run id") as err:
            fn()
        assert_one_clear_message(str(err.value))
        assert len(str(err.value)) < 400, name  # a 5000-character id is not echoed whole
    for argv in (["status"], ["tail"], ["metrics"], ["stop"], ["resume"], ["record"], ["compare"]):
        result = runner.invoke(app, [*argv, "--", run_id])
        assert result.exit_code == 2, (argv, result.output)
        assert result.output.count("error: bad run id") == 1, (argv, result.output)
        assert_one_clear_message(result.output)
    assert lab_tree(lab_root) == before


# ---------------------------------------------------------------------------------------------
# Impossible shapes
# ---------------------------------------------------------------------------------------------

IMPOSSIBLE = {
    "micro-batch does not divide the rollout batch": (
        "grpo",
        ["train.batch_size=3"],
        "is not divisible by train.batch_size = 3",
    ),
    "prompt budget above max_length": (
        "dpo",
        ["data.max_length=64", "data.max_prompt_length=128"],
        "data.max_prompt_length (128) must be smaller than data.max_length (64)",
    ),
    "prompt budget equal to max_length": (
        "simpo",
        ["data.max_length=64", "data.max_prompt_length=64"],
        "must be smaller than data.max_length",
    ),
    "eval split as large as the data (sft)": (
        "sft",
        ["data.max_samples=16", "data.eval_size=16"],
        "must be smaller than data.max_samples",
    ),
    "eval split as large as the data (reward model)": (
        "preference_rm",
        ["data.max_samples=16", "data.eval_size=32"],
        "must be smaller than data.max_samples",
    ),
    "unknown loss": ("dpo", ["loss=dpoo"], "'loss': Input should be 'dpo'"),
    "unknown policy-gradient algorithm": ("grpo", ["algorithm=grpoo"], "'algorithm': Input"),
    "misspelt key": ("dpo", ["train.lerning_rate=1e-4"], "Did you mean: learning_rate"),
    "zero batch": ("dpo", ["train.batch_size=0"], "'train.batch_size': Input should be greater"),
    "text where a number goes": ("dpo", ["train.max_steps=ten"], "'train.max_steps'"),
}
IMPOSSIBLE.update(
    {
        f"one rollout for {algorithm}": (
            algorithm,
            ["rollout.num_rollouts=1"],
            "needs rollout.num_rollouts >= 2 (got 1)",
        )
        for algorithm in sorted(s.name for s in PG_FAMILY.algorithms if s.needs_groups)
    }
)


QUICK_FOR = {"dpo": QUICK, "simpo": QUICK}  # launch checks run on the quick config's data sizes


@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
def test_impossible_shapes_are_refused_before_anything_starts(lab_root, no_trainer, case):
    recipe, overrides, needle = IMPOSSIBLE[case]
    before = lab_tree(lab_root)
    calls = {
        "resolve_config": lambda: api.resolve_config(recipe, overrides),
        "shrink_config": lambda: api.shrink_config(recipe, overrides, model="tiny"),
        "plan_experiment": lambda: api.plan_experiment(
            algorithm=recipe, model="tiny", overrides=overrides
        ),
        "launch": lambda: api.launch(
            api.RunRequest(
                recipe=recipe,
                overrides=QUICK_FOR.get(recipe, []) + overrides,
                model="tiny",
                device="cpu",
            )
        ),
    }
    for name, fn in calls.items():
        with pytest.raises(LabError) as err:
            fn()
        text = str(err.value)
        assert needle in text, (name, text)
        assert_one_clear_message(text)
    argv = ["launch", recipe, "--model", "tiny", "--device", "cpu"]
    result = runner.invoke(app, argv + [a for o in overrides for a in ("--set", o)])
    assert result.exit_code == 2 and result.output.count("error: ") == 1, result.output
    assert needle in result.output
    assert lab_tree(lab_root) == before


def test_unknown_algorithm_names_the_close_ones(lab_root):
    for fn in (
        lambda: api.resolve_config("dpoo"),
        lambda: api.launch(api.RunRequest(recipe="dpoo", model="tiny")),
        lambda: api.plan_experiment(algorithm="dpoo"),
        lambda: api.plan_experiment("train a dragon"),
    ):
        with pytest.raises(LabError) as err:
            fn()
        text = str(err.value)
        assert re.search(r"unknown (recipe|algorithm) 'dpoo'|no algorithm found", text), text
        assert "dpo" in text
    result = runner.invoke(app, ["launch", "dpoo", "--model", "tiny"])
    assert (
        result.exit_code == 2 and "error: unknown recipe 'dpoo'. Did you mean: dpo" in result.output
    )
    assert not (lab_root / "experiments").exists()


def test_cuda_without_a_gpu_is_refused_at_launch(lab_root, no_trainer, machine):
    machine(gpus=[])  # the same answer on a GPU box
    for device, extra, needle in [
        ("cuda", [], "cuda:0 was asked for but this machine shows 0 GPU(s)"),
        ("cuda:1", [], "cuda:1 was asked for"),
        ("auto", ["model.device=cuda"], "model.device=cuda was asked for"),
        ("cpu", ["model.device=cuda"], "model.device=cuda was asked for"),
    ]:
        with pytest.raises(LabError) as err:
            api.launch(
                api.RunRequest(recipe="dpo", overrides=QUICK + extra, model="tiny", device=device)
            )
        assert needle in str(err.value)
        # the way on is a typed next step (the CLI renders it as `--device cpu`, see below)
        assert err.value.kind == "unavailable"
        assert ("launch_run", {"device": "cpu"}) in [
            (s.operation, dict(s.args)) for s in err.value.next_steps
        ]
    with pytest.raises(LabError, match="bad device 'tpu'"):
        api.launch(api.RunRequest(recipe="dpo", overrides=QUICK, model="tiny", device="tpu"))
    assert not (lab_root / "experiments").exists(), "a refused launch created its campaign"
    result = runner.invoke(app, ["launch", "dpo", "--model", "tiny", "--device", "cuda"])
    assert result.exit_code == 2 and result.output.count("error: ") == 1, result.output
    assert "was asked for but this machine shows 0 GPU(s)" in result.output
    assert "`rlhf-lab launch ... --device cpu`" in result.output
    # plan writes nothing and starts nothing: it warns instead
    plan = api.plan_experiment(algorithm="dpo", model="tiny", overrides=["model.device=cuda"])
    assert "the config asks for model.device=cuda but this machine has no GPU" in plan.warnings


@pytest.mark.parametrize(
    ("model", "lab_says", "trainer_says"),
    [
        (
            "/nonexistent/path",
            "cannot be resolved: No such file or folder: '/nonexistent/path'",
            "ModelNotFoundError: No such file or folder: '/nonexistent/path'",
        ),
        (
            "nobody/no-such-model",
            "cannot be loaded here: HF_HUB_OFFLINE=1 is set and its weights are not in the local",
            "HF_HUB_OFFLINE=1 is set and it is not in the local Hugging Face cache",
        ),
    ],
)
def test_a_model_that_cannot_load_is_one_message_before_launch_and_in_run_status(
    lab_root, monkeypatch, model, lab_says, trainer_says
):
    """The lab refuses the launch (and a plan of a model that resolves to nothing) before
    anything is written; a run that reaches the trainer anyway (started below the lab's checks,
    e.g. its model folder removed while it was queued) ends failed with the trainer's one-line
    reason in its status."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    overrides = [f"model.name={model}"] + QUICK
    if model.startswith("/"):
        with pytest.raises(LabError, match="cannot be resolved"):
            api.plan_experiment(algorithm="dpo", overrides=overrides)
    else:  # a hub id may be planned for another machine: the plan warns
        plan = api.plan_experiment(algorithm="dpo", overrides=overrides)
        assert any("local Hugging Face cache" in w for w in plan.warnings), plan.warnings
        assert any("tiny" in c for c in plan.offline_choices)
    with pytest.raises(LabError) as err:
        api.launch(
            api.RunRequest(
                recipe="dpo", overrides=QUICK + [f"model.name={model}"], device="cpu", shrink=False
            )
        )
    assert lab_says in err.value.message and "\n" not in err.value.message
    assert ("shrink_config", {"model": "tiny"}) in [
        (s.operation, dict(s.args)) for s in err.value.next_steps
    ]
    assert not (lab_root / "experiments").exists(), "a refused launch wrote something"
    config = api.resolve_config("dpo", QUICK + [f"model.name={model}"]).data
    launched = runs.start_or_queue(
        runs.NewRun(
            family="direct_alignment",
            algorithm="dpo",
            config=config,
            campaign="model-gone",
            source="dpo.yaml",
            overrides=[],
        )
    )
    status = runs.wait_for_end(launched.run.id, poll_s=0.5, timeout_s=120)
    assert status.state == "failed", status
    assert trainer_says in status.error and "tiny" in status.error
    assert "\n" not in status.error.strip() and "Traceback" not in status.error
    view = api.run_status(launched.run.id)
    assert any(trainer_says in a.message for a in view.alerts)


# ---------------------------------------------------------------------------------------------
# MCP HTTP bind address
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1.nip.io",
        "localhost.example.com",
        "0",
        "[::]",
        " 0.0.0.0 ",
        "0.0.0.0\x00",
        "127.0.0.1/8",
        "::ffff:0.0.0.0",
        "10.0.0.1",
        "*",
    ],
    ids=repr,
)
def test_non_loopback_hosts_need_allow_remote(host):
    with pytest.raises(LabError, match="--allow-remote"):
        check_bind_host(host)


@pytest.fixture
def served(monkeypatch):
    """Record where the HTTP server would listen instead of serving."""
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(mcp_server, "_serve_http", lambda host, port: calls.append((host, port)))
    return calls


def test_http_mcp_binds_to_loopback_by_default(served):
    result = runner.invoke(app, ["mcp", "--http"])
    assert result.exit_code == 0, result.output
    assert served == [("127.0.0.1", mcp_server.DEFAULT_PORT)]
    assert mcp_server._cli(["--http", "--port", "9"]) == 0
    assert served[-1] == ("127.0.0.1", 9)
    helped = runner.invoke(app, ["mcp", "--help"])
    assert "127.0.0.1" in helped.output and "--allow-remote" in helped.output


def test_http_mcp_refuses_a_public_bind_without_the_flag(served, capsys):
    for host in ("0.0.0.0", "::", "192.168.1.20"):
        result = runner.invoke(app, ["mcp", "--http", "--host", host])
        assert result.exit_code == 2, result.output
        assert result.output.count("error: refusing to serve on") == 1
        assert "--allow-remote" in result.output
        assert mcp_server._cli(["--http", "--host", host]) == 2
        assert "--allow-remote" in capsys.readouterr().err
    assert served == [], "a refused bind must never reach the server"
    result = runner.invoke(app, ["mcp", "--http", "--host", "0.0.0.0", "--allow-remote"])
    assert result.exit_code == 0 and served == [("0.0.0.0", mcp_server.DEFAULT_PORT)]


def test_http_mcp_serves_the_checked_host_and_refuses_bad_ports(served):
    result = runner.invoke(app, ["mcp", "--http", "--host", " 127.0.0.1 "])
    assert result.exit_code == 0 and served == [("127.0.0.1", mcp_server.DEFAULT_PORT)]
    for port in ("0", "70000", "-1"):
        result = runner.invoke(app, ["mcp", "--http", "--port", port])
        assert result.exit_code == 2 and "bad --port" in result.output, result.output
    assert len(served) == 1
