"""Faults, end to end through the lab (``rlhf_lab.api`` / ``rlhf_lab.runs`` / the CLI).

Each test provokes one way a run can go wrong and checks what the lab then reports:

* ``kill -9`` of a real trainer's process group mid-run (one recipe per trainer family): the run
  is ``died`` with a ``died`` alert, metrics.jsonl holds whole lines only, the ledger records it,
  and ``resume`` continues it to the same metrics as an uninterrupted run with the same config;
* ``stop`` (SIGTERM): the trainer checkpoints, writes outcome ``stopped`` and exits on its own;
* a crash inside the trainer (``RLHF_LAB_FAULT_AT_STEP``): ``failed`` with the error named;
* the launcher killed in the middle of ``launch``, before and after it started the process;
* damaged run files (truncated, missing, garbage): every reading command still answers;
* a recorded pid that now belongs to an unrelated live process: never reported as running;
* ``rlhf-lab resume`` refusing runs it cannot continue.

Every lab call runs against a temporary ``RLHF_LAB_ROOT``. The trainer runs use the ``tiny``
preset with a handful of steps; the launcher and pid tests use cheap stand-in processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import _synthetic as synthetic
import psutil
import pytest
from typer.testing import CliRunner

from rlhf_lab import api, runs
from rlhf_lab.cli import app
from rlhf_lab.paths import LabError
from rlhf_lab.runs import wait_for_end
from tests._lab_processes import wait_until as poll_until

RUN_TIMEOUT_S = 300.0
POLL_S = 0.05

# The preference families (DPO, the preference reward model): 96 pairs, 16 held out, batches of
# 8 for 10 steps, evaluated every 5.
PAIRS_FOR_10_STEPS = [
    "data.max_samples=96",
    "data.eval_size=16",
    "data.max_length=96",
    "train.batch_size=8",
    "train.max_steps=10",
    "eval.eval_every=5",
]
# Quick tiny configs (applied after the lab's `--model tiny` shrink): ~10 optimizer steps each.
QUICK = {
    "direct_alignment": (
        "dpo",
        [*PAIRS_FOR_10_STEPS, "eval.num_samples=0", "checkpoint.save_final_model=false"],
    ),
    # Full-vocabulary sampling: the random tiny model then emits a format tag now and then, so
    # some groups have reward contrast and the updates (and the resumed ones) really move.
    "policy_gradients": (
        "grpo",
        [
            "data.size=32",
            "data.eval_size=4",
            "rollout.prompts_per_step=2",
            "rollout.num_rollouts=4",
            "rollout.max_new_tokens=48",
            "rollout.top_k=0",
            "rollout.top_p=1.0",
            "rollout.temperature=1.0",
            "train.batch_size=8",
            "train.gradient_accumulation_steps=1",
            "train.max_steps=10",
            "eval.eval_every=5",
            "eval.eval_batch_size=4",
            "eval.max_new_tokens=8",
            "eval.num_samples=0",
            "checkpoint.save_final_model=false",
        ],
    ),
    "reward_models": (
        "preference_rm",
        [
            *PAIRS_FOR_10_STEPS,
            "eval.eval_batch_size=8",
            "eval.num_samples=0",
            "checkpoint.save_final_model=false",
        ],
    ),
}
# Metric keys that measure the machine, not the training: never compared between runs.
VOLATILE_KEY_PARTS = ("time_s", "timing/", "throughput/", "memory/", "mfu/", "elapsed")


@pytest.fixture(autouse=True)
def lab_root(tmp_path, monkeypatch):
    """A fresh lab per test; whatever a failed test left running is stopped afterwards."""
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    yield tmp_path
    for status in runs.active_runs():
        runs.stop_run(status.id, grace_s=5)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str):
    """Poll ``predicate`` every POLL_S until it returns something truthy (returned)."""
    return poll_until(predicate, timeout_s, what, poll=POLL_S)


def launch(recipe: str, overrides: list[str], campaign: str) -> runs.RunInfo:
    """A tiny run through the lab's front door (force: several of them share the CPU here)."""
    return api.launch(
        api.RunRequest(
            recipe=recipe, overrides=overrides, model="tiny", campaign=campaign, force=True
        )
    ).run


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints (the trainer renames a finished folder into place)."""
    found = []
    for path in (run_dir / "checkpoints").glob("step-*"):
        tail = path.name.removeprefix("step-")
        if tail.isdigit() and (path / "state.pt").is_file():
            found.append(int(tail))
    return sorted(found)


def log_tail(run_dir: Path, chars: int = 3000) -> str:
    try:
        return (run_dir / "train.log").read_text(errors="replace")[-chars:]
    except OSError:
        return "(no train.log)"


def wait_succeeded(run_id: str) -> runs.RunStatus:
    status = wait_for_end(run_id, poll_s=0.25, timeout_s=RUN_TIMEOUT_S)
    assert status.state == "succeeded", (status, log_tail(Path(status.run_dir)))
    return status


def comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(p in k for p in VOLATILE_KEY_PARTS)}


def assert_same_metrics(have: dict, want: dict) -> None:
    """Numbers within float tolerance, everything else ("nan", phase names) exactly."""
    where = (want.get("phase"), want.get("step"))
    assert have.keys() == want.keys(), where
    for key, value in want.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            assert have[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (where, key)
        else:
            assert have[key] == value, (where, key)


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def cli(*argv: str):
    """Run a CLI command in process; it must end by exiting (never another exception)."""
    result = CliRunner().invoke(app, list(argv))
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        argv,
        result.exception,
        result.output,
    )
    assert "Traceback" not in result.output, (argv, result.output)
    return result


# ---------------------------------------------------------------------------------------------
# 1. kill -9 mid-run, then resume
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(QUICK))
def test_kill_9_mid_run_is_died_recorded_and_resumes_to_the_uninterrupted_result(family):
    recipe, quick = QUICK[family]
    overrides = [*quick, "checkpoint.save_every=2"]
    campaign = f"kill-9-{family.replace('_', '-')}"
    straight = launch(recipe, overrides, campaign)
    victim = launch(recipe, overrides, campaign)
    run_dir = Path(victim.run_dir)

    def first_checkpoint():
        if runs.run_state(victim.id).terminal:
            pytest.fail(f"{victim.id} ended before its first checkpoint:\n{log_tail(run_dir)}")
        return checkpoint_steps(run_dir)

    wait_until(first_checkpoint, RUN_TIMEOUT_S, f"a checkpoint of {victim.id}")
    before = runs.run_state(victim.id)
    assert before.state == "running" and before.pgid
    os.killpg(before.pgid, signal.SIGKILL)

    view = wait_until(
        lambda: (v := api.run_status(victim.id)).status.state != "running" and v, 30, "died"
    )
    assert view.status.state == "died" and not view.status.alive, view.status
    assert "died" in [a.kind for a in view.alerts], view.alerts
    assert view.status.step < view.status.total_steps  # it really was killed mid-run
    assert not (run_dir / "exit.json").exists()  # nobody lived to record an exit status
    text = (run_dir / "metrics.jsonl").read_text()
    assert text.endswith("\n")
    assert all(isinstance(json.loads(line), dict) for line in text.splitlines())

    api.record_run(victim.id)
    ledger = {r.run_id: r for r in api.show_campaign(campaign).runs}
    assert ledger[victim.id].state == "died"

    saved = checkpoint_steps(run_dir)
    resumed = api.resume_run(victim.id, force=True)
    assert f"checkpoint step {saved[-1]}" in resumed.message
    wait_succeeded(victim.id)
    wait_succeeded(straight.id)

    expected = [comparable(r) for r in metric_rows(Path(straight.run_dir))]
    got = [comparable(r) for r in metric_rows(run_dir)]
    # one history: each (phase, step) row once, in order, the same as the uninterrupted run's
    assert [(r["phase"], r["step"]) for r in got] == [(r["phase"], r["step"]) for r in expected]
    for have, want in zip(got, expected, strict=True):
        assert_same_metrics(have, want)

    record = read_json(run_dir / "run.json")
    assert [(r["state"], r["from_step"]) for r in record["resumes"]] == [("died", saved[-1])]
    api.record_run(victim.id)  # recording again replaces the row
    rows = [r for r in api.show_campaign(campaign).runs if r.run_id == victim.id]
    assert [r.state for r in rows] == ["succeeded"]


# ---------------------------------------------------------------------------------------------
# 2. SIGTERM from `stop`
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_stop_makes_the_trainer_checkpoint_and_end_as_stopped():
    recipe, quick = QUICK["direct_alignment"]
    endless = [
        *quick,
        "train.num_epochs=100",
        "train.max_steps=500",
        "eval.eval_every=0",
        "checkpoint.save_every=null",
    ]
    run = launch(recipe, endless, "stop-check")
    run_dir = Path(run.run_dir)

    def past_step_one():
        status = runs.run_state(run.id)
        if status.terminal:
            pytest.fail(f"{run.id} ended before it was stopped:\n{log_tail(run_dir)}")
        return status.step and status.step >= 1 and status

    running = wait_until(past_step_one, RUN_TIMEOUT_S, f"step 1 of {run.id}")
    assert running.state == "running"

    status = api.stop_run(run.id, grace_s=120)  # long grace: the trainer must end on its own
    assert status.state == "stopped" and not status.alive, (status, log_tail(run_dir))
    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "stopped" and "SIGTERM" in summary["detail"]
    exit_info = read_json(run_dir / "exit.json")
    assert exit_info["signal"] is None and exit_info["exit_code"] == 143  # not killed
    saved = checkpoint_steps(run_dir)
    assert saved and running.step <= saved[-1] < 500  # the stop's own checkpoint
    view = api.run_status(run.id)
    assert not [a for a in view.alerts if a.severity == "error"], view.alerts
    assert api.stop_run(run.id).state == "stopped"  # stopping again changes nothing


# ---------------------------------------------------------------------------------------------
# 3. A crash inside the trainer
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_crash_in_the_trainer_is_failed_with_its_error_and_resumes(monkeypatch):
    monkeypatch.setenv("RLHF_LAB_FAULT_AT_STEP", "3")  # the launcher passes it to the trainer
    recipe, quick = QUICK["direct_alignment"]
    overrides = [*quick, "train.max_steps=5", "checkpoint.save_every=1"]
    run = launch(recipe, overrides, "crash-check")
    run_dir = Path(run.run_dir)
    final = wait_for_end(run.id, poll_s=0.25, timeout_s=RUN_TIMEOUT_S)
    assert final.state == "failed", (final, log_tail(run_dir))

    summary = read_json(run_dir / "summary.json")
    assert summary["outcome"] == "failed"
    assert summary["error"].startswith("InjectedFault:") and "step 3" in summary["error"]
    assert "InjectedFault" in summary["traceback"]
    assert read_json(run_dir / "exit.json")["exit_code"] == 1
    assert checkpoint_steps(run_dir) == [2]  # the fault came before step 3's checkpoint

    view = api.run_status(run.id)
    assert "InjectedFault" in view.status.error
    failed = [a for a in view.alerts if a.kind == "failed"]
    assert failed and "InjectedFault" in failed[0].message and "step 3" in failed[0].message
    assert "Traceback" in (failed[0].detail or "")
    shown = cli("status", run.id)
    assert shown.exit_code == 0 and "[failed]" in shown.output and "InjectedFault" in shown.output

    monkeypatch.delenv("RLHF_LAB_FAULT_AT_STEP")
    api.resume_run(run.id, force=True)
    done = wait_succeeded(run.id)
    assert done.step == done.total_steps == 5
    assert read_json(run_dir / "run.json")["resumes"][0]["state"] == "failed"


# ---------------------------------------------------------------------------------------------
# 4. The launcher killed in the middle of `launch`
# ---------------------------------------------------------------------------------------------

# A launcher that dies at a chosen point of a real `launch` (argv: the point, the stand-in
# trainer's seconds). It prints the run id, then SIGKILLs itself.
LAUNCHER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from rlhf_lab import api, runs
    from rlhf_lab.runs.supervisor import supervised_by

    point, seconds = sys.argv[1], sys.argv[2]
    cfg = api.resolve_config("dpo", [])
    run = runs.NewRun(family=cfg.family, algorithm=cfg.algorithm, config=cfg.config,
                      campaign="half-launch", source=str(cfg.recipe.config_path), device="cpu")

    def die(run_dir):
        print(Path(run_dir).name, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "before-start":
        die(runs.prepare_run(run).run_dir)

    def stand_in(family, run_dir, resume=False):
        return [sys.executable, "-c", f"import time; time.sleep({seconds})", str(run_dir)]

    # start_run hands the wrapper to `reap` right after starting it, before run.json has its pid
    with supervised_by(trainer_argv=stand_in, reap=lambda proc: die(proc.args[3])):
        runs.start_or_queue(run)
    """
)


