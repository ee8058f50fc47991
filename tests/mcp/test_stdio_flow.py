"""A real stdio session: the SDK's stdio client starts `python -m rlhf_lab.mcp_server` as a
subprocess and drives the whole agent flow on the `tiny` model (list_recipes -> plan -> shrink ->
memory -> launch -> poll run_status -> tail_logs with cursors -> record_results -> the ledger
resource). A second run, launched through a server that is then SIGKILLed, keeps training and
ends as succeeded.

The killed-server run starts first (module fixture) so that its training overlaps the flow
run's on the machine's two cores.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import anyio
import psutil
import pytest
from mcp import Client, StdioServerParameters

from tests._helpers.server_env import server_env
from tests._lab_processes import kill_live_runs
from tests.mcp._lab import QUICK

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"succeeded", "failed", "stopped", "died"}
RUN_TIMEOUT_S = 240


def params(root: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "rlhf_lab.mcp_server"], env=server_env(root), cwd=ROOT
    )


def server_pids() -> list[int]:
    """Our own children that are an rlhf-lab MCP server (the stdio client started them)."""
    out = []
    for child in psutil.Process().children():
        try:
            if "rlhf_lab.mcp_server" in " ".join(child.cmdline()):
                out.append(child.pid)
        except psutil.Error:
            continue
    return out


async def wait_gone(pid: int, timeout: float = 10.0) -> None:
    """Until ``pid`` is dead (a zombie counts: the stdio client reaps it, not us)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"server {pid} survived SIGKILL")


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mcp-stdio")
    mp = pytest.MonkeyPatch()
    mp.setenv("RLHF_LAB_ROOT", str(root))  # for rlhf_lab.api calls made by the tests
    yield root
    kill_live_runs(root)
    mp.undo()


@pytest.fixture(scope="module", autouse=True)
def orphan(lab_root):
    """Launch a run through a stdio server, SIGKILL the server, report the run's state."""

    async def go():
        async with Client(params(lab_root)) as client:
            result = await client.call_tool(
                "launch_run",
                {
                    "recipe": "dpo",
                    "model": "tiny",
                    "overrides": QUICK,
                    "device": "cpu",
                    "campaign": "mcp-orphan",
                },
            )
            assert not result.is_error, result.content
            run_id = result.structured_content["run_id"]
            (pid,) = server_pids()
            os.kill(pid, signal.SIGKILL)
            await wait_gone(pid)
            return run_id, pid

    from rlhf_lab.api import run_state

    run_id, pid = anyio.run(go)
    return {"run_id": run_id, "server_pid": pid, "after_kill": run_state(run_id)}


