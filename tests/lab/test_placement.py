"""Devices and placement with a FAKE GPU inventory: the machine's GPUs (``rlhf_lab.runs.machine``,
set by the ``machine`` fixture) are replaced; everything else is real (run folders, the launcher,
detached stand-in trainers, the queue worker's start-when-free, file locks).

Covers: the numbering (NVML order; CUDA_VISIBLE_DEVICES renumbers, by index or UUID), ``--gpus``
ids / counts and their bad input, ``--device auto`` picking the freest free GPU, a run on several
GPUs holding each (and its trainer seeing exactly them), queued runs starting side by side on
free GPUs (a four-arm sweep on four GPUs), the torchrun command line, the per-rank (FSDP2) memory
estimate checked on each device, and the world-size checks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import rlhf_lab.api as api
from rlhf_lab import runs
from rlhf_lab.errors import InvalidArgument, LabError, Unavailable
from rlhf_lab.planning.memory import estimate_memory
from rlhf_lab.planning.shrink import shrink_config
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.runs.launcher import trainer_argv
from rlhf_lab.runs.machine import check_resources
from rlhf_lab.runs.world import check_world_size
from tests._helpers.lab_launches import queue_on_tiny

QUICK = ["data.max_samples=32", "data.eval_size=8", "train.max_steps=2", "train.batch_size=4"]


# A stand-in trainer (a real detached process) that writes the CUDA/OMP variables it sees into
# its run folder, then sleeps.
_ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "OMP_NUM_THREADS")
WRITES_ITS_ENV = (
    "import json, os, sys, time; open(sys.argv[1] + '/env.json', 'w').write(json.dumps("
    f"{{k: os.environ.get(k) for k in {_ENV_KEYS!r}}})); time.sleep(30)"
)


@pytest.fixture
def lab(tmp_path, monkeypatch, stand_in_trainer, no_queue_worker, no_recorder):
    """Launches start the env-writing stand-in, queued runs stay queued, no recorder starts; the
    runs still live are stopped afterwards."""
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    stand_in_trainer(WRITES_ITS_ENV)
    started: list[str] = []
    yield started
    for run in runs.active_runs():
        runs.stop_run(run.id, grace_s=2)


def wait_for(path: Path, timeout: float = 20) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.is_file() and path.read_text():
            return json.loads(path.read_text())
        time.sleep(0.1)
    raise AssertionError(f"{path} not written within {timeout}s")


# ---------------------------------------------------------------------------------- numbering


def test_visible_gpus_follow_nvml_order_and_cuda_visible_devices(monkeypatch, machine):
    machine(gpus=[10, 20, 30, 40])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [(g.index, g.nvml_index) for g in runs.visible_gpus()] == [
        (0, 0),
        (1, 1),
        (2, 2),
        (3, 3),
    ]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-fake-1")
    shown = runs.visible_gpus()
    assert [(g.index, g.nvml_index, g.free_gb) for g in shown] == [(0, 3, 40), (1, 1, 20)]
    assert api.visible_gpu_count() == 2
    # the trainer of lab device cuda:1 sees the physical GPU behind it
    env = runs._trainer_env("cuda:1", devices=["cuda:1", "cuda:0"])
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-fake-1,3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert runs.visible_gpus() == []


def test_gpus_argument_ids_counts_and_bad_input(machine):
    machine(gpus=[10, 20, 30, 40])
    ids = runs.resolve_placement("auto", "0,1,2,3")
    assert ids.devices == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"] and ids.nproc == 4
    assert ids.distributed
    count = runs.resolve_placement("auto", "4")
    assert count.devices == [] and count.gpus_wanted == 4 and count.nproc == 4
    one = runs.resolve_placement("auto", "2,")
    assert one.devices == ["cuda:2"] and one.nproc == 1
    with pytest.raises(Unavailable, match=r"GPU 7 was asked for .* shows 4 GPU\(s\)"):
        runs.resolve_placement("auto", "0,7")
    with pytest.raises(Unavailable, match=r"5 GPU\(s\) was asked for"):
        runs.resolve_placement("auto", 5)
    for bad in ("0;1", "-2", "x", "1,1"):
        with pytest.raises(InvalidArgument, match="gpus"):
            runs.resolve_placement("auto", bad)
    with pytest.raises(InvalidArgument, match="not both"):
        runs.resolve_placement("cuda:1", "0,1")
    cpu = runs.resolve_placement("auto", None, 2)
    assert cpu.devices == ["cpu"] and cpu.nproc == 2 and cpu.distributed
    assert runs.resolve_placement("auto").gpus_wanted == 1  # the lab picks the GPU


def test_device_auto_launch_takes_the_freest_gpu_no_run_holds(lab, machine):
    machine(gpus=[10, 40, 30, 5])
    assert runs.freest_gpus(2, set()) == ["cuda:1", "cuda:2"]
    first = api.launch(
        api.RunRequest(recipe="sft", overrides=QUICK, model="tiny", campaign="place")
    )
    assert first.run.device == "cuda:1" and first.devices == ["cuda:1"]
    env = wait_for(Path(first.run.run_dir) / "env.json")
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # another seed (the same config beside a running run is refused as a repeat)
    second = api.launch(
        api.RunRequest(recipe="sft", overrides=[*QUICK, "seed=2"], model="tiny", campaign="place")
    )
    assert second.run.device == "cuda:2"  # cuda:1 is held now; the next freest
    status = runs.run_state(second.run.id)
    assert status.devices == ["cuda:2"]
    held = {r.id: r.devices for r in runs.active_runs("cuda:1")}
    assert list(held) == [first.run.id]


def test_run_on_several_gpus_holds_each_and_starts_under_torchrun(lab, machine):
    machine(gpus=[40, 40, 40, 40])
    argv = trainer_argv("sft", Path("/runs/x"), nproc=2)
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert argv[argv.index("--nproc-per-node") + 1] == "2" and "--standalone" in argv
    assert argv[argv.index("-m", 3) + 1 :] == [
        "trainers.sft.train",
        "--config",
        "/runs/x/config.yaml",
        "--run-dir",
        "/runs/x",
    ]
    result = api.launch(
        api.RunRequest(recipe="sft", overrides=QUICK, model="tiny", campaign="multi", gpus="1,3")
    )
    assert result.run.argv[-2:] == ["--nproc", "2"]  # the launcher asked for 2 ranks
    env = wait_for(Path(result.run.run_dir) / "env.json")
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert result.devices == ["cuda:1", "cuda:3"]
    record = json.loads((Path(result.run.run_dir) / "run.json").read_text())
    assert record["devices"] == ["cuda:1", "cuda:3"] and record["nproc"] == 2
    for device in ("cuda:1", "cuda:3"):  # held by the run on each
        assert [r.id for r in runs.active_runs(device)] == [result.run.id]
    assert runs.active_runs("cuda:0") == []
    machine(gpus=[40, 40, 40, 0.01])
    other = [*QUICK, "seed=2"]  # the same config again would be refused as a repeat
    with pytest.raises(LabError, match="cuda:3 is busy"):  # both do not fit there
        api.launch(
            api.RunRequest(recipe="sft", overrides=other, model="tiny", campaign="multi", gpus="3,")
        )
    machine(gpus=[40, 40, 40, 40])
    beside = api.launch(
        api.RunRequest(recipe="sft", overrides=other, model="tiny", campaign="multi", gpus="3,")
    )
    assert beside.sharing_device_with == [result.run.id]  # both fit: started beside it
    held = check_resources()
    hold = next(h for h in held.lab_runs if h.run_id == result.run.id)
    assert hold.gpu_indices == [1, 3]
    # two runs started within one second: their ids order by the random suffix, not by start
    assert [sorted(g.lab_runs) for g in held.gpus] == [
        [],
        [result.run.id],
        [],
        sorted([result.run.id, beside.run.id]),
    ]


def test_lab_numbers_under_cuda_visible_devices_map_to_the_physical_gpu(lab, monkeypatch, machine):
    machine(gpus=[40, 40, 40, 40])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with pytest.raises(Unavailable, match=r"GPU 2 was asked for .* shows 2 GPU\(s\)"):
        api.launch(
            api.RunRequest(recipe="sft", overrides=QUICK, model="tiny", campaign="cvd", gpus="2,")
        )
    result = api.launch(
        api.RunRequest(recipe="sft", overrides=QUICK, model="tiny", campaign="cvd", gpus="1,")
    )
    assert result.devices == ["cuda:1"]
    assert wait_for(Path(result.run.run_dir) / "env.json")["CUDA_VISIBLE_DEVICES"] == "3"
    shown = check_resources()
    assert [g.lab_runs for g in shown.gpus] == [[], [], [], [result.run.id]]


def test_sweep_of_four_arms_runs_on_four_gpus_at_once(lab, machine):
    machine(gpus=[40, 40, 40, 40])
    swept = api.sweep(
        api.SweepRequest(
            recipes=["dpo", "ipo", "simpo", "orpo"], overrides=QUICK, model="tiny", campaign="four"
        )
    )
    queued = [launch.run.id for launch in swept.launches]
    assert all(launch.queued and launch.devices == [] for launch in swept.launches)
    extra = queue_on_tiny(
        "dpo", [*QUICK, "seed=2"], campaign="four"
    )  # another seed: the dpo arm's config again would be refused as a repeat
    for run_id in queued:  # the worker's start-when-free: each starts at once on a free GPU
        started = runs._start_when_free(run_id, poll_s=0.1)
        assert started is not None and started.state == "running"
    devices = sorted(runs.run_state(r).device for r in queued)
    assert devices == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert len(runs.active_runs()) == 4  # four arms train at the same time
    # a fifth waits until a GPU frees up, then takes it
    import threading

    box: list = []
    waiter = threading.Thread(
        target=lambda: box.append(runs._start_when_free(extra.run.id, poll_s=0.1))
    )
    waiter.start()
    time.sleep(1.0)
    assert runs.run_state(extra.run.id).state == "queued"
    freed = runs.run_state(queued[2]).device
    runs.stop_run(queued[2], grace_s=2)
    waiter.join(timeout=20)
    assert box and box[0] is not None and box[0].device == freed


# ------------------------------------------------------------------------- memory and batches


def test_per_rank_estimate_shards_model_states_and_keeps_activations():
    shrunk = shrink_config("sft", [], model="tiny").config
    one = estimate_memory("sft", "sft", TrainerConfig("sft", shrunk), device="cuda")
    four = estimate_memory("sft", "sft", TrainerConfig("sft", shrunk), device="cuda", world_size=4)
    part = {c.name: c.gb for c in one.components}
    rank = {c.name: c.gb for c in four.components}
    for name in ("policy weights", "policy gradients", "policy optimizer (AdamW)"):
        if name in part:
            assert rank[name] == pytest.approx(part[name] / 4, abs=1e-4)
    activations = [n for n in part if "activations" in n]
    assert activations and all(rank[n] == part[n] for n in activations)
    assert "FSDP2 gathered layers" in rank and four.world_size == 4
    assert four.total_gb < one.total_gb


def test_memory_is_checked_on_each_device(lab, machine):
    machine(gpus=[40, 40, 0.01, 40])
    with pytest.raises(LabError, match=r"per rank.*memory of cuda:2"):
        api.launch(
            api.RunRequest(
                recipe="sft", overrides=QUICK, model="tiny", campaign="mem", gpus="0,1,2,3"
            )
        )
    assert not list(Path(runs._lab_dir()).parent.glob("*mem*"))  # nothing written
    ok = api.launch(
        api.RunRequest(recipe="sft", overrides=QUICK, model="tiny", campaign="mem", gpus="0,1")
    )
    assert ok.devices == ["cuda:0", "cuda:1"]


def test_estimate_memory_takes_gpus_and_nproc_like_a_launch(lab, machine):
    """The API/MCP estimate with ``gpus`` / ``nproc``: one rank's estimate, checked against
    the GPU with the least free memory (CPU: all ranks in one RAM); bad input as a launch."""
    machine(gpus=[40, 40, 0.001, 40])
    one = api.estimate_memory("sft", model="tiny", overrides=QUICK)
    four = api.estimate_memory("sft", model="tiny", overrides=QUICK, gpus="0,1,2,3")
    assert four.estimate.world_size == 4 and one.estimate.world_size == 1
    assert four.estimate.total_gb < one.estimate.total_gb
    assert four.device == "cuda:2" and four.fits is False  # the tightest GPU decides
    assert "on each of 4 GPUs" in four.verdict
    two = api.estimate_memory("sft", model="tiny", overrides=QUICK, gpus="0,1")
    assert two.fits is True and two.device in ("cuda:0", "cuda:1")
    cpu = api.estimate_memory("sft", model="tiny", overrides=QUICK, nproc=2)
    assert cpu.device == "cpu" and cpu.estimate.world_size == 2
    assert "per rank × 2 ranks" in cpu.verdict
    with pytest.raises(InvalidArgument, match="more than the global batch allows"):
        api.estimate_memory("sft", model="tiny", overrides=QUICK, nproc=16)
    with pytest.raises(LabError, match="GPU"):
        api.estimate_memory("sft", model="tiny", overrides=QUICK, gpus="7,")


def test_world_size_against_the_batches():
    pg = TrainerConfig(
        "policy_gradients", {"rollout": {"prompts_per_step": 4}, "train": {"batch_size": 2}}
    )
    check_world_size("policy_gradients", pg, 2)
    check_world_size("policy_gradients", pg, 4)
    with pytest.raises(InvalidArgument, match="not divisible by the world size 3"):
        check_world_size("policy_gradients", pg, 3)
    with pytest.raises(InvalidArgument, match="8 ranks are more than the global batch allows"):
        check_world_size("policy_gradients", pg, 8)
    sft = TrainerConfig(
        "sft", {"data": {"max_samples": 32, "eval_size": 8}, "train": {"batch_size": 4}}
    )
    check_world_size("sft", sft, 6)  # 24 examples, one step of 4 × 6
    with pytest.raises(InvalidArgument, match="takes 28 examples .* 24 training examples"):
        check_world_size("sft", sft, 7)


def test_bad_world_size_is_refused_before_anything_is_written(lab):
    with pytest.raises(InvalidArgument, match="more than the global batch allows"):
        api.launch(
            api.RunRequest(
                recipe="sft",
                overrides=[*QUICK, "train.batch_size=8"],
                model="tiny",
                campaign="ws",
                nproc=4,
            )
        )
    assert not any(Path(runs._lab_dir()).parent.glob("*-ws"))


# A real two-rank CPU run end to end through the lab (torchrun, gloo; rank 0 writes the folder)
REAL_NPROC = 2


@pytest.mark.slow
def test_real_cpu_run_under_torchrun_succeeds(tmp_path, monkeypatch, no_recorder):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    quick = [
        *QUICK,
        "eval.eval_every=2",
        "eval.sample_every=0",
        "checkpoint.save_final_model=false",
    ]
    result = api.launch(
        api.RunRequest(
            recipe="sft", overrides=quick, model="tiny", campaign="real", nproc=REAL_NPROC
        )
    )
    assert result.run.argv[1:3] == ["-m", "torch.distributed.run"]
    assert result.run.argv[result.run.argv.index("--nproc-per-node") + 1] == str(REAL_NPROC)
    final = runs.wait_for_end(result.run.id, poll_s=1, timeout_s=400)
    log = (Path(result.run.run_dir) / "train.log").read_text()
    assert final.state == "succeeded", log[-2000:]
    assert final.devices == ["cpu"] and final.nproc == REAL_NPROC
    assert final.step == final.total_steps == 2
    assert "[rank 1]" in log  # both ranks ran and reached the log
