"""The campaign's answer (rlhf_lab/results/answer.py and the ledger's Answer block): the change
from the start per arm with its interval, checked against hand computations; the budget's
adequacy; the figure; the block under the title of a new and of an old ledger; compare
--campaign recording it."""

from __future__ import annotations

import json
import math

import pytest

from rlhf_lab import ledger
from rlhf_lab.ledger.render import replace_blocks
from rlhf_lab.results.answer import (
    arm_change,
    change_answer,
    change_verdict,
    draw_change_figure,
    signal_moved,
    start_and_last,
)
from rlhf_lab.results.compare import compare_runs
from rlhf_lab.results.stats import newcombe_difference
from tests.lab.test_overoptimisation import CAMP, PNG_MAGIC, make_run

PLAIN = ("model.name=tiny", "train.max_steps=12")


pytestmark = pytest.mark.usefixtures("lab_root")


def pg_rows(start: float, end: float, *, fmt=(0.5, 0.9), contrast=0.6, steps=12, n=32):
    """A policy-gradient run: eval rows at 0, 6 and 12 (correctness start → end, linear), rollout
    rows with the given reward contrast and a response length growing by one token a step."""
    rows = []
    for step in (0, 6, 12):
        f = step / steps
        rows.append(
            {
                "step": step,
                "phase": "eval",
                "eval/avg_correctness": start + (end - start) * f,
                "eval/avg_format": fmt[0] + (fmt[1] - fmt[0]) * f,
                "eval/response_length/mean": 40.0 + step,
                "eval/num_prompts": n,
            }
        )
    for step in range(1, steps + 1):
        rows.append(
            {
                "step": step,
                "phase": "rollout",
                "avg_correctness": start + (end - start) * step / steps,
                "frac_reward_zero_std": 1.0 - contrast,
                "response_length/mean": 30.0 + step,
            }
        )
    return sorted(rows, key=lambda r: (r["step"], r["phase"] != "eval"))


def test_start_and_last_read_the_step0_and_last_evaluations():
    rows = pg_rows(0.25, 0.5)
    assert start_and_last(rows, "eval/avg_correctness") == (0.25, 0.5, 32)
    # no step-0 evaluation: no start to measure from
    assert start_and_last([r for r in rows if r["step"] != 0], "eval/avg_correctness") is None
    assert start_and_last(rows, "eval/missing") is None


def test_arm_change_over_seeds_is_the_t_interval_of_the_deltas():
    # deltas 0.1, 0.2, 0.3: mean 0.2, sd 0.1, t(0.975, 2) = 4.302653
    change = arm_change("grpo", "m", [(0.2, 0.3, 32), (0.2, 0.4, 32), (0.1, 0.4, 32)])
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert change.change.estimate == pytest.approx(0.2)
    assert change.change.low == pytest.approx(0.2 - half, abs=1e-5)
    assert change.change.high == pytest.approx(0.2 + half, abs=1e-5)
    assert change.basis == "t over 3 seeds"
    assert change_verdict(change) == "no change beyond noise"  # 0.2 ± 0.25 contains 0


def test_seeds_that_moved_alike_take_newcombe_on_the_pooled_prompts():
    change = arm_change("grpo", "m", [(0.25, 0.5, 32), (0.25, 0.5, 32)])
    expected = newcombe_difference(0.5, 64, 0.25, 64)
    assert (change.change.low, change.change.high) == pytest.approx((expected.low, expected.high))
    assert change.change.low > 0 and change_verdict(change) == "raised"
    lowered = arm_change("grpo", "m", [(0.5, 0.1, 32)])  # one seed
    assert change_verdict(lowered) == "lowered"
    # not a share, no spread: no noise estimate, no verdict
    assert arm_change("grpo", "len", [(40.0, 52.0, 32), (40.0, 52.0, 32)]) is None


def test_the_budget_is_adequate_only_when_groups_had_contrast():
    moved, text = signal_moved({"a": pg_rows(0.2, 0.5, contrast=0.6)})
    assert moved and "60%" in text and "first quarter" in text
    flat, text = signal_moved({"a": pg_rows(0.0, 0.0, contrast=0.0)})
    assert not flat and "too few groups had contrast" in text
    assert signal_moved({"a": []})[0] is False


