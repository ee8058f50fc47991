"""Runs that depend on runs: ``after`` lists, ``run:<id>`` references, lineage and pipelines
(:mod:`rlhf_lab.runs.deps`, :mod:`rlhf_lab.runs.lineage`, :mod:`rlhf_lab.runs.pipelines`,
``api.run_pipeline``).

The bookkeeping and the bad input are tested on run folders written by hand with the schemas of
trainers/core/runfolder.py (and on queued runs whose queue worker is kept from starting: the
seam the runs tests use); two tests run real trainers on ``tiny``: an upstream run that fails
(its dependent is cancelled, never runs, and runs once the upstream is resumed), and the whole
``rlhf`` pipeline (once its PPO recipe exists in this checkout).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from mcp import Client
from typer.testing import CliRunner

from rlhf_lab import _queue, api, runs
from rlhf_lab.api.pipelines import _recipe_exists
from rlhf_lab.cli import app
from rlhf_lab.errors import Conflict, InvalidArgument, LabError, NotFound
from rlhf_lab.mcp_server import server
from rlhf_lab.planning.shrink import WARM_START_PG_LR
from rlhf_lab.runs.deps import rearm_dependents
from rlhf_lab.runs.lineage import base_model
from rlhf_lab.runs.pipelines import check_stages, find_pipeline, plan_stages
from tests._helpers.lab_launches import queue_on_tiny
from tests._helpers.run_folders import (
    CREATED_AT,
    write_ending,
    write_run_json,
    write_tiny_final_model,
)

RUN_TIMEOUT_S = 300.0
SFT_STEPS = ["train.max_steps=3", "data.max_samples=48", "data.eval_size=8", "eval.eval_every=0"]
SFT_STEPS += ["eval.num_samples=0"]


@pytest.fixture(autouse=True)
def lab_root(tmp_path, monkeypatch):
    """A fresh lab per test; runs a failed test left behind are stopped (queued ones too, so
    the queue worker exits)."""
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    yield tmp_path
    for status in [*runs.queued_runs(), *runs.active_runs()]:
        runs.stop_run(status.id, grace_s=5)


def synthetic_run(
    root: Path,
    run_id: str,
    family: str,
    algorithm: str,
    *,
    state: str = "succeeded",
    model: str = "tiny",
    references: dict | None = None,
    campaign: str = "2026-01-01-upstream",
) -> Path:
    """A run folder as the launcher and a trainer leave it; a succeeded one has final_model/
    (its config.json: the tiny preset's architecture)."""
    run_dir = root / "experiments" / campaign / "runs" / run_id
    write_run_json(
        run_dir, family, algorithm, state=state, created_at=CREATED_AT, references=references or {}
    )
    config = {"model": {"name": model}, "checkpoint": {"save_final_model": True}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    if state in ("succeeded", "failed"):
        write_ending(run_dir, state, steps=2, wall_time_s=1.0)
    if state == "succeeded":
        write_tiny_final_model(run_dir)
    return run_dir


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def run_folders(root: Path) -> list[Path]:
    return sorted(root.glob("experiments/*/runs/*"))


def cli(*argv: str):
    result = CliRunner().invoke(app, list(argv))
    assert "Traceback" not in result.output, result.output
    return result


SFT = "sft-20260101-000000-aaaa"
FAILED = "sft-20260101-000000-dddd"


# ---------------------------------------------------------------------------------------------
# References and lineage
# ---------------------------------------------------------------------------------------------


def test_a_run_output_is_shrunk_estimated_and_checked_like_the_model_it_came_from(lab_root):
    """run:<id> and a run's final_model path lead back, through every run in between, to the
    preset the chain started from; the shrink then uses the preset's rules (a local folder used
    to count as a big hub model: lr 5e-6, 512 new tokens, no final model saved)."""
    sft = synthetic_run(lab_root, SFT, "sft", "sft")
    dpo = "dpo-20260101-000000-cccc"
    synthetic_run(
        lab_root, dpo, "direct_alignment", "dpo", model=str(sft / "final_model"),
        references={"model.name": SFT},
    )  # fmt: skip
    assert base_model(f"run:{SFT}") == "tiny"
    assert base_model(str(sft / "final_model")) == "tiny"
    assert base_model(f"run:{dpo}") == "tiny"  # dpo <- sft <- tiny

    for name in (f"run:{dpo}", str(sft / "final_model")):
        shrunk = api.shrink_config("grpo", [f"model.name={name}"])
        config = shrunk.config
        assert config["model"]["name"] == name
        # the tiny rules for a trained run (a fine-tuning lr), not 5e-6
        assert config["train"]["learning_rate"] == WARM_START_PG_LR
        assert config["rollout"]["max_new_tokens"] == 64
        assert config["checkpoint"]["save_final_model"] is True
        assert not any("randomly initialised" in n for n in shrunk.notes)  # it is warm-started

    memory = api.estimate_memory("dpo", None, [f"model.name=run:{SFT}"])
    tiny = api.estimate_memory("dpo", "tiny", [])
    assert memory.estimate.param_count == tiny.estimate.param_count


def test_bad_references_and_dependencies_are_refused_before_anything_is_written(lab_root):
    synthetic_run(lab_root, SFT, "sft", "sft")
    synthetic_run(lab_root, FAILED, "sft", "sft", state="failed")
    queued = synthetic_run(lab_root, "sft-20260101-000000-eeee", "sft", "sft", state="queued")
    before = run_folders(lab_root)
    unknown = "dpo-20260101-000000-0000"
    cases = [
        (NotFound, "names no run", dict(recipe="dpo", overrides=[f"model.name=run:{unknown}"])),
        (
            InvalidArgument,
            "not a reward model",
            dict(recipe="top_per_prompt", overrides=[f"scorer.name=run:{SFT}"], model=None),
        ),
        (  # a policy-gradient reward from a run that is no reward model
            InvalidArgument,
            "that run is sft (sft), not a preference (Bradley-Terry) or outcome reward model",
            dict(recipe="ppo_rm", model="tiny", overrides=[f"reward.model=run:{SFT}"]),
        ),
        (  # reward weights that make every reward zero
            InvalidArgument,
            "every reward weight is 0",
            dict(
                recipe="grpo",
                model="tiny",
                overrides=["reward.verifier_weight=0", "reward.format_weight=0"],
            ),
        ),
        (NotFound, "no run with that id", dict(recipe="dpo", model="tiny", after=[unknown])),
        (Conflict, "resume it first", dict(recipe="dpo", model="tiny", after=[FAILED])),
        (Conflict, "is failed", dict(recipe="dpo", overrides=[f"model.name=run:{FAILED}"])),
        (
            InvalidArgument,
            "read only in",
            dict(recipe="dpo", overrides=[f"data.dataset=run:{SFT}"]),
        ),
        (  # the old way, a path to an output not written yet: the error says how to wait for it
            NotFound,
            "write model.name=run:sft-20260101-000000-eeee to wait",
            dict(recipe="dpo", overrides=[f"model.name={queued / 'final_model'}"]),
        ),
    ]
    for kind, needle, kwargs in cases:
        recipe = kwargs.pop("recipe")
        with pytest.raises(kind) as err:
            api.launch(api.RunRequest(recipe=recipe, shrink=True, campaign="bad", **kwargs))
        assert needle in err.value.message, err.value.message
    assert run_folders(lab_root) == before
    assert not (lab_root / "experiments" / "bad.md").exists()
    assert not list((lab_root / "experiments").glob("*-bad*"))

    # the same on the two surfaces: one line on the CLI, a tool error in neutral words on MCP
    out = cli("launch", "dpo", "--shrink", "--set", f"model.name=run:{unknown}")
    assert out.exit_code == 2 and "names no run" in out.output
    assert len([ln for ln in out.output.splitlines() if ln.startswith("error:")]) == 1
    cycle = ["--model", "tiny", "--set", "sft.model.name=stage:grpo"]
    out = cli("pipeline", "r1-zero", *cycle)
    assert out.exit_code == 2 and "dependency cycle: sft -> grpo -> sft" in out.output
    assert run_folders(lab_root) == before


@pytest.mark.anyio
async def test_mcp_refuses_a_cycle_and_a_bad_reference_in_its_own_terms(lab_root):
    async with Client(server) as client:
        bad = await client.call_tool(
            "launch_run",
            {"recipe": "dpo", "overrides": ["model.name=run:dpo-20260101-000000-0000"]},
        )
        cycle = await client.call_tool(
            "run_pipeline",
            {"name": "r1-zero", "model": "tiny", "overrides": ["sft.model.name=stage:grpo"]},
        )
    for result, needle in ((bad, "names no run"), (cycle, "dependency cycle")):
        text = "".join(getattr(c, "text", "") for c in result.content)
        assert result.is_error and needle in text, text
        assert "--" not in text and "Traceback" not in text
    assert run_folders(lab_root) == []


# ---------------------------------------------------------------------------------------------
# Pipelines: construction, the queue's decisions
# ---------------------------------------------------------------------------------------------

CHAIN = """\
description: a test chain on recipes every checkout has
question: does the chain hold together?
stages:
  sft:
    recipe: sft
    check: the loss falls
  rm:
    recipe: preference_rm
    overrides: [model.name=stage:sft]
  ppo:
    recipe: ppo
    overrides: [model.name=stage:sft, model.ref_name=stage:sft]
    after: [rm]
"""


def test_shipped_pipelines_name_their_stages_references_and_order():
    rlhf = {s.name: s for s in plan_stages(find_pipeline("rlhf"), "tiny")}
    assert list(rlhf) == ["sft", "rm", "ppo"]
    assert rlhf["rm"].refs == {"model.name": "sft"} and rlhf["rm"].after == ["sft"]
    ppo = rlhf["ppo"]
    assert ppo.recipe == "ppo_rm"
    assert ppo.refs == {"model.name": "sft", "model.ref_name": "sft", "reward.model": "rm"}
    assert ppo.after == ["sft", "rm"] and ppo.model is None  # it starts from the SFT model
    for feeding in ("sft", "rm"):  # an output another stage takes is always saved
        assert rlhf[feeding].overrides[-1] == "checkpoint.save_final_model=true"
    assert "data.source=preference" in ppo.overrides and "data.dataset=builtin" in ppo.overrides

    r1 = plan_stages(find_pipeline("r1-zero"), "tiny", ["grpo.train.max_steps=2"])
    assert [(s.name, s.recipe, s.after) for s in r1] == [
        ("sft", "sft_tiny_warmstart", []),
        ("grpo", "grpo", ["sft"]),
    ]
    checked = check_stages(r1)  # the real recipes validate, the SFT run standing in for itself
    assert checked["grpo"][2].get("model.name") == "run:<sft-run-id>"
    # shrunk as a trained run of tiny
    assert checked["grpo"][2].get("train.learning_rate") == WARM_START_PG_LR
    listed = cli("pipeline", "list")
    assert listed.exit_code == 0 and "rlhf:" in listed.output and "r1-zero:" in listed.output

    plan = api.plan_experiment("sft warm start then grpo on tiny")
    assert plan.intent == "pipeline" and plan.pipeline == "r1-zero"
    assert [(r.name, r.after) for r in plan.runs] == [("sft", []), ("grpo", ["sft"])]
    assert "model.name=run:<sft-run-id>" in plan.runs[1].launch_command
    assert plan.pipeline_command.startswith("uv run rlhf-lab pipeline r1-zero --model tiny")
    assert any("grpo (grpo): groups have reward contrast" in s for s in plan.steps)
    if _recipe_exists("ppo_rm"):
        asked = api.plan_experiment("train a reward model then run PPO against it", model="tiny")
        assert asked.pipeline == "rlhf" and [r.name for r in asked.runs] == ["sft", "rm", "ppo"]


def test_a_pipeline_queues_its_stages_after_the_stages_they_take_a_model_from(
    lab_root, no_queue_worker
):
    chain = lab_root / "chain.yaml"
    chain.write_text(CHAIN)
    result = api.run_pipeline(str(chain), model="tiny", overrides=["ppo.train.max_steps=2"])
    assert result.campaign.endswith("chain-pipeline")
    ids = {s.stage: s.run_id for s in result.stages}
    dirs = {stage: runs.find_run(run_id) for stage, run_id in ids.items()}
    assert [s.state for s in result.stages] == ["queued"] * 3
    sft, rm, ppo = (record(dirs[s]) for s in ("sft", "rm", "ppo"))
    assert sft.get("after", []) == [] and sft["stage"] == "sft" and sft["pipeline"] == "chain"
    assert rm["after"] == [ids["sft"]] and rm["references"] == {"model.name": ids["sft"]}
    assert ppo["after"] == [ids["sft"], ids["rm"]]
    assert ppo["references"] == {"model.name": ids["sft"], "model.ref_name": ids["sft"]}
    assert f"model.name=run:{ids['sft']}" in ppo["overrides"]  # run.json keeps the run id ...
    config = yaml.safe_load((dirs["ppo"] / "config.yaml").read_text())
    final = str(dirs["sft"] / "final_model")
    assert config["model"]["name"] == config["model"]["ref_name"] == final  # ... config the path
    assert config["train"]["max_steps"] == 2
    sft_config = yaml.safe_load((dirs["sft"] / "config.yaml").read_text())
    assert sft_config["checkpoint"]["save_final_model"] is True
    by_stage = {s.stage: s for s in result.stages}
    assert by_stage["sft"].handoff == [
        "final_model → model.name of rm",
        "final_model → model.name of ppo",
        "final_model → model.ref_name of ppo",
    ]

    # the ledger tells the stages as one story, and names the upstream run, not a path
    ledger = api.campaign_markdown(result.campaign)
    assert "Pipeline `chain`: sft → rm → ppo." in ledger
    assert f"| sft | `{ids['sft']}` | queued | — | final_model → model.name of rm" in ledger
    assert f"| ppo | `{ids['ppo']}` | queued | sft, rm |" in ledger
    assert f"run:{ids['sft']} (sft)" in ledger and final not in ledger

    # the queue's decisions: the first stage is ready, the rest wait; a failed stage cancels
    # every later one (never started), and a resumed one re-arms them
    assert _queue._next_queued(set()) == (ids["sft"], False)
    assert _queue._next_queued({ids["sft"]}) == (None, True)
    _set_state(dirs["sft"], "failed")
    assert _queue._next_queued(set()) == (None, False)
    for stage in ("rm", "ppo"):
        rec = record(dirs[stage])
        assert rec["state"] == "cancelled" and ids["sft"] in rec["error"]
        assert not (dirs[stage] / "train.log").exists()
        assert api.run_status(ids[stage]).advice.startswith("never started")
    with pytest.raises(LabError, match=f"resume {ids['sft']} first"):
        api.resume_run(ids["rm"])
    _set_state(dirs["sft"], "succeeded")
    assert sorted(rearm_dependents(ids["sft"])) == sorted([ids["rm"], ids["ppo"]])
    assert [record(dirs[s])["state"] for s in ("rm", "ppo")] == ["queued", "queued"]
    assert _queue._next_queued(set()) == (ids["rm"], False)


def _rm_succeeded(run_dir: Path, accuracy: float, n_eval: int = 64) -> None:
    summary = {"outcome": "succeeded", "steps": 4, "final_eval": {"eval/accuracy": accuracy}}
    summary["data"] = {"n_eval": n_eval}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    _set_state(run_dir, "succeeded")


def test_the_rl_stage_does_not_start_on_a_reward_model_at_chance(lab_root, no_queue_worker):
    """The rlhf pipeline gates ppo on the reward model's held-out accuracy: the lower end of its
    95% Wilson interval must be above 0.5. 0.56 on 64 pairs (lower end 0.44) cancels ppo with
    the reason, never started; 0.84 on 64 pairs (0.73) lets it start."""
    result = api.run_pipeline("rlhf", model="tiny")
    ids = {s.stage: s.run_id for s in result.stages}
    dirs = {stage: runs.find_run(run_id) for stage, run_id in ids.items()}
    gate = {"run": ids["rm"], "stage": "rm", "metric": "eval/accuracy", "above": 0.5}
    assert record(dirs["ppo"])["gates"] == [gate]
    assert not record(dirs["rm"]).get("gates")
    _set_state(dirs["sft"], "succeeded")
    _rm_succeeded(dirs["rm"], 0.84)
    assert _queue._next_queued(set()) == (ids["ppo"], False)  # 0.84 on 64: it may start

    _rm_succeeded(dirs["rm"], 0.5625)
    assert _queue._next_queued(set()) == (None, False)
    rec = record(dirs["ppo"])
    assert rec["state"] == "cancelled" and not (dirs["ppo"] / "train.log").exists()
    assert "0.562 on 64 items" in rec["error"] and "Wilson interval, 0.441" in rec["error"]
    assert "not above 0.5 (chance)" in rec["error"]
    status = api.run_status(ids["ppo"])
    assert status.advice.startswith("never started") and "Wilson" in status.advice
    assert "Wilson" in api.campaign_markdown(result.campaign)

    # a reward model that logged no held-out accuracy does not open the gate either
    _set_state(dirs["ppo"], "queued")
    (dirs["rm"] / "summary.json").write_text(json.dumps({"outcome": "succeeded", "steps": 4}))
    assert _queue._next_queued(set()) == (None, False)
    assert "logged no held-out eval/accuracy" in record(dirs["ppo"])["error"]


def test_an_output_another_run_takes_is_always_saved(lab_root, no_queue_worker):
    """The shrink turns final models off for large models (and a user may too): a queued
    upstream is made to save it when a run that takes its model is launched; one that already
    ran without saving it is refused. A plain ``after`` is replayed in the ledger's command."""
    up = queue_on_tiny("sft", [*SFT_STEPS, "checkpoint.save_final_model=false"]).run
    down = api.launch(
        api.RunRequest(recipe="dpo", overrides=[f"model.name=run:{up.id}"], shrink=True)
    )
    assert any(f"upstream run {up.id} will save its final model" in w for w in down.warnings)
    config = yaml.safe_load((Path(up.run_dir) / "config.yaml").read_text())
    assert config["checkpoint"]["save_final_model"] is True
    assert record(Path(up.run_dir))["overrides"][-1] == "checkpoint.save_final_model=true"
    assert down.queued and record(Path(down.run.run_dir))["after"] == [up.id]

    waiting = api.launch(api.RunRequest(recipe="dpo", overrides=[], model="tiny", after=[up.id]))
    assert waiting.queued and f"--after {up.id}" in api.record_results(waiting.run.id).command

    done = synthetic_run(lab_root, SFT, "sft", "sft")
    (done / "config.yaml").write_text(yaml.safe_dump({"checkpoint": {"save_final_model": False}}))
    with pytest.raises(Conflict, match="does not save its final model"):
        api.launch(api.RunRequest(recipe="dpo", overrides=[f"model.name=run:{SFT}"], shrink=True))
    out = cli("launch", "dpo", "--model", "tiny", "--after", SFT, "--after", "nope")
    assert out.exit_code == 2 and "cannot run after nope: there is no run" in out.output


def test_runs_waiting_for_each_other_are_cancelled_not_left_waiting(lab_root, no_queue_worker):
    """Only a hand-edited run.json can make two queued runs wait for each other; the queue
    worker then cancels both instead of polling forever."""
    a = queue_on_tiny("dpo", []).run
    b = queue_on_tiny("dpo", ["seed=1"], after=[a.id]).run
    rec = record(Path(a.run_dir))
    (Path(a.run_dir) / "run.json").write_text(json.dumps({**rec, "after": [b.id]}))
    assert _queue._next_queued(set()) == (None, False)
    for run in (a, b):
        rec = record(Path(run.run_dir))
        assert rec["state"] == "cancelled" and "dependency cycle" in rec["error"]


def _set_state(run_dir: Path, state: str) -> None:
    rec = record(run_dir)
    rec["state"] = state
    (run_dir / "run.json").write_text(json.dumps(rec))


# ---------------------------------------------------------------------------------------------
# Real runs on tiny
# ---------------------------------------------------------------------------------------------


def _wait_state(run_id: str, states: set[str], timeout_s: float = RUN_TIMEOUT_S) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        state = runs.run_state(run_id).state
        if state in states:
            return state
        time.sleep(0.25)
    pytest.fail(f"{run_id} did not reach {states} within {timeout_s:.0f} s")


@pytest.mark.slow
def test_a_failed_upstream_cancels_its_dependent_and_resuming_it_rearms_it(lab_root, monkeypatch):
    """An SFT run that fails at step 3 leaves the run that starts from its model cancelled (never
    started, the reason named, nothing hangs); resuming the SFT run re-arms it, and it then
    starts from the SFT run's final model."""
    monkeypatch.setenv("RLHF_LAB_FAULT_AT_STEP", "3")  # the queue worker's trainers inherit it
    upstream = queue_on_tiny("sft", [*SFT_STEPS, "train.max_steps=4", "checkpoint.save_every=1"], campaign="fails", force=True).run  # fmt: skip
    dependent = api.launch(api.RunRequest(recipe="sft", overrides=[*SFT_STEPS, "train.max_steps=2", f"model.name=run:{upstream.id}"], shrink=True, campaign="fails", force=True))  # fmt: skip
    assert dependent.queued and f"starts once {upstream.id} succeeded" in dependent.message
    assert _wait_state(upstream.id, {"failed", "succeeded"}) == "failed"
    assert _wait_state(dependent.run.id, {"cancelled"}, timeout_s=30) == "cancelled"
    run_dir = Path(dependent.run.run_dir)
    assert not (run_dir / "train.log").exists() and not (run_dir / "process.json").exists()
    status = runs.run_state(dependent.run.id)
    assert f"upstream run {upstream.id} ended failed" in status.error

    monkeypatch.delenv("RLHF_LAB_FAULT_AT_STEP")
    resumed = api.resume_run(upstream.id, force=True)
    assert resumed.rearmed == [dependent.run.id]
    assert runs.run_state(dependent.run.id).state in {"queued", "starting", "running"}
    assert _wait_state(upstream.id, {"succeeded", "failed"}) == "succeeded"
    assert _wait_state(dependent.run.id, {"succeeded", "failed", "cancelled"}) == "succeeded"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["name"] == str(Path(upstream.run_dir) / "final_model")
    row = api.record_results(dependent.run.id)
    assert row.model == f"run:{upstream.id} (sft)" and row.state == "succeeded"


@pytest.mark.slow
@pytest.mark.skipif(
    not _recipe_exists("ppo_rm"), reason="the ppo_rm recipe is not in this checkout"
)
def test_the_rlhf_pipeline_runs_end_to_end_on_tiny(lab_root):
    """SFT -> preference RM -> PPO against it, shrunk to a couple of steps per stage (the RM
    to its shrunk recipe, so that it clears ppo's gate): every stage succeeds in order, the PPO run scores with the RM run's model, and the ledger tells
    the stages as one story."""
    quick = [  # the rm stage keeps its shrunk size: ppo's gate needs it above chance
        "sft.train.max_steps=2",
        "ppo.train.max_steps=2",
        "sft.data.max_samples=48",
        "sft.data.eval_size=8",
        "ppo.data.size=8",
        "ppo.data.eval_size=2",
        "ppo.rollout.prompts_per_step=2",
        "ppo.rollout.num_rollouts=2",
        "ppo.rollout.max_new_tokens=16",
        "ppo.eval.max_new_tokens=8",
        "ppo.train.batch_size=4",
        "ppo.eval.num_samples=0",
    ]
    result = api.run_pipeline("rlhf", model="tiny", overrides=quick)
    ids = {s.stage: s.run_id for s in result.stages}
    assert list(ids) == ["sft", "rm", "ppo"]
    for stage in ("sft", "rm", "ppo"):
        state = _wait_state(ids[stage], {"succeeded", "failed", "cancelled", "died"})
        log = (runs.find_run(ids[stage]) / "train.log").read_text()[-3000:]
        assert state == "succeeded", (stage, log)
    ppo_dir = runs.find_run(ids["ppo"])
    config = yaml.safe_load((ppo_dir / "config.yaml").read_text())
    assert config["reward"]["model"] == str(runs.find_run(ids["rm"]) / "final_model")
    assert config["model"]["name"] == str(runs.find_run(ids["sft"]) / "final_model")
    api.record_results(ids["ppo"])
    ledger = api.campaign_markdown(result.campaign)
    assert "Pipeline `rlhf`: sft → rm → ppo." in ledger
    assert f"| rm | `{ids['rm']}` | succeeded | sft | final_model → reward.model of ppo |" in ledger
