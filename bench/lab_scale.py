"""The lab at scale: how listing, status, campaigns and recording grow with the number of runs
(issue 18). For each N the bench writes N synthetic finished runs (500-2,000 metric lines each,
a held-out row every 10 steps, the files the launcher and a trainer leave) spread over
campaigns of 100 runs, then times:

- cold processes of the console script (median of ``--repeats``): ``runs``, ``runs --json``,
  ``status``, ``campaign list``, ``campaign show`` (one campaign); their peak RSS. The lab also
  holds 22 campaigns, one of 500 ledger rows, as a clone brings them (``ledger.json`` and
  markdown, not written by this lab), and ``campaign list (no summaries)`` times the listing
  with no campaign summary in the run index (each call after dropping them): the first
  listing of a fresh clone (issue 27);
- warm calls of the API functions behind the MCP tools in one process (median after a warm-up
  call): ``list_runs`` (``run_list``), ``run_status``, ``list_campaigns``, ``query_runs`` with no
  condition;
- ``record`` of one run into a campaign of K rows (K from ``--record-k``), warm: the median of
  three records after a warm-up one.

The first listing after writing the runs builds the run index; its time is reported on its own
("index build"). ``--baseline DIR`` times the same commands from another checkout (e.g. ``git
archive <rev> rlhf_lab trainers | tar -x -C DIR``) through PYTHONPATH: the before/after of the
issue's table. The growth order is the slope of log(time) against log(N) between the smallest
and the largest N. A benchmark, not a test: on a shared machine wall times move with the load
(recorded in the results).

    uv run python bench/lab_scale.py --quick                 # N = 10, 100; K = 10, 100
    uv run python bench/lab_scale.py --at-scale              # N = 10,000, K = 5,000: ~5 min
    uv run python bench/lab_scale.py                         # N up to 10,000; K up to 5,000
    uv run python bench/lab_scale.py --n 10 100 --baseline /tmp/old

``--at-scale`` measures only the issue's targets (N = 10,000 runs, K = 5,000 rows) with runs of
100-300 metric lines (``--lines``): after the index is built, a listing reads no metric file
of a finished run (it checks signatures), so the size of the metric files changes the
one-off index build, not the figures. Each line of output says whether it met its target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import ROOT, print_table, write_results

CAMPAIGN_SIZE = 100
# Children start outside the checkout: ``python -c`` puts the working directory first on
# sys.path, which would shadow the --baseline checkout given through PYTHONPATH.
CHILD_CWD = tempfile.gettempdir()
CLI_COMMANDS = (
    ("runs", ["runs"]),
    ("runs --json", ["runs", "--json"]),
    ("status", ["status"]),
    ("campaign list", ["campaign", "list"]),
)
UNCACHED_LIST = "campaign list (no summaries)"
SMALL_CAMPAIGNS, BIG_CAMPAIGN_ROWS = 21, 500
TRAIN_KEYS = ("loss", "accuracy", "margins", "chosen_rewards", "rejected_rewards", "grad_norm")


def _campaign(i: int) -> str:
    return f"2026-01-{i % 28 + 1:02d}-scale-{i:04d}"


# metric lines per synthetic run (``--lines``)
LINES = [500, 2000]
# the targets at N = 10,000 runs / K = 5,000 rows (seconds)
TARGETS = {
    "runs": 0.3,
    "runs --json": 0.3,
    "status": 0.3,
    "campaign list": 0.3,
    UNCACHED_LIST: 0.3,
    "MCP list_runs": 0.05,
    "MCP run_status": 0.05,
    "MCP list_campaigns": 0.05,
    "MCP query_runs": 0.05,
    "record": 0.5,
}


def write_run(exp: Path, campaign: str, run_id: str, rng: random.Random) -> None:
    """One finished DPO run folder as the launcher and the trainer leave it."""
    run_dir = exp / campaign / "runs" / run_id
    run_dir.mkdir(parents=True)
    steps = rng.randint(*LINES)
    record = {
        "id": run_id,
        "family": "direct_alignment",
        "algorithm": rng.choice(["dpo", "ipo", "simpo"]),
        "campaign": campaign,
        "device": "cpu",
        "argv": ["python", "-m", "trainers.direct_alignment.train"],
        "state": "succeeded",
        "created_at": f"2026-01-01T{rng.randint(0, 23):02d}:00:00.000+00:00",
        "ended_at": "2026-01-02T00:00:00.000+00:00",
    }
    (run_dir / "run.json").write_text(json.dumps(record))
    (run_dir / "config.yaml").write_text(
        f"algorithm: {record['algorithm']}\nmodel:\n  name: tiny\nseed: {rng.randint(0, 9)}\n"
    )
    lines = []
    for step in range(1, steps + 1):
        row = {"step": step, "time_s": step * 0.1, "phase": "train"}
        row.update({k: round(rng.random(), 6) for k in TRAIN_KEYS})
        lines.append(json.dumps(row))
        if step % 10 == 0:
            acc = round(0.5 + 0.3 * rng.random(), 4)
            lines.append(json.dumps({"step": step, "phase": "eval", "eval/accuracy": acc}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "train.log").write_text(f"step {steps}/{steps} loss 0.5\n")
    (run_dir / "progress.json").write_text(json.dumps({"step": steps, "total_steps": steps}))
    (run_dir / "summary.json").write_text(json.dumps({"outcome": "succeeded", "steps": steps}))
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "signal": None}))
    old = time.time() - 3600  # a finished run's files are old
    for path in run_dir.iterdir():
        os.utime(path, (old, old))


def populate(root: Path, n: int, have: int) -> None:
    """Grow the lab at ``root`` from ``have`` to ``n`` runs."""
    rng = random.Random(n)
    exp = root / "experiments"
    for i in range(have, n):
        write_run(exp, _campaign(i // CAMPAIGN_SIZE), f"dpo-20260101-{i:06d}-{i % 65536:04x}", rng)


def console_script() -> Path:
    found = shutil.which("rlhf-lab") or str(Path(sys.executable).parent / "rlhf-lab")
    return Path(found)


def _env(root: Path, baseline: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["RLHF_LAB_ROOT"] = str(root)
    env["COLUMNS"] = "200"
    if baseline is not None:
        env["PYTHONPATH"] = str(baseline)
    return env


_WRAP = (
    "import atexit, resource, sys, runpy\n"
    "atexit.register(lambda: print('MAXRSS', resource.getrusage(resource.RUSAGE_SELF)"
    ".ru_maxrss, file=sys.stderr))\n"
    "sys.argv = ['rlhf-lab', *sys.argv[1:]]\n"
    "runpy.run_module('rlhf_lab.cli', run_name='__main__')\n"
)


def cold(
    argv: list[str], env: dict[str, str], repeats: int, before: Callable[[], None] | None = None
) -> dict:
    """Median wall time and the peak RSS (MiB) of fresh processes running ``argv`` (``before``
    runs ahead of each, untimed)."""
    walls, cpus, rss = [], [], 0
    for _ in range(repeats):
        if before is not None:
            before()
        start, cpu = time.perf_counter(), _children_cpu()
        done = subprocess.run(
            [sys.executable, "-c", _WRAP, *argv],
            env=env,
            capture_output=True,
            cwd=CHILD_CWD,
            text=True,
        )
        walls.append(time.perf_counter() - start)
        cpus.append(_children_cpu() - cpu)
        if done.returncode != 0:
            raise SystemExit(f"{argv} failed: {done.stderr[-800:]}")
        for line in done.stderr.splitlines():
            if line.startswith("MAXRSS"):
                rss = max(rss, int(line.split()[1]) // 1024)
    return {
        "median_s": statistics.median(walls),
        "median_cpu_s": statistics.median(cpus),
        "max_rss_mib": rss,
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


_WARM = """
import json, statistics, sys, time
from rlhf_lab import api
repeats, run_id = int(sys.argv[1]), sys.argv[2]
calls = {
    "list_runs": lambda: api.run_list(),
    "run_status": lambda: api.run_status(run_id),
    "list_campaigns": lambda: api.list_campaigns(),
    "query_runs": lambda: api.query_runs(),
}
out = {}
for name, call in calls.items():
    call()
    times, cpus = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        call()
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    out[name] = [statistics.median(times), statistics.median(cpus)]
print(json.dumps(out))
"""

_RECORD = """
import json, statistics, sys, time
from rlhf_lab import api
run_id = sys.argv[1]
api.record_results(run_id, note="warm-up")
times, cpus = [], []
for i in range(3):
    t, c = time.perf_counter(), time.process_time()
    api.record_results(run_id, note=f"note {i}")
    times.append(time.perf_counter() - t)
    cpus.append(time.process_time() - c)
