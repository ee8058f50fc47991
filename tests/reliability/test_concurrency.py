"""Concurrency: many writers on one campaign ledger (threads and separate processes), readers
racing those writers, and launches racing for one device.

What must hold afterwards: every recorded run has its row in ledger.json, in show_campaign and in
the markdown; the markdown stays valid (YAML front matter, each managed block's begin/end markers
once and in order); text written by hand before the storm is still there byte for byte; a reader
never sees the markdown and ledger.json disagree; of two launches racing for one device exactly
one starts a trainer and the other is refused naming it (or, with queue=True, waits its turn).

tests/lab/test_ledger.py already races ledger.record_run from threads and forked processes; this
file goes through the api functions the CLI and the MCP server use, from independent interpreters,
with readers in the race, and with real trainers for the launches.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _synthetic as synthetic
import pytest
import yaml

import rlhf_lab.runs.launcher as runs_launch
from rlhf_lab import api, ledger
from tests._helpers.lab_launches import queue_on_tiny
from tests._helpers.races import at_once
from tests._lab_processes import kill_live_runs, wait_until

REPO = Path(__file__).resolve().parents[2]
MARKER_RE = re.compile(r"<!-- rlhf-lab:(begin|end) ([a-z-]+) -->")
N_RUNS = 50
# A DPO run on the tiny preset that trains until it is stopped (thousands of steps).
ENDLESS = [
    "data.max_samples=64",
    "data.eval_size=16",
    "train.batch_size=8",
    "train.num_epochs=1000",
    "train.max_steps=5000",
    "eval.eval_every=0",
    "eval.num_samples=0",
    "checkpoint.save_final_model=false",
    "model.device=cpu",
]
# Written into the markdown before the storm: under the lab's Goal heading, between two managed
# blocks and in a section of its own at the end. None of it may change.
HAND_GOAL = "Hypothesis (hand-written): β=0.1 keeps margins growing — ünïcode, `code`, | pipes |\n"
HAND_BETWEEN = "A note between the Runs block and the Plots heading, kept as is.\n"
HAND_SECTION = (
    "## Notes by hand\n\n"
    "Paragraph one of a section the lab does not know about.\n\n"
    "```\n<!-- not a marker: rlhf-lab: begin runs -->\n```\n"
)


@pytest.fixture(autouse=True)
def lab_root(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield tmp_path
    kill_live_runs(tmp_path)  # never leave a trainer (or the queue worker's run) behind


# ---------------------------------------------------------------------------------------------
# Synthetic finished runs and ledger checks
# ---------------------------------------------------------------------------------------------


def storm_campaign(slug: str) -> tuple[api.Campaign, list[str]]:
    """A campaign with hand-written text in its markdown and N_RUNS finished runs to record."""
    camp = api.create_campaign(slug, "Do concurrent writers keep every row?")
    md = Path(camp.path)
    text = md.read_text()
    text = text.replace("## Goal\n\n", "## Goal\n\n" + HAND_GOAL + "\n", 1)
    text = text.replace(
        "<!-- rlhf-lab:end runs -->\n", "<!-- rlhf-lab:end runs -->\n\n" + HAND_BETWEEN, 1
    )
    md.write_text(text + "\n" + HAND_SECTION)
    run_ids = [f"dpo-20260105-120000-{i:04d}" for i in range(N_RUNS)]
    for run_id in run_ids:
        synthetic.finished_run(api.experiments_dir() / camp.id / "runs" / run_id, steps=6)
    return camp, run_ids


def ledger_problems(markdown: str, runs_in_data: list[str] | None = None) -> list[str]:
    """What is wrong with a campaign markdown: front matter that is not YAML, block markers that
    are missing, doubled or out of order, hand-written text changed, or run rows that disagree
    with ``runs_in_data`` (the run ids the ledger data holds)."""
    problems = []
    if not markdown.startswith("---\n") or "\n---\n" not in markdown[3:]:
        return ["no front matter"]
    front = markdown[4 : markdown.index("\n---\n", 3) + 1]
    try:
        meta = yaml.safe_load(front)
    except yaml.YAMLError as err:
        return [f"front matter is not YAML: {err}"]
    if not isinstance(meta, dict) or not meta.get("id"):
        problems.append(f"front matter has no id: {meta!r}")
    found = MARKER_RE.findall(markdown)
    expected = [(kind, name) for name in ledger.BLOCKS for kind in ("begin", "end")]
    if sorted(found) != sorted(expected):
        problems.append(f"markers: {found}")
    open_block = None
    for kind, name in found:
        if (kind == "begin") != (open_block is None) or (kind == "end" and open_block != name):
            problems.append(f"marker {kind} {name} while {open_block} is open")
        open_block = name if kind == "begin" else None
    for chunk in (HAND_GOAL, HAND_BETWEEN, HAND_SECTION):
        if markdown.count(chunk) != 1:
            problems.append(f"hand-written text changed: {chunk[:40]!r}")
    if runs_in_data is not None:
        rows = sorted(run_rows(markdown))
        if rows != sorted(runs_in_data):
            problems.append(f"{len(rows)} rows in the Runs table, {len(runs_in_data)} in the data")
    return problems


def run_rows(markdown: str) -> dict[str, str]:
    """Run id -> its row in the Runs block's table (a repeated id keeps its last row)."""
    block = markdown.split("<!-- rlhf-lab:begin runs -->", 1)[-1]
    block = block.split("<!-- rlhf-lab:end runs -->", 1)[0]
    found = re.findall(r"^(\| `(dpo-20260105-120000-\d{4})` \| dpo \|.*)$", block, re.M)
    ids = [run_id for _, run_id in found]
    rows = {run_id: row for row, run_id in found}
    return rows if len(ids) == len(rows) else {**rows, "duplicated": ""}


