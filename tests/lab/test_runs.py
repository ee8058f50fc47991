"""The launcher end to end with REAL short direct-alignment runs on the `tiny` model (started
detached through rlhf_lab._wrapper), plus cheap fake trainers for the process-control edge cases.

The real runs all start together in one module fixture so that their start-up (importing torch)
overlaps on the machine's two cores; each test then checks one of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import psutil
import pytest
import yaml

import rlhf_lab
from rlhf_lab import _queue, runs
from rlhf_lab.demo import DPO_SANITY_OVERRIDES
from rlhf_lab.paths import LabError
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.results.diagnosis import diagnose
from tests._helpers.races import at_once
from tests._lab_processes import kill_live_runs, wait_until
from trainers.core.config import load_config
from trainers.direct_alignment.config import DirectAlignmentConfig

SRC = Path(rlhf_lab.__file__).resolve().parents[1]
RECIPE = SRC / "trainers" / "direct_alignment" / "configs" / "dpo.yaml"
QUICK = DPO_SANITY_OVERRIDES + [
    "data.max_samples=32",
    "data.eval_size=8",
    "data.max_length=96",
    "train.batch_size=8",
    "train.max_steps=3",
    "eval.eval_every=0",
    "eval.sample_every=0",
    "eval.num_samples=1",
    "eval.sample_max_new_tokens=8",
    "checkpoint.save_final_model=false",
]
# A stand-in trainer (tests/conftest.py: stand_in_trainer) that lives until it is stopped.
SLEEPS = "import time; time.sleep(30)"
# Runs until it is stopped or killed (thousands of steps).
LONG = QUICK + ["train.num_epochs=1000", "train.max_steps=3000", "model.device=cpu"]
# The queued pair runs on its own device label so it need not wait for the other real runs;
# the config pins the CPU, so the label only matters to the lab's bookkeeping.
QUEUE_DEVICE = "cuda:7"


def config(overrides: list[str]) -> TrainerConfig:
    data = load_config(RECIPE, DirectAlignmentConfig, overrides).model_dump(mode="json")
    return TrainerConfig("direct_alignment", data)


def new_run(
    cfg: TrainerConfig, campaign: str, source: str = "x", overrides=(), **kw
) -> runs.NewRun:
    """A DPO run to create, as the API hands it to the runs layer (``kw`` wins over these)."""
    fields = {"family": "direct_alignment", "algorithm": "dpo", "config": cfg}
    fields.update(campaign=campaign, source=source, overrides=list(overrides))
    return runs.NewRun(**{**fields, **kw})


def launch(
    overrides: list[str],
    campaign: str = "launcher-test",
    *,
    queue: bool = False,
    force: bool = False,
    fits_together: bool | None = None,
    **kw,
) -> runs.LaunchResult:
    run = new_run(config(overrides), campaign, str(RECIPE), overrides, **kw)
    return runs.start_or_queue(run, queue=queue, force=force, fits_together=fits_together)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("labroot")
    mp = pytest.MonkeyPatch()
    mp.setenv("RLHF_LAB_ROOT", str(root))
    mp.setenv("OMP_NUM_THREADS", "1")  # several trainers share two cores
    mp.setenv("MKL_NUM_THREADS", "1")
    yield root
    kill_live_runs(root)  # never leave a test's processes behind
    mp.undo()


LAUNCHER = """
import sys
from rlhf_lab import runs
from rlhf_lab.planning.trainer_config import TrainerConfig
from trainers.core.config import load_config
from trainers.direct_alignment.config import DirectAlignmentConfig
overrides = sys.argv[2:]
data = load_config(sys.argv[1], DirectAlignmentConfig, overrides).model_dump(mode="json")
cfg = TrainerConfig("direct_alignment", data)
run = runs.NewRun(family="direct_alignment", algorithm="dpo", config=cfg,
                  campaign="orphan-test", source=sys.argv[1], overrides=overrides, device="cpu")
