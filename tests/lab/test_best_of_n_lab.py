"""best_of_n on the lab side, fast: its time prediction by hand, the CPU sizing that keeps n_max,
the ORM/PRM run references of an evaluate call, and the analysis behind a campaign's answer
(verdict, table, figure) on hand-built job folders."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from rlhf_lab.errors import InvalidArgument
from rlhf_lab.planning import time as pt
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.results.best_of_n import analyse_best_of_n, verdict_text
from tests.lab.test_evaluations import write_run
from tests.lab.test_time_predictor import STUB
from trainers.evaluation import best_of_n_stats as bs

pytestmark = pytest.mark.usefixtures("lab_root")


# ---------------------------------------------------------------------------------------------
# time
# ---------------------------------------------------------------------------------------------


def test_best_of_n_time_by_hand():
    cfg = {
        "suite": "best_of_n",
        "sampling": {"n": 4, "max_new_tokens": 10, "batch_size": 2},
        "prompts": {"size": 8},
        "best_of_n": {"score_batch_size": 8},
    }
    est = pt.evaluation_from_calibration(STUB, TrainerConfig("evaluation", cfg), policies=1)
    # generation: 4 batches of 2 prompts; each one prefill of 2 × 60 tokens at 2000/s, then 9
    # decode steps at 8 rows (0.02 + (0.05 − 0.02) × 4/12 = 0.03 s)
    generation = 4 * (2 * 60 / 2000 + 9 * 0.03)
    # scoring: 32 rows of 60 + 10 tokens, 8 a pass: 4 passes of 0.02 + 560/4000 s, per model
    scoring = 2 * 4 * (0.02 + 8 * 70 / 4000)
    start = 5 + 2 + 2 * 1  # imports, the first load, two more models
    assert est.parts["generation"] == pytest.approx(generation, abs=0.05)
    assert est.parts["scoring"] == pytest.approx(scoring, abs=0.05)
    assert est.total_s == pytest.approx(generation + scoring + start, abs=0.1)
    assert "8 prompts × 4 samples, then ORM and PRM scoring" in est.text
    # scoring an earlier job's completions again samples nothing
    again = {**cfg, "best_of_n": {"score_batch_size": 8, "samples_from": "/x/runs/bon-1"}}
    est_again = pt.evaluation_from_calibration(STUB, TrainerConfig("evaluation", again), policies=1)
    assert est_again.parts["generation"] == 0.0
    assert "scoring of 8 prompts × 4 earlier samples" in est_again.text
    assert est_again.parts["scoring"] == pytest.approx(scoring, abs=0.05)
    # another suite keeps its own work model
    other = pt.evaluation_from_calibration(
        STUB, TrainerConfig("evaluation", {**cfg, "suite": "reasoning"}), policies=1
    )
    assert "scoring" not in other.parts


def test_cost_counts_the_tokens_sampled_and_none_when_samples_are_reused():
    from rlhf_lab.evaluation.cost import estimate_evaluation

    cost = estimate_evaluation("tiny", "best_of_n", device="cpu", baseline=False)
    assert cost.generated_tokens == 64 * 16 * 128 and cost.policies == 1
    reused = estimate_evaluation(
        "tiny", "best_of_n", ["best_of_n.samples_from=/x/bon"], device="cpu", baseline=False
    )
    assert reused.generated_tokens == 0


def test_cpu_sizing_keeps_n_max_for_best_of_n():
    from rlhf_lab.evaluation import jobs as evaluations

    data = evaluations.shipped_suite("best_of_n")
    assert evaluations.cpu_sized_overrides(data, "smollm2-135m-instruct", "cpu") == []
    reasoning = evaluations.shipped_suite("reasoning")
    assert "sampling.n=1" in evaluations.cpu_sized_overrides(reasoning, "smollm2", "cpu")


# ---------------------------------------------------------------------------------------------
# the reward-model references of an evaluate call
# ---------------------------------------------------------------------------------------------


def _runs(root: Path) -> dict[str, Path]:
    return {
        "policy": write_run(root, "sft-aaaa", "sft", "sft"),
        "orm": write_run(root, "orm-bbbb", "reward_models", "orm", state="queued"),
        "prm": write_run(root, "prm-cccc", "reward_models", "prm", state="queued"),
        "pref": write_run(root, "pref-dddd", "reward_models", "preference_rm", state="queued"),
        "bon": write_run(root, "bon-eeee", "evaluation", "best_of_n", state="queued"),
        "reasoning": write_run(root, "rea-ffff", "evaluation", "reasoning", state="queued"),
    }


def test_evaluate_resolves_the_orm_and_prm_runs_and_waits_for_them(lab_root):
    from rlhf_lab.evaluation.jobs import prepare_evaluation

    runs = _runs(lab_root)
    job = prepare_evaluation(
        "sft-aaaa",
        "best_of_n",
        overrides=["best_of_n.orm=run:orm-bbbb", "best_of_n.prm=prm-cccc", "prompts.size=8"],
        device="cpu",
    )
    assert job.config.get("best_of_n.orm") == str(runs["orm"] / "final_model")
    assert job.config.get("best_of_n.prm") == str(runs["prm"] / "final_model")
    assert job.config.get("sampling.n") == 16 and job.config.get("suite") == "best_of_n"
    assert {"orm-bbbb", "prm-cccc"} <= set(job.after)
    assert job.config.get("baseline") is None  # a run's default baseline (auto) does not apply
    assert job.config.get("best_of_n.samples_from") is None
    reuse = prepare_evaluation(
        "sft-aaaa",
        "best_of_n",
        overrides=[
            "best_of_n.orm=run:orm-bbbb",
            "best_of_n.prm=prm-cccc",
            "best_of_n.samples_from=run:bon-eeee",
        ],
    )
    assert reuse.config.get("best_of_n.samples_from") == str(runs["bon"])
    assert "bon-eeee" in reuse.after
    with pytest.raises(InvalidArgument, match="no baseline"):
        prepare_evaluation(
            "sft-aaaa",
            "best_of_n",
            baseline="tiny",
            overrides=["best_of_n.orm=run:orm-bbbb", "best_of_n.prm=prm-cccc"],
        )


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["best_of_n.orm=run:prm-cccc", "best_of_n.prm=run:prm-cccc"], "not a orm reward model"),
        (["best_of_n.orm=run:orm-bbbb", "best_of_n.prm=run:pref-dddd"], "not a prm reward model"),
        (["best_of_n.orm=run:orm-bbbb", "best_of_n.prm=run:sft-aaaa"], "not a prm reward model"),
        (["best_of_n.orm=run:orm-bbbb"], "best_of_n.prm"),
        (["best_of_n.orm=run:orm-bbbb", "best_of_n.prm=run:nope-0000"], "names no run"),
        (
            ["best_of_n.orm=orm-bbbb", "best_of_n.prm=prm-cccc", "best_of_n.samples_from=rea-ffff"],
            "not a best_of_n evaluation",
        ),
    ],
)
def test_evaluate_refuses_wrong_reward_models_before_writing(lab_root, overrides, needle):
    from rlhf_lab.errors import LabError
    from rlhf_lab.evaluation.jobs import prepare_evaluation

    _runs(lab_root)
    before = sorted(p.name for p in (lab_root / "experiments").rglob("*"))
    with pytest.raises(LabError) as err:
        prepare_evaluation("sft-aaaa", "best_of_n", baseline="none", overrides=overrides)
    assert needle in err.value.message
    assert "--set" not in err.value.message
    assert sorted(p.name for p in (lab_root / "experiments").rglob("*")) == before


# ---------------------------------------------------------------------------------------------
# the analysis
# ---------------------------------------------------------------------------------------------


def _job(root: Path, name: str, rows: list[dict], n_max: int, seed: int = 0) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    settings = {
        "seed": seed,
        "sampling": {"n": n_max},
        "best_of_n": {"prm_aggregate": "product", "majority_draws": 2000},
    }
    (folder / "eval.json").write_text(json.dumps({"suite": "best_of_n", "settings": settings}))
    (folder / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _rows(n_prompts: int, prm_good: bool) -> list[dict]:
    """8 samples a prompt, 2 correct (answer "7"); the PRM ranks the correct ones first (or
    not), the ORM ranks a wrong one first; wrong answers disagree, so the vote is mixed."""
    rows = []
    for i in range(n_prompts):
        samples = []
        for j in range(8):
            correct = j in (0, 4)
            prm_score = 0.9 if correct and prm_good else 0.1 + 0.05 * j
            samples.append(
                {
                    "correct": correct,
                    "answer": "7" if correct else str(j),
                    "orm": 0.05 if correct else 0.2 + 0.05 * j,
                    "prm": prm_score,
                    "prm_product": prm_score,
                    "prm_min": 1.0 - prm_score,  # the other aggregate ranks the other way
                }
            )
        rows.append({"id": f"p{i}", "samples": samples})
    return rows


def test_answer_says_the_prm_lead_grows_and_draws_the_figure(tmp_path):
    job = _job(tmp_path, "bon-1", _rows(40, prm_good=True), 8)
    answer = analyse_best_of_n([job], tmp_path / "fig" / "best_of_n.png", resamples=200)
    assert answer.verdict.startswith("PRM's lead over ORM grows with n")
    assert "n=2" in answer.verdict and "n=8" in answer.verdict
    assert [r["n"] for r in answer.table] == [1, 2, 4, 8]
    # n = 8: the PRM always picks a right one, the ORM never
    assert answer.table[-1]["PRM"].startswith("1.000") and answer.table[-1]["ORM"].startswith(
        "0.000"
    )
    assert answer.table[0]["PRM − ORM"].startswith("+0.000")
    png = Path(answer.figure)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| n | ORM | PRM |" in answer.markdown_table()
    assert answer.n_prompts == 40 and answer.prm_aggregate == "product"


def test_answer_no_lead_and_the_other_aggregate(tmp_path):
    job = _job(tmp_path, "bon-1", _rows(40, prm_good=False), 8)
    answer = analyse_best_of_n([job], resamples=200)
    assert answer.figure is None
    # both rank a wrong answer first whenever one is drawn: equal accuracy at every n
    assert answer.verdict.startswith("no lead") or answer.verdict.startswith("no PRM lead")
    flipped = analyse_best_of_n([job], aggregate="min", resamples=200)
    assert flipped.prm_aggregate == "min"
    assert flipped.verdict.startswith("PRM's lead over ORM grows with n")


def test_pooling_two_sampling_seeds_averages_prompt_by_prompt(tmp_path):
    good = _job(tmp_path, "a", _rows(30, prm_good=True), 8)
    bad = _job(tmp_path, "b", _rows(30, prm_good=False), 8, seed=1)
    pooled = analyse_best_of_n([good, bad], resamples=200)
    one = analyse_best_of_n([good], resamples=200).stats["accuracy"]["prm"]["8"]["value"]
    other = analyse_best_of_n([bad], resamples=200).stats["accuracy"]["prm"]["8"]["value"]
    assert pooled.stats["accuracy"]["prm"]["8"]["value"] == pytest.approx((one + other) / 2)
    assert pooled.n_prompts == 30
    assert [e.split(":")[0] for e in pooled.per_evaluation] == ["a", "b"]
    assert pooled.per_evaluation[0].startswith("a: PRM − ORM at n=8 +1.000")


def test_analysis_refuses_other_folders(tmp_path):
    with pytest.raises(InvalidArgument):
        analyse_best_of_n([tmp_path])
    a = _job(tmp_path, "a", _rows(3, True), 8)
    b = _job(tmp_path, "b", copy.deepcopy(_rows(3, True)), 8)
    (b / "eval.json").write_text(json.dumps({"suite": "reasoning", "settings": {}}))
    with pytest.raises(InvalidArgument):
        analyse_best_of_n([a, b])
    with pytest.raises(InvalidArgument):
        analyse_best_of_n([a], aggregate="mean")


def test_verdict_when_no_sample_is_correct_is_no_answer_not_no_lead(tmp_path):
    rows = _rows(10, prm_good=True)
    for r in rows:
        for smp in r["samples"]:
            smp["correct"] = False
    answer = analyse_best_of_n([_job(tmp_path, "zero", rows, 8)], resamples=200)
    assert answer.verdict.startswith("no answer: none of the policy's samples is correct")
    assert "PRM − majority vote" in answer.table[0]


def test_verdict_wording_for_a_lead_that_does_not_grow():
    values = []
    for i in range(60):  # the PRM is ahead by the same amount at n = 2 and n = 4
        lead = 0.2 if i % 2 else 0.0
        values.append(
            {
                "orm": {1: 0.5, 2: 0.5, 4: 0.5},
                "prm": {1: 0.5, 2: 0.5 + lead, 4: 0.5 + lead},
                "majority": {1: 0.5, 2: 0.5, 4: 0.5},
                "random": {1: 0.5, 2: 0.5, 4: 0.5},
            }
        )
    text = verdict_text(bs.best_of_n_table(values, resamples=200))
    assert text.startswith("PRM leads ORM at n=4") and "not resolved" in text
