"""Bad input, MCP: tool arguments fuzzed through the in-memory client give a result matching
the tool's output schema or a tool error with text, never the "unexpected exception" path and
never a write outside experiments/ (trainers are never started: the start is replaced by a
refusal); the HTTP transport binds to loopback by default, a public address only with
--allow-remote.

tests/mcp/test_wiring.py holds the basic cases; this file adds the fuzzing and the bind checks.
The shared helpers and the fixtures are in _bad_input.py.
"""

from __future__ import annotations

from pathlib import Path

import _synthetic as synthetic
import anyio.from_thread
import jsonschema
import pytest
import yaml
from _bad_input import (  # noqa: F401  (lab_root, no_trainer: fixtures)
    FINISHED,
    FUZZ,
    QUICK,
    assert_one_clear_message,
    lab_root,
    no_trainer,
    outside_experiments,
    override_strategy,
    runner,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client

from rlhf_lab import api, mcp_server
from rlhf_lab.cli import app
from rlhf_lab.mcp_server import check_bind_host, server
from rlhf_lab.paths import LabError
from rlhf_lab.planning.catalog import FAMILIES

pytestmark = pytest.mark.usefixtures("lab_root")


# ---------------------------------------------------------------------------------------------
# MCP tool arguments fuzzed
# ---------------------------------------------------------------------------------------------

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