def killed_launcher(point: str, seconds: float = 0.0) -> tuple[str, Path]:
    """Run the dying launcher; returns the id and folder of the run it left behind."""
    out = subprocess.run(
        [sys.executable, "-c", LAUNCHER, point, str(seconds)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert out.returncode == -signal.SIGKILL, out.stderr
    run_id = out.stdout.strip()
    return run_id, runs.find_run(run_id)


def test_launcher_killed_before_starting_the_process_is_starting_then_died(supervise):
    run_id, run_dir = killed_launcher("before-start")
    listed = {s.id: s for s in api.list_runs()}
    assert listed[run_id].state == "starting" and not listed[run_id].alive
    assert api.run_status(run_id).status.state == "starting"

    supervise(starting_timeout_s=0.5)
    time.sleep(0.6)
    view = api.run_status(run_id)
    status = view.status
    assert status.state == "died" and not status.alive
    assert status.error == "the launcher exited before it started the process"
    # the alert says so too, and sends the user to launch again (there is nothing to resume)
    [alert] = [a for a in view.alerts if a.kind == "died"]
    assert "launcher exited" in alert.message and "launch it again" in alert.hint
    assert [s.id for s in api.list_runs(state="died")] == [run_id]
    assert read_json(run_dir / "run.json")["state"] == "died"  # settled on disk too
    shown = cli("status", run_id)
    assert "[died]" in shown.output and "launcher exited before it started" in shown.output


def test_launcher_killed_after_starting_the_wrapper_still_tracks_the_run(supervise):
    """run.json never got the wrapper's pid; the wrapper's process.json must carry the run."""
    supervise(starting_timeout_s=0.5)  # what counts is the live process

    # (a) looked at while it runs: running, and `stop` ends it
    run_id, run_dir = killed_launcher("after-start", seconds=60)
    assert "pid" not in read_json(run_dir / "run.json")
    wait_until(lambda: (run_dir / "process.json").is_file(), 30, "process.json")
    time.sleep(0.6)
    status = runs.run_state(run_id)
    assert status.state == "running" and status.alive, status
    trainer = read_json(run_dir / "process.json")["trainer_pid"]
    assert status.trainer_pid == trainer
    assert [s.id for s in runs.active_runs()] == [run_id]
    stopped = api.stop_run(run_id, grace_s=10)
    assert stopped.state == "stopped" and not stopped.alive
    assert not psutil.pid_exists(trainer) or psutil.Process(trainer).status() == "zombie"

    # (b) nobody looked until it had ended: its exit status decides, not the stale start
    run_id, run_dir = killed_launcher("after-start", seconds=0)
    wait_until(lambda: (run_dir / "exit.json").is_file(), 30, "exit.json")
    time.sleep(0.6)
    status = api.run_status(run_id).status
    assert status.state == "succeeded" and status.error is None, status

    # (c) its processes killed before anyone looked: died, for the right reason
    run_id, run_dir = killed_launcher("after-start", seconds=60)
    wait_until(lambda: (run_dir / "process.json").is_file(), 30, "process.json")
    os.killpg(read_json(run_dir / "process.json")["wrapper_pid"], signal.SIGKILL)
    time.sleep(0.6)
    status = wait_until(lambda: (s := runs.run_state(run_id)).state != "running" and s, 10, "end")
    assert status.state == "died" and "without an exit status" in status.error, status


# ---------------------------------------------------------------------------------------------
# 5. Damaged run files
# ---------------------------------------------------------------------------------------------

CAMPAIGN = "2026-01-01-damaged"


def finished_run(root: Path, run_id: str, state: str = "succeeded") -> Path:
    return synthetic.finished_run(root / "experiments" / CAMPAIGN / "runs" / run_id, state=state)


def cut_last_metrics_line(run_dir: Path) -> None:
    text = (run_dir / "metrics.jsonl").read_text()
    (run_dir / "metrics.jsonl").write_text(text[: len(text) - 25])  # mid-way through the line


DAMAGE = {
    "metrics-last-line-cut": cut_last_metrics_line,
    "progress-missing": lambda d: (d / "progress.json").unlink(),
    "run-json-garbage": lambda d: (d / "run.json").write_bytes(b"\x00\xff{garbage\x9c\n"),
    "summary-json-garbage": lambda d: (d / "summary.json").write_bytes(b'{"outcome": "succ\xff'),
    "metrics-garbage-line": lambda d: open(d / "metrics.jsonl", "ab").write(b"\xff\x00[1, 2\n"),
    "run-json-not-an-object": lambda d: (d / "run.json").write_text("[1, 2, 3]\n"),
    "summary-json-empty": lambda d: (d / "summary.json").write_text(""),
    "run-json-wrong-types": lambda d: (d / "run.json").write_text(
        json.dumps({"state": "running", "pid": "abc", "create_time": "x", "campaign": ["x"]})
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_run_files_still_get_an_answer(damage, lab_root):
    run_id = "dpo-20260101-000000-dead"
    run_dir = finished_run(lab_root, run_id)
    DAMAGE[damage](run_dir)
    run_json_broken = damage.startswith("run-json")

    if run_json_broken:
        with pytest.raises(LabError, match="run.json"):
            api.run_status(run_id)
    else:
        view = api.run_status(run_id)
        assert view.status.state == "succeeded"
        assert view.status.last_eval.get("eval/accuracy") == 0.5
    listed = api.list_runs()
    assert [s.id for s in listed] == [run_id]
    assert listed[0].state == ("died" if run_json_broken else "succeeded")
    if run_json_broken:
        assert "run.json" in listed[0].error
    series = api.read_metrics(run_id)
    whole = 7 if damage == "metrics-last-line-cut" else 8
    assert series.total_rows == whole and all(isinstance(r["step"], int) for r in series.rows)
    assert "step 4/4" in api.tail_log(run_id).text
    record = api.record_run(run_id)
    assert record.run_id == run_id
    damaged_file = {"metrics": "metrics.jsonl", "run": "run.json", "summary": "summary.json"}
    named = damaged_file.get(damage.split("-")[0])
    if named:  # the ledger row names the damaged file instead of silently ignoring it
        assert any(named in warning for warning in record.warnings), record.warnings

    for argv in (["status", run_id], ["runs"], ["metrics", run_id], ["metrics", run_id, "--json"]):
        result = cli(*argv)
        if run_json_broken and argv[0] == "status":
            assert result.exit_code == 2 and result.output.startswith("error:")
            assert "run.json" in result.output
        else:
            assert result.exit_code == 0, (argv, result.output)
            assert run_id in result.output or argv[0] == "runs"
    assert run_id[:12] in cli("runs").output


# ---------------------------------------------------------------------------------------------
# 6. A recorded pid now held by an unrelated live process
# ---------------------------------------------------------------------------------------------


def point_run_at(run_dir: Path, **fields) -> None:
    record = {**read_json(run_dir / "run.json"), "state": "running", **fields}
    (run_dir / "run.json").write_text(json.dumps(record))


def test_a_reused_pid_held_by_a_live_unrelated_process_is_never_running(lab_root):
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    mine = None
    try:
        born = psutil.Process(sleeper.pid).create_time()
        wrong_time = finished_run(lab_root, "dpo-20260101-000000-aaaa", state="died")
        point_run_at(wrong_time, pid=sleeper.pid, pgid=sleeper.pid, create_time=born - 3600)
        (wrong_time / "process.json").write_text(
            json.dumps({"trainer_pid": sleeper.pid, "trainer_create_time": born - 3600})
        )
        no_time = finished_run(lab_root, "dpo-20260101-000000-bbbb", state="died")
        point_run_at(no_time, pid=sleeper.pid, pgid=sleeper.pid, create_time=None)

        for run_dir in (wrong_time, no_time):
            view = api.run_status(run_dir.name)
            assert view.status.state == "died" and not view.status.alive, view.status
            assert "died" in [a.kind for a in view.alerts]
            assert read_json(run_dir / "run.json")["state"] == "died"
            assert api.stop_run(run_dir.name, grace_s=1).state == "died"
        assert runs.active_runs() == []
        assert sleeper.poll() is None  # the lab never signalled the unrelated process

        # control: a process whose command line names the run folder *is* the run
        control = finished_run(lab_root, "dpo-20260101-000000-cccc", state="died")
        mine = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(30)", str(control)],
            start_new_session=True,
        )
        wait_until(
            lambda: str(control) in " ".join(psutil.Process(mine.pid).cmdline()),
            10,
            "the control's command line",
        )
        point_run_at(control, pid=mine.pid, pgid=mine.pid, create_time=None)
        assert runs.run_state(control.name).state == "running"
        assert runs.stop_run(control.name, grace_s=5).state == "stopped"
        assert mine.wait(timeout=10) == -signal.SIGTERM
        assert sleeper.poll() is None
    finally:
        for proc in (sleeper, mine):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


# ---------------------------------------------------------------------------------------------
# `rlhf-lab resume` refuses what it cannot continue
# ---------------------------------------------------------------------------------------------


def test_resume_refuses_a_succeeded_run_and_a_run_without_checkpoints(lab_root):
    done = finished_run(lab_root, "dpo-20260101-000000-d0e1")
    result = cli("resume", done.name)
    assert result.exit_code == 2
    assert "is succeeded" in result.output and "launch a new run" in result.output

    died = finished_run(lab_root, "dpo-20260101-000000-d1e2", state="died")
    result = cli("resume", died.name)
    assert result.exit_code == 2
    assert "no checkpoint" in result.output and "launch it again" in result.output
    assert "checkpoint.save_every" in result.output  # the setting that makes checkpoints
    for run_dir in (done, died):  # nothing was started or moved
        assert "resumes" not in read_json(run_dir / "run.json")
        assert not (run_dir / "attempts").exists()
