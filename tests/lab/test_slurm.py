"""Cluster runs through a REAL one-node Slurm (Debian slurm-wlm + munge on this machine, brought
up by tests/e2e/slurm.py; ``.ci/run`` does it before the suite and sets
``RLHF_LAB_REQUIRE_SLURM=1``, so in CI these tests fail rather than skip when Slurm is missing).

Three shrunk tiny SFT runs are submitted together (module fixture) so that their start-up
overlaps: one goes through Slurm to ``succeeded`` (pending -> running -> succeeded, the log read
by ``tail``); one is stopped while it trains (``scancel --signal=TERM`` to the job's steps: the
trainer checkpoints, the run is ``stopped`` and resumes as a new job); one reaches Slurm's time
limit (``--time 10``, lowered by ``scontrol`` once it trains): Slurm's SIGTERM 30 s before the
limit reaches the trainer, which checkpoints; the run is ``failed`` with that reason and
``resume`` continues it from the checkpoint. The cheap checks (the job script, ``plan --slurm``,
a machine without sbatch, bad options) need no cluster.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rlhf_lab.api as api
from rlhf_lab import runs
from rlhf_lab.errors import InvalidArgument, LabError, Unavailable
from rlhf_lab.planning.calibration_apply import CalibrationPolicy, read_calibration, using
from rlhf_lab.runs.slurm import SlurmOptions, job_script, signal_lead_s, time_limit_s
from tests._helpers.lab_launches import queue_on_tiny
from tests._helpers.stub_probe import RATES, StubProbe

ROOT = Path(__file__).resolve().parents[2]
QUICK = [
    "data.max_samples=32",
    "data.eval_size=8",
    "train.batch_size=4",
    "train.max_steps=2",
    "eval.eval_every=2",
    "eval.sample_every=0",
    "checkpoint.save_final_model=false",
]
# Trains until it is stopped or Slurm ends it (tiny steps, a checkpoint every 5).
LONG = [
    *QUICK,
    "train.max_steps=100000",
    "train.num_epochs=10000",
    "eval.eval_every=100000",
    "checkpoint.save_every=5",
]
DEADLINE_S = 420  # bounded polls: two busy cores, torch imported twice per job (torchrun + rank)


def _slurm_setup():
    spec = importlib.util.spec_from_file_location("rlhf_lab_e2e_slurm", ROOT / "tests/e2e/slurm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_until(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = _slurm_setup().ensure_slurm()
    if reason:
        if os.environ.get("RLHF_LAB_REQUIRE_SLURM"):
            pytest.fail(f"RLHF_LAB_REQUIRE_SLURM is set but {reason}")
        pytest.skip(f"no Slurm here: {reason}")
    root = tmp_path_factory.mktemp("slurm-lab")
    old = os.environ.get("RLHF_LAB_ROOT")
    os.environ["RLHF_LAB_ROOT"] = str(root)
    submitted = {
        "ok": api.launch(
            api.RunRequest(recipe="sft", overrides=QUICK, model="tiny", campaign="slurm", slurm={})
        ),
        "stop": api.launch(
            api.RunRequest(recipe="sft", overrides=LONG, model="tiny", campaign="slurm", slurm={})
        ),
        # ten minutes asked; once it trains the test lowers the limit with scontrol (a start-up
        # slower than the limit would leave nothing to checkpoint: on a loaded machine torchrun
        # took two minutes to start)
        "limit": api.launch(
            api.RunRequest(
                recipe="sft", overrides=LONG, model="tiny", campaign="slurm", slurm={"time": "10"}
            )
        ),
    }
    yield {name: result.run.id for name, result in submitted.items()}
    for run_id in (r.run.id for r in submitted.values()):
        job = (runs.run_state(run_id).slurm_job or "").strip()
        if job:
            subprocess.run(["scancel", job], capture_output=True)
    if old is None:
        os.environ.pop("RLHF_LAB_ROOT", None)
    else:
        os.environ["RLHF_LAB_ROOT"] = old


@pytest.mark.slow
def test_a_slurm_run_goes_from_pending_to_succeeded(cluster):
    run_id = cluster["ok"]
    first = runs.run_state(run_id)
    assert first.slurm_job and first.state in ("queued", "running")
    run_dir = Path(first.run_dir)
    script = (run_dir / "job.sh").read_text()
    assert (
        "srun" in script and "torch.distributed.run" in script and "--rdzv-backend c10d" in script
    )
    final = wait_until(
        lambda: (s := runs.run_state(run_id)).terminal and s, DEADLINE_S, "the run to end"
    )
    assert final.state == "succeeded", (final.error, (run_dir / "train.log").read_text()[-2000:])
    assert final.slurm_state in ("COMPLETED", None)
    assert (run_dir / "exit.json").is_file()  # the lab's exit record, written inside the job
    log = api.tail_logs(run_id, lines=50)  # tail reads the job's log in the run folder
    assert f"Slurm job {final.slurm_job}" in log.text and "exited with code 0" in log.text


@pytest.mark.slow
def test_a_calibrated_slurm_launch_keeps_its_calibration_in_the_run_folder(cluster):
    """A shrunk GRPO run probes its task on this machine before it is submitted; the probe's
    table and choice go into the run folder (calibration.json) and the ledger, as for a local
    run (a Slurm launch wrote none before). The job is cancelled once submitted."""
    small = ["train.max_steps=1", "data.size=4", "data.eval_size=2", "rollout.num_rollouts=2"]
    with using(CalibrationPolicy(probe=StubProbe(RATES), cache_dir=None)):
        result = api.launch(
            api.RunRequest(recipe="grpo", overrides=small, model="tiny", campaign="cal", slurm={})
        )
    job = (runs.run_state(result.run.id).slurm_job or "").strip()
    if job:
        subprocess.run(["scancel", job], capture_output=True)
    cal = read_calibration(result.run.run_dir)
    assert cal is not None and cal.choice.chosen == "letter_counting/1-3-words"
    assert "difficulty calibration of tiny" in api.show_campaign("cal").markdown


@pytest.mark.slow
def test_stop_signals_the_job_and_the_run_is_stopped_then_resubmitted(cluster):
    run_id = cluster["stop"]
    wait_until(
        lambda: (s := runs.run_state(run_id)).state == "running" and (s.step or 0) >= 6,
        DEADLINE_S,
        "the long run to train past its first checkpoint",
    )
    stopped = runs.stop_run(run_id, grace_s=120)
    assert stopped.state == "stopped", stopped.message
    assert stopped.last_checkpoint_step is not None and stopped.last_checkpoint_step >= 5
    job = stopped.slurm_job
    resumed = api.resume_run(run_id)
    assert resumed.queued and resumed.run.slurm["job_id"] != job
    assert resumed.run.slurm["jobs"] == [job, resumed.run.slurm["job_id"]]
    assert "--resume" in (Path(resumed.run.run_dir) / "job.sh").read_text()
    again = runs.stop_run(run_id, grace_s=5)  # pending or starting: ends without training
    assert again.state in ("stopped", "killed")


def _deafen_slurm(folder: Path, monkeypatch) -> Path:
    """SLURM_CONF pointed at a copy of this cluster's configuration whose controller port
    nobody listens on: the real squeue, scontrol and scancel then fail as they do when slurmctld
    is down or too busy to answer (MessageTimeout=1, so each fails at once). Returns the
    configuration in use before."""
    conf = Path(os.environ.get("SLURM_CONF") or _slurm_setup().CONF)
    kept = [x for x in conf.read_text().splitlines() if not x.startswith(("SlurmctldPort", "Mess"))]
    deaf = folder / "unreachable-slurm.conf"
    deaf.write_text("\n".join([*kept, "SlurmctldPort=6899", "MessageTimeout=1", ""]))
    monkeypatch.setenv("SLURM_CONF", str(deaf))
    return conf


def test_a_job_slurm_has_forgotten_is_died_but_an_unanswered_query_changes_nothing(
    cluster, monkeypatch, tmp_path
):
    """A CI failure: squeue timed out on a busy controller just after a resubmission, and the
    lab wrote the queued run down as died. Only Slurm saying it does not know the job may end
    a run; a controller that cannot be asked leaves the last state seen, written nowhere."""
    from rlhf_lab.runs.slurm import job_state, slurm_run_state

    forgotten = {"state": "queued", "slurm": {"job_id": "999999", "state": "PENDING"}}
    assert job_state("999999") == (None, None)
    assert slurm_run_state(forgotten, False, ("died", None))[0] == "died"

    _deafen_slurm(tmp_path, monkeypatch)
    with pytest.raises(Unavailable, match="controller did not answer about job 999999"):
        job_state("999999")
    for recorded, alive in (("queued", False), ("running", True)):
        record = {**forgotten, "state": recorded}
        assert slurm_run_state(record, False, ("died", None)) == (recorded, None, alive, "PENDING")


@pytest.mark.slow
def test_a_stop_slurm_cannot_hear_is_refused_and_leaves_the_run_as_it_was(
    cluster, monkeypatch, tmp_path
):
    """The run a stop could not reach Slurm for is neither died nor marked as being stopped
    (a stale stop request would turn its later end into ``stopped``); once Slurm answers
    again the same stop works."""
    launched = api.launch(
        api.RunRequest(recipe="sft", overrides=LONG, model="tiny", campaign="deaf", slurm={})
    )
    run_id = launched.run.id
    run_json = Path(launched.run.run_dir) / "run.json"
    conf = _deafen_slurm(tmp_path, monkeypatch)
    try:
        seen = runs.run_state(run_id)
        assert seen.state in ("queued", "running") and not seen.terminal, seen
        with pytest.raises(Unavailable, match="controller did not answer"):
            runs.stop_run(run_id, grace_s=5)
        record = json.loads(run_json.read_text())
        assert record["state"] in ("queued", "running") and "stop_requested_at" not in record
        monkeypatch.setenv("SLURM_CONF", str(conf))
        assert runs.stop_run(run_id, grace_s=30).state in ("stopped", "killed")
    finally:
        job = str(launched.run.slurm["job_id"])
        heard = {**os.environ, "SLURM_CONF": str(conf)}
        subprocess.run(["scancel", job], capture_output=True, env=heard)


@pytest.mark.slow
def test_slurm_time_limit_checkpoints_fails_with_the_reason_and_resumes(cluster):
    """#SBATCH --signal=B:TERM@30: the wrapper passes Slurm's warning to the trainer, which
    checkpoints and exits before the limit; the run is failed with the time limit as its reason
    and resume resubmits it from that checkpoint."""
    run_id = cluster["limit"]
    run_dir = Path(runs.run_state(run_id).run_dir)
    assert "#SBATCH --signal=B:TERM@30" in (run_dir / "job.sh").read_text()
    wait_until(
        lambda: (s := runs.run_state(run_id)).state == "running" and (s.step or 0) >= 6,
        DEADLINE_S,
        "the run to train past its first checkpoint",
    )
    job = runs.run_state(run_id).slurm_job
    elapsed = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%M"], capture_output=True, text=True
    ).stdout.strip()  # [D-]H:MM:SS or M:SS
    minutes = sum(int(x) * 60**i for i, x in enumerate(reversed(elapsed.split(":")))) // 60
    lowered = subprocess.run(
        ["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes + 1}"],
        capture_output=True,
        text=True,
    )
    assert lowered.returncode == 0, lowered.stderr
    final = wait_until(
        lambda: (s := runs.run_state(run_id)).terminal and s, DEADLINE_S, "the time limit"
    )
    log = (run_dir / "train.log").read_text()
    assert final.state == "failed", (final.error, log[-2000:])
    assert "time limit" in final.error and "(10)" in final.error, final.error
    assert "Slurm's time limit is near" in log and "SIGTERM" in log
    saved = [int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*")]
    steps = [line for line in log.splitlines() if "step " in line][-3:]
    assert saved and max(saved) >= 5, (steps, log[:1500])  # written when the warning came
    resumed = api.resume_run(run_id)
    assert resumed.queued and "--resume" in (run_dir / "job.sh").read_text()
    wait_until(
        lambda: "resumed from step-" in (run_dir / "train.log").read_text(),
        DEADLINE_S,
        "the resubmitted job to resume from the checkpoint",
    )
    runs.stop_run(run_id, grace_s=60)


# ------------------------------------------------------------------------ no cluster needed


def test_job_script_runs_srun_and_torchrun_with_rendezvous_on_the_first_node(tmp_path):
    options = SlurmOptions(nodes=2, gpus_per_node=4, partition="gpu", time="2:00:00", account="lab")
    text = job_script("dpo-1", "direct_alignment", tmp_path / "run", options, source_dir=ROOT)
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=2:00:00",
        "#SBATCH --account=lab",
        f"#SBATCH --output={tmp_path}/run/train.log",
    ):
        assert line in text
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    assert "--nnodes 2 --nproc-per-node 4 --rdzv-backend c10d" in text
    assert '--rdzv-endpoint "$head_node:$rdzv_port"' in text
    assert "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 " in text
    assert "rlhf_lab._wrapper" in text
    # every node's torchrun meets the others at the first node's c10d store; the job id names
    # the rendezvous and the node ranks come from it (never run on several nodes here)
    assert '--rdzv-id "$SLURM_JOB_ID"' in text
    assert text.index("head_node=") < text.index("exec ")
    cpus = job_script("a-1", "sft", "/r", SlurmOptions(nodes=2, cpus_per_task=8), source_dir=ROOT)
    assert "#SBATCH --cpus-per-task=8" in cpus and "--kill-on-bad-exit=1 --cpus-per-task=8" in cpus
    assert "-m trainers.direct_alignment.train --config" in text
    syntax = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert syntax.returncode == 0, syntax.stderr


def test_a_time_limit_asks_slurm_for_sigterm_before_it():
    assert [time_limit_s(t) for t in ("1", "2:30", "1:00:00", "1-0", "1-2:3", "0-0:1:5")] == [
        60,
        150,
        3600,
        86400,
        93780,
        65,
    ]
    assert [signal_lead_s(t) for t in ("1", "2", "1:00:00", "2-0")] == [30, 30, 180, 300]
    timed = job_script("a-1", "sft", "/r", SlurmOptions(time="1:00:00"), source_dir=ROOT)
    assert "#SBATCH --signal=B:TERM@180" in timed
    untimed = job_script("a-1", "sft", "/r", SlurmOptions(), source_dir=ROOT)
    assert "--signal" not in untimed  # no limit asked: the cluster's default, no warning


def test_the_wrapper_records_slurms_time_limit_sigterm_and_leaves_srun_alone(tmp_path):
    """In a job (RLHF_LAB_SLURM=1) a SIGTERM to the wrapper is not forwarded to its child
    (srun would kill the tasks at once); it is recorded in exit.json. A real wrapper and child."""
    import json
    import signal

    child = "import time, sys; time.sleep(4); sys.exit(7)"
    env = {**os.environ, "RLHF_LAB_SLURM": "1", "PYTHONPATH": str(ROOT)}
    env.pop("SLURM_JOB_ID", None)
    wrapper = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlhf_lab._wrapper",
            str(tmp_path),
            "--",
            sys.executable,
            "-c",
            child,
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: (tmp_path / "process.json").is_file(), 30, "the child to start")
    wrapper.send_signal(signal.SIGTERM)
    _, err = wrapper.communicate(timeout=30)
    assert wrapper.returncode == 7  # the child ran to its own end
    record = json.loads((tmp_path / "exit.json").read_text())
    assert record["exit_code"] == 7 and record["slurm_time_limit_signal"] is True
    assert "time limit is near" in err


def test_without_sbatch_a_slurm_launch_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(Unavailable, match="Slurm is not installed here"):
        api.launch(
            api.RunRequest(
                recipe="sft", overrides=QUICK, model="tiny", campaign="nosl", slurm={"nodes": 1}
            )
        )
    assert not list(tmp_path.glob("experiments/*nosl*"))


def test_bad_slurm_options_and_world_size_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    with pytest.raises(InvalidArgument, match="bad Slurm time"):
        api.launch(
            api.RunRequest(recipe="sft", overrides=QUICK, model="tiny", slurm={"time": "soon"})
        )
    with pytest.raises(InvalidArgument, match="bad Slurm options"):
        api.launch(api.RunRequest(recipe="sft", overrides=QUICK, model="tiny", slurm={"nodes": 0}))
    with pytest.raises(InvalidArgument, match="more than the global batch allows"):
        api.launch(
            api.RunRequest(
                recipe="sft", overrides=QUICK, model="tiny", slurm={"nodes": 4, "gpus_per_node": 2}
            )
        )
    with pytest.raises(InvalidArgument, match="gpus_per_node"):
        api.launch(
            api.RunRequest(recipe="sft", overrides=QUICK, model="tiny", gpus="0,1", slurm={})
        )
    with pytest.raises(LabError, match="does not apply to a Slurm job"):
        queue_on_tiny("sft", QUICK, slurm={})
    assert not list(tmp_path.glob("experiments/*/runs/*"))


def test_plan_shows_the_job_script(tmp_path):
    env = {**os.environ, "RLHF_LAB_ROOT": str(tmp_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlhf_lab.cli",
            "plan",
            "--algorithm",
            "dpo",
            "--model",
            "tiny",
            "--slurm",
            "--nodes",
            "2",
            "--gpus-per-node",
            "4",
            "--time",
            "30",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --nodes=2" in done.stdout and "#SBATCH --time=30" in done.stdout
    assert "--rdzv-backend c10d" in done.stdout
    assert not list(tmp_path.glob("experiments/*/runs/*"))  # shown, not submitted
