"""Honest framing (issue #25, item 6): the headline is not a number that cannot move, is shown
beside its step-0 value, a reward model's score of its own policy is labelled a proxy, and a
proportion's interval is never a point."""

from __future__ import annotations

import json

import pytest

from rlhf_lab import api
from rlhf_lab.ledger.render import _headline_text
from rlhf_lab.ledger.schema import HeadlineValue, RunRecord
from rlhf_lab.results.compare import compare_runs
from rlhf_lab.results.headline import PROXY_LABEL, headline_for, headline_line, start_text
from rlhf_lab.results.stats import pooled_share_interval, wilson_interval
from rlhf_lab.runs.folder import run_eval_rows
from tests.lab.test_overoptimisation import REPO, make_run, pg
from trainers.core.config import read_yaml

VERIFIER = ("model.name=tiny", "data.eval_size=32", "train.max_steps=20")


pytestmark = pytest.mark.usefixtures("lab_root")


def stuck_rows(formats=(0.1, 0.3, 0.5)) -> list[dict]:
    """A verifier-rewarded GRPO run on tiny: correctness 0 at every evaluation, format moving."""
    rows = []
    for i, f in enumerate(formats):
        step = 10 * i
        rows.append({"step": step, "phase": "train", "loss": 0.1, "avg_format": f})
        rows.append(
            {"step": step, "phase": "eval", "eval/avg_correctness": 0.0, "eval/avg_format": f}
        )
    return rows


def test_a_correctness_stuck_at_zero_is_not_the_headline_of_a_verifier_run():
    cfg = read_yaml(REPO / "trainers/policy_gradients/configs/grpo.yaml")
    rows = stuck_rows()
    # before: a run without a reward model always kept eval/avg_correctness, 0 throughout
    assert headline_for("policy_gradients", "grpo", pg(cfg), rows).metric == "eval/avg_format"
    # one evaluation is not "throughout": the spec's headline stays
    assert headline_for("policy_gradients", "grpo", pg(cfg), rows[:2]).metric == (
        "eval/avg_correctness"
    )
    # when nothing moved, the spec's headline stays (it is the first logged)
    flat = stuck_rows(formats=(0.0, 0.0, 0.0))
    assert headline_for("policy_gradients", "grpo", pg(cfg), flat).metric == "eval/avg_correctness"


def test_status_compare_and_ledger_agree_on_the_headline_and_show_step_0():
    make_run("g-0", stuck_rows(), overrides=VERIFIER)
    make_run("g-1", stuck_rows(formats=(0.2, 0.2, 0.4)), overrides=VERIFIER)
    line = api.run_status("g-0").headline
    assert line.startswith("held-out eval/avg_format 0.5 (step 20;")
    assert "step 0: 0.1)" in line
    cmp = compare_runs(["g-0", "g-1"])
    assert cmp.headline == "eval/avg_format"
    assert "at step 0" in cmp.markdown
    _header, row = [ln for ln in cmp.markdown.splitlines() if ln.startswith("| ")][:2]
    cells = [c.strip() for c in row.split("|")]
    assert cells[cells.index("0.45") + 2] == "0.15"  # mean 0.45, interval, step-0 mean 0.15


def test_the_ledger_headline_shows_its_start_and_the_proxy_label():
    h = HeadlineValue(metric="eval/avg_correctness", value=0.25, step=40, n=64, low=0.1, high=0.4)
    assert "step 0" not in _headline_text(RunRecord(run_id="r", campaign="c", headline=h))
    h.start_value, h.start_step = 0.125, 0
    assert _headline_text(RunRecord(run_id="r", campaign="c", headline=h)).endswith(
        "on n=64); step 0: 0.125"
    )
    h.start_step = 10
    assert "; first eval, step 10: 0.125" in _headline_text(
        RunRecord(run_id="r", campaign="c", headline=h)
    )
    proxy = HeadlineValue(metric="eval/proxy_reward", value=1.5, step=5)
    assert PROXY_LABEL in _headline_text(RunRecord(run_id="r", campaign="c", headline=proxy))
    assert PROXY_LABEL == "judged by its own reward model (proxy)"


