"""The lab's MCP server driven by a client nobody here wrote: the official MCP Inspector CLI.

The Inspector and the Node it needs are pinned in tests/e2e/package.json + package-lock.json and
installed with ``npm ci`` outside the repository by tests/e2e/inspector.py (``.ci/run`` does it
before the suite; here it is a no-op when already done). Every call below is one
``mcp-inspector --cli ... --format json`` process, as a user or a CI job would type it:

- tools/list with ``--strict`` (the Inspector's tool-schema portability lint) is clean, both on
  the command the test starts and on the server registered in the project's ``.mcp.json``;
- one sanity flow on the built-in ``tiny`` model, over stdio: plan_experiment -> launch_run (DPO,
  two steps) -> run_status until it ends -> tail_logs -> record_results -> resources/read of the
  campaign's ``ledger://`` resource, with the run's held-out accuracy in its ledger row;
- the same server over streamable HTTP (``rlhf-lab mcp --http`` on a free port): tools/list and
  run_status of the flow's run;
- error paths as the client shows them: an error result (``isError``) that names the tool
  arguments and tools to use, never a CLI flag, a traceback or a validation-library URL.

The run is launched first (module fixture) so that it trains while the other calls run; the lab
writes under a temporary ``RLHF_LAB_ROOT``. Skipped only when npm is absent (and never when
``RLHF_LAB_REQUIRE_INSPECTOR`` is set, as ``.ci/run`` does).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._helpers.server_env import server_env
from tests._lab_processes import kill_live_runs

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / "tests" / "e2e" / "inspector.py"

pytestmark = pytest.mark.slow  # one tiny DPO run plus ~20 Inspector processes

QUICK = [
    "data.max_samples=32",
    "data.eval_size=16",
    "train.batch_size=8",
    "train.max_steps=2",
    "eval.eval_every=2",
    "eval.sample_every=0",
    "checkpoint.save_final_model=false",
]
STEPS = 2
HEADLINE = "eval/accuracy"  # direct alignment's held-out metric
CAMPAIGN = "inspector-e2e"
TERMINAL = {"succeeded", "failed", "stopped", "killed", "died"}
RUN_DEADLINE_S = 300  # bounded poll; the run takes ~30 s on two busy cores
CALL_TIMEOUT_S = 120
TOOL_ERROR_EXIT = 5  # the Inspector CLI's exit code for a result with isError: true
CLI_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _installer():
    spec = importlib.util.spec_from_file_location("rlhf_lab_e2e_inspector", INSTALLER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lab_command() -> list[str]:
    """``rlhf-lab mcp`` from this environment (what ``uv run rlhf-lab mcp`` runs)."""
    exe = Path(sys.executable).with_name("rlhf-lab")
    return [str(exe), "mcp"] if exe.exists() else [sys.executable, "-m", "rlhf_lab.cli", "mcp"]


@dataclass
class Call:
    """One Inspector process: its argv, exit code and output."""

    argv: list[str]
    rc: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return (
            f"$ {' '.join(self.argv[1:])}\nexit {self.rc}\n"
            f"stdout: {self.stdout[-3000:]}\nstderr: {self.stderr[-3000:]}"
        )

    @property
    def envelope(self) -> dict:
        try:
            return json.loads(self.stdout)
        except ValueError:
            raise AssertionError(f"stdout is not one JSON object:\n{self}") from None

    @property
    def result(self) -> dict:
        assert "result" in self.envelope, str(self)
        return self.envelope["result"]

    @property
    def text(self) -> str:
        """The text blocks of a tool result."""
        return "\n".join(b.get("text", "") for b in self.result.get("content", []))

    def ok(self) -> dict:
        """The structured content of a successful tool call."""
        assert self.rc == 0 and self.result.get("isError") is not True, str(self)
        return self.result["structuredContent"]


@dataclass
class Inspector:
    argv: list[str]  # pinned node + the mcp-inspector launcher
    bin_dir: Path
    state: Path  # its catalog, config and OAuth files go here, not to ~/.mcp-inspector
    lab_root: Path

    def env(self, catalog: bool = True) -> dict[str, str]:
        """Its environment: the pinned Node first on PATH, its state files under ``state``
        (``catalog=False`` when ``--config`` names the server file: the two exclude each other)."""
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(self.bin_dir), env.get("PATH", "")])
        if shutil.which("uv", path=env["PATH"]) is None and os.environ.get("UV"):
            # `uv run pytest` exports $UV, the uv that .mcp.json's command needs
            env["PATH"] += os.pathsep + str(Path(os.environ["UV"]).parent)
        if catalog:
            env["MCP_CATALOG_PATH"] = str(self.state / "catalog.json")
        env.update(
            NO_COLOR="1",
            MCP_CLIENT_CONFIG_PATH=str(self.state / "client.json"),
            MCP_STORAGE_DIR=str(self.state / "storage"),
            MCP_INSPECTOR_OAUTH_STATE_PATH=str(self.state / "oauth.json"),
        )
        return env

    def run(self, target: list[str], *options: str) -> Call:
        argv = [*self.argv, "--cli", *target, "--format", "json", *options]
        env = self.env(catalog="--config" not in options)
        out = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CALL_TIMEOUT_S
        )
        return Call(argv, out.returncode, out.stdout, out.stderr)

    def stdio(self, *options: str) -> Call:
        """Start ``rlhf-lab mcp`` over stdio on the test's lab root and do one request."""
        pairs = [x for k, v in server_env(self.lab_root).items() for x in ("-e", f"{k}={v}")]
        return self.run([*lab_command()], *pairs, "--connect-timeout", "60000", *options)

    def call(self, tool: str, args: dict | None = None) -> Call:
        return self.stdio(
            "--method",
            "tools/call",
            "--tool-name",
            tool,
            "--tool-args-json",
            json.dumps(args or {}),
        )


