"""Outputs an agent can afford: with default arguments every tool result stays under Claude
Code's default limit on MCP output (25,000 tokens, counted here as 4 characters a token, over
the whole result: its text and its structured content) even in a lab of 1,000 runs, and
tools/list stays under 24 KB on the wire. Plans, run lists and metric series have compact
defaults with more on request (``detail``, ``limit``, ``max_bytes``, ``keys``).

The lab is written on disk the way the launcher and a trainer leave it (run.json, config.yaml,
metrics.jsonl, train.log, progress.json, summary.json, exit.json with the schemas of
trainers/core/runfolder.py); nothing is trained. The tools are called through the real server
in process (the SDK's in-memory client).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest
from mcp import Client

from rlhf_lab import api
from rlhf_lab.mcp_server import TOOL_NAMES, server
from tests._helpers.run_folders import STEP_KEYS, write_jsonl, write_run_json
from tests.mcp._fixtures import asyncio_backend  # noqa: F401  (pytest fixtures)
from trainers.core.runfolder import ExitFile, MetricRow, ProgressFile, SummaryFile

pytestmark = pytest.mark.anyio

RUNS = 1_000
CAMPAIGNS = 100
BIG_STEPS = 3_000  # the run whose metrics are read: a long run, a row per step
TOKEN_CHARS = 4
RESULT_TOKEN_LIMIT = 25_000  # Claude Code's default cap on one MCP tool result
TOOLS_LIST_LIMIT = 24_000  # bytes of tools/list as sent
TRAIN_KEYS = [
    "loss",
    "accuracy",
    "margins",
    "chosen_rewards",
    "rejected_rewards",
    "chosen_logps",
    "rejected_logps",
    *STEP_KEYS,
]
EVAL_KEYS = ["eval/loss", "eval/accuracy", "eval/margins", "eval/chosen_rewards"]


def _campaign(i: int) -> str:
    return f"2026-03-{i % 28 + 1:02d}-sizes-{i:03d}"


def _run_id(i: int) -> str:
    return f"dpo-20260301-{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-{i:04x}"


def _write(path: Path, model) -> None:
    path.write_text(model.model_dump_json(exclude_none=True))


def _write_run(exp: Path, i: int, steps: int, rng: random.Random) -> None:
    campaign, run_id = _campaign(i % CAMPAIGNS), _run_id(i)
    run_dir = exp / campaign / "runs" / run_id
    write_run_json(
        run_dir,
        "direct_alignment",
        "dpo",
        config_source="trainers/direct_alignment/configs/dpo.yaml",
        overrides=["model.name=tiny", f"train.max_steps={steps}"],
        state="succeeded",
        created_at=f"2026-03-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000+00:00",
        ended_at="2026-03-02T00:00:00.000+00:00",
        exit_code=0,
    )
    config = run_dir / "config.yaml"
    config.write_text("algorithm: dpo\nmodel:\n  name: tiny\nseed: 42\n")
    rows = []
    for step in range(1, steps + 1):
        train = {k: rng.random() for k in TRAIN_KEYS}
        rows.append(MetricRow(step=step, time_s=step * 0.731, phase="train", **train))
        if step % 10 == 0 or step == steps:
            held_out = {k: rng.random() for k in EVAL_KEYS}
            rows.append(MetricRow(step=step, time_s=step * 0.731, phase="eval", **held_out))
    dumped = [r.model_dump(exclude_none=True) for r in rows]
    write_jsonl(run_dir / "metrics.jsonl", dumped)
    log = "".join(f"step {s}/{steps} loss 0.5 accuracy 0.6\n" for s in range(1, min(steps, 300)))
    (run_dir / "train.log").write_text(log)
    _write(run_dir / "progress.json", ProgressFile(step=steps, total_steps=steps, elapsed_s=9.0))
    _write(
        run_dir / "summary.json",
        SummaryFile(
            outcome="succeeded",
            steps=steps,
            total_steps=steps,
            wall_time_s=9.0,
            final_metrics=dumped[-2],
            final_eval=dumped[-1],
        ),
    )
    _write(run_dir / "exit.json", ExitFile(exit_code=0))


@pytest.fixture(scope="module")
def big_lab(tmp_path_factory):
    """A lab of 1,000 finished runs in 100 campaigns; the first run is 3,000 steps long."""
    root = tmp_path_factory.mktemp("lab-1000")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLHF_LAB_ROOT", str(root))
        mp.setenv("HF_HUB_OFFLINE", "1")
        first = api.create_campaign(_campaign(0), "Question 0: does a long listing stay small?")
        exp = api.experiments_dir()
        ledger, state = Path(first.path).read_text(), Path(first.asset_dir, "ledger.json")
        for c in range(1, CAMPAIGNS):  # the others as copies of a real one (fast)
            name = _campaign(c)
            text = ledger.replace(_campaign(0), name).replace("Question 0", f"Question {c}")
            text = text.replace(f"date: '{_campaign(0)[:10]}'", f"date: '{name[:10]}'")
            (exp / f"{name}.md").write_text(text)
            (exp / name / "runs").mkdir(parents=True)
            (exp / name / "ledger.json").write_text(state.read_text().replace(_campaign(0), name))
        rng = random.Random(0)
        for i in range(RUNS):
            _write_run(exp, i, BIG_STEPS if i == 0 else 4, rng)
        yield root


@pytest.fixture
async def client(big_lab):
    async with Client(server) as c:
        yield c


def _size(result) -> int:
    """Characters of a whole tool result as a client receives it (text + structured)."""
    return len(result.model_dump_json(by_alias=True, exclude_none=True))


BIG = _run_id(0)
DEFAULT_CALLS: list[tuple[str, dict]] = [
    ("list_recipes", {}),
    ("plan_experiment", {"request": "compare dpo, ipo and simpo", "model": "tiny"}),
    ("plan_experiment", {"request": "compare ppo and grpo", "model": "tiny"}),
    ("plan_experiment", {"request": "does a PRM beat an ORM for best-of-n?", "model": "tiny"}),
    ("shrink_config", {"recipe": "grpo", "model": "tiny"}),
    ("estimate_memory", {"recipe": "ppo", "model": "tiny"}),
    ("check_resources", {}),
    ("launch_run", {"recipe": "dpo", "model": "tiny", "campaign": "Not A Slug"}),  # refused
    ("run_pipeline", {"name": "r1-zero", "model": "tiny", "campaign": "Not A Slug"}),  # refused
    ("run_status", {"run_id": BIG}),
    ("tail_logs", {"run_id": BIG}),
    ("get_metrics", {"run_id": BIG}),
    ("stop_run", {"run_id": BIG}),
    ("resume_run", {"run_id": BIG}),  # a succeeded run: refused with its next step
    ("list_runs", {}),
    ("compare_runs", {"run_ids": [_run_id(i) for i in range(0, 40, 4)]}),
    ("record_results", {"run_id": _run_id(1)}),
    ("list_campaigns", {}),
    ("sweep_runs", {"recipes": ["dpo", "ipo"], "model": "tiny", "campaign": "Not A Slug"}),
    ("evaluate_model", {"target": BIG, "suite": ["no-such-suite"]}),  # refused
    ("query_runs", {}),
]


async def test_every_tool_result_fits_with_1000_runs(client):
    assert {name for name, _ in DEFAULT_CALLS} == set(TOOL_NAMES)
    schemas = {t.name: t.output_schema for t in (await client.list_tools()).tools}
    sizes: dict[str, int] = {}
    for name, args in DEFAULT_CALLS:
        result = await client.call_tool(name, args)
        text = "".join(getattr(c, "text", "") for c in result.content)
        refused = ("launch_run", "run_pipeline", "resume_run", "sweep_runs", "evaluate_model")
        if name not in refused:
            assert not result.is_error, f"{name}: {text[:300]}"
            jsonschema.validate(result.structured_content, schemas[name])
            # the text is the same data as compact JSON, not a second, indented copy
            assert json.loads(text) == result.structured_content and "\n" not in text
        sizes[f"{name} {args}"] = _size(result)
    too_big = {k: v for k, v in sizes.items() if v > RESULT_TOKEN_LIMIT * TOKEN_CHARS}
    assert not too_big, too_big
    # the compact defaults keep even the largest well below the cap
    assert max(sizes.values()) < 40_000, sizes


async def test_list_runs_rows_are_compact_with_detail_on_request(client):
    out = (await client.call_tool("list_runs", {})).structured_content
    assert out["total"] == RUNS and len(out["runs"]) == 50 and "limit" in out["note"]
    row = out["runs"][-1]
    assert row["id"] == _run_id(RUNS - 1) and row["state"] == "succeeded"
    assert row["step"] == row["total_steps"] == 4
    assert row["metric"] == "eval/accuracy" and isinstance(row["value"], float)
    assert row["status"] is None
    assert len(json.dumps(out)) < 12_000
    detailed = await client.call_tool("list_runs", {"detail": True})
    rows = detailed.structured_content["runs"]
    assert len(rows) == 10 and rows[-1]["status"]["run_dir"].endswith(row["id"])
    assert _size(detailed) < RESULT_TOKEN_LIMIT * TOKEN_CHARS
    one_campaign = await client.call_tool("list_runs", {"campaign": _campaign(0), "limit": 500})
    assert one_campaign.structured_content["total"] == RUNS // CAMPAIGNS


async def test_get_metrics_is_bounded_by_size_and_gives_more_on_request(client):
    out = (await client.call_tool("get_metrics", {"run_id": BIG})).structured_content
    assert out["total_rows"] == BIG_STEPS + BIG_STEPS // 10
    assert len(json.dumps(out["rows"], separators=(",", ":"))) <= 8_000
    assert {r["phase"] for r in out["rows"]} == {"train", "eval"}
    assert out["rows"][-1]["step"] == BIG_STEPS and out["downsampled"] and out["note"]
    # fewer keys: more points in the same budget
    one_key = await client.call_tool(
        "get_metrics", {"run_id": BIG, "keys": ["eval/accuracy"], "phase": "eval"}
    )
    rows = one_key.structured_content["rows"]
    assert len(rows) > len(out["rows"]) and set(rows[0]) == {
        "step",
        "time_s",
        "phase",
        "eval/accuracy",
    }
    widest = await client.call_tool("get_metrics", {"run_id": BIG, "max_bytes": 40_000})
    assert _size(widest) < RESULT_TOKEN_LIMIT * TOKEN_CHARS


async def test_list_campaigns_and_resources_stay_bounded(client):
    out = (await client.call_tool("list_campaigns", {})).structured_content
    assert (
        out["total"] == CAMPAIGNS
        and len(out["campaigns"]) == 20
        and "ledger://index" in out["note"]
    )
    listed = await client.list_resources()
    campaigns = [str(r.uri) for r in listed.resources if str(r.uri) != "ledger://index"]
    assert len(campaigns) == 100
    assert len(listed.model_dump_json(by_alias=True, exclude_none=True)) < 40_000


def _titles(schema) -> list[str]:
    if isinstance(schema, dict):
        own = [schema["title"]] if isinstance(schema.get("title"), str) else []
        return own + [t for v in schema.values() for t in _titles(v)]
    if isinstance(schema, list):
        return [t for v in schema for t in _titles(v)]
    return []


async def test_tools_list_is_small(client):
    listed = await client.list_tools()
    wire = listed.model_dump_json(by_alias=True, exclude_none=True)
    assert len(wire.encode()) < TOOLS_LIST_LIMIT, len(wire.encode())
    for tool in listed.tools:
        assert not _titles(tool.input_schema), tool.name  # pydantic's generated titles go
        # nested models are typed, not spelled out (a result carries its own fields)
        text = json.dumps(tool.output_schema)
        assert "$defs" not in text and "$ref" not in text, tool.name
        assert tool.output_schema["type"] == "object" and tool.output_schema["properties"]


def test_the_cli_json_shares_the_compact_defaults(big_lab):
    """`rlhf-lab runs --json` and `metrics --json` are the same operations as the MCP tools,
    with the same bounded defaults."""
    from typer.testing import CliRunner

    from rlhf_lab.cli import app

    runner = CliRunner()
    listed = json.loads(runner.invoke(app, ["runs", "--json"]).output)
    assert listed["total"] == RUNS and len(listed["runs"]) == 50
    assert set(listed["runs"][0]) == {
        "id",
        "campaign",
        "state",
        "step",
        "total_steps",
        "metric",
        "value",
        "best",
        "status",
    }
    series = json.loads(runner.invoke(app, ["metrics", BIG, "--json"]).output)
    assert len(json.dumps(series["rows"], separators=(",", ":"))) <= 8_000 and series["note"]
    table = runner.invoke(app, ["runs", "--limit", "3"])
    assert table.exit_code == 0 and "eval/accuracy" in table.output and "newest 3" in table.output
