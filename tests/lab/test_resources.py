"""check_resources: no GPU is an answer (not a crash), a mocked NVML is read correctly, and lab
runs are matched to the devices they hold (by run.json's device field or by process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import psutil
import pytest

from rlhf_lab.runs import resources
from rlhf_lab.runs.machine import check_resources
from rlhf_lab.runs.resources import GIB, active_lab_runs, gpu_index


@pytest.fixture(autouse=True)
def _lab_root(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path


class FakeNVMLError(Exception):
    pass


def fake_pynvml(gpus: list[dict], init_error: str | None = None) -> types.ModuleType:
    """A stand-in for nvidia-ml-py's `pynvml` module with the calls check_resources makes."""
    mod = types.ModuleType("pynvml")
    mod.NVMLError = FakeNVMLError
    calls = {"init": 0, "shutdown": 0}
    mod.calls = calls

    def init():
        calls["init"] += 1
        if init_error:
            raise FakeNVMLError(init_error)

    def shutdown():
        calls["shutdown"] += 1

    mod.nvmlInit = init
    mod.nvmlShutdown = shutdown
    mod.nvmlSystemGetDriverVersion = lambda: "550.54"
    mod.nvmlDeviceGetCount = lambda: len(gpus)
    mod.nvmlDeviceGetHandleByIndex = lambda i: i
    mod.nvmlDeviceGetName = lambda h: gpus[h]["name"]
    mod.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(**gpus[h]["mem"])
    mod.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=gpus[h]["util"])
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpus[h]["procs"]
    ]
    mod.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    return mod


def write_run(root, campaign, run_id, **fields):
    folder = root / "experiments" / campaign / "runs" / run_id
    folder.mkdir(parents=True)
    info = {"id": run_id, "campaign": campaign, "family": "direct_alignment", **fields}
    (folder / "run.json").write_text(json.dumps(info))
    return folder


# ---------------------------------------------------------------------------------------------
# No GPU
# ---------------------------------------------------------------------------------------------


def test_no_nvml_library_is_no_gpu(monkeypatch):
    mod = fake_pynvml([], init_error="NVML Shared Library Not Found")
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    res = check_resources()
    assert res.gpus == []
    assert any(n.startswith("no GPU") and "Shared Library" in n for n in res.notes)
    assert mod.calls["shutdown"] == 0  # init failed: nothing to shut down


def test_nvml_not_installed_is_no_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    res = check_resources()
    assert res.gpus == [] and any("not installed" in n for n in res.notes)


def test_driver_with_zero_devices(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([]))
    res = check_resources()
    assert res.gpus == [] and any("no devices" in n for n in res.notes)


def test_real_machine_answers_without_crashing():
    res = check_resources()
    assert res.cpu_count >= 1 and res.ram_total_gb > 0
    assert 0 < res.ram_available_gb <= res.ram_total_gb
    assert res.cpu_load and all(x >= 0 for x in res.cpu_load)
    if not res.gpus:
        assert any(n.startswith("no GPU") for n in res.notes)
    json.dumps(res.model_dump(mode="json"))


# ---------------------------------------------------------------------------------------------
# Mocked GPUs and lab runs
# ---------------------------------------------------------------------------------------------


def test_mocked_gpus_processes_and_lab_runs(monkeypatch, _lab_root):
    me = os.getpid()
    stranger = 4_000_000  # not a real pid
    gpus = [
        {
            "name": b"NVIDIA H100 80GB HBM3",  # older bindings return bytes
            "mem": {"total": 80 * GIB, "used": 10 * GIB, "free": 70 * GIB},
            "util": 35,
            "procs": [(stranger, 9 * GIB)],
        },
        {
            "name": "NVIDIA H100 80GB HBM3",
            "mem": {"total": 80 * GIB, "used": 60 * GIB, "free": 20 * GIB},
            "util": 97,
            "procs": [(me, None)],  # driver did not report the memory
        },
    ]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus))
    create_time = psutil.Process(me).create_time()
    write_run(
        _lab_root, "2026-01-01-dpo-sanity", "dpo-20260101-000000-abcd",
        state="running", pid=me, create_time=create_time,
    )  # fmt: skip
    write_run(
        _lab_root, "2026-01-01-dpo-sanity", "dpo-20260101-000001-beef",
        state="starting", pid=None, device="cuda:0",
    )  # fmt: skip
    write_run(
        _lab_root, "2026-01-01-dpo-sanity", "dpo-20260101-000002-dead",
        state="succeeded", pid=me, device="cuda:0",
    )  # fmt: skip

    res = check_resources()
    assert res.driver_version == "550.54"
    g0, g1 = res.gpus
    assert g0.name == "NVIDIA H100 80GB HBM3" and g0.uuid == "GPU-0"
    assert (g0.total_gb, g0.used_gb, g0.free_gb, g0.utilization_pct) == (80.0, 10.0, 70.0, 35)
    assert g0.processes[0].pid == stranger and g0.processes[0].used_memory_gb == 9.0
    assert g0.processes[0].lab_run is None
    assert g1.processes[0].used_memory_gb is None
    # matched by process on GPU 1, by the device field on GPU 0; finished runs do not count
    assert g1.processes[0].lab_run == "dpo-20260101-000000-abcd"
    assert g1.lab_runs == ["dpo-20260101-000000-abcd"]
    assert g0.lab_runs == ["dpo-20260101-000001-beef"]
    runs = {r.run_id: r for r in res.lab_runs}
    assert set(runs) == {"dpo-20260101-000000-abcd", "dpo-20260101-000001-beef"}
    assert runs["dpo-20260101-000000-abcd"].alive and runs[
        "dpo-20260101-000000-abcd"
    ].gpu_indices == [1]
    assert runs["dpo-20260101-000001-beef"].gpu_indices == [0]
    assert not runs["dpo-20260101-000001-beef"].alive
    assert any("dpo-20260101-000001-beef" in n and "gone" in n for n in res.notes)


