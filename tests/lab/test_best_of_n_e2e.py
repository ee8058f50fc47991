"""best_of_n end to end through the lab on ``tiny``: an ORM and a PRM launched as runs, the
evaluation named against them while they are still running (it waits for both), recorded into
the ledger's Evaluation section, and the campaign answer (verdict, table, figure) read back from
the job folder. The policy is the session's cached SFT warm start (it answers a share of the
chain sums right, so the selectors have samples that disagree); the reward models are trained a
few steps only: the point is the flow, not which selector wins."""

from __future__ import annotations

import pytest

from rlhf_lab import api, runs
from rlhf_lab.results.best_of_n import analyse_best_of_n
from tests.lab.test_evaluations_e2e import CAMPAIGN, adopt_warm_start, evaluated

RM = [
    "model.name=tiny",
    "checkpoint.save_final_model=true",
    "data.max_samples=24",
    "data.eval_size=4",
    "train.max_steps=3",
]


pytestmark = pytest.mark.usefixtures("lab_root", "stop_leftover_runs")


@pytest.mark.slow  # builds the SFT warm start when no earlier test of the session has
def test_best_of_n_waits_for_its_reward_models_and_lands_in_the_ledger(lab_root, tmp_path):
    sft_id = adopt_warm_start(lab_root)
    orm = api.launch(
        api.RunRequest(recipe="orm", overrides=RM, shrink=True, campaign=CAMPAIGN, device="cpu")
    )
    prm = api.launch(
        api.RunRequest(recipe="prm", overrides=RM, shrink=True, campaign=CAMPAIGN, device="cpu")
    )
    launched = api.evaluate_model(
        sft_id,
        suite=["best_of_n"],
        overrides=[
            f"best_of_n.orm=run:{orm.run.id}",
            f"best_of_n.prm=run:{prm.run.id}",
            "prompts.size=6",
            "sampling.n=4",
            "sampling.max_new_tokens=32",
            "bootstrap.resamples=200",
        ],
    )
    assert launched.baseline is None  # best_of_n compares selectors on one policy's samples
    (job_id,) = launched.run_ids
    ev = evaluated(job_id)
    assert ev.suite == "best_of_n" and ev.headline == "prm_minus_orm"
    assert ev.details["orm"].endswith(f"{orm.run.id}/final_model")
    assert ev.details["prm"].endswith(f"{prm.run.id}/final_model")
    share = ev.metrics["random@1"].value
    assert 0 < share < 1  # the warm start's samples disagree
    for sel in ("orm", "prm", "majority"):  # one sample: every selector takes it
        assert ev.metrics[f"{sel}@1"].value == pytest.approx(share)

    section = api.campaign_markdown(CAMPAIGN).split("## Evaluation", 1)[1]
    assert f"`{job_id}`" in section and "prm_minus_orm (headline)" in section

    answer = analyse_best_of_n([runs.find_run(job_id)], tmp_path / "best_of_n.png", resamples=200)
    assert not answer.verdict.startswith("no answer")
    assert [r["n"] for r in answer.table] == [1, 2, 4]
    assert answer.figure is not None and answer.n_prompts == 6
