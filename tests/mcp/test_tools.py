"""The MCP server in process (the SDK's in-memory `Client(server)`): every tool's happy path, its
structured output against the tool's own output schema, and each documented failure as a tool
error with actionable text and no traceback; resources and prompts listed and readable.

Run folders are written on disk the way the lab and a trainer leave them (the lab only reads the
disk), except `launch_run`, which starts a real trainer and stops it at once.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import types
from pathlib import Path

import jsonschema
import psutil
import pytest
import yaml
from mcp import MCPError

from rlhf_lab import api, mcp_server
from rlhf_lab.mcp_server import TOOL_NAMES
from rlhf_lab.planning.catalog import FAMILIES
from tests._helpers.run_folders import write_jsonl, write_run_json
from tests.mcp._fixtures import asyncio_backend, fresh_lab, in_memory_client  # noqa: F401  (pytest fixtures)
from tests.mcp._lab import QUICK

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("lab_root")]

CAMPAIGN = "2026-03-01-mcp-tools"
RUN = "dpo-20260301-120000-aaaa"
RUN2 = "ipo-20260301-120500-bbbb"
MISSING = "dpo-20990101-000000-dead"
READ_ONLY = {
    "list_recipes",
    "plan_experiment",
    "shrink_config",
    "estimate_memory",
    "check_resources",
    "run_status",
    "tail_logs",
    "get_metrics",
    "list_runs",
    "list_campaigns",
    "query_runs",
}


@pytest.fixture
async def schemas(client):
    return {t.name: t for t in (await client.list_tools()).tools}


# ------------------------------------------------------------------------------------ helpers


def make_run(
    run_id: str = RUN,
    algorithm: str = "dpo",
    *,
    family: str = "direct_alignment",
    state: str = "succeeded",
    rows: list[dict] | None = None,
    log_lines: int = 40,
    campaign: str = CAMPAIGN,
) -> Path:
    """A finished run folder as the launcher and a trainer leave it (in a campaign ledger, as
    launch_run makes one)."""
    api.create_campaign(campaign, "Does the MCP server see this run?")
    path = api.experiments_dir() / campaign / "runs" / run_id
    path.mkdir(parents=True)
    if family == "direct_alignment":
        config = api.shrink_config(algorithm, QUICK, model="tiny").config
    else:
        config = {"model": {"name": "tiny"}, "seed": 42}
    (path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    write_run_json(
        path,
        family,
        algorithm,
        config_source=f"trainers/{family}/configs/{algorithm}.yaml",
        overrides=QUICK,
        state=state,
        created_at="2026-03-01T12:00:00.000+00:00",
        exit_code=0,
    )
    if rows is None:
        rows = []
        for step in range(1, 5):
            rows.append(
                {
                    "step": step,
                    "time_s": step,
                    "phase": "train",
                    "loss": 0.7 - 0.05 * step,
                    "accuracy": 0.5 + 0.1 * step,
                    "margins": 0.1 * step,
                }
            )
            rows.append(
                {
                    "step": step,
                    "time_s": step,
                    "phase": "eval",
                    "eval/accuracy": 0.5 + 0.05 * step,
                    "eval/margins": 0.05 * step,
                    "eval/chosen_rewards": 0.1,
                    "eval/rejected_rewards": -0.1,
                }
            )
    write_jsonl(path / "metrics.jsonl", rows)
    (path / "train.log").write_text(
        "".join(f"step {i} loss {0.7 - i / 100:.3f}\n" for i in range(log_lines))
    )
    (path / "progress.json").write_text(json.dumps({"step": 4, "total_steps": 4, "elapsed_s": 4.0}))
    (path / "summary.json").write_text(
        json.dumps(
            {"outcome": state, "final_metrics": rows[-2] if rows else {}, "wall_time_s": 4.0}
        )
    )
    return path


async def call(client, schemas, name: str, args: dict | None = None) -> dict:
    """Call a tool that must succeed; its structured output must match its output schema."""
    result = await client.call_tool(name, args or {})
    text = result.content[0].text if result.content else ""
    assert not result.is_error, text
    assert result.structured_content is not None, f"{name} returned no structured content"
    jsonschema.validate(result.structured_content, schemas[name].output_schema)
    return result.structured_content


async def fails(client, name: str, args: dict, *needles: str) -> str:
    """Call a tool that must fail with an actionable message and no traceback."""
    result = await client.call_tool(name, args)
    text = "\n".join(c.text for c in result.content if getattr(c, "text", None))
    assert result.is_error, f"{name}({args}) did not fail: {text[:300]}"
    assert result.structured_content is None
    assert text.strip(), "an error needs a message"
    assert "Traceback" not in text and 'File "' not in text, text
    for needle in needles:
        assert needle.lower() in text.lower(), f"{needle!r} not in {text!r}"
    return text


# ------------------------------------------------------------------------------- tool listing


async def test_every_tool_is_listed_typed_described_and_annotated(client):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == set(TOOL_NAMES) and len(TOOL_NAMES) == 19
    for name, tool in tools.items():
        assert tool.description and "use" in tool.description.lower(), name  # says when to use it
        assert tool.output_schema and tool.output_schema.get("type") == "object", name
        for prop, spec in tool.input_schema.get("properties", {}).items():
            assert spec.get("description"), f"{name}.{prop} has no description"
        hints = tool.annotations
        assert hints is not None, name
        assert hints.read_only_hint is (name in READ_ONLY), name
    assert tools["stop_run"].annotations.destructive_hint is True
    assert tools["launch_run"].annotations.destructive_hint is False
    assert tools["record_results"].annotations.destructive_hint is False
    # the family list the tools accept is the catalog's
    family = tools["list_recipes"].input_schema["properties"]["family"]
    listed = {v for option in family["anyOf"] for v in option.get("enum", [])}
    assert listed == set(FAMILIES)


async def test_unexpected_exception_is_a_short_tool_error_without_traceback(client, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(api, "list_campaigns", boom)
    text = await fails(
        client, "list_campaigns", {}, "RuntimeError", "disk on fire", "bug in rlhf-lab"
    )
    assert "second line" not in text


# ---------------------------------------------------------------------------- recipes / plans


async def test_list_recipes(client, schemas):
    out = await call(client, schemas, "list_recipes", {"family": "direct_alignment"})
    names = {r["name"] for r in out["recipes"]}
    assert {"dpo", "ipo", "simpo", "kto"} <= names
    assert {r["family"] for r in out["recipes"]} == {"direct_alignment"}
    (fam,) = out["families"]
    assert "accuracy" in fam["key_metrics"] and fam["acceptance"] and "IPO" in fam["comparison"]
    everything = await call(client, schemas, "list_recipes")
    assert len(everything["recipes"]) > len(out["recipes"])
    await fails(client, "list_recipes", {"family": "alchemy"}, "family")


async def test_plan_experiment(client, schemas):
    out = await call(
        client, schemas, "plan_experiment", {"request": "dpo sanity check", "model": "tiny"}
    )
    assert out["intent"] == "sanity" and out["campaign"] == "dpo-sanity"
    (run,) = out["runs"]
    assert run["recipe"] == "direct_alignment/dpo" and run["model"] == "tiny"
    (criteria,) = out["criteria"]
    assert criteria["algorithms"] == ["dpo"] and "accuracy" in criteria["key_metrics"]
    assert criteria["acceptance"] and run["launch_command"] and out["steps"]
    assert not list(api.experiments_dir().glob("*.md")), "planning must not write a ledger"
    await fails(client, "plan_experiment", {"request": "bake a cake"}, "no algorithm", "Next:")


async def test_shrink_config(client, schemas):
    out = await call(
        client, schemas, "shrink_config", {"recipe": "dpo", "model": "tiny", "overrides": QUICK}
    )
    assert out["config"]["model"]["name"] == "tiny" and out["expected_optimizer_steps"] == 4
    assert {c["key"] for c in out["diff"]} >= {"model.name", "train.max_steps"}
    await fails(
        client, "shrink_config", {"recipe": "dpoo"}, "unknown recipe", "dpo", "list_recipes"
    )
    await fails(
        client,
        "shrink_config",
        {"recipe": "dpo", "model": "tiny", "overrides": ["train.lerning_rate=1e-4"]},
        "lerning_rate",
        "learning_rate",
        "overrides",
    )


async def test_estimate_memory(client, schemas):
    out = await call(
        client, schemas, "estimate_memory", {"recipe": "dpo", "model": "tiny", "overrides": QUICK}
    )
    assert out["estimate"]["total_gb"] > 0 and out["estimate"]["model"] == "tiny"
    assert out["device"] == "cpu" or out["device"].startswith("cuda:")
    assert out["fits"] is True and out["verdict"].startswith("fits")
    full = await call(
        client,
        schemas,
        "estimate_memory",
        {"recipe": "dpo", "shrink": False, "model": "tiny", "device": "cpu"},
    )
    assert full["shrunk"] is False and full["device"] == "cpu"
    await fails(
        client,
        "estimate_memory",
        {"recipe": "dpo", "model": "nobody/no-such-model-7b"},
        "hub",
        "tiny",
    )
    await fails(client, "estimate_memory", {"recipe": "dpo", "device": "tpu"}, "device")


async def test_check_resources_without_a_gpu_is_an_answer(client, schemas, monkeypatch):
    def no_library():
        raise OSError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_library))
    out = await call(client, schemas, "check_resources")
    assert out["gpus"] == [] and any(n.startswith("no GPU") for n in out["notes"])
    assert out["cpu_count"] >= 1 and out["ram_available_gb"] > 0


# ------------------------------------------------------------------------------------- launch


async def test_launch_run_returns_at_once_and_stop_run_stops_it(client, schemas):
    start = time.monotonic()
    out = await call(
        client,
        schemas,
        "launch_run",
        {
            "recipe": "dpo",
            "model": "tiny",
            "overrides": QUICK,
            "device": "cpu",
            "campaign": "mcp-launch",
        },
    )
    assert time.monotonic() - start < 20, "launch_run must not wait for the trainer"
    run_id = out["run_id"]
    assert (
        out["state"] == "running" and not out["queued"] and out["campaign"].endswith("mcp-launch")
    )
    assert Path(out["log_path"]).name == "train.log" and "run_status" in out["next_step"]
    assert api.run_state(run_id).state == "running"

    stopped = await call(client, schemas, "stop_run", {"run_id": run_id, "grace_s": 5})
    assert stopped["id"] == run_id and stopped["state"] == "stopped" and not stopped["alive"]


async def test_launch_run_failures(client, machine, lab_root):
    await fails(client, "launch_run", {"recipe": "dpoo"}, "unknown recipe", "list_recipes")
    await fails(
        client,
        "launch_run",
        {"recipe": "dpo", "model": "tiny", "overrides": ["train.batch_size=zero"]},
        "batch_size",
        "shrink_config",
    )
    await fails(client, "launch_run", {"recipe": "dpo", "campaign": "Not A Slug"}, "slug")
    assert not list(lab_root.glob("experiments/*/runs/*")), "a refused launch writes no run"

    # A job already trains on the CPU and the memory check says a second one does not fit.
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        busy = make_run("dpo-20260301-110000-cccc", state="running")
        record = json.loads((busy / "run.json").read_text())
        record.update(
            pid=holder.pid, pgid=holder.pid, create_time=psutil.Process(holder.pid).create_time()
        )
        (busy / "run.json").write_text(json.dumps(record))
        (busy / "summary.json").unlink()
        machine(free_ram_gb=0.001)
        await fails(
            client,
            "launch_run",
            # another seed than the running run's: not an identical launch, only a busy device
            {"recipe": "dpo", "model": "tiny", "overrides": [*QUICK, "seed=7"], "device": "cpu"},
            "is busy",
            "dpo-20260301-110000-cccc",
            "do not fit",
            "queue=true",
        )
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------------------------- watching


async def test_run_status(client, schemas):
    make_run()
    out = await call(client, schemas, "run_status", {"run_id": RUN})
    assert out["status"]["state"] == "succeeded" and out["status"]["step"] == 4
    assert "record_results" in out["advice"]
    await fails(client, "run_status", {"run_id": MISSING}, "no run", "list_runs")
    await fails(client, "run_status", {"run_id": "../../etc/passwd"}, "bad run id")


async def test_run_status_alerts_follow_changes_to_a_finished_run(client, schemas):
    path = make_run()
    before = await call(client, schemas, "run_status", {"run_id": RUN})
    assert [a["kind"] for a in before["alerts"]] == []
    again = await call(client, schemas, "run_status", {"run_id": RUN})  # served from the cache
    assert again["alerts"] == []
    with (path / "train.log").open("a") as fh:
        fh.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    after = await call(client, schemas, "run_status", {"run_id": RUN})
    (oom,) = [a for a in after["alerts"] if a["kind"] == "oom"]
    assert "batch_size" in oom["hint"] and "out of memory" in oom["message"]


async def test_tail_logs_caps_output_and_continues_from_the_cursor(client, schemas):
    path = make_run(log_lines=400)
    size = (path / "train.log").stat().st_size
    last = await call(client, schemas, "tail_logs", {"run_id": RUN, "lines": 3})
    assert last["text"] == "".join((path / "train.log").read_text().splitlines(True)[-3:])
    assert last["text"].startswith("step 397 ")
    assert last["cursor"] == size and last["state"] == "succeeded"

    # from the start, capped: whole lines, at most max_bytes, resumable with the cursor
    text, cursor, calls = "", 0, 0
    while True:
        chunk = await call(
            client, schemas, "tail_logs", {"run_id": RUN, "cursor": cursor, "max_bytes": 1000}
        )
        assert len(chunk["text"].encode()) <= 1000 and chunk["cursor"] >= cursor
        text, cursor, calls = text + chunk["text"], chunk["cursor"], calls + 1
        if chunk["eof"]:
            break
        assert chunk["truncated"] and chunk["note"]
    assert text == (path / "train.log").read_text() and calls > 3

    with (path / "train.log").open("a") as fh:
        fh.write("new line\n")
    more = await call(client, schemas, "tail_logs", {"run_id": RUN, "cursor": cursor})
    assert more["text"] == "new line\n"
    empty = await call(client, schemas, "tail_logs", {"run_id": RUN, "cursor": more["cursor"]})
    assert empty["text"] == "" and "no new output" in empty["note"]

    await fails(client, "tail_logs", {"run_id": MISSING}, "no run", "list_runs")
    await fails(client, "tail_logs", {"run_id": RUN, "max_bytes": 10**7}, "max_bytes")


async def test_get_metrics_down_samples_and_keeps_the_last_row(client, schemas):
    rows = [
        {"step": s, "time_s": s, "phase": "train", "loss": 1.0 / s, "accuracy": 0.5}
        for s in range(1, 1001)
    ]
    rows.append({"step": 1001, "time_s": 1001.0, "phase": "train", "loss": math.nan})
    make_run(rows=rows)
    out = await call(client, schemas, "get_metrics", {"run_id": RUN})
    # bounded by size by default: evenly down-sampled, the last row kept, a note on how to see more
    assert 20 < len(out["rows"]) < 1001 and out["downsampled"] and out["total_rows"] == 1001
    assert len(json.dumps(out["rows"], separators=(",", ":"))) <= 8_000
    assert out["rows"][-1]["step"] == 1001 and out["rows"][-1]["loss"] is None  # NaN -> null
    assert out["rows"][1]["loss"] == float(f"{out['rows'][1]['loss']:.6g}")  # 6 digits
    assert "max_bytes" in out["note"] and "keys" in out["note"]
    more = await call(client, schemas, "get_metrics", {"run_id": RUN, "max_bytes": 40_000})
    assert len(more["rows"]) > len(out["rows"])
    only = await call(
        client, schemas, "get_metrics", {"run_id": RUN, "keys": ["accuracy"], "max_points": 5}
    )
    assert len(only["rows"]) == 5 and only["keys"] == ["accuracy"]
    none = await call(client, schemas, "get_metrics", {"run_id": RUN, "keys": ["eval/nothing"]})
    assert none["rows"] == [] and "eval/nothing" in none["note"]
    await fails(client, "get_metrics", {"run_id": MISSING}, "no run", "list_runs")
    await fails(client, "get_metrics", {"run_id": RUN, "phase": "warmup"}, "phase")
    await fails(client, "get_metrics", {"run_id": RUN, "max_bytes": 10**6}, "max_bytes")


async def test_stop_run_on_a_finished_run_changes_nothing(client, schemas):
    make_run()
    out = await call(client, schemas, "stop_run", {"run_id": RUN})
    assert out["state"] == "succeeded" and not out["stop_requested"]
    await fails(client, "stop_run", {"run_id": MISSING}, "no run", "list_runs")


async def test_list_runs(client, schemas):
    empty = await call(client, schemas, "list_runs")
    assert empty["runs"] == [] and "launch_run" in empty["note"]
    make_run()
    make_run(RUN2, "ipo")
    out = await call(client, schemas, "list_runs", {"campaign": "mcp-tools"})
    assert [r["id"] for r in out["runs"]] == [RUN, RUN2] and out["total"] == 2
    newest = await call(client, schemas, "list_runs", {"limit": 1})
    assert [r["id"] for r in newest["runs"]] == [RUN2] and newest["total"] == 2
    none = await call(client, schemas, "list_runs", {"state": "failed"})
    assert none["runs"] == [] and none["note"]
    await fails(client, "list_runs", {"campaign": "Bad Slug"}, "slug")
    await fails(client, "list_runs", {"state": "exploded"}, "state")


# ------------------------------------------------------------------------------------- ledger


async def test_record_results_writes_the_ledger_row(client, schemas):
    make_run()
    out = await call(client, schemas, "record_results", {"run_id": RUN, "note": "looks fine"})
    assert out["run_id"] == RUN and out["campaign"] == CAMPAIGN and out["note"] == "looks fine"
    assert out["ledger_uri"] == f"ledger://{CAMPAIGN}" and out["model"] == "tiny"
    assert out["command"] and out["seed"] == 42 and out["changes"]
    assert {m["name"] for m in out["metrics"]} >= {"accuracy", "eval/accuracy"}
    md = Path(out["ledger_path"]).read_text()
    assert f"`{RUN}`" in md and "looks fine" in md
    await fails(client, "record_results", {"run_id": MISSING}, "no run", "list_runs")


async def test_compare_runs_follows_the_family_rules(client, schemas):
    make_run()
    make_run(RUN2, "ipo")
    out = await call(
        client, schemas, "compare_runs", {"run_ids": [RUN, RUN2], "record_in": CAMPAIGN}
    )
    assert out["family"] == "direct_alignment" and [r["run_id"] for r in out["rows"]] == [RUN, RUN2]
    assert "eval/accuracy" in out["columns"] and out["recorded_in"] == CAMPAIGN
    assert out["rows"][0]["values"]["eval/accuracy"] == pytest.approx(0.7)
    make_run("sft-20260301-130000-dddd", "sft", family="sft")
    await fails(
        client,
        "compare_runs",
        {"run_ids": [RUN, "sft-20260301-130000-dddd"]},
        "different families",
        "one family",
    )
    await fails(client, "compare_runs", {"run_ids": [RUN, MISSING]}, MISSING)
    await fails(client, "compare_runs", {"run_ids": []}, "run_ids")


async def test_list_campaigns(client, schemas):
    empty = await call(client, schemas, "list_campaigns")
    assert empty["campaigns"] == [] and "launch_run" in empty["note"]
    api.create_campaign(CAMPAIGN, "Does the MCP server record runs?", family="direct_alignment")
    out = await call(client, schemas, "list_campaigns")
    (camp,) = out["campaigns"]
    assert (
        camp["id"] == CAMPAIGN and camp["question"].startswith("Does the MCP") and not out["note"]
    )


# ------------------------------------------------------------------------- resources, prompts


async def test_resources_are_listed_and_readable(client):
    resources = {str(r.uri) for r in (await client.list_resources()).resources}
    templates = {
        t.uri_template for t in (await client.list_resource_templates()).resource_templates
    }
    assert "ledger://index" in resources and "ledger://{campaign}" in templates

    first = await client.read_resource("ledger://index", cache_mode="bypass")
    assert "No campaigns yet" in first.contents[0].text

    make_run()
    api.record_run(RUN, "for the resource")
    index = await client.read_resource("ledger://index", cache_mode="bypass")
    assert CAMPAIGN in index.contents[0].text and index.contents[0].mime_type == "text/markdown"
    ledger = await client.read_resource(f"ledger://{CAMPAIGN}")
    text = ledger.contents[0].text
    assert text.startswith("---\n") and f"id: {CAMPAIGN}" in text and f"`{RUN}`" in text
    by_slug = await client.read_resource("ledger://mcp-tools")
    assert by_slug.contents[0].text == text

    with pytest.raises(MCPError) as err:
        await client.read_resource("ledger://2026-01-01-nothing-here")
    assert "list_campaigns" in str(err.value) and "Traceback" not in str(err.value)


async def test_prompts_are_listed_and_carry_the_workflows(client):
    prompts = {p.name: p for p in (await client.list_prompts()).prompts}
    assert set(prompts) == {"sanity_check", "compare_algorithms"}
    assert [a.name for a in prompts["sanity_check"].arguments if a.required] == ["algorithm"]

    sanity = await client.get_prompt("sanity_check", {"algorithm": "dpo"})
    text = sanity.messages[0].content.text
    order = [
        "plan_experiment",
        "shrink_config",
        "estimate_memory",
        "launch_run",
        "run_status",
        "tail_logs",
        "record_results",
    ]
    positions = [text.index(tool) for tool in order]
    assert positions == sorted(positions), "the workflow steps are in order"
    assert "W&B" in text and "follow-up sweep" in text and "eval/accuracy ends above 0.5" in text

    compare = await client.get_prompt("compare_algorithms", {"algorithms": "dpo, ipo"})
    text = compare.messages[0].content.text
    assert "compare_runs" in text and "matched random control" in text
    assert "IPO's loss scale is not comparable" in text and "'dpo-vs-ipo'" in text
    assert "queue=true" in text


async def test_server_module_does_not_print_to_stdout(capsys, client, schemas):
    """In stdio mode stdout is the protocol: no tool may print (logging goes to stderr)."""
    make_run()
    for name, args in [
        ("list_recipes", {}),
        ("run_status", {"run_id": RUN}),
        ("record_results", {"run_id": RUN}),
        ("list_campaigns", {}),
    ]:
        await call(client, schemas, name, args)
    await fails(client, "run_status", {"run_id": MISSING})
    assert capsys.readouterr().out == ""
    assert mcp_server.server.name == "rlhf-lab"