result = runs.start_or_queue(run)
print(result.run.id)
"""


@pytest.fixture(scope="module")
def fleet(lab_root):
    """Every real run this module needs, started at once (three trainers):

    orphan launched on cpu by a process that exits at once: running, then succeeded;
    q1, q2 queued on QUEUE_DEVICE, both long: q1 runs first and is stopped; q2 starts only after
    q1 ended, and its trainer is then killed with SIGKILL.
    """
    out = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(RECIPE), *QUICK],
        cwd=SRC,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    fleet = {"orphan": out.stdout.strip().splitlines()[-1]}
    fleet["orphan_first_state"] = runs.run_state(fleet["orphan"]).state
    fleet["q1"] = launch(LONG, campaign="queue-test", device=QUEUE_DEVICE, queue=True)
    fleet["q2"] = launch(LONG, campaign="queue-test", device=QUEUE_DEVICE, queue=True)
    return fleet


# ---------------------------------------------------------------------------------------------
# Cheap checks (no trainer)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "..",
        "../x",
        "a/b",
        "/etc/passwd",
        "dpo\x00x",
        "dpo-1\n",
        "DPO-1",
        "dpo_1",
        "a--b",
        "x" * 200,
        "-a",
        " a",
    ],
)
def test_bad_run_ids_are_rejected(bad, tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    with pytest.raises(LabError, match="bad run id"):
        runs.find_run(bad)
    with pytest.raises(LabError, match="bad run id"):
        runs.run_state(bad)
    with pytest.raises(LabError):
        runs.stop_run(bad)
    assert not (tmp_path / "experiments").exists()


def test_unknown_run_and_bad_inputs_create_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    with pytest.raises(LabError, match="no run"):
        runs.find_run("dpo-20260101-000000-abcd")
    cfg = config(QUICK)
    bad_inputs = [  # (the error, the campaign, the run's other fields that differ)
        ("campaign slug", "../evil", {}),
        ("unknown family", "ok", {"family": "../trainers"}),
        ("algorithm", "ok", {"algorithm": "dpo/../x"}),
        ("device", "ok", {"device": "tpu"}),
        ("mapping", "ok", {"config": TrainerConfig("direct_alignment", {})}),
    ]
    for error, campaign, bad in bad_inputs:
        with pytest.raises(LabError, match=error):
            runs.prepare_run(new_run(cfg, campaign, **bad))
    assert list(tmp_path.glob("experiments/*/runs/*")) == []


def test_prepare_run_writes_config_and_run_json(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    cfg = config(QUICK)
    info = runs.prepare_run(new_run(cfg, "prep", str(RECIPE), QUICK, device="cpu"), state="queued")
    run_dir = Path(info.run_dir)
    assert run_dir.parent.parent.name.endswith("-prep") and run_dir.name == info.id
    assert runs.find_run(info.id) == run_dir
    record = read_json(run_dir / "run.json")
    assert record["state"] == "queued" and record["overrides"] == QUICK
    assert record["argv"][1:3] == ["-m", "trainers.direct_alignment.train"]
    from trainers.core.config import read_yaml

    assert read_yaml(run_dir / "config.yaml") == cfg.to_data()
    assert (run_dir / "config.yaml").read_text() == yaml.safe_dump(cfg.to_data(), sort_keys=False)
    # a queued run that is stopped before it starts is simply marked stopped
    status = runs.stop_run(info.id)
    assert status.state == "stopped" and not status.alive
    assert runs.list_runs(campaign="prep", state="stopped")[0].id == info.id
    with pytest.raises(LabError, match="unknown state"):
        runs.list_runs(state="bogus")


def test_reused_pid_is_not_reported_as_running(tmp_path, monkeypatch):
    """run.json names this very test process's pid but a different create time."""
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    info = runs.prepare_run(new_run(config(QUICK), "reuse"))
    path = Path(info.run_dir) / "run.json"
    record = read_json(path)
    me = psutil.Process()
    record.update(state="running", pid=os.getpid(), pgid=os.getpgid(0))
    record["create_time"] = me.create_time() - 1000.0
    path.write_text(json.dumps(record))
    status = runs.run_state(info.id)
    assert status.state == "died" and not status.alive
    assert read_json(path)["state"] == "died"  # run.json updated
    assert runs.active_runs() == []
    # the same pid with the right create time *is* alive
    info2 = runs.prepare_run(new_run(config(QUICK), "reuse"))
    path2 = Path(info2.run_dir) / "run.json"
    record2 = {**read_json(path2), "state": "running", "pid": os.getpid()}
    record2["create_time"] = me.create_time()
    path2.write_text(json.dumps(record2))
    assert runs.run_state(info2.id).state == "running"
    assert [s.id for s in runs.active_runs()] == [info2.id]