def test_a_proxy_headline_is_labelled_in_the_status_line():
    cfg = read_yaml(REPO / "trainers/policy_gradients/configs/grpo.yaml")
    cfg["data"]["source"] = "preference"
    cfg["reward"]["model"] = "/rm"
    first = {"step": 0, "phase": "eval", "eval/proxy_reward": -0.5}
    last = {"step": 5, "phase": "eval", "eval/proxy_reward": 1.5}
    line = headline_line("policy_gradients", "grpo", last, {}, pg(cfg), eval_rows=[first])
    assert line == f"held-out eval/proxy_reward 1.5 (step 5; step 0: -0.5) [{PROXY_LABEL}]"
    assert PROXY_LABEL in headline_for("policy_gradients", "grpo", pg(cfg), [last]).label


def test_start_text():
    assert start_text((0, 0.25)) == "step 0: 0.25"
    assert start_text((10, 0.25)) == "first eval, step 10: 0.25"
    assert start_text((10, 0.25), final_step=10) is None
    assert start_text(None) is None


def test_seeds_that_all_score_zero_keep_a_wilson_interval():
    """Three seeds at 0/128: the t interval is the point 0; the pooled Wilson upper bound is
    z²/(384+z²) = 3.8415/387.84 = 0.009905."""
    iv = pooled_share_interval([0.0, 0.0, 0.0], 128)
    assert iv.low == 0.0 and iv.high == pytest.approx(0.009905, abs=1e-6)
    assert wilson_interval(0.0, 128).high == pytest.approx(0.029137, abs=1e-6)
    assert pooled_share_interval([0.0, 0.5], None) is None
    assert pooled_share_interval([1.5, 0.5], 10) is None


def test_compare_of_seeds_stuck_at_zero_has_no_point_interval():
    cfg = VERIFIER
    rows = [
        {"step": s, "phase": "eval", "eval/avg_correctness": 0.0, "eval/avg_format": 0.0}
        for s in (0, 10)
    ]
    for seed in range(3):
        make_run(f"z-{seed}", rows, overrides=(*cfg, f"seed={seed}"))
    cmp = compare_runs(["z-0", "z-1", "z-2"])
    arm = cmp.arms[0]
    assert arm.mean == 0.0 and arm.low == 0.0
    assert arm.high == pytest.approx(pooled_share_interval([0, 0, 0], 32).high)
    assert "no spread" in arm.basis


