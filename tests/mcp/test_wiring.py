"""Claude Code wiring: the skills parse and name only tools the server has, `.claude/skills`
links to them, `.mcp.json` starts the server (spawned exactly as Claude Code would), `rlhf-lab
skills install` copies skills and merges `.mcp.json`, the HTTP transport binds loopback only."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from typer.testing import CliRunner

from rlhf_lab.cli import app
from rlhf_lab.mcp_server import DEFAULT_PORT, TOOL_NAMES, check_bind_host, server
from rlhf_lab.paths import LabError
from rlhf_lab.skills import LOCAL_ENTRY, install_skills, list_skills, mcp_entry, parse_skill

ROOT = Path(__file__).resolve().parents[2]
SKILLS = {
    "run-sanity-experiment",
    "compare-algorithms",
    "debug-failing-run",
    "write-up-campaign",
    "run-rlhf-pipeline",
}
PREFIX = "mcp__rlhf-lab__"
runner = CliRunner()


def server_tools() -> set[str]:
    async def names():
        async with Client(server) as client:
            return {t.name for t in (await client.list_tools()).tools}

    return anyio.run(names)


# ------------------------------------------------------------------------------------- skills


def test_skills_parse_and_name_only_tools_the_server_has():
    skills = {s.name: s for s in list_skills()}
    assert set(skills) == SKILLS
    tools = server_tools()
    assert tools == set(TOOL_NAMES)
    for name, skill in skills.items():
        assert 40 < len(skill.description) < 1024, name
        mcp_tools = [t for t in skill.allowed_tools if t.startswith("mcp__")]
        assert mcp_tools, f"{name} pre-approves no MCP tool"
        for tool in mcp_tools:
            assert tool.startswith(PREFIX), f"{name}: {tool} is not an rlhf-lab tool"
            assert tool.removeprefix(PREFIX) in tools, f"{name}: no tool {tool}"
        body = Path(skill.path).read_text()
        for used in {t.removeprefix(PREFIX) for t in mcp_tools}:
            assert used in body, f"{name} allows {used} but never says how to use it"
        assert "docs/algorithms.md" in body and "acceptance" in body.lower(), name
        assert "one job" in body.lower() or "one training job" in body.lower(), name
    sanity = Path(skills["run-sanity-experiment"].path).read_text()
    for item in ("exact command", "seed", "config file", "W&B", "follow-up sweep", "OOM", "stall"):
        assert item.lower() in sanity.lower(), item
    compare = Path(skills["compare-algorithms"].path).read_text()
    for item in ("avg_correctness", "chosen_rewards", "IPO", "held-out", "matched random control"):
        assert item in compare, item
    assert "Bash(uv run rlhf-lab:*)" in skills["run-sanity-experiment"].allowed_tools


def test_skill_parser_rejects_broken_front_matter(tmp_path):
    bad = tmp_path / "my-skill" / "SKILL.md"
    bad.parent.mkdir()
    bad.write_text("---\nname: my-skill\ndescription: d\n---\nbody\n")
    with pytest.raises(LabError, match="allowed-tools"):
        parse_skill(bad)
    bad.write_text("---\nname: Other_Name\ndescription: d\nallowed-tools: Read\n---\n")
    with pytest.raises(LabError, match="bad skill name"):
        parse_skill(bad)
    bad.write_text(
        "---\nname: my-skill\ndescription: d\nallowed-tools: Read, Bash(uv run x:*)\n---\n"
    )
    assert parse_skill(bad).allowed_tools == ["Read", "Bash(uv run x:*)"]


def test_claude_skills_are_relative_symlinks_to_the_sources():
    links = ROOT / ".claude" / "skills"
    assert {p.name for p in links.iterdir()} == SKILLS
    for name in SKILLS:
        link = links / name
        assert link.is_symlink(), f"{link} must be a symlink (git stores it as one)"
        assert os.readlink(link) == f"../../skills/{name}"
        assert (link / "SKILL.md").resolve() == (ROOT / "skills" / name / "SKILL.md").resolve()


# ------------------------------------------------------------------------------------ .mcp.json


def test_mcp_json_registers_the_server_and_its_command_starts_it(tmp_path):
    text = (ROOT / ".mcp.json").read_text()
    config = json.loads(text)
    # `rlhf-lab skills install --target .` would write exactly this file back
    assert text == json.dumps({"mcpServers": {"rlhf-lab": LOCAL_ENTRY}}, indent=2) + "\n"
    entry = config["mcpServers"]["rlhf-lab"]
    assert entry["command"] == "uv" and entry["args"] == ["run", "rlhf-lab", "mcp"]
    assert entry == LOCAL_ENTRY == mcp_entry(ROOT)
    if shutil.which(entry["command"]) is None:
        pytest.skip("uv is not on PATH")

    env = {k: v for k, v in os.environ.items() if k.startswith("UV_")}
    env.update(RLHF_LAB_ROOT=str(tmp_path), HF_HUB_OFFLINE="1", WANDB_MODE="disabled")
    spawn = StdioServerParameters(command=entry["command"], args=entry["args"], env=env, cwd=ROOT)

    async def handshake():
        async with stdio_client(spawn) as (read, write):
            async with ClientSession(read, write) as session:  # the classic initialize handshake
                init = await session.initialize()
                tools = await session.list_tools()
                status = await session.call_tool("list_runs", {})
                return init, {t.name for t in tools.tools}, status

    init, names, status = anyio.run(handshake)
    assert init.server_info.name == "rlhf-lab"
    assert names == set(TOOL_NAMES)
    assert not status.is_error and status.structured_content["runs"] == []


def test_skills_install_copies_skills_and_merges_mcp_json(tmp_path):
    target = tmp_path / "other-repo"
    (target / ".claude" / "skills" / "their-skill").mkdir(parents=True)
    (target / ".claude" / "skills" / "their-skill" / "SKILL.md").write_text("keep me")
    other = {"command": "node", "args": ["server.js"]}
    (target / ".mcp.json").write_text(
        json.dumps({"mcpServers": {"other": other, "rlhf-lab": {"command": "old"}}, "x": 1})
    )

    result = runner.invoke(app, ["skills", "install", "--target", str(target), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out["installed"]) == SKILLS
    for name in SKILLS:
        copied = target / ".claude" / "skills" / name / "SKILL.md"
        assert copied.is_file() and not copied.parent.is_symlink()
        assert copied.read_text() == (ROOT / "skills" / name / "SKILL.md").read_text()
    assert (target / ".claude" / "skills" / "their-skill" / "SKILL.md").read_text() == "keep me"

    merged = json.loads((target / ".mcp.json").read_text())
    assert merged["x"] == 1 and merged["mcpServers"]["other"] == other
    entry = merged["mcpServers"]["rlhf-lab"]
    assert entry["command"] == "uv" and entry["args"][-2:] == ["rlhf-lab", "mcp"]
    assert entry["args"][:3] == ["run", "--project", str(ROOT)]
    assert entry["env"]["RLHF_LAB_ROOT"] == str(target.resolve())
    assert out["servers"] == ["other", "rlhf-lab"]

    again = install_skills(target)  # idempotent
    assert (
        set(again.installed) == SKILLS and json.loads((target / ".mcp.json").read_text()) == merged
    )


def test_skills_install_refuses_a_broken_mcp_json(tmp_path):
    (tmp_path / ".mcp.json").write_text("{not json")
    result = runner.invoke(app, ["skills", "install", "--target", str(tmp_path)])
    assert result.exit_code == 2 and "not valid JSON" in result.output
    assert (tmp_path / ".mcp.json").read_text() == "{not json"
    missing = runner.invoke(app, ["skills", "install", "--target", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "not a directory" in missing.output


# --------------------------------------------------------------------------- transports, import


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"])
def test_loopback_hosts_are_allowed(host):
    assert check_bind_host(host) == host


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.com", "::"])
def test_remote_hosts_need_allow_remote(host):
    with pytest.raises(LabError, match="--allow-remote"):
        check_bind_host(host)
    assert check_bind_host(host, allow_remote=True) == host


def test_mcp_command_refuses_a_public_host_with_a_clear_error():
    result = runner.invoke(app, ["mcp", "--http", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "refusing to serve on '0.0.0.0'" in result.output and "--allow-remote" in result.output
    helped = runner.invoke(app, ["mcp", "--help"])
    assert all(opt in helped.output for opt in ("--http", "--host", "--port", "--allow-remote"))
    assert str(DEFAULT_PORT) in helped.output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_http_transport_serves_on_loopback(tmp_path):
    port = _free_port()
    env = {**os.environ, "RLHF_LAB_ROOT": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlhf_lab.mcp_server", "--http", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the HTTP server did not start"
                time.sleep(0.2)

        async def listing():
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                return {t.name for t in (await client.list_tools()).tools}

        assert anyio.run(listing) == set(TOOL_NAMES)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert out == b"", "the server printed to stdout"


def test_server_import_is_torch_free():
    code = (
        "import sys, rlhf_lab.mcp_server, rlhf_lab.skills\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == "", "importing the server printed to stdout"