def test_one_failing_gpu_does_not_hide_the_others(monkeypatch):
    gpus = [
        {"name": "A", "mem": {"total": GIB, "used": 0, "free": GIB}, "util": 0, "procs": []},
        {"name": "B", "mem": {"total": GIB, "used": 0, "free": GIB}, "util": 0, "procs": []},
    ]
    mod = fake_pynvml(gpus)
    good = mod.nvmlDeviceGetMemoryInfo

    def flaky(h):
        if h == 0:
            raise FakeNVMLError("GPU is lost")
        return good(h)

    mod.nvmlDeviceGetMemoryInfo = flaky
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    res = check_resources()
    assert [g.name for g in res.gpus] == ["B"]
    assert any("GPU 0" in n and "lost" in n for n in res.notes)
    assert mod.calls["shutdown"] == 1


def test_run_with_reused_pid_is_not_alive(_lab_root):
    me = os.getpid()
    write_run(
        _lab_root, "2026-01-01-x", "x-20260101-000000-0000",
        state="running", pid=me, create_time=psutil.Process(me).create_time() - 1000,
    )  # fmt: skip
    (run,) = active_lab_runs()
    assert run.pid == me and not run.alive


def test_run_reading_ignores_broken_files(_lab_root):
    folder = _lab_root / "experiments" / "2026-01-01-x" / "runs" / "broken"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text("{not json")
    assert active_lab_runs() == []


def test_child_process_of_a_run_is_matched(monkeypatch, _lab_root):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        gpus = [
            {
                "name": "G",
                "mem": {"total": GIB, "used": 0, "free": GIB},
                "util": 0,
                "procs": [(child.pid, GIB // 2)],
            }
        ]
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus))
        write_run(_lab_root, "2026-01-01-y", "y-run", state="running", pid=os.getpid())
        res = check_resources()
        assert res.gpus[0].processes[0].lab_run == "y-run"
        assert res.gpus[0].lab_runs == ["y-run"]
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    "device,index",
    [("cuda:1", 1), ("cuda", 0), (2, 2), ("3", 3), ("cpu", None), (None, None), ("auto", None)],
)
def test_gpu_index(device, index):
    assert gpu_index(device) == index


def test_module_does_not_import_pynvml_at_import_time():
    assert "pynvml" not in vars(resources)


# ---------------------------------------------------------------------------------------------
# The machine seam
# ---------------------------------------------------------------------------------------------


def test_a_machine_set_for_a_block_is_read_by_every_thread_and_undone_after():
    import threading

    from rlhf_lab.runs.machine import Machine, this_machine, using_machine

    real = this_machine()
    three = Machine(cpu_cores=lambda: 3)
    with using_machine(three):
        seen: list[int] = []
        reader = threading.Thread(target=lambda: seen.append(this_machine().cpu_cores()))
        reader.start()
        reader.join()
        assert seen == [3]
        with using_machine(Machine(cpu_cores=lambda: 5)):
            assert this_machine().cpu_cores() == 5
        assert this_machine() is three
    assert this_machine() is real


def test_the_report_and_the_device_memory_read_the_machine(machine):
    machine(gpus=[10.0, 30.0], free_ram_gb=3.0, total_ram_gb=4.0)
    res = check_resources()
    assert [(g.index, g.free_gb) for g in res.gpus] == [(0, 10.0), (1, 30.0)]
    assert (res.ram_available_gb, res.ram_total_gb) == (3.0, 4.0) and res.notes == []
    from rlhf_lab.runs.machine import this_machine

    here = this_machine()
    assert [here.device_free_gb(d) for d in ("cpu", "cuda", "cuda:1", "cuda:2")] == [
        3.0,
        10.0,
        30.0,
        None,
    ]
    assert here.device_total_gb("cpu") == 4.0 and here.device_total_gb("cuda:1") == 48.0
