"""The check-and-hold of a device is one step for every way a run starts (``_devices_hold``):
a queued run whose GPU the lab picks, a queued run that names the GPU and a launch that names
it race for ONE fake GPU in real threads (real run folders, real stand-in trainer processes,
real file locks); never do two of them hold it. Only the GPU query is replaced."""

from __future__ import annotations

import threading

import pytest

import rlhf_lab.api as api
from rlhf_lab import runs
from rlhf_lab.errors import LabError
from tests._helpers.lab_launches import queue_on_tiny

from .test_placement import QUICK, lab  # noqa: F401 (lab: a fixture)


@pytest.fixture
def one_gpu_lab(lab, machine):  # noqa: F811 - the lab fixture of test_placement
    """test_placement's lab with one GPU of 40 GB."""
    machine(gpus=[40.0])


def race(*starts) -> tuple[list, list[threading.Thread]]:
    """Run ``starts`` at the same moment in threads; (their results or the error raised, the
    threads: a start that waits for the GPU is still polling after 3 s)."""
    gate = threading.Barrier(len(starts))
    results: list = [None] * len(starts)

    def go(i, start):
        gate.wait()
        try:
            results[i] = start()
        except LabError as err:
            results[i] = err

    threads = [threading.Thread(target=go, args=(i, s), daemon=True) for i, s in enumerate(starts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=3)  # a start that waits for the GPU is still waiting: the GPU is held
    return results, threads


def end(threads: list[threading.Thread]) -> None:
    """Stop the queued runs first (a waiting start then returns), then the running ones."""
    for status in runs.queued_runs():
        runs.stop_run(status.id, grace_s=2)
    for t in threads:
        t.join(timeout=10)
    for status in runs.active_runs():
        runs.stop_run(status.id, grace_s=2)


def holders() -> list[str]:
    return [s.id for s in runs.active_runs("cuda:0")]


def test_a_picked_gpu_and_a_named_gpu_never_go_to_two_runs(one_gpu_lab):
    picked = queue_on_tiny("sft", QUICK, campaign="race")
    named = queue_on_tiny("sft", [*QUICK, "seed=2"], campaign="race", device="cuda:0")
    assert picked.devices == [] and named.devices == ["cuda:0"]
    _, threads = race(
        lambda: runs._start_when_free(picked.run.id, poll_s=0.1),
        lambda: runs._start_when_free(named.run.id, poll_s=0.1),
    )
    assert len(holders()) == 1, holders()
    waiting = {picked.run.id, named.run.id} - set(holders())
    assert runs.run_state(waiting.pop()).state == "queued"
    end(threads)


def test_a_queued_pick_and_an_explicit_launch_on_the_same_gpu(one_gpu_lab):
    queued = queue_on_tiny("sft", QUICK, campaign="race")
    results, threads = race(
        lambda: runs._start_when_free(queued.run.id, poll_s=0.1),
        lambda: api.launch(
            api.RunRequest(
                recipe="sft", overrides=[*QUICK, "seed=2"], model="tiny", campaign="race", gpus="0,"
            )
        ),
    )
    assert len(holders()) == 1, (holders(), results)
    if runs.run_state(queued.run.id).state == "running":
        assert isinstance(results[1], LabError)  # the launch found the GPU held: refused
    else:
        assert runs.run_state(queued.run.id).state == "queued"
    end(threads)
