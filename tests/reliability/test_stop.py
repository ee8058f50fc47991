"""Stop never loses work and never lies: a real tiny trainer stopped in each phase.

``RLHF_LAB_SIGTERM_AT=<point>[:<n>]`` makes the trainer send itself a real SIGTERM the n-th time
it reaches a point (a phase it enters, or a stop check such as ``micro_batch``), so each test hits
its phase deterministically, without sleeps. The trainers run in this process (``main(argv)``:
the same harness, signal handler and stop checks as a launched one; SIGTERM goes to this process
and the harness restores the previous handler afterwards). For each phase the test asserts the
exit code 143 (the trainer ended on its own), outcome ``stopped`` with a detail that names where
it stopped and what it saved, the checkpoint of the last completed step (none before step 1),
and that resuming gives the same rows as an uninterrupted run.

The lab side (``stop_run`` waiting, SIGKILL after the grace period and the ``killed`` state,
Ctrl-C in ``launch --foreground``) is at the end of the file.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import _synthetic as synthetic
import pytest
from conftest import assert_phases, torch_threads, trainer_argv
from typer.testing import CliRunner

from rlhf_lab import api, runs
from rlhf_lab.cli import _stop_or_detach, app
from trainers.core.rundir import SIGTERM_ENV, RunDir, read_jsonl
from trainers.direct_alignment import train as da_train
from trainers.policy_gradients import train as pg_train

ROOT = Path(__file__).resolve().parents[2]
DA_CONFIG = ROOT / "trainers" / "direct_alignment" / "configs" / "dpo.yaml"
PG_CONFIG = ROOT / "trainers" / "policy_gradients" / "configs" / "grpo.yaml"

# 3 steps of 2 micro-batches; evaluation and sampled generations (do_sample) after step 2.
DA = [
    "model.name=tiny",
    "model.gradient_checkpointing=false",
    "data.dataset=builtin:reasoning-preferences",
    "data.max_samples=40",
    "data.eval_size=8",
    "data.max_length=96",
    "train.batch_size=4",
    "train.gradient_accumulation_steps=2",
    "train.max_steps=3",
    "eval.eval_every=2",
    "eval.eval_batch_size=4",
    "eval.sample_every=2",
    "eval.num_samples=1",
    "eval.sample_max_new_tokens=8",
    "logging.log_every=1",
    "checkpoint.save_every=null",
    "checkpoint.save_final_model=false",
]
# 3 rollout steps; full-vocabulary sampling, so rollouts depend on the random state.
PG = [
    "model.name=tiny",
    "model.gradient_checkpointing=false",
    "data.size=16",
    "data.eval_size=2",
    "rollout.prompts_per_step=2",
    "rollout.num_rollouts=2",
    "rollout.max_new_tokens=12",
    "rollout.top_k=0",
    "rollout.top_p=1.0",
    "rollout.temperature=1.0",
    "train.batch_size=4",
    "train.max_steps=3",
    "eval.eval_every=2",
    "eval.eval_batch_size=2",
    "eval.max_new_tokens=6",
    "eval.num_samples=1",
    "checkpoint.save_every=null",
    "checkpoint.save_final_model=false",
]
VOLATILE = ("time_s", "timing/", "throughput/", "memory/", "mfu/", "elapsed")


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    with torch_threads(1):
        yield


def da(run_dir: Path, resume: bool = False) -> int:
    return da_train.main(trainer_argv(DA_CONFIG, run_dir, DA, resume))


def pg(run_dir: Path, resume: bool = False) -> int:
    return pg_train.main(trainer_argv(PG_CONFIG, run_dir, PG, resume))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Uninterrupted DA and PG runs to compare the stopped-then-resumed ones with; what each
    wrote to progress.json (phase, step, total) and printed is kept for the phase tests."""
    root = tmp_path_factory.mktemp("straight")
    os.environ.pop(SIGTERM_ENV, None)
    seen: dict[str, list] = {}
    original = RunDir.write_progress

    def spy(self, step, total_steps, *, phase=None, **extra):
        seen.setdefault(self.path.name, []).append((phase, step, total_steps))
        return original(self, step, total_steps, phase=phase, **extra)

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(RunDir, "write_progress", spy)
        assert da(root / "da") == 0
        assert pg(root / "pg") == 0
    (root / "out.txt").write_text(out.getvalue())
    (root / "progress.json").write_text(json.dumps(seen))
    return root