def test_run_eval_rows_reads_the_start_and_the_end_of_a_long_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "phase": "eval", "eval/x": 0.0}]
    rows += [{"step": s, "phase": "train", "loss": 1.0, "pad": "x" * 200} for s in range(1, 400)]
    rows += [{"step": 400, "phase": "eval", "eval/x": 0.5}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = run_eval_rows(path, max_bytes=4096)
    assert [r["step"] for r in got] == [0, 400]
    small = run_eval_rows(path, max_bytes=10**6)  # one window holds it all: no repeats
    assert [r["step"] for r in small] == [0, 400]
    assert run_eval_rows(tmp_path / "missing.jsonl") == []


# ---------------------------------------------------------------------------------------------
# A win rate judged by the reward model the policy was trained against
# ---------------------------------------------------------------------------------------------


def write_winrate_job(root, job_id: str, target_run, judge: str, win: float):
    from tests.lab.test_evaluations import m, write_job

    return write_job(
        root,
        job_id,
        "winrate",
        target_run,
        headline="win_rate",
        baseline="tiny",
        judge=judge,
        metrics={"win_rate": m(win, win - 0.1, win + 0.1)},
        details={"prompts": {"n_prompts": 40}},
    )


def test_a_win_rate_judged_by_the_policys_own_reward_model_is_a_labelled_proxy(lab_root):
    from rlhf_lab.evaluation.records import PROXY_JUDGE, evaluation_rows, read_eval_summary
    from tests.lab.test_evaluations import CAMPAIGN, write_run

    api.create_campaign(CAMPAIGN, "q")
    rm = write_run(lab_root, "rm-20260101-000000-0001", "reward_models", "preference")
    other = write_run(lab_root, "rm-20260101-000000-0002", "reward_models", "preference")
    cfg = {"model": {"name": "tiny"}, "reward": {"model": str(rm / "final_model")}}
    ppo = write_run(lab_root, "ppo-20260101-000000-0003", "policy_gradients", "ppo", config=cfg)
    own = write_winrate_job(
        lab_root, "winrate-20260101-000001-0004", ppo, str(rm / "final_model"), 0.9
    )
    indep = write_winrate_job(
        lab_root, "winrate-20260101-000001-0005", ppo, str(other / "final_model"), 0.55
    )
    s_own, _ = read_eval_summary(own)
    s_indep, _ = read_eval_summary(indep)
    assert s_own.judge_is_own_reward_model and not s_indep.judge_is_own_reward_model
    # the ledger's Evaluation rows: the proxy is labelled, never "(headline)"
    record = RunRecord(run_id=own.name, campaign=CAMPAIGN, family="evaluation", evaluation=s_own)
    (row,) = evaluation_rows([record])
    assert row["metric"] == f"win_rate ({PROXY_JUDGE})"
    # compare: the independent judge's win rate leads; the proxy's columns come after
    table = api.compare_runs([own.name, indep.name])
    assert table.columns[0] == "win_rate"
    assert table.columns[3] == f"win_rate ({PROXY_JUDGE})"
    assert [r.values.get("win_rate") for r in table.rows] == [None, 0.55]
    assert "is the reward model the target was trained against" in table.markdown
    # a run trained against run:<id> is recognised as well
    cfg["reward"]["model"] = f"run:{rm.name}"
    (ppo / "config.yaml").write_text(json.dumps(cfg))
    assert read_eval_summary(own)[0].judge_is_own_reward_model


# ---------------------------------------------------------------------------------------------
# compare --campaign (issue #25, item 7)
# ---------------------------------------------------------------------------------------------


def test_compare_takes_a_campaigns_runs_on_the_cli_api_and_mcp(lab_root):
    import asyncio

    from mcp import Client
    from typer.testing import CliRunner

    from rlhf_lab.cli import app
    from rlhf_lab.errors import InvalidArgument
    from rlhf_lab.mcp_server import server
    from tests.lab.test_overoptimisation import CAMP

    make_run("g-0", stuck_rows(), overrides=VERIFIER)
    make_run("g-1", stuck_rows(formats=(0.2, 0.2, 0.4)), overrides=VERIFIER)
    make_run("g-2", stuck_rows(), overrides=VERIFIER, state="failed")  # no result: left out
    (lab_root / "experiments" / f"{CAMP}.md").write_text("# rlhf\n")
    cmp = api.compare_runs(campaign=CAMP)
    assert [r.run_id for r in cmp.rows] == ["g-0", "g-1"]
    out = CliRunner().invoke(app, ["compare", "--campaign", CAMP, "--json"])
    assert out.exit_code == 0, out.output
    assert [r["run_id"] for r in json.loads(out.output)["rows"]] == ["g-0", "g-1"]

    async def mcp_rows():
        async with Client(server) as client:
            got = await client.call_tool("compare_runs", {"campaign": CAMP})
            return [r["run_id"] for r in got.structured_content["rows"]]

    assert asyncio.run(mcp_rows()) == ["g-0", "g-1"]
    # a second family (an SFT warm start): one family at a time, each named in the error
    sft = lab_root / "experiments" / CAMP / "runs" / "sft-0"
    sft.mkdir(parents=True)
    (sft / "run.json").write_text(
        json.dumps({"id": "sft-0", "family": "sft", "algorithm": "sft", "state": "succeeded"})
    )
    (sft / "summary.json").write_text(json.dumps({"outcome": "succeeded", "steps": 1}))
    with pytest.raises(InvalidArgument, match="several families") as err:
        api.compare_runs(campaign=CAMP)
    assert {s.args["family"] for s in err.value.next_steps} == {"policy_gradients", "sft"}
    picked = api.compare_runs(campaign=CAMP, family="policy_gradients")
    assert [r.run_id for r in picked.rows] == ["g-0", "g-1"]
    with pytest.raises(InvalidArgument, match="no run of family dpo"):
        api.compare_runs(campaign=CAMP, family="dpo")
    with pytest.raises(InvalidArgument, match="give campaign too"):
        api.compare_runs(["g-0"], family="sft")


# ---------------------------------------------------------------------------------------------
# The Next block's warm-start follow-up gives both commands
# ---------------------------------------------------------------------------------------------


def test_a_warm_start_follow_up_gives_the_sft_launch_and_the_dependent_launch():
    import shlex

    from rlhf_lab.ledger.followups import WARM_START_ID, _run_items

    run = RunRecord(
        run_id="grpo-1",
        campaign="c",
        family="policy_gradients",
        algorithm="grpo",
        recipe="grpo",
        model="tiny",
        overrides=["model.name=tiny", "train.max_steps=20", "seed=3"],
        flags=["noise_samples"],
    )
    (item,) = list(_run_items(run, "2026-03-02-c"))
    first, then = (shlex.split(c) for c in item.commands)
    assert first == [
        "uv", "run", "rlhf-lab", "launch", "sft_tiny_warmstart", "--campaign", "2026-03-02-c"
    ]  # fmt: skip
    assert then[:5] == ["uv", "run", "rlhf-lab", "launch", "grpo"]
    sets = [then[i + 1] for i, a in enumerate(then) if a == "--set"]
    assert sets == ["model.name=run:<sft-run-id>", "train.max_steps=20"]  # seed dropped
    assert then[-2:] == ["--campaign", "2026-03-02-c"]
    assert WARM_START_ID in item.action and "queues it until the SFT run succeeds" in item.action


def test_an_evaluation_whose_accuracy_is_zero_for_both_models_leads_with_what_moved(lab_root):
    from rlhf_lab.evaluation.records import evaluation_notes, evaluation_rows, read_eval_summary
    from tests.lab.test_evaluations import m, write_job, write_run

    run = write_run(lab_root, "grpo-20260101-000000-0001", "policy_gradients", "grpo")

    def job(job_id: str, acc: float, with_baseline: bool = True):
        return write_job(
            lab_root,
            job_id,
            "reasoning",
            run,
            headline="accuracy",
            metrics={
                "accuracy": m(acc, 0.0, 0.1),
                "format_rate": m(0.3, 0.2, 0.4),
                "mean_length": m(15.0, 14.0, 16.0),
            },
            baseline_metrics={"accuracy": m(0.0, 0.0, 0.1), "format_rate": m(0.1, 0.0, 0.2)}
            if with_baseline
            else {},
            difference={"accuracy": m(acc, 0.0, 0.1), "format_rate": m(0.2, 0.1, 0.3)}
            if with_baseline
            else {},
        )

    s, _ = read_eval_summary(job("reasoning-20260101-000001-0002", 0.0))
    assert s.headline == "format_rate"  # not mean_length: only compared metrics qualify
    assert "accuracy is 0 for the target and its baseline" in s.headline_note
    record = RunRecord(run_id="reasoning-20260101-000001-0002", campaign="c",
                       family="evaluation", evaluation=s)  # fmt: skip
    rows = evaluation_rows([record])
    assert rows[0]["metric"] == "format_rate (headline)" and rows[1]["metric"] == "accuracy"
    assert "format_rate is the headline" in evaluation_notes([record])[0]
    # the target moved: the suite's own headline stays
    moved, _ = read_eval_summary(job("reasoning-20260101-000001-0003", 0.25))
    assert moved.headline == "accuracy"
    # no baseline: one measurement shows no constant, the suite's headline stays
    alone, _ = read_eval_summary(job("reasoning-20260101-000001-0004", 0.0, with_baseline=False))
    assert alone.headline == "accuracy" and alone.headline_note is None


def test_two_arms_without_spread_are_compared_on_pooled_items_not_a_point():
    """3 seeds at 0/32 against 3 seeds at 2/32: Welch's interval is the point 0.0625 (a sure
    'better'); the pooled Newcombe interval on 96 items each is not."""
    from rlhf_lab.ledger.schema import ArmSummary
    from rlhf_lab.results.compare import verdict_between
    from rlhf_lab.results.stats import newcombe_difference

    a = ArmSummary(label="a", run_ids=["1", "2", "3"], values=[0.0625] * 3, n_items=32)
    b = ArmSummary(label="b", run_ids=["4", "5", "6"], values=[0.0] * 3, n_items=32)
    v = verdict_between(a, b, higher_is_better=True, share=True)
    iv = newcombe_difference(0.0625, 96, 0.0, 96)
    assert (v.low, v.high) == pytest.approx((iv.low, iv.high)) and v.low < v.high
    assert "Newcombe" in v.method and "no spread" in v.reason
    # with spread, Welch over seeds as before
    a2 = a.model_copy(update={"values": [0.0625, 0.125, 0.0]})
    assert "Welch" in verdict_between(a2, b, higher_is_better=True, share=True).method