def test_status_reads_progress_metrics_summary_and_stale_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    info = runs.prepare_run(new_run(config(QUICK), "status"))
    run_dir = Path(info.run_dir)
    record = {**read_json(run_dir / "run.json"), "state": "running", "pid": os.getpid()}
    record["create_time"] = psutil.Process().create_time()  # "alive": this test process
    (run_dir / "run.json").write_text(json.dumps(record))
    (run_dir / "progress.json").write_text(
        json.dumps({"step": 10, "total_steps": 110, "elapsed_s": 100.0, "updated_at": 1.0})
    )
    rows = [
        {"step": 0, "time_s": 30.0, "phase": "eval", "eval/accuracy": 0.5},
        {"step": 5, "time_s": 60.0, "phase": "train", "loss": 0.7},
        {"step": 10, "time_s": 70.0, "phase": "train", "loss": 0.6},
        {"step": 10, "time_s": 71.0, "phase": "eval", "eval/accuracy": 0.75},
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 11, "ti'  # cut mid-line
    (run_dir / "metrics.jsonl").write_text(text)
    status = runs.run_state(info.id)
    assert status.state == "running" and status.alive
    assert status.step == 10 and status.total_steps == 110
    assert status.eta_s == pytest.approx(200.0)  # 2 s per step between the logged train rows
    assert status.last_train["loss"] == 0.6 and status.last_eval["eval/accuracy"] == 0.75

    # it ends: a summary with a W&B link, an exit status from the wrapper
    (run_dir / "summary.json").write_text(
        json.dumps({"outcome": "succeeded", "wandb_url": "https://wandb.ai/x/y/runs/z"})
    )
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "signal": None}))
    record["create_time"] -= 1000  # the process is gone (a different process holds the pid)
    (run_dir / "run.json").write_text(json.dumps(record))
    status = runs.run_state(info.id)
    assert status.state == "succeeded" and status.eta_s is None
    assert status.wandb_url == read_json(run_dir / "run.json")["wandb_url"]
    assert status.wandb_url.startswith("https://wandb.ai/")
    assert runs.stop_run(info.id).state == "succeeded"  # stopping a finished run changes nothing

    # a run left in "starting" by a launcher that died before starting the process
    stale = runs.prepare_run(new_run(config(QUICK), "status"))
    path = Path(stale.run_dir) / "run.json"
    assert runs.run_state(stale.id).state == "starting"
    path.write_text(json.dumps({**read_json(path), "created_at": "2020-01-01T00:00:00+00:00"}))
    status = runs.run_state(stale.id)
    assert status.state == "died" and "launcher" in status.error


def test_resume_restarts_a_died_run_with_resume_and_keeps_the_attempt(
    tmp_path, monkeypatch, stand_in_trainer
):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    stand_in_trainer(SLEEPS)
    info = runs.start_or_queue(new_run(config(QUICK), "resume")).run
    run_dir = Path(info.run_dir)
    with pytest.raises(LabError, match="stop it first"):
        runs.resume_run(info.id)  # still running
    os.killpg(info.pgid, signal.SIGKILL)
    wait_until(lambda: runs.run_state(info.id).state == "died", 10, "died state")
    with pytest.raises(LabError, match="no checkpoint"):
        runs.resume_run(info.id)
    (run_dir / "checkpoints" / ".tmp-step-0000004-1").mkdir(parents=True)  # partial: ignored
    (run_dir / "checkpoints" / "step-0000002").mkdir()
    (run_dir / "checkpoints" / "step-0000002" / "state.pt").write_bytes(b"x")
    (run_dir / "summary.json").write_text('{"outcome": "failed", "error": "old"}')
    try:
        result = runs.resume_run(info.id)
        assert "step 2" in result.message and result.run.argv[-1] == "--resume"
        status = runs.run_state(info.id)
        assert status.state == "running" and status.pid != info.pid
        record = read_json(run_dir / "run.json")
        assert [r["state"] for r in record["resumes"]] == ["died"]
        assert record["resumes"][0]["from_step"] == 2
        assert "error" not in record and "ended_at" not in record
        # the old attempt's files no longer decide the state
        assert not (run_dir / "summary.json").exists()
        assert read_json(run_dir / "attempts" / "1" / "summary.json")["error"] == "old"
    finally:
        runs.stop_run(info.id, grace_s=2)
    assert runs.run_state(info.id).state == "stopped"
    # a stopped run can be resumed again; a second attempt folder keeps the first
    runs.resume_run(info.id)
    runs.stop_run(info.id, grace_s=2)
    assert len(read_json(run_dir / "run.json")["resumes"]) == 2
    assert (run_dir / "attempts" / "2").is_dir()