def assert_complete(camp: api.Campaign, run_ids: list[str], notes: dict[str, str]) -> None:
    """Every run is in ledger.json, in show_campaign and in the markdown, exactly once."""
    data = json.loads((Path(camp.asset_dir) / "ledger.json").read_text())
    assert sorted(r["run_id"] for r in data["runs"]) == sorted(run_ids)
    view = api.show_campaign(camp.slug)
    assert sorted(r.run_id for r in view.runs) == sorted(run_ids)
    assert view.markdown == Path(camp.path).read_text()
    assert ledger_problems(view.markdown, run_ids) == []
    rows = run_rows(view.markdown)
    for run_id, note in notes.items():
        assert note in rows[run_id], (run_id, rows[run_id])
    assert not [p.name for p in api.experiments_dir().rglob("*.tmp*")], "temporary files left"


# ---------------------------------------------------------------------------------------------
# Ledger writers and readers
# ---------------------------------------------------------------------------------------------


def test_fifty_threads_record_while_readers_never_see_a_torn_ledger(monkeypatch):
    camp, run_ids = storm_campaign("thread-storm")
    # Widen the window between a writer replacing ledger.json and replacing the markdown: a
    # reader that does not take the writers' lock would then pair new rows with an old markdown.
    real_write = ledger.atomic_write_text

    def slow_write(path, text):
        real_write(path, text)
        if Path(path).name == "ledger.json":
            time.sleep(0.01)

    monkeypatch.setattr(ledger, "atomic_write_text", slow_write)
    notes = {run_id: f"note from writer {i} ✓" for i, run_id in enumerate(run_ids)}
    done = threading.Event()
    torn: list[str] = []
    reads = [0, 0]
    unread: list[str] = []  # records no reader read after within 10 s
    # On two busy cores the lock may go to the eight writers again and again and starve the
    # readers; each writer therefore waits, after its record, until some reader has finished a
    # read that began after it. Reads and writes interleave by construction, not by luck.
    read_done = threading.Condition()

    def reader(slot: int) -> None:
        while not done.is_set():
            try:
                view = api.show_campaign(camp.slug)
            except Exception as err:  # a reader must never fail either
                torn.append(f"read {reads[slot]}: {err!r}")
                return
            problems = ledger_problems(view.markdown, [r.run_id for r in view.runs])
            torn.extend(f"read {reads[slot]}: {p}" for p in problems)
            with read_done:
                reads[slot] += 1
                read_done.notify_all()
            time.sleep(0.002)  # let the writers at the lock between two reads

    def writer(run_id: str) -> api.RunRecord:
        record = api.record_run(run_id, notes[run_id], plot=run_id.endswith("0"))
        with read_done:
            before = sum(reads)
            if not read_done.wait_for(lambda: sum(reads) >= before + 2, timeout=10):
                unread.append(run_id)
        return record

    readers = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for thread in readers:
        thread.start()
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            records = list(pool.map(writer, run_ids))
    finally:
        done.set()
        for thread in readers:
            thread.join(timeout=60)
    assert [r.run_id for r in records] == run_ids
    assert torn == [], torn[:5]
    assert unread == [], f"no read followed these records: {unread}; the race was not exercised"
    assert sum(reads) >= 10, reads
    assert_complete(camp, run_ids, notes)
    plots = sorted(p.stem for p in (Path(camp.asset_dir) / "plots").glob("*.png"))
    assert plots == [r for r in run_ids if r.endswith("0")]


