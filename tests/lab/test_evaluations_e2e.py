"""Evaluations end to end on ``tiny``: the SFT warm start and a GRPO run the lab starts from it
(``model.name=run:<id>``), each evaluated on ``reasoning`` by ``evaluate_model`` as a lab job;
the ledger's Evaluation section shows both with intervals and compare tables them. (The cache
is tested on the job itself: tests/trainers/evaluation/test_cache.py.)

The warm start is the session's cached run of the ``sft_tiny_warmstart`` recipe
(``trainers.sft.train.warm_start_model``, which other tests build too); its real run folder is
copied into the lab's campaign with the run.json the launcher would have written, so that the
lab can name it as ``run:<id>`` without training it a second time. The GRPO run is two steps at
a small learning rate: the point here is the lab's before/after on the same prompts (the GRPO
run must evaluate at least as accurate as its warm start); that GRPO raises accuracy given
enough steps is tests/trainers/policy_gradients/test_pg_learning.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlhf_lab import api, runs
from rlhf_lab.runs import wait_for_end
from tests._helpers.run_folders import CREATED_AT, write_run_json
from trainers.core.runfolder import EvalFile, read_file

CAMPAIGN = "2026-01-01-warm-then-grpo"
TASK = "{name: chain_sum, config: {min_terms: 2, max_terms: 3, min_digits: 1, max_digits: 1}}"
EVAL = [
    "prompts.size=24",
    "sampling.temperature=0",  # greedy: the before/after difference is the models', not the dice
    "sampling.n=1",
    "reasoning.pass_k=[1]",
    "sampling.max_new_tokens=32",
    "bootstrap.resamples=200",
]


pytestmark = pytest.mark.usefixtures("lab_root", "stop_leftover_runs")


def adopt_warm_start(root: Path) -> str:
    """The cached warm-start run folder as a succeeded SFT run of the lab; returns its id."""
    from trainers.sft.train import warm_start_model

    warm = warm_start_model()
    run_id = "sft-20260101-000000-0001"
    run_dir = root / "experiments" / CAMPAIGN / "runs" / run_id
    shutil.copytree(warm.parent, run_dir, ignore=shutil.ignore_patterns("checkpoints"))
    source = "trainers/sft/configs/sft_tiny_warmstart.yaml"
    write_run_json(
        run_dir, "sft", "sft", state="succeeded", config_source=source, created_at=CREATED_AT
    )
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "signal": None}))
    return run_id


def evaluated(job_id: str) -> EvalFile:
    status = wait_for_end(job_id, poll_s=0.5, timeout_s=600)
    assert status.state == "succeeded", (status, runs.find_run(job_id).joinpath("train.log"))
    ev, warning = read_file(runs.find_run(job_id) / "eval.json", EvalFile)
    assert ev is not None, warning
    api.record_results(job_id)  # the recorder does it too, but in its own time
    return ev


@pytest.mark.slow
def test_warm_start_and_grpo_evaluated_before_and_after_into_the_ledger(lab_root):
    sft_id = adopt_warm_start(lab_root)
    grpo = api.launch(
        api.RunRequest(
            recipe="grpo",
            overrides=[
                f"model.name=run:{sft_id}",
                f"data.specs=[{TASK}]",
                "train.max_steps=2",
                "rollout.prompts_per_step=2",
                "rollout.num_rollouts=4",
                "rollout.max_new_tokens=32",
                "train.learning_rate=1.0e-5",
                "eval.eval_every=0",
            ],
            shrink=True,
            campaign=CAMPAIGN,
            device="cpu",
        )
    )
    grpo_id = grpo.run.id
    assert wait_for_end(grpo_id, poll_s=0.5, timeout_s=600).state == "succeeded"

    # the warm start against the preset it came from; the GRPO run against the warm start
    warm_eval = api.evaluate_model(sft_id, overrides=EVAL)
    assert warm_eval.campaign == CAMPAIGN and warm_eval.baseline == "auto"
    grpo_eval = api.evaluate_model(f"run:{grpo_id}", overrides=EVAL)
    (w_id,), (g_id,) = warm_eval.run_ids, grpo_eval.run_ids
    status = api.run_status(w_id).status  # a job like a run
    assert status.family == "evaluation" and status.algorithm == "reasoning"
    w, g = evaluated(w_id), evaluated(g_id)

    assert w.baseline == "auto (tiny)" and w.target_run.endswith(sft_id)
    assert g.target_run.endswith(grpo_id)
    assert g.baseline_model == str(runs.find_run(sft_id) / "final_model")  # its starting model
    for ev in (w, g):
        acc = ev.metrics["accuracy"]
        assert acc.low is not None and acc.low <= acc.value <= acc.high and acc.n == 24
        assert ev.difference["accuracy"].low is not None
    assert w.metrics["accuracy"].value > 0.3 and w.difference["accuracy"].low > 0
    # the GRPO run is at least as accurate as the warm start it started from, on the same
    # prompts with the same seed
    assert g.metrics["accuracy"].value >= g.baseline_metrics["accuracy"].value

    ledger = api.campaign_markdown(CAMPAIGN)
    section = ledger.split("## Evaluation", 1)[1].split("## Comparison", 1)[0]
    for job, ev in ((w_id, w), (g_id, g)):
        acc = ev.metrics["accuracy"]
        assert f"`{job}`" in section
        assert f"{acc.value:.3g} [{acc.low:.3g}, {acc.high:.3g}]" in section
    assert f"| {sft_id} | reasoning | accuracy (headline) |" in section
    assert f"baseline auto (run:{sft_id})" in section  # the starting model, named as a run
    assert f"| {grpo_id} | reasoning | accuracy (headline) |" in section
    runs_block = ledger.split("## Runs", 1)[1].split("## Plots", 1)[0]
    assert grpo_id in runs_block and w_id not in runs_block  # jobs have their own block

    # compare: the evaluations side by side, and beside the training runs they evaluated
    table = api.compare_runs([w_id, g_id])
    assert table.family == "evaluation" and table.columns[:3] == [
        "accuracy",
        "baseline accuracy",
        "Δ accuracy",
    ]
    assert table.rows[1].values["accuracy"] == g.metrics["accuracy"].value
    assert f"`{g_id}`" in api.compare_runs([grpo_id]).markdown