def test_racing_launches_on_one_device_start_only_one(tmp_path, monkeypatch, stand_in_trainer):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    stand_in_trainer(SLEEPS)
    cfg = config(QUICK)
    extra = []
    results, refusals = at_once(lambda: runs.start_or_queue(new_run(cfg, "race")), 4, join_s=60)
    errors = [str(err) for err in refusals]
    try:
        assert len(results) == 1 and len(errors) == 3, (results, errors)
        winner = results[0].run
        assert all(winner.id in e and "force=True" in e and "queue=True" in e for e in errors)
        assert len(list(tmp_path.glob("experiments/*/runs/*"))) == 1  # losers wrote nothing
        # fits_together (the caller's memory check) lets a second job share the device
        shared = runs.start_or_queue(
            new_run(cfg, "race"),
            fits_together=True,
        )
        extra.append(shared.run)
        assert shared.sharing_device_with == [winner.id]
        assert {s.id for s in runs.active_runs("cpu")} == {winner.id, shared.run.id}
        with pytest.raises(LabError, match="both do not fit"):
            runs.start_or_queue(
                new_run(cfg, "race"),
                fits_together=False,
            )
    finally:
        for info in [r.run for r in results] + extra:
            runs.stop_run(info.id, grace_s=5)
    assert runs.active_runs() == []


def test_cpu_runs_started_beside_others_get_their_share_of_the_cores(
    tmp_path, monkeypatch, machine, stand_in_trainer
):
    assert [runs.cpu_threads_beside(n, 4) for n in range(5)] == [4, 2, 1, 1, 1]
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    machine(cores=4)

    stand_in_trainer(
        "import os, sys, time; from pathlib import Path; "
        "Path(sys.argv[1], 'omp.txt').write_text(os.environ.get('OMP_NUM_THREADS', 'unset'));"
        " time.sleep(30)"
    )
    cfg = config(QUICK + ["model.device=cpu"])
    started = []
    try:
        for kw in ({}, {"fits_together": True}, {"force": True}):
            started.append(runs.start_or_queue(new_run(cfg, "cores"), **kw).run)
        seen = [
            wait_until(lambda d=Path(i.run_dir): (d / "omp.txt").is_file(), 30, "the trainer")
            and (Path(i.run_dir) / "omp.txt").read_text()
            for i in started
        ]
        assert seen == ["unset", "2", "1"]  # alone: torch's default; then 4 // 2, 4 // 3
        records = [read_json(Path(i.run_dir) / "run.json") for i in started]
        assert [r.get("cpu_threads") for r in records] == [None, 2, 1]
        log = (Path(started[2].run_dir) / "train.log").read_text()
        assert f"sharing the CPU with {started[0].id}, {started[1].id}" in log
        # a thread count the user set is left alone
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        mine = runs.start_or_queue(
            new_run(cfg, "cores"),
            force=True,
        ).run
        started.append(mine)
        omp = Path(mine.run_dir) / "omp.txt"
        assert wait_until(omp.is_file, 30, "the trainer") and omp.read_text() == "3"
    finally:
        for info in started:
            runs.stop_run(info.id, grace_s=5)
    assert runs.active_runs() == []