# ---------------------------------------------------------------------------------------------
# Fixtures: the installed Inspector, a lab root, the run (launched first), the HTTP server
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def inspector(tmp_path_factory) -> Inspector:
    installer = _installer()
    try:
        root = installer.ensure()
    except installer.NpmMissing as exc:
        if os.environ.get("RLHF_LAB_REQUIRE_INSPECTOR"):
            pytest.fail(f"RLHF_LAB_REQUIRE_INSPECTOR is set but {exc}")
        pytest.skip(f"the MCP Inspector end-to-end tests need Node.js and npm: {exc}")
    lab_root = tmp_path_factory.mktemp("inspector-lab")
    yield Inspector(
        argv=installer.command(root),
        bin_dir=installer.bin_dir(root),
        state=tmp_path_factory.mktemp("inspector-state"),
        lab_root=lab_root,
    )
    kill_live_runs(lab_root)


@pytest.fixture(scope="module")
def launched(inspector) -> dict:
    """plan_experiment, then launch_run of the two-step DPO run the flow follows."""
    plan = inspector.call("plan_experiment", {"request": "dpo sanity check", "model": "tiny"})
    launch = inspector.call(
        "launch_run",
        {
            "recipe": "dpo",
            "model": "tiny",
            "overrides": QUICK,
            "device": "cpu",
            "campaign": CAMPAIGN,
        },
    )
    return {"plan": plan, "launch": launch, "run_id": launch.ok()["run_id"]}


@pytest.fixture(scope="module")
def tool_list(inspector) -> Call:
    return inspector.stdio("--method", "tools/list", "--strict")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def http_url(inspector, tmp_path_factory):
    """``rlhf-lab mcp --http`` on a free loopback port, on the flow's lab root; stopped after."""
    port = _free_port()
    log = tmp_path_factory.mktemp("inspector-http") / "server.log"
    env = {**os.environ, **server_env(inspector.lab_root)}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*lab_command(), "--http", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the HTTP server exited:\n{log.read_text()[-3000:]}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"no server on {port}:\n{log.read_text()}"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def schema_findings(call: Call) -> list[str]:
    """The ``--strict`` lint findings, one line each."""
    return [
        f"{t['toolName']}: {f['severity']} {f['rule']} at {f['schema']}.{f['path']}"
        for t in call.envelope.get("schemaFindings") or []
        for f in t.get("findings", [])
    ]


def tool_names(call: Call) -> list[str]:
    assert call.rc == 0, str(call)
    return sorted(t["name"] for t in call.result["tools"])


def find_number(obj, key: str) -> float | None:
    """The first numeric value stored under ``key`` anywhere in a JSON value."""
    if isinstance(obj, dict):
        value = obj.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        obj = list(obj.values())
    if isinstance(obj, list):
        for item in obj:
            found = find_number(item, key)
            if found is not None:
                return found
    return None


# ---------------------------------------------------------------------------------------------
# Tests, in the order they run (the launched run trains meanwhile)
# ---------------------------------------------------------------------------------------------


def test_plan_then_launch_over_stdio(launched):
    plan = launched["plan"].ok()
    assert plan["intent"] == "sanity", plan
    assert '"algorithm": "dpo"' in json.dumps(plan), "the plan is not for DPO"

    launch = launched["launch"].ok()
    assert re.fullmatch(r"dpo-\d{8}-\d{6}-[0-9a-f]{4}", launch["run_id"]), launch
    assert launch["campaign"].endswith(CAMPAIGN), launch
    assert launch["state"] in {"starting", "running"}, launch
    assert launch["device"] == "cpu", launch


def test_tools_list_is_strict_clean(tool_list):
    """``--strict`` reports every tool-schema portability problem; a clean list has none."""
    assert tool_list.rc == 0, str(tool_list)
    assert not schema_findings(tool_list), "\n".join(schema_findings(tool_list))
    assert "Warning:" not in tool_list.stderr and "Error:" not in tool_list.stderr
    names = tool_names(tool_list)
    assert {"plan_experiment", "launch_run", "run_status", "record_results"} <= set(names)