@pytest.mark.slow  # two real trainers on the tiny model: 20-40 s on two busy cores
def test_agent_flow_over_stdio(lab_root):
    stream_errors: list[Exception] = []

    async def on_message(message) -> None:
        if isinstance(message, Exception):  # e.g. a stdout line that is not JSON-RPC
            stream_errors.append(message)

    async def flow() -> dict:
        async with Client(params(lab_root), message_handler=on_message) as client:
            assert client.server_info.name == "rlhf-lab"

            async def call(name: str, args: dict) -> dict:
                result = await client.call_tool(name, args)
                assert not result.is_error, f"{name}: {result.content}"
                return result.structured_content

            recipes = await call("list_recipes", {})
            assert "direct_alignment/dpo" in {r["id"] for r in recipes["recipes"]}

            plan = await call(
                "plan_experiment", {"request": "small dpo sanity check", "model": "tiny"}
            )
            assert plan["intent"] == "sanity"
            assert plan["runs"][0]["recipe"] == "direct_alignment/dpo"

            shrunk = await call(
                "shrink_config", {"recipe": "dpo", "model": "tiny", "overrides": QUICK}
            )
            assert shrunk["expected_optimizer_steps"] == 4

            memory = await call(
                "estimate_memory",
                {"recipe": "dpo", "model": "tiny", "overrides": QUICK, "device": "cpu"},
            )
            assert memory["fits"] is True

            start = time.monotonic()
            launched = await call(
                "launch_run",
                {
                    "recipe": "dpo",
                    "model": "tiny",
                    # another seed than the orphan's run (maybe still running): not identical
                    "overrides": [*QUICK, "seed=3"],
                    "device": "cpu",
                    "campaign": "mcp-flow",
                },
            )
            launch_s = time.monotonic() - start
            run_id, campaign = launched["run_id"], launched["campaign"]

            text, cursor, cursors = "", 0, []
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while True:
                status = await call("run_status", {"run_id": run_id})
                chunk = await call("tail_logs", {"run_id": run_id, "cursor": cursor})
                assert chunk["cursor"] >= cursor
                text, cursor = text + chunk["text"], chunk["cursor"]
                cursors.append(cursor)
                if status["status"]["state"] in TERMINAL:
                    break
                assert time.monotonic() < deadline, f"run still {status['status']['state']}"
                await anyio.sleep(1.0)
            while True:  # the rest of the log, now that the run is over
                chunk = await call("tail_logs", {"run_id": run_id, "cursor": cursor})
                text, cursor = text + chunk["text"], chunk["cursor"]
                if chunk["eof"]:
                    break
            last = await call("tail_logs", {"run_id": run_id, "lines": 3})

            recorded = await call("record_results", {"run_id": run_id, "note": "stdio flow"})
            ledger = await client.read_resource(f"ledger://{campaign}", cache_mode="bypass")
            return {
                "run_id": run_id,
                "campaign": campaign,
                "launch_s": launch_s,
                "final": status,
                "text": text,
                "cursors": cursors,
                "last": last,
                "recorded": recorded,
                "ledger": ledger.contents[0].text,
            }

    out = anyio.run(flow)
    run_id = out["run_id"]
    assert out["launch_s"] < 20, "launch_run must return before the trainer is done"
    assert out["final"]["status"]["state"] == "succeeded", out["text"][-2000:]
    assert out["final"]["status"]["step"] == 4 and out["final"]["status"]["exit_code"] == 0

    log = (lab_root / out["recorded"]["run_dir"] / "train.log").read_text()
    assert out["text"] == log, "the cursor reads add up to the whole train.log"
    assert len(set(out["cursors"])) > 1, "the log grew between polls"
    assert "step 4/4" in log and "trainer exited with code 0" in out["last"]["text"]

    rec = out["recorded"]
    assert rec["state"] == "succeeded" and rec["model"] == "tiny" and rec["note"] == "stdio flow"
    final = {m["name"]: m["final"] for m in rec["metrics"]}
    assert isinstance(final["eval/accuracy"], float) and isinstance(final["margins"], float)

    md = out["ledger"]
    assert md.startswith("---\n") and f"id: {out['campaign']}" in md
    (row,) = [line for line in md.splitlines() if line.startswith(f"| `{run_id}` | dpo |")]
    assert "| succeeded |" in row and "4/4" in row
    assert f"{final['eval/accuracy']:.4g}" in row, row
    assert "stdio flow" in md
    assert not stream_errors, f"stdout carried something that is not JSON-RPC: {stream_errors}"


def test_run_survives_the_server_being_killed(orphan):
    from rlhf_lab.api import run_state
    from rlhf_lab.runs import wait_for_end

    assert not psutil.pid_exists(orphan["server_pid"]) or (
        psutil.Process(orphan["server_pid"]).status() == psutil.STATUS_ZOMBIE
    )
    after = orphan["after_kill"]
    assert after.state == "running" and after.alive, after
    final = wait_for_end(orphan["run_id"], poll_s=1.0, timeout_s=RUN_TIMEOUT_S)
    assert final.state == "succeeded", final
    assert final.exit_code == 0 and final.step == 4
    assert run_state(orphan["run_id"]).state == "succeeded"
