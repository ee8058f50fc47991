"""Round-trip latency of the MCP tools an agent polls (run_status, tail_logs) over a real stdio
session, the way Claude Code talks to the server. Target: median below 100 ms per call.

    uv run python bench/mcp_latency.py                  # a synthetic finished run (default)
    uv run python bench/mcp_latency.py --run-id ID      # a real run under $RLHF_LAB_ROOT
    uv run python bench/mcp_latency.py --n 100

Without --run-id the benchmark writes two finished direct-alignment run folders into a temporary
lab root, a sanity-size run (200 steps, 64 KiB log) and a long one (2,000 steps, 2 MiB log), so
the reads have realistic files to parse. "log growing" appends a line to train.log before each
call, which is what a poll of a running run sees (nothing can be reused from the previous poll).
It prints a table and writes bench/results/mcp_latency.json. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import anyio
from _common import ROOT, write_json
from mcp import Client, StdioServerParameters

from trainers.core.runfolder import RunFile

RESULTS = ROOT / "bench" / "results" / "mcp_latency.json"
TARGET_MS = 100.0
CAMPAIGN = "2026-01-01-latency"
# (label, run id, optimizer steps, train.log size): a sanity run and a long run.
SCENARIOS = (
    ("sanity-size run (200 steps, 64 KiB log)", "dpo-20260101-000000-0001", 200, 64 * 2**10),
    ("long run (2,000 steps, 2 MiB log)", "dpo-20260101-000000-0002", 2000, 2 * 2**20),
)


def synthetic_run(root: Path, run_id: str, steps: int, log_bytes: int) -> Path:
    """A finished direct-alignment run folder of the given size."""
    run_dir = root / "experiments" / CAMPAIGN / "runs" / run_id
    run_dir.mkdir(parents=True)
    record = RunFile(
        id=run_id,
        family="direct_alignment",
        algorithm="dpo",
        campaign=CAMPAIGN,
        device="cpu",
        argv=[sys.executable, "-m", "trainers.direct_alignment.train"],
        state="succeeded",
        created_at="2026-01-01T00:00:00.000+00:00",
        exit_code=0,
    )
    (run_dir / "run.json").write_text(json.dumps(record.model_dump(exclude_unset=True)))
    (run_dir / "config.yaml").write_text("model:\n  name: tiny\nseed: 42\n")
    rows = []
    for step in range(1, steps + 1):
        rows.append(
            {
                "step": step,
                "time_s": step * 0.1,
                "phase": "train",
                "loss": 0.69 / step**0.2,
                "accuracy": min(1.0, 0.5 + step / 4000),
                "margins": step / 1000,
                "grad_norm": 1.0,
            }
        )
        if step % 20 == 0:
            rows.append(
                {
                    "step": step,
                    "time_s": step * 0.1,
                    "phase": "eval",
                    "eval/accuracy": min(1.0, 0.5 + step / 5000),
                    "eval/margins": step / 2000,
                }
            )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = "step {i} loss 0.5000 acc 0.750 (0.10s) " + "x" * 60 + "\n"
    with (run_dir / "train.log").open("w") as fh:
        i = 0
        while fh.tell() < log_bytes:
            fh.write(line.format(i=i))
            i += 1
    samples = [
        {"step": s, "prompt": "Reverse 'abc'", "completion": "<answer>cba</answer>"}
        for s in range(0, steps, 10)
    ]
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (run_dir / "progress.json").write_text(json.dumps({"step": steps, "total_steps": steps}))
    (run_dir / "summary.json").write_text(json.dumps({"outcome": "succeeded", "wall_time_s": 200}))
    return run_dir


async def timed(client, n: int, call, before=None) -> list[float]:
    samples = []
    for i in range(n + 3):  # three warm-up calls
        if before is not None:
            before()
        start = time.perf_counter()
        if call is None:
            await client.list_tools(cache_mode="bypass")
        else:
            result = await client.call_tool(*call)
            if result.is_error:
                raise SystemExit(f"{call[0]} failed: {result.content[0].text}")
        if i >= 3:
            samples.append((time.perf_counter() - start) * 1000)
    return samples


async def measure(params, runs: list[tuple[str, str, Path]], n: int) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {}
    async with Client(params) as client:
        timings["list_tools (transport baseline)"] = await timed(client, n, None)
        for label, run_id, run_dir in runs:
            first = await client.call_tool("tail_logs", {"run_id": run_id, "lines": 1})
            if first.is_error:
                raise SystemExit(f"tail_logs failed: {first.content[0].text}")
            end = first.structured_content["cursor"]
            log = run_dir / "train.log" if run_dir else None

            def grow(log=log):
                with log.open("a") as fh:
                    fh.write("step ... loss 0.5\n")

            calls = {
                "run_status": (("run_status", {"run_id": run_id}), None),
                "run_status, log growing (no cache)": (("run_status", {"run_id": run_id}), grow),
                "tail_logs last 50 lines": (("tail_logs", {"run_id": run_id, "lines": 50}), None),
                "tail_logs cursor, nothing new": (
                    ("tail_logs", {"run_id": run_id, "cursor": end}),
                    None,
                ),
                "tail_logs cursor, 8 kB chunk": (
                    ("tail_logs", {"run_id": run_id, "cursor": 0}),
                    None,
                ),
            }
            for name, (call, before) in calls.items():
                if before is not None and log is None:
                    continue  # a real run is not modified
                timings[f"{label}: {name}"] = await timed(client, n, call, before)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30, help="timed calls per tool")
    parser.add_argument("--run-id", help="a real run under $RLHF_LAB_ROOT (default: synthetic)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="mcp-latency-") as tmp:
        if args.run_id:
            root = Path(os.environ.get("RLHF_LAB_ROOT", ROOT))
            runs = [("real run", args.run_id, None)]
        else:
            root = Path(tmp)
            runs = [
                (label, rid, synthetic_run(root, rid, steps, size))
                for label, rid, steps, size in SCENARIOS
            ]
        env = {"RLHF_LAB_ROOT": str(root), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "rlhf_lab.mcp_server"], env=env, cwd=ROOT
        )
        timings = anyio.run(measure, params, runs, args.n)

    rows = {}
    print(f"MCP round trips over stdio, {args.n} calls each; target: median < {TARGET_MS:.0f} ms")
    width = max(len(k) for k in timings) + 2
    print(f"{'call':{width}} {'median ms':>10} {'p90 ms':>8} {'max ms':>8}  target")
    for label, samples in timings.items():
        ordered = sorted(samples)
        med = statistics.median(ordered)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        ok = med < TARGET_MS
        rows[label] = {
            "median_ms": round(med, 2),
            "p90_ms": round(p90, 2),
            "max_ms": round(ordered[-1], 2),
            "n": len(ordered),
            "meets_target": ok,
        }
        print(
            f"{label:{width}} {med:10.1f} {p90:8.1f} {ordered[-1]:8.1f}  {'ok' if ok else 'SLOW'}"
        )

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    report = {
        "benchmark": "mcp_latency",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "target_median_ms": TARGET_MS,
        "transport": "stdio",
        "results": rows,
        "machine": {
            "host": platform.node(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "load_avg": [round(x, 2) for x in load] if load else None,
            "mcp": version("mcp"),
        },
    }
    write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