def stop_at(monkeypatch, point: str, run, run_dir: Path, resume: bool = False) -> dict:
    """Run with a self-SIGTERM at ``point``; returns the summary of the stopped run."""
    monkeypatch.setenv(SIGTERM_ENV, point)
    assert run(run_dir, resume=resume) == 143  # the harness's stop exit: it ended by itself
    monkeypatch.delenv(SIGTERM_ENV)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "stopped", summary
    return summary


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))


def rows(run_dir: Path) -> list[tuple[int, str]]:
    return [(r["step"], r["phase"]) for r in read_jsonl(run_dir / "metrics.jsonl")]


def assert_resumes_to(run, run_dir: Path, want: Path) -> None:
    """Resume ``run_dir``; its metrics and samples equal the uninterrupted run's."""
    assert run(run_dir, resume=True) == 0
    got, expected = read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(want / "metrics.jsonl")
    assert [(r["step"], r["phase"]) for r in got] == [(r["step"], r["phase"]) for r in expected]
    for have, row in zip(got, expected, strict=True):
        for key, value in row.items():
            if any(p in key for p in VOLATILE):
                continue
            if isinstance(value, float):
                assert have[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (row["step"], key)
            else:
                assert have[key] == value, (row["step"], key)
    samples = [s["completion"] for s in read_jsonl(run_dir / "samples.jsonl")]
    assert samples == [s["completion"] for s in read_jsonl(want / "samples.jsonl")]


# ---------------------------------------------------------------------------------------------
# No blind start: phases and totals from the first write, a train.log line per evaluation
# ---------------------------------------------------------------------------------------------


def test_direct_alignment_and_policy_gradients_say_what_they_do_from_the_start(straight):
    writes = {
        k: [tuple(w) for w in v]
        for k, v in json.loads((straight / "progress.json").read_text()).items()
    }
    da_writes, pg_writes = writes["da"], writes["pg"]
    assert_phases(da_writes, "tokenizing", "reference_logprobs", "loading_model", "evaluating")
    assert_phases(da_writes, "training", "evaluating", "generating", "training", "done")
    assert da_writes[2] == ("reference_logprobs", 0, 3)  # the total, once tokenised
    assert pg_writes[0] == ("loading_model", 0, 3)  # the config tells it: from the first write
    assert_phases(pg_writes, "tokenizing", "loading_model", "evaluating", "generating")
    assert_phases(pg_writes, "generating", "training", "evaluating", "training", "done")
    out = (straight / "out.txt").read_text()
    for step in (0, 2, 3):
        assert f"eval step {step}/3: loss " in out  # dpo's eval/loss, eval/accuracy ...
        assert f"eval step {step}/3: avg_correctness " in out  # grpo's held-out correctness


def test_the_wrapper_writes_progress_before_the_trainer_starts(tmp_path):
    """Phase `starting` while the trainer imports its libraries; a resumed run keeps its step."""
    show = "import pathlib, sys; print(pathlib.Path(sys.argv[1], 'progress.json').read_text())"

    def progress_the_trainer_finds() -> dict:
        out = subprocess.run(
            [sys.executable, "-m", "rlhf_lab._wrapper", str(tmp_path), "--"]
            + [sys.executable, "-c", show, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return json.loads(out.stdout)

    new = progress_the_trainer_finds()
    assert (new["phase"], new["step"], new["total_steps"]) == ("starting", 0, None)
    (tmp_path / "progress.json").write_text(json.dumps({"step": 7, "total_steps": 9, "epoch": 1}))
    resumed = progress_the_trainer_finds()
    assert (resumed["phase"], resumed["step"], resumed["total_steps"]) == ("starting", 7, 9)
    assert resumed["epoch"] == 1


def test_status_shows_the_phase_and_total_while_no_step_is_done(
    tmp_path, monkeypatch, stand_in_trainer
):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    writes_progress = (
        "import json, pathlib, sys, time; p = pathlib.Path(sys.argv[1], 'progress.json'); "
        "p.write_text(json.dumps({'step': 0, 'total_steps': 32, 'phase': 'tokenizing'})); "
        "time.sleep(60)"
    )
    stand_in_trainer(writes_progress)
    run = api.launch(
        api.RunRequest(recipe="dpo", overrides=[], model="tiny", campaign="blind", force=True)
    ).run
    progress = Path(run.run_dir) / "progress.json"
    deadline = time.time() + 60
    while time.time() < deadline and not (
        progress.is_file() and "tokenizing" in progress.read_text()
    ):
        time.sleep(0.05)
    status = api.run_status(run.id).status
    assert (status.state, status.step, status.total_steps, status.phase) == (
        "running",
        0,
        32,
        "tokenizing",
    )
    shown = CliRunner().invoke(app, ["status", run.id])
    assert "[running]  step 0/32 (tokenizing)" in shown.output, shown.output
    api.stop_run(run.id, grace_s=5)


# ---------------------------------------------------------------------------------------------
# Before the first step: nothing to checkpoint, and nothing lost
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["loading_model", "tokenizing", "reference_logprobs"])
def test_a_stop_before_the_first_step_ends_at_once_with_nothing_to_checkpoint(
    tmp_path, monkeypatch, phase
):
    """Model loading, tokenising and DPO's reference log-probs: SIGTERM raises right there."""
    summary = stop_at(monkeypatch, phase, da, tmp_path / "run")
    assert f"SIGTERM during {phase}" in summary["detail"]
    assert "nothing to checkpoint" in summary["detail"]
    assert checkpoints(tmp_path / "run") == [] and rows(tmp_path / "run") == []
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert progress["phase"] == phase and progress["step"] == 0


# ---------------------------------------------------------------------------------------------
# Mid-step, in the evaluation and in generation: the last completed step, resumed exactly
# ---------------------------------------------------------------------------------------------


def test_a_stop_between_micro_batches_drops_the_partial_step(tmp_path, monkeypatch, straight):
    """Step 2's first micro-batch has run its backward; its gradient is never applied."""
    run_dir = tmp_path / "run"
    summary = stop_at(monkeypatch, "micro_batch:4", da, run_dir)
    assert "SIGTERM during micro_batch in step 2" in summary["detail"]
    assert "partial step was dropped; checkpoint of step 1 written" in summary["detail"]
    assert checkpoints(run_dir) == ["step-0000001"]
    assert max(step for step, _ in rows(run_dir)) == 1  # nothing of step 2 was logged
    again = stop_at(monkeypatch, "tokenizing", da, run_dir, resume=True)  # stopped again early
    assert "SIGTERM during tokenizing: the checkpoint of step 1 is kept" in again["detail"]
    assert checkpoints(run_dir) == ["step-0000001"]
    assert_resumes_to(da, run_dir, straight / "da")


def test_a_stop_during_evaluation_checkpoints_the_step_and_evaluates_again(
    tmp_path, monkeypatch, straight
):
    """The 2nd evaluation (after step 2): the step is kept, the evaluation runs on resume."""
    run_dir = tmp_path / "run"
    summary = stop_at(monkeypatch, "evaluating:2", da, run_dir)
    assert "SIGTERM during eval_batch after step 2" in summary["detail"]
    assert checkpoints(run_dir) == ["step-0000002"]
    assert (2, "train") in rows(run_dir) and (2, "eval") not in rows(run_dir)
    assert_resumes_to(da, run_dir, straight / "da")


def test_a_stop_during_sampled_generations_after_the_evaluation(tmp_path, monkeypatch, straight):
    """Step 2's eval row is written, its samples are not: on resume both come once, the same."""
    run_dir = tmp_path / "run"
    summary = stop_at(monkeypatch, "token:2", da, run_dir)  # token 1: the step-0 generation
    assert "SIGTERM during token after step 2" in summary["detail"]
    assert (2, "eval") in rows(run_dir)
    assert_resumes_to(da, run_dir, straight / "da")


def test_a_stop_during_a_policy_gradient_rollout(tmp_path, monkeypatch, straight):
    """Step 2's rollout is being generated: the checkpoint is step 1, with its random state."""
    run_dir = tmp_path / "run"
    summary = stop_at(monkeypatch, "generating:2", pg, run_dir)
    assert "SIGTERM during token in step 2" in summary["detail"]
    assert checkpoints(run_dir) == ["step-0000001"]
    assert max(step for step, _ in rows(run_dir)) == 1
    assert_resumes_to(pg, run_dir, straight / "pg")


# ---------------------------------------------------------------------------------------------
# The lab: stop waits, SIGKILL only after the grace period, and then it says `killed`
# ---------------------------------------------------------------------------------------------


IGNORES_SIGTERM = (
    "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "d = os.path.join(sys.argv[1], 'checkpoints', 'step-0000004'); os.makedirs(d); "
    "open(os.path.join(d, 'state.pt'), 'w').close(); time.sleep(60)"
)


def test_a_trainer_that_ignores_sigterm_is_killed_and_reported_so(
    tmp_path, monkeypatch, stand_in_trainer
):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    stand_in_trainer(IGNORES_SIGTERM)
    run = api.launch(
        api.RunRequest(recipe="dpo", overrides=[], model="tiny", campaign="kill", force=True)
    ).run
    ready = Path(run.run_dir) / "checkpoints" / "step-0000004" / "state.pt"
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:  # it ignores SIGTERM from here on
        time.sleep(0.05)
    result = api.stop_run(run.id, grace_s=0.5)
    assert result.state == "killed" and not result.alive
    assert result.last_checkpoint_step == 4
    assert "killed" in result.message and "work after checkpoint step 4 is lost" in result.message
    assert "resume continues from checkpoint step 4" in result.message
    assert json.loads((Path(run.run_dir) / "run.json").read_text())["state"] == "killed"
    assert api.run_status(run.id).status.state == "killed"  # stays killed when read again
    assert [s.id for s in api.list_runs(state="killed")] == [run.id]
    shown = CliRunner().invoke(app, ["stop", run.id])
    assert shown.exit_code == 0 and "already ended (killed)" in shown.output
    stand_in_trainer("pass")  # this attempt succeeds
    resumed = api.resume_run(run.id, force=True)  # a killed run resumes from its checkpoint
    assert "from checkpoint step 4" in resumed.message
    final = runs.wait_for_end(run.id, poll_s=0.1, timeout_s=60)
    assert final.state == "succeeded", final  # the earlier stop's SIGKILL is history now
    record = json.loads((Path(run.run_dir) / "run.json").read_text())
    assert [r["state"] for r in record["resumes"]] == ["killed"]


def test_killed_only_when_the_trainer_had_not_written_outcome_stopped(tmp_path, monkeypatch):
    """The state rule, on run folders written by hand: a stop that sent SIGKILL (``killed_at``)
    to a trainer that had already written outcome ``stopped`` (it was only slow to exit) is a
    stop; without that outcome it is ``killed``, and the status says what was lost."""
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    runs_dir = tmp_path / "experiments" / "2026-01-01-kill" / "runs"
    for name, outcome in (
        ("dpo-20260101-000000-aaaa", "stopped"),
        ("dpo-20260101-000000-bbbb", None),
    ):
        run_dir = synthetic.finished_run(runs_dir / name, state="died")
        record = json.loads((run_dir / "run.json").read_text())
        record.update(
            state="running", stop_requested_at=record["ended_at"], killed_at=record["ended_at"]
        )
        (run_dir / "run.json").write_text(json.dumps(record))
        if outcome:
            (run_dir / "summary.json").write_text(json.dumps({"outcome": outcome}))
    assert api.run_status("dpo-20260101-000000-aaaa").status.state == "stopped"
    killed = api.run_status("dpo-20260101-000000-bbbb")
    assert killed.status.state == "killed" and "SIGKILL" in killed.status.error
    assert "killed" in killed.advice and "resume_run" in killed.advice
    shown = CliRunner().invoke(app, ["status", "dpo-20260101-000000-bbbb"])
    assert "[killed]" in shown.output


# ---------------------------------------------------------------------------------------------
# Ctrl-C in `launch --foreground`
# ---------------------------------------------------------------------------------------------


def test_ctrl_c_asks_once_at_a_terminal_and_stops_without_one():
    asked: list[str] = []

    def answer(text):
        return lambda prompt: asked.append(prompt) or text

    assert _stop_or_detach(False, answer("d")) == "stop" and asked == []  # no TTY: no question
    assert _stop_or_detach(True, answer("d")) == "detach"
    assert _stop_or_detach(True, answer(" Detach\n")) == "detach"
    assert _stop_or_detach(True, answer("s")) == "stop"
    assert _stop_or_detach(True, answer("")) == "stop"  # the default
    assert _stop_or_detach(True, answer(None)) == "stop"  # end of input or a second Ctrl-C
    assert asked == ["stop the run or detach? [S/d] "] * 5


def test_a_ctrl_c_before_the_run_is_followed_is_kept_for_it(capfd):
    """The foreground launch's handler (rlhf_lab/cli/interrupts.py), in this process: a SIGINT
    while launching is noted and raised once the run is followed, a second one while launching
    aborts, and the handler found before the command (here SIGINT ignored) comes back."""
    from rlhf_lab.cli.interrupts import NOTED, Interrupts, sigint_restored

    @sigint_restored
    def launch(twice: bool) -> int:
        interrupts = Interrupts().install()
        signal.raise_signal(signal.SIGINT)  # noted: nothing raised while launching
        assert interrupts.noted == 1
        if twice:
            signal.raise_signal(signal.SIGINT)  # raises: the launch is aborted
        with pytest.raises(KeyboardInterrupt):
            interrupts.follow()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # while following: at once
        return interrupts.noted

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert launch(twice=False) == 1
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        with pytest.raises(KeyboardInterrupt):
            launch(twice=True)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert capfd.readouterr().err.count(NOTED) == 2  # one line on stderr per noted Ctrl-C


def _progress_step(root: Path) -> int:
    for path in root.glob("experiments/*/runs/*/progress.json"):
        try:
            return int(json.loads(path.read_text()).get("step") or 0)
        except (OSError, ValueError):
            return 0
    return 0


# when the test sends SIGINT: (lines printed so far, lab root) -> whether it is time
CTRL_C_MOMENTS = {
    # the run folder exists: the CLI is still launching it
    "while launching": lambda lines, root: any(root.glob("experiments/*/runs/*/run.json")),
    # the launch returned; the CLI has not started following the run yet
    "before the first log line": lambda lines, root: any(
        line.startswith("run id:") for line in lines
    ),
    "right after the first log line": lambda lines, root: any(
        line.startswith("[rlhf-lab]") for line in lines
    ),
    "mid-run": lambda lines, root: _progress_step(root) >= 1,
}


@pytest.mark.parametrize(
    ("moment", "inherited"),
    [(moment, "default") for moment in CTRL_C_MOMENTS]
    + [("right after the first log line", "ignored"), ("while launching", "ignored")],
)
def test_ctrl_c_in_a_non_interactive_foreground_launch_stops_the_run(tmp_path, moment, inherited):
    """A real `rlhf-lab launch --foreground` without a terminal gets one SIGINT, at each moment
    of the launch: it stops the run through the lab's stop (the trainer ends on its own)
    instead of detaching, losing the signal or dying with the run left going. "ignored": the
    CLI starts with SIGINT ignored, as a script's background job does (``cmd &`` without job
    control), where Python installs no handler of its own: the one Ctrl-C of a run in the
    foreground was lost there, the run went on to its end and the CLI exited 0."""
    env = {**os.environ, "RLHF_LAB_ROOT": str(tmp_path)}
    argv = [sys.executable, "-m", "rlhf_lab.cli", "launch", "dpo", "--model", "tiny", "--force"]
    argv += ["--set", "train.max_steps=500", "--campaign", "fg", "--foreground"]
    if inherited == "ignored":
        argv = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
    cli = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines: list[str] = []

    def read() -> None:
        for line in cli.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while not CTRL_C_MOMENTS[moment](list(lines), tmp_path):
            assert cli.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.01)
        cli.send_signal(signal.SIGINT)
        cli.wait(timeout=180)
        reader.join(timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()
    text = "".join(lines)
    run_id = next(line for line in lines if line.startswith("run id:")).split()[-1]
    assert cli.returncode == 1, text
    assert f"stopping {run_id}" in text and f"{run_id} stopped" in text, text
    record = json.loads(next(tmp_path.glob(f"experiments/*/runs/{run_id}/run.json")).read_text())
    assert record["state"] == "stopped" and record.get("stop_requested_at")
    assert "killed_at" not in record