print(json.dumps({"record": [statistics.median(times), statistics.median(cpus)]}))
"""


def _child(code: str, args: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, cwd=CHILD_CWD, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"child failed: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def record_campaign(root: Path, k: int) -> str:
    """A campaign of ``k`` recorded rows (copies of one recorded row) plus one run folder to
    record; returns that run's id."""
    exp = root / "experiments"
    campaign = f"2026-02-01-record-{k}"
    rng = random.Random(k)
    first, target = f"dpo-20260201-000000-{k:04x}", f"dpo-20260201-999999-{k:04x}"
    write_run(exp, campaign, first, rng)
    write_run(exp, campaign, target, rng)
    env = _env(root, None)
    subprocess.run(
        [str(console_script()), "record", first],
        env=env,
        check=True,
        capture_output=True,
        cwd=CHILD_CWD,
    )
    path = exp / campaign / "ledger.json"
    data = json.loads(path.read_text())
    row = data["runs"][0]
    data["runs"] = [{**row, "run_id": f"dpo-20260131-{i:06d}-{k:04x}"} for i in range(k)]
    path.write_text(json.dumps(data))
    return target


def _ledger(name: str, question: str, rows: list[dict]) -> dict:
    date, slug = name[:10], name[11:]
    meta = {"id": name, "slug": slug, "date": date, "question": question}
    return {"version": 1, "campaign": {**meta, "seeds": [0]}, "runs": rows}