def test_wrapper_killed_with_its_group_is_died_and_ignored_sigterm_escalates(
    tmp_path, monkeypatch, stand_in_trainer
):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    stand_in_trainer(SLEEPS)
    cfg = config(QUICK)
    info = runs.start_or_queue(new_run(cfg, "kill")).run
    assert runs.run_state(info.id).state == "running"
    os.killpg(info.pgid, signal.SIGKILL)  # wrapper and trainer both gone: no exit.json
    status = wait_until(
        lambda: (s := runs.run_state(info.id)).state != "running" and s, 10, "died state"
    )
    assert status.state == "died" and not (Path(info.run_dir) / "exit.json").exists()
    assert "died" in [a.kind for a in diagnose(info.id)]

    # A trainer that ignores SIGTERM is killed after the grace period; the run is "killed"
    # (tests/reliability/test_stop.py checks what the stop then says was lost).
    stand_in_trainer(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(30)"
    )
    info = runs.start_or_queue(new_run(cfg, "kill")).run
    # the line the trainer prints (the log's header names the command, 'ready' included)
    wait_until(lambda: "\nready\n" in (Path(info.run_dir) / "train.log").read_text(), 20, "ready")
    t0 = time.time()
    status = runs.stop_run(info.id, grace_s=1.0)
    assert status.state == "killed" and not status.alive
    assert time.time() - t0 < 8


def test_exit_code_is_recorded_by_the_wrapper(tmp_path, monkeypatch, stand_in_trainer):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    stand_in_trainer("import sys; print('boom', flush=True); sys.exit(3)")
    info = runs.start_or_queue(new_run(config(QUICK), "exit")).run
    status = wait_until(lambda: (s := runs.run_state(info.id)).terminal and s, 20, "end")
    assert status.state == "failed" and status.exit_code == 3 and status.signal is None
    assert read_json(Path(info.run_dir) / "exit.json")["exit_code"] == 3
    record = read_json(Path(info.run_dir) / "run.json")
    assert record["state"] == "failed" and record["exit_code"] == 3 and record["ended_at"]


def test_queue_hook_calls_ledger_record_run_and_survives_errors(monkeypatch):
    calls = []
    fake = types.ModuleType("rlhf_lab.ledger")
    fake.record_run = calls.append
    monkeypatch.setitem(sys.modules, "rlhf_lab.ledger", fake)
    monkeypatch.setattr(rlhf_lab, "ledger", fake, raising=False)
    _queue.record_hook("dpo-20260101-000000-abcd")
    assert calls == ["dpo-20260101-000000-abcd"]

    def broken(run_id):
        raise RuntimeError("ledger is broken")

    fake.record_run = broken
    _queue.record_hook("dpo-20260101-000000-abcd")  # must not raise


# ---------------------------------------------------------------------------------------------
# Real trainer runs
# ---------------------------------------------------------------------------------------------


def wait_for_step(run_id: str, step: int = 1, timeout: float = 150) -> runs.RunStatus:
    return wait_until(
        lambda: (s := runs.run_state(run_id)).step is not None and s.step >= step and s,
        timeout,
        f"{run_id} to reach step {step}",
    )


def test_launch_records_the_run_and_holds_the_device(fleet, lab_root):
    run_id = fleet["orphan"]  # launched by a process that has exited since
    assert fleet["orphan_first_state"] == "running"
    run_dir = runs.find_run(run_id)
    record = read_json(run_dir / "run.json")
    for key in ("pid", "pgid", "create_time", "host", "git_commit", "versions", "argv", "cwd"):
        assert record.get(key) is not None, key
    assert record["pgid"] == record["pid"] and record["device"] == "cpu"
    assert record["argv"][1:3] == ["-m", "trainers.direct_alignment.train"]
    assert "torch" in record["versions"] and record["cwd"] == str(SRC)
    assert record["overrides"] == QUICK and record["config_source"] == str(RECIPE)
    assert runs.run_state(run_id).state == "running"  # start-up alone takes seconds
    wrapper = psutil.Process(record["pid"])
    assert wrapper.create_time() == pytest.approx(record["create_time"], abs=0.05)
    assert wrapper.ppid() != os.getpid()  # its launcher is gone; it was re-parented
    assert os.getpgid(record["pid"]) == record["pid"] != os.getpgid(0)  # its own group

    # the device is taken: another launch names the running job, suggests --force/--queue
    before = set(lab_root.glob("experiments/*/runs/*"))
    with pytest.raises(LabError) as err:
        launch(QUICK, device="cpu")
    text = str(err.value)
    assert run_id in text and f"pid {record['pid']}" in text and "step" in text
    assert "busy" in text and "force=True" in text and "queue=True" in text
    assert set(lab_root.glob("experiments/*/runs/*")) == before


