"""Cold start of the reading `rlhf-lab` commands: each timed call is a fresh process of the
installed console script (what a user or an agent's shell runs), so the figure includes the
interpreter, the imports and the work. Target: median below 0.3 s per command.

    uv run python bench/cli_startup.py            # 15 calls per command and lab root
    uv run python bench/cli_startup.py --quick    # 5 calls each
    uv run python bench/cli_startup.py --n 30 --runs 100
    git archive HEAD~3 rlhf_lab trainers | tar -x -C /tmp/old   # before/after, alternated:
    uv run python bench/cli_startup.py --baseline /tmp/old

Two lab roots ($RLHF_LAB_ROOT): an empty temporary one, and one holding ``--runs`` synthetic
finished direct-alignment runs (bench/mcp_latency.py's ``synthetic_run``: 200 steps, 64 KiB
log each) spread over a few campaigns, which is what `status` and `runs` have to scan. Commands
are alternated round by round so machine drift falls on all of them. Prints median, p90 and max
wall time, the median CPU time (user + system, far less sensitive to a busy machine than wall
time) and writes bench/results/cli_startup.json. A benchmark, not a test; wall times depend
on the machine's load (recorded in the results).

The children run without PYTHONDONTWRITEBYTECODE (set in some sandboxes), as in a user's shell:
with it, every module that has no cached .pyc yet (rich's help renderer, markdown_it, pygments)
is compiled from source on every call, which alone added ~0.1 s to `--help` here.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, alternate, machine_info, print_table, write_results
from mcp_latency import synthetic_run

TARGET_S = 0.3
# (label, argv after the console script): the non-training commands a user runs most.
COMMANDS = (
    ("--help", ["--help"]),
    ("version", ["version"]),
    ("status", ["status"]),
    ("runs", ["runs"]),
    ("runs --json", ["runs", "--json"]),
    ("recipes", ["recipes"]),
    ("campaign list", ["campaign", "list"]),
)
CAMPAIGNS = ("2026-01-01-latency", "2026-01-02-dpo-beta", "2026-01-03-simpo-sanity")


def console_script() -> Path:
    """The installed `rlhf-lab` entry point next to this interpreter (the venv's bin/)."""
    script = Path(sys.executable).parent / "rlhf-lab"
    if not script.is_file():
        raise SystemExit(f"{script} is missing; install the project first (uv sync)")
    return script


def populate(root: Path, count: int) -> None:
    """``count`` finished runs spread over a few campaigns (synthetic_run writes into one
    campaign; the folders are moved so `runs` sees several)."""
    for i in range(count):
        run_id = f"dpo-20260101-{i // 60:04d}{i % 60:02d}-{i:04x}"
        run_dir = synthetic_run(root, run_id, steps=200, log_bytes=64 * 2**10)
        campaign = CAMPAIGNS[i % len(CAMPAIGNS)]
        if campaign != run_dir.parent.parent.name:
            target = root / "experiments" / campaign / "runs" / run_id
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(run_dir, target)


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_call(argv: list[str], env: dict[str, str]) -> dict:
    """Wall time and CPU time (user + system) of one fresh process; the CPU time is what the
    command itself costs, nearly independent of how busy the machine is. A failing command stops
    the benchmark."""
    cpu_before = children_cpu_s()
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-500:]}")
    return {"wall_s": wall, "cpu_s": children_cpu_s() - cpu_before}


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[round(0.9 * (len(ordered) - 1))]


def measure(root: Path, n: int, script: Path, baseline: Path | None) -> dict[str, dict]:
    env = {
        **os.environ,
        "RLHF_LAB_ROOT": str(root),
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "120",
    }
    # A user's shell lets Python cache bytecode; without it every call recompiles what changed.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    contenders = {
        label: (lambda argv=argv: timed_call([str(script), *argv], env)) for label, argv in COMMANDS
    }
    if baseline is not None:  # the same commands from another checkout, alternated with ours
        old_env = {**env, "PYTHONPATH": str(baseline)}
        for label, argv in COMMANDS:
            contenders[f"{label} (baseline)"] = lambda argv=argv: timed_call(
                [str(script), *argv], old_env
            )
    for call in contenders.values():  # one untimed call each: file-system caches, .pyc files
        call()
    results = alternate(contenders, n)
    summary = {}
    for label, rows in results.items():
        walls = [r["wall_s"] for r in rows]
        summary[label] = {
            "median_s": round(statistics.median(walls), 4),
            "p90_s": round(p90(walls), 4),
            "max_s": round(max(walls), 4),
            "median_cpu_s": round(statistics.median(r["cpu_s"] for r in rows), 4),
            "n": len(walls),
            "meets_target": statistics.median(walls) < TARGET_S,
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=15, help="timed calls per command and root")
    parser.add_argument("--runs", type=int, default=50, help="synthetic runs in the full root")
    parser.add_argument("--quick", action="store_true", help="5 calls each (under a minute)")
    parser.add_argument("--out", type=Path, default=None, help="results file")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a folder holding another rlhf_lab/ and trainers/ (e.g. `git archive` of an older "
        "commit) to time alternately with this checkout, via PYTHONPATH",
    )
    args = parser.parse_args()
    n = 5 if args.quick else args.n
    script = console_script()

    load_before = machine_info()["load_avg_1m"]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as tmp:
        empty, full = Path(tmp) / "empty", Path(tmp) / "full"
        empty.mkdir()
        populate(full, args.runs)
        for root_label, root in (("empty root", empty), (f"{args.runs} finished runs", full)):
            for label, row in measure(root, n, script, args.baseline).items():
                results[f"{root_label}: {label}"] = row

    print(
        f"\n`{script.name} ...` as fresh processes, {n} calls each; target: median < {TARGET_S} s;"
        f" load average (1 min) {load_before} before, {machine_info()['load_avg_1m']} after"
    )
    print_table(
        ["command", "median s", "p90 s", "max s", "median CPU s", "target"],
        [
            [
                k,
                r["median_s"],
                r["p90_s"],
                r["max_s"],
                r["median_cpu_s"],
                "ok" if r["meets_target"] else "SLOW",
            ]
            for k, r in results.items()
        ],
    )
    write_results(
        "cli_startup",
        {
            "target_median_s": TARGET_S,
            "calls_per_command": n,
            "synthetic_runs": args.runs,
            "console_script": str(script),
            "load_avg_1m_before": load_before,
            "baseline": str(args.baseline) if args.baseline else None,
            "results": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