def test_change_answer_names_each_arm_with_its_interval(tmp_path):
    rows = {
        "g1": pg_rows(0.2, 0.6),
        "g2": pg_rows(0.25, 0.55),
        "g3": pg_rows(0.2, 0.65),
        "d1": pg_rows(0.2, 0.2, fmt=(0.5, 0.5)),
        "d2": pg_rows(0.25, 0.3, fmt=(0.5, 0.5)),
        "d3": pg_rows(0.2, 0.15, fmt=(0.5, 0.5)),
    }
    arms = {"grpo": ["g1", "g2", "g3"], "drgrpo": ["d1", "d2", "d3"]}
    metrics = [("eval/avg_correctness", "held-out correctness"), ("eval/avg_format", "format")]
    answer = change_answer(arms, rows, metrics)
    assert "**grpo**, held-out correctness: 0.217 → 0.6, Δ +0.383" in answer.verdict
    assert answer.verdict.count("— **raised**") == 1
    assert "**drgrpo**, held-out correctness: 0.217 → 0.217" in answer.verdict
    assert answer.verdict.endswith("— **no change beyond noise**")
    assert any(
        line.startswith("**grpo**, format") and "**raised**" in line for line in answer.details
    )
    assert answer.budget.startswith("adequate") and answer.run_ids[:3] == ["g1", "g2", "g3"]
    out = draw_change_figure(
        arms,
        rows,
        [("eval/avg_correctness", "eval", "c"), ("response_length/mean", "rollout", "l")],
        tmp_path / "answer.png",
    )
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert draw_change_figure(arms, {}, [("x", "eval", "x")], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_the_answer_block_opens_a_new_campaign_and_is_added_under_an_old_title():
    ledger.create_campaign(CAMP, "Does it learn?")
    md = (ledger.experiments_dir() / f"{CAMP}.md").read_text()
    assert md.index("## Answer") < md.index("## Goal")
    assert "_No answer yet" in md
    old = "# Does it learn?\n\n## Goal\n\ntext\n"
    new = replace_blocks(old, {"answer": "**yes**"}, {"answer": "Answer"}, "x.md")
    assert new.startswith(
        "# Does it learn?\n\n## Answer\n\n<!-- rlhf-lab:begin answer -->\n**yes**"
    )
    assert new.endswith("## Goal\n\ntext\n")


def test_compare_campaign_records_the_answer_and_its_figure(lab_root):
    ledger.create_campaign(CAMP, "Does GRPO raise held-out correctness from the warm start?")
    ids = []
    for i, (a, b) in enumerate([(0.2, 0.6), (0.25, 0.55), (0.2, 0.65)]):
        run_id = f"grpo-{i}"
        make_run(run_id, pg_rows(a, b), overrides=(*PLAIN, f"seed={42 + i}"))
        ledger.record_run(run_id, plot=False)
        ids.append(run_id)
    compare_runs(ids, record_in=CAMP)
    stored = json.loads((lab_root / "experiments" / CAMP / "ledger.json").read_text())
    assert stored["answer"]["verdict"].startswith("**grpo**, greedy held-out correctness")
    assert stored["answer"]["figure"] == "plots/answer.png"
    assert (lab_root / "experiments" / CAMP / "plots" / "answer.png").read_bytes()[:8] == PNG_MAGIC
    md = (lab_root / "experiments" / f"{CAMP}.md").read_text()
    lines = md.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("**grpo**, greedy"))
    assert at < 40 and at < lines.index("## Goal")
    assert f"![answer]({CAMP}/plots/answer.png)" in md
    # recording a run again (the incremental path) keeps the answer
    ledger.record_run(ids[0], plot=False)
    assert "**grpo**, greedy" in (lab_root / "experiments" / f"{CAMP}.md").read_text()


def test_with_two_arms_the_comparison_between_them_leads_the_answer(lab_root):
    """A campaign of two arms answers with the difference between them (its interval) first,
    then each arm's change from the start."""
    ledger.create_campaign(CAMP, "Does GRPO beat Dr. GRPO here?")
    ids = []
    for i, (recipe, end) in enumerate(
        [("grpo", 0.9), ("grpo", 0.92), ("drgrpo", 0.3), ("drgrpo", 0.32)]
    ):
        run_id = f"{recipe}-{i}"
        make_run(run_id, pg_rows(0.2, end), recipe=recipe, overrides=(*PLAIN, f"seed={42 + i % 2}"))
        ids.append(run_id)
    compare_runs(ids, record_in=CAMP)
    answer = json.loads((lab_root / "experiments" / CAMP / "ledger.json").read_text())["answer"]
    assert answer["verdict"].startswith(
        "**grpo** beats **drgrpo** on greedy held-out correctness: Δ +0.6"
    )
    assert "95% +" in answer["verdict"]
    assert answer["details"][0].startswith("**grpo**, greedy held-out correctness: 0.2 → 0.91")


def test_a_training_trend_is_last_quarter_against_first_over_seeds():
    from rlhf_lab.results.answer import training_trend

    runs = [pg_rows(0.2, 0.5), pg_rows(0.2, 0.5), pg_rows(0.2, 0.5)]
    for i, run in enumerate(runs):  # lengths 30+step (+i): quarters of 12 steps are 3 steps
        for r in run:
            if r["phase"] == "rollout":
                r["response_length/mean"] += i * r["step"] / 12
    line = training_trend("grpo", runs, "response_length/mean", "length")
    # per run: mean of steps 10-12 minus steps 1-3 = 9 (+ 9i/12): 9, 9.75, 10.5 -> mean 9.75
    assert "Δ +9.75" in line and line.endswith("— **rose**")
    assert training_trend("grpo", runs[:1], "response_length/mean", "length") is None