def clone_campaigns(root: Path) -> None:
    """22 campaigns as a clone brings them: 21 planned ones and one of 500 rows (copies of a row
    recorded by the lab), their ``ledger.json`` and markdown written here and dated an hour back,
    so the run index holds no summary of them."""
    exp = root / "experiments"
    big = f"2026-03-01-ledger-{BIG_CAMPAIGN_ROWS}"
    rng = random.Random(BIG_CAMPAIGN_ROWS)
    write_run(exp, big, "dpo-20260301-000000-0001", rng)
    subprocess.run(
        [str(console_script()), "record", "dpo-20260301-000000-0001"],
        env=_env(root, None),
        check=True,
        capture_output=True,
        cwd=CHILD_CWD,
    )
    row = json.loads((exp / big / "ledger.json").read_text())["runs"][0]
    rows = [{**row, "run_id": f"dpo-20260228-{i:06d}-0001"} for i in range(BIG_CAMPAIGN_ROWS)]
    written = {big: _ledger(big, "a campaign of many rows?", rows)}
    for i in range(SMALL_CAMPAIGNS):
        name = f"2026-03-{i + 2:02d}-planned-{i:02d}"
        written[name] = _ledger(name, f"question {i}?", [])
    old = time.time() - 3600
    for name, data in written.items():
        (exp / name).mkdir(exist_ok=True)
        (exp / name / "ledger.json").write_text(json.dumps(data))
        front = f"---\nid: {name}\nstatus: planned\nquestion: {data['campaign']['question']}\n---\n"
        (exp / f"{name}.md").write_text(front)
        for path in (exp / name / "ledger.json", exp / f"{name}.md"):
            os.utime(path, (old, old))


def forget_summaries(root: Path) -> None:
    """Drop the campaign summaries from the run index (as in a fresh clone's first listing)."""
    with sqlite3.connect(root / ".rlhf-lab" / "index.sqlite") as conn:
        conn.execute("DELETE FROM campaigns")


def growth(ns: list[int], values: list[float]) -> float | None:
    """The slope of log(time) against log(N) from the smallest to the largest N."""
    if len(ns) < 2 or values[0] <= 0 or values[-1] <= 0:
        return None
    return math.log(values[-1] / values[0]) / math.log(ns[-1] / ns[0])