def test_registered_server_lists_the_same_tools(inspector, tool_list):
    """The server exactly as ``.mcp.json`` registers it for Claude Code (``uv run rlhf-lab
    mcp``), read by the Inspector from that file."""
    env = inspector.env()
    if shutil.which("uv", path=env["PATH"]) is None:
        pytest.skip(".mcp.json starts the server with uv, and uv is not on PATH")
    call = inspector.run(
        [], "--config", ".mcp.json", "--server", "rlhf-lab", "--method", "tools/list"
    )
    assert tool_names(call) == tool_names(tool_list), str(call)


def _assert_clean_error(call: Call, *names: str) -> None:
    """An error result as an agent should get it: isError, the names it needs, no CLI flag,
    traceback or validation-library link."""
    assert call.rc == TOOL_ERROR_EXIT, str(call)
    assert call.result.get("isError") is True, str(call)
    text = call.text
    for name in names:
        assert name in text, f"{name!r} not named in:\n{text}"
    assert "Traceback" not in text and "Traceback" not in call.stderr, str(call)
    assert not CLI_FLAG.findall(text), f"CLI flags {CLI_FLAG.findall(text)} in:\n{text}"
    assert "pydantic.dev" not in text, f"validation-library link in:\n{text}"


def test_error_unknown_recipe_points_to_list_recipes(inspector):
    call = inspector.call(
        "launch_run", {"recipe": "no-such-recipe", "model": "tiny", "device": "cpu"}
    )
    _assert_clean_error(call, "no-such-recipe", "recipe", "list_recipes")


def test_error_unknown_run_is_not_found(inspector):
    run_id = "dpo-20200101-000000-abcd"
    call = inspector.stdio(
        "--method", "tools/call", "--tool-name", "run_status", "--tool-arg", f"run_id={run_id}"
    )
    _assert_clean_error(call, run_id, "list_runs")
    assert re.search(r"\bno run\b|not found", call.text, re.IGNORECASE), call.text


def test_error_malformed_argument_names_it(inspector):
    """``overrides`` must be a list; a plain string is the usual slip."""
    call = inspector.call(
        "launch_run", {"recipe": "dpo", "model": "tiny", "overrides": "train.max_steps=2"}
    )
    _assert_clean_error(call, "overrides")


def test_error_bad_override_value_names_the_key_not_a_flag(inspector):
    call = inspector.call(
        "launch_run",
        {"recipe": "dpo", "model": "tiny", "device": "cpu", "overrides": ["train.max_steps=abc"]},
    )
    _assert_clean_error(call, "train.max_steps", "overrides")


def test_streamable_http(inspector, http_url, tool_list, launched):
    http = ["--transport", "http", "--server-url", http_url]
    listed = inspector.run([], *http, "--method", "tools/list")
    assert tool_names(listed) == tool_names(tool_list), str(listed)

    status = inspector.run(
        [],
        *http,
        "--method",
        "tools/call",
        "--tool-name",
        "run_status",
        "--tool-arg",
        f"run_id={launched['run_id']}",
    ).ok()["status"]
    assert status["id"] == launched["run_id"], status
    assert status["state"] in {"starting", "running", "succeeded"}, status


def test_sanity_flow_until_the_ledger(inspector, launched):
    run_id = launched["run_id"]
    deadline = time.monotonic() + RUN_DEADLINE_S
    while True:
        status = inspector.call("run_status", {"run_id": run_id}).ok()["status"]
        if status["state"] in TERMINAL:
            break
        assert time.monotonic() < deadline, f"still {status['state']} after {RUN_DEADLINE_S} s"
        time.sleep(1.0)

    tail = inspector.call("tail_logs", {"run_id": run_id, "lines": 200}).ok()
    assert status["state"] == "succeeded", f"{status}\n{tail['text'][-3000:]}"
    assert status["step"] == status["total_steps"] == STEPS and status["exit_code"] == 0, status
    assert f"step {STEPS}/{STEPS}" in tail["text"], tail["text"]
    assert tail["eof"] is True and "Traceback" not in tail["text"], tail
    headline = find_number(status, HEADLINE)
    assert headline is not None and 0.0 <= headline <= 1.0, status

    note = "driven by the MCP Inspector"
    recorded = inspector.call("record_results", {"run_id": run_id, "note": note}).ok()
    assert recorded["run_id"] == run_id and recorded["state"] == "succeeded", recorded
    assert HEADLINE in json.dumps(recorded), recorded

    campaign = launched["launch"].ok()["campaign"]
    read = inspector.stdio("--method", "resources/read", "--uri", f"ledger://{campaign}")
    assert read.rc == 0, str(read)
    (content,) = read.result["contents"]
    assert content["uri"] == f"ledger://{campaign}", content["uri"]
    ledger = content["text"]
    assert ledger.startswith("---\n") and f"id: {campaign}" in ledger, ledger[:500]
    assert HEADLINE in ledger and note in ledger, ledger
    rows = [line for line in ledger.splitlines() if line.startswith(f"| `{run_id}` |")]
    row = next((r for r in rows if "succeeded" in r), None)
    assert row is not None, f"no succeeded row for {run_id} in:\n{ledger}"
    numbers = [float(x) for x in re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?", row)]
    assert any(abs(x - headline) < 1e-3 for x in numbers), f"{HEADLINE}={headline} not in {row}"