@pytest.mark.slow  # waits for the shared fleet's start-up: ~35 s on a busy 2-core box
def test_run_outlives_its_launcher_and_succeeds(fleet):
    run_id = fleet["orphan"]
    seen, logs = [], []
    final = runs.follow_run(run_id, seen.append, logs.append, poll_s=0.3, timeout_s=240)
    assert final.state == "succeeded", (final, "".join(logs)[-2000:])
    assert final.outcome == "succeeded" and final.exit_code == 0 and final.ended_at
    assert final.step == final.total_steps == 3 and seen[-1].state == "succeeded"
    assert "loss" in final.last_train and "eval/accuracy" in final.last_eval
    text = "".join(logs)
    assert "step 3/3" in text and "trainer exited with code 0" in text
    run_dir = Path(final.run_dir)
    assert read_json(run_dir / "summary.json")["outcome"] == "succeeded"
    assert read_json(run_dir / "run.json")["state"] == "succeeded"
    assert read_json(run_dir / "exit.json")["exit_code"] == 0
    assert [s.id for s in runs.list_runs(campaign="orphan-test", state="succeeded")] == [run_id]


def stop_first_queued(fleet) -> runs.RunStatus:
    first = fleet["q1"].run.id
    status = runs.run_state(first)
    if status.terminal:
        return status
    wait_for_step(first)
    return runs.stop_run(first, grace_s=60)


def test_queue_starts_the_first_and_stop_ends_it(fleet):
    first, second = fleet["q1"], fleet["q2"]
    assert first.queued and second.queued and first.device == QUEUE_DEVICE
    assert first.state == "queued" and first.queue_position == 1
    assert second.queue_position in (1, 2)  # 1 if the worker already took the first
    status = wait_for_step(first.run.id)  # the worker started it
    assert status.state == "running" and status.device == QUEUE_DEVICE
    assert status.total_steps == 3000 and status.eta_s > 0
    assert runs.run_state(second.run.id).state == "queued"  # waits for the device

    status = stop_first_queued(fleet)
    assert status.state == "stopped" and not status.alive and status.stop_requested
    run_dir = Path(status.run_dir)
    assert read_json(run_dir / "summary.json")["outcome"] == "stopped"
    assert read_json(run_dir / "exit.json")["exit_code"] == 143  # the harness's stop code
    assert read_json(run_dir / "run.json")["state"] == "stopped"
    assert list((run_dir / "checkpoints").iterdir())  # the trainer checkpointed on SIGTERM


def test_queue_starts_the_second_after_the_first_then_kill_9_is_died(fleet, lab_root):
    s1 = stop_first_queued(fleet)
    run_id = fleet["q2"].run.id
    run_dir = runs.find_run(run_id)
    # kill the trainer as soon as it exists (no need to wait for training to begin)
    wait_until(lambda: (run_dir / "process.json").exists(), 60, "the second run to start")
    status = runs.run_state(run_id)
    assert status.state == "running"
    assert runs._parse_time(s1.ended_at) <= runs._parse_time(status.started_at)
    # the worker logs a start once the launch returns, which can be after the trainer wrote
    # process.json (a race the test lost once on a busy machine): wait for the line
    log = lab_root / "experiments" / ".lab" / "queue.log"
    wait_until(lambda: f"started {run_id}" in log.read_text(), 30, "the worker to log the start")
    queue_log = log.read_text()
    assert queue_log.index(f"started {s1.id}") < queue_log.index(f"started {run_id}")

    proc = read_json(run_dir / "process.json")
    trainer = psutil.Process(proc["trainer_pid"])
    assert str(run_dir) in " ".join(trainer.cmdline())
    trainer.send_signal(signal.SIGKILL)
    status = wait_until(lambda: (s := runs.run_state(run_id)).terminal and s, 30, "died")
    assert status.state == "died" and status.signal == signal.SIGKILL and not status.alive
    assert read_json(run_dir / "exit.json")["signal"] == 9  # the wrapper survived to record it
    assert read_json(run_dir / "run.json")["state"] == "died"
    alerts = diagnose(run_id)
    oom = [a for a in alerts if a.kind == "oom"]
    assert oom and oom[0].severity == "error" and "SIGKILL" in oom[0].message and oom[0].hint

    path = lab_root / "experiments" / ".lab" / "queue.log"
    wait_until(lambda: "worker exits" in path.read_text(), 30, "the queue worker to exit")
    assert path.read_text().count("worker started") == 1  # one worker ran both