def test_a_queued_run_stopped_before_it_started_says_it_never_ran():
    """The ledger told of a resumable checkpoint for a queued run stopped before it ran."""
    ledger.create_campaign(CAMP, "q")
    path = make_run("grpo-never", [], overrides=PLAIN, state="stopped")
    (path / "summary.json").unlink()
    record = ledger.record_run("grpo-never", plot=False)
    assert record.failure == "stopped on request before it started: it never ran"
    ran = make_run("grpo-ran", pg_rows(0.2, 0.3), overrides=PLAIN, state="stopped")
    assert (ran / "summary.json").is_file()
    assert "resuming it continues" in ledger.record_run("grpo-ran", plot=False).failure


def dpo_run(run_id: str, beta: float, seed: int, rights: list[int]) -> None:
    """A direct-alignment run folder that logged the gold evaluation at steps 0, 6, 12."""
    import yaml

    from tests.lab.test_overoptimisation import REPO

    path = ledger.experiments_dir() / CAMP / "runs" / run_id
    path.mkdir(parents=True)
    source = "trainers/direct_alignment/configs/dpo.yaml"
    cfg = yaml.safe_load((REPO / source).read_text())
    cfg.update(beta=beta, seed=seed)
    cfg["model"]["name"] = "tiny"
    meta = {
        "id": run_id, "family": "direct_alignment", "algorithm": "dpo", "campaign": CAMP,
        "config_source": source, "overrides": [f"beta={beta}", f"seed={seed}", "model.name=tiny"],
        "argv": ["python", "-m", "trainers.direct_alignment.train"], "state": "succeeded",
        "started_at": "2026-03-02T10:00:00.000+00:00",
    }  # fmt: skip
    (path / "run.json").write_text(json.dumps(meta))
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows, gold = [], []
    for step, n in zip((0, 6, 12), rights, strict=True):
        rows.append(
            {"step": step, "phase": "eval", "eval/gold_correctness": n / 32,
             "eval/gold_reward": n / 32, "eval/sqrt_kl": step / 6 / beta ** 0.5,
             "eval/num_prompts": 32, "eval/accuracy": 0.5 + step / 40}
        )  # fmt: skip
        gold.append({"step": step, "right": [1.0 if i < n else 0.0 for i in range(32)]})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "eval_gold.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gold))
    (path / "summary.json").write_text(json.dumps({"outcome": "succeeded", "steps": 12}))


def test_compare_of_gold_logging_dpo_runs_records_gold_against_kl(lab_root):
    ledger.create_campaign(CAMP, "Does gold rise then fall against KL?")
    ids = []
    for beta, rights in ((0.01, (8, 24, 4)), (0.5, (8, 12, 14))):
        for seed in (42, 43, 44):
            run_id = f"dpo-{int(beta * 100)}-{seed}"
            dpo_run(run_id, beta, seed, list(rights))
            ledger.record_run(run_id, plot=False)
            ids.append(run_id)
    compare_runs(ids, record_in=CAMP)
    stored = json.loads((lab_root / "experiments" / CAMP / "ledger.json").read_text())
    answer = stored["answer"]
    assert answer["source"] == "gold against KL" and answer["figure"] == "plots/gold-vs-kl.png"
    assert "beta=0.01: rises then falls" in answer["verdict"]
    assert "beta=0.5: rises and holds" in answer["verdict"]
    assert "√KL" in answer["budget"]
    png = lab_root / "experiments" / CAMP / "plots" / "gold-vs-kl.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    md = (lab_root / "experiments" / f"{CAMP}.md").read_text()
    assert md.index("beta=0.01: rises then falls") < md.index("## Goal")


def test_best_of_n_jobs_become_the_answer(lab_root):
    from rlhf_lab.results.campaign_answer import record_best_of_n_answer
    from tests.lab.test_best_of_n_lab import _job, _rows

    ledger.create_campaign(CAMP, "Does the PRM's lead over the ORM grow with n?")
    runs = ledger.experiments_dir() / CAMP / "runs"
    _job(runs, "eval-20260302-100000-ab12", _rows(40, prm_good=True), 8)
    assert record_best_of_n_answer(CAMP, ["grpo-20260302-100000-ab12"]) is None  # not a job
    entry = record_best_of_n_answer(CAMP, ["eval-20260302-100000-ab12"])
    assert entry.verdict.startswith("PRM's lead over ORM grows with n")
    assert entry.figure == "plots/best-of-n.png" and "| n | ORM | PRM |" in entry.details[0]
    png = lab_root / "experiments" / CAMP / "plots" / "best-of-n.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    md = (lab_root / "experiments" / f"{CAMP}.md").read_text()
    assert md.index("PRM's lead over ORM grows") < md.index("## Goal")