def measure(ns: list[int], ks: list[int], repeats: int, baseline: Path | None) -> dict:
    sides = {"after": None} if baseline is None else {"before": baseline, "after": None}
    results: dict = {side: {} for side in sides}
    script_root = Path(tempfile.mkdtemp(prefix="lab-scale-"))
    try:
        clone_campaigns(script_root)
        have = 0
        for n in ns:
            populate(script_root, n, have)
            have = n
            some_run = f"dpo-20260101-{n - 1:06d}-{(n - 1) % 65536:04x}"
            for side, base in sides.items():
                env = _env(script_root, base)
                shutil.rmtree(script_root / ".rlhf-lab", ignore_errors=True)
                start = time.perf_counter()  # the first listing builds the index
                subprocess.run(
                    [sys.executable, "-c", _WRAP, "runs"],
                    env=env,
                    check=True,
                    capture_output=True,
                    cwd=CHILD_CWD,
                )
                row = {"index build": {"median_s": time.perf_counter() - start}}
                for label, argv in CLI_COMMANDS:
                    row[label] = cold(argv, env, repeats)
                row[UNCACHED_LIST] = cold(
                    ["campaign", "list"], env, repeats, lambda: forget_summaries(script_root)
                )
                show = ["campaign", "show", _campaign((n - 1) // CAMPAIGN_SIZE)]
                if (script_root / "experiments" / f"{show[2]}.md").is_file():
                    row["campaign show"] = cold(show, env, repeats)
                warm = _child(_WARM, [str(repeats * 4), some_run], env)
                for name, (wall, cpu) in warm.items():
                    row[f"MCP {name}"] = {"median_s": wall, "median_cpu_s": cpu}
                results[side][n] = row
                print(
                    f"N={n} {side}: "
                    + ", ".join(f"{k} {v['median_s']:.3f}s" for k, v in row.items()),
                    flush=True,
                )
        for k in ks:
            target = record_campaign(script_root, k)
            for side, base in sides.items():
                wall, cpu = _child(_RECORD, [target], _env(script_root, base))["record"]
                results[side].setdefault("record", {})[k] = {"median_s": wall, "median_cpu_s": cpu}
                print(f"record K={k} {side}: {wall:.3f}s (CPU {cpu:.3f}s)", flush=True)
    finally:
        shutil.rmtree(script_root, ignore_errors=True)
    return results


def _cell(entry: dict) -> str:
    cpu = entry.get("median_cpu_s")
    return f"{entry['median_s']:.3g}" + ("" if cpu is None else f" ({cpu:.3g})")


def print_side(side: str, by_n: dict, ns: list[int]) -> None:
    """One side's table: median wall (CPU) seconds per N, the growth order, peak RSS."""
    rows = []
    for label in [k for k in by_n[ns[0]] if k != "record"]:
        entries = [by_n[n][label] for n in ns]
        order = growth(ns, [e.get("median_cpu_s") or e["median_s"] for e in entries])
        rss = max(e.get("max_rss_mib") or 0 for e in entries)
        rows.append([label, *map(_cell, entries), "-" if order is None else f"N^{order:.2f}", rss])
    print(f"\n{side}: median wall s (CPU s); cold processes for the CLI, warm calls for MCP")
    print_table(["command", *[f"N={n}" for n in ns], "growth (CPU)", "peak RSS MiB"], rows)
    if "record" in by_n:
        ks = sorted(by_n["record"])
        print_table(
            ["record (warm)", *[f"K={k}" for k in ks]],
            [["wall s (CPU s)", *[_cell(by_n["record"][k]) for k in ks]]],
        )


def print_targets(results: dict, ns: list[int], ks: list[int]) -> None:
    """The issue's targets at the largest N and K measured, met or not (wall and CPU)."""
    by_n = results["after"]
    rows = []
    for label, target in TARGETS.items():
        entry = by_n.get("record", {}).get(ks[-1]) if label == "record" else by_n[ns[-1]].get(label)
        if entry is None:
            continue
        wall, cpu = entry["median_s"], entry.get("median_cpu_s")
        where = f"K={ks[-1]}" if label == "record" else f"N={ns[-1]}"
        verdict = (
            "met" if wall < target else ("CPU only" if cpu is not None and cpu < target else "no")
        )
        rows.append(
            [label, where, f"{wall:.3f}", "-" if cpu is None else f"{cpu:.3f}", target, verdict]
        )
    print("\ntargets (after)")
    print_table(["command", "at", "wall s", "CPU s", "target s", "met"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10, 100, 1000, 5000, 10000])
    parser.add_argument("--record-k", type=int, nargs="+", default=[10, 100, 500, 5000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="N = 10, 100; K = 10, 100; 3 calls")
    parser.add_argument(
        "--at-scale",
        action="store_true",
        help="the targets only: N = 10,000, K = 5,000, 100-300 metric lines per run (~5 min)",
    )
    parser.add_argument(
        "--lines", type=int, nargs=2, default=None, help="metric lines per run: MIN MAX"
    )
    args = parser.parse_args()
    if args.quick:
        args.n, args.record_k, args.repeats = [10, 100], [10, 100], 3
    if args.at_scale:
        args.n, args.record_k = [10000], [5000]
        LINES[:] = [100, 300]
    if args.lines:
        LINES[:] = sorted(args.lines)
    load_before = round(os.getloadavg()[0], 2)  # not machine_info: torch would inflate the
    # children's peak RSS (Linux keeps the largest RSS across exec)
    results = measure(sorted(args.n), sorted(args.record_k), args.repeats, args.baseline)
    ns = sorted(args.n)
    for side, by_n in results.items():
        print_side(side, by_n, ns)
    load_after = round(os.getloadavg()[0], 2)
    print(f"\nload average (1 min): {load_before} before, {load_after} after (wall times move")
    print("with it; CPU seconds far less)")
    print_targets(results, ns, sorted(args.record_k))
    write_results(
        "lab_scale",
        {
            "settings": {
                "n": ns,
                "record_k": sorted(args.record_k),
                "repeats": args.repeats,
                "baseline": str(args.baseline) if args.baseline else None,
                "metric_lines": LINES,
                "root": str(ROOT),
                "load_avg_1m_before": load_before,
                "load_avg_1m_after": load_after,
            },
            "results": {
                side: {str(k): v for k, v in by_n.items()} for side, by_n in results.items()
            },
        },
    )


if __name__ == "__main__":
    main()