# Each process imports the lab, says it is ready, waits for the go file, then records its runs
# from one thread each: all the record calls of all the processes run at the same moment.
RECORDER = """
import sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
gate, run_ids = Path(sys.argv[1]), sys.argv[2:]
from rlhf_lab import api
(gate / f"ready-{run_ids[0]}").touch()
while not (gate / "go").exists():
    time.sleep(0.005)
with ThreadPoolExecutor(len(run_ids)) as pool:
    list(pool.map(lambda r: api.record_run(r, f"note from process {r[-4:]}", plot=False), run_ids))
"""
PROCESSES = 10


def start_together(script: str, args: list[list[str]], gate: Path) -> list[subprocess.Popen]:
    """Start one interpreter per argument list running ``script``; release them all at once when
    every one has written its ready file."""
    gate.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(gate), *extra],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for extra in args
    ]
    try:
        wait_until(
            lambda: (
                len(list(gate.glob("ready-*"))) == len(procs)
                or any(p.poll() is not None for p in procs)
            ),
            120,
            "every process to import the lab",
            poll=0.05,
        )
    finally:
        (gate / "go").touch()
    return procs


def test_fifty_record_calls_from_ten_processes_at_once(lab_root):
    camp, run_ids = storm_campaign("process-storm")
    groups = [run_ids[i::PROCESSES] for i in range(PROCESSES)]
    procs = start_together(RECORDER, groups, lab_root / "gate")
    try:
        outcomes = [(p.wait(timeout=180), p.stderr.read()[-600:]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [(ids, err) for ids, (code, err) in zip(groups, outcomes, strict=True) if code]
    assert failed == []
    notes = {run_id: f"note from process {run_id[-4:]}" for run_id in run_ids}
    assert_complete(camp, run_ids, notes)


# ---------------------------------------------------------------------------------------------
# Launches racing for one device
# ---------------------------------------------------------------------------------------------


def run_dirs(root: Path) -> list[Path]:
    return sorted(root.glob("experiments/*/runs/*"))


def test_two_threads_launching_at_once_start_one_trainer_and_refuse_the_other(
    lab_root, monkeypatch, machine, supervise
):
    # Whatever the order, the memory check must not let the second job share the CPU: the free
    # RAM holds one run (an idle CPU passes the launch's fit check) but not two.
    machine(free_ram_gb=lambda: 0.001 if api.active_runs("cpu") else 1000.0)
    # Both threads pass the campaign and memory checks, then enter the runs layer together (the
    # campaign's file lock would otherwise stagger them by its polling interval).
    at_launch = threading.Barrier(2)
    real_start = runs_launch.start_or_queue

    def launch_together(*args, **kwargs):
        at_launch.wait(timeout=60)
        return real_start(*args, **kwargs)

    supervise(start_or_queue=launch_together)

    def launch():
        return api.launch(
            api.RunRequest(
                recipe="dpo", overrides=ENDLESS, model="tiny", campaign="race", device="cpu"
            )
        )

    started, errors = at_once(launch, 2, join_s=120)
    refused = [str(err) for err in errors]
    assert len(started) == 1 and len(refused) == 1, (started, refused)
    winner = started[0].run
    try:
        message = refused[0]
        assert "device cpu is busy" in message and winner.id in message
        assert "queue=True" in message and "force=True" in message
        assert run_dirs(lab_root) == [Path(winner.run_dir)], "the refused launch wrote a run"
        # the winner is a real trainer that gets to train
        status = wait_until(
            lambda: (s := api.run_status(winner.id).status).step and s, 120, "a first step"
        )
        assert status.state == "running" and status.alive and status.trainer_pid
        assert [s.id for s in api.active_runs("cpu")] == [winner.id]
    finally:
        final = api.stop_run(winner.id, grace_s=10)
    assert final.state == "stopped" and not final.alive


LAUNCHER = """
import json, sys, time
from pathlib import Path
gate, config = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
from rlhf_lab import runs
from rlhf_lab.paths import LabError
from rlhf_lab.planning.trainer_config import TrainerConfig
(gate / f"ready-{sys.argv[3]}").touch()
while not (gate / "go").exists():
    time.sleep(0.002)
try:
    run = runs.NewRun(family="direct_alignment", algorithm="dpo",
                      config=TrainerConfig("direct_alignment", config),
                      campaign="race", source="dpo.yaml", device="cpu")
    result = runs.start_or_queue(run)
    print(json.dumps({"started": result.run.id}))
except LabError as err:
    print(json.dumps({"refused": str(err)}))
"""


def test_two_processes_launching_at_once_start_one_trainer_and_refuse_the_other(lab_root):
    config = api.shrink_config("dpo", ENDLESS, model="tiny").config
    config_file = lab_root / "config.json"
    config_file.write_text(json.dumps(config))
    procs = start_together(
        LAUNCHER, [[str(config_file), "a"], [str(config_file), "b"]], lab_root / "gate"
    )
    outs = [p.communicate(timeout=120) for p in procs]
    answers = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    started = [a["started"] for a in answers if "started" in a]
    refused = [a["refused"] for a in answers if "refused" in a]
    assert len(started) == 1 and len(refused) == 1, (answers, [err[-800:] for _, err in outs])
    winner = started[0]
    try:
        assert "device cpu is busy" in refused[0] and winner in refused[0]
        assert [p.name for p in run_dirs(lab_root)] == [winner]
        assert api.run_status(winner).status.state == "running"
    finally:
        final = api.stop_run(winner, grace_s=10)
    assert final.state == "stopped"


def test_two_queued_launches_at_once_run_one_at_a_time(lab_root):
    def launch():
        return queue_on_tiny("dpo", ENDLESS, campaign="queue-race", device="cpu")

    # any failure is reported by the assert below
    results, failures = at_once(launch, 2, join_s=120, catch=Exception)
    errors = [repr(err) for err in failures]
    assert errors == [] and len(results) == 2
    ids = [r.run.id for r in results]
    try:
        assert all(r.queued and r.device == "cpu" for r in results)
        assert {r.queue_position for r in results} <= {1, 2}
        first = wait_until(
            lambda: next((i for i in ids if api.run_status(i).status.state == "running"), None),
            120,
            "the queue worker to start one run",
        )
        (second,) = [i for i in ids if i != first]
        # while the first trains, the second keeps waiting: never two jobs on the device
        for _ in range(8):
            assert api.run_status(second).status.state == "queued"
            assert [s.id for s in api.active_runs("cpu")] == [first]
            time.sleep(0.25)
        assert api.stop_run(second).state == "stopped"  # a queued run just leaves the queue
    finally:
        for run_id in ids:
            api.stop_run(run_id, grace_s=10)
    assert {api.run_status(i).status.state for i in ids} == {"stopped"}
