"""Evaluations on the lab side, fast: the cache key, the ledger's Evaluation block, evaluation
rows in compare, and bad arguments on the CLI and MCP (one clear line, nothing written).
The real job end to end is tests/lab/test_evaluations_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mcp import Client
from typer.testing import CliRunner

from rlhf_lab import api
from rlhf_lab.cli import app
from rlhf_lab.evaluation.records import fmt_interval, read_eval_summary
from rlhf_lab.mcp_server import server
from tests._helpers.run_folders import (
    CREATED_AT,
    write_ending,
    write_run_json,
    write_tiny_final_model,
)
from trainers.core.runfolder import EvalFile, EvalMetric
from trainers.evaluation.cache import model_key, settings_of
from trainers.evaluation.config import EvalConfig

CAMPAIGN = "2026-01-01-evals"
runner = CliRunner()


pytestmark = pytest.mark.usefixtures("lab_root")


def write_run(
    root: Path,
    run_id: str,
    family: str,
    algorithm: str,
    *,
    state: str = "succeeded",
    config: dict | None = None,
    final_model: bool = True,
) -> Path:
    """A run folder as the launcher and its job leave it."""
    run_dir = root / "experiments" / CAMPAIGN / "runs" / run_id
    write_run_json(run_dir, family, algorithm, state=state, created_at=CREATED_AT)
    cfg = config or {"model": {"name": "tiny"}, "checkpoint": {"save_final_model": True}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    if state in ("succeeded", "failed"):
        write_ending(run_dir, state, steps=2)
    if final_model and state == "succeeded":
        write_tiny_final_model(run_dir)
    return run_dir


def m(value: float, low: float, high: float, n: int = 40) -> EvalMetric:
    return EvalMetric(value=value, low=low, high=high, n=n)


def write_job(root: Path, job_id: str, suite: str, target_run: Path, **fields) -> Path:
    """An evaluation job's folder (``suite`` run on ``target_run``) with the eval.json the job
    writes; ``fields`` are the rest of its EvalFile."""
    job = write_run(root, job_id, "evaluation", suite, final_model=False)
    ev = EvalFile(suite=suite, target=str(target_run), target_run=str(target_run), **fields)
    (job / "eval.json").write_text(ev.model_dump_json())
    return job


def write_eval_job(root: Path, job_id: str, target_run: Path, acc: float, base: float) -> Path:
    """A reasoning evaluation job's folder with the eval.json the job writes."""
    return write_job(
        root,
        job_id,
        "reasoning",
        target_run,
        headline="accuracy",
        target_model=str(target_run / "final_model"),
        baseline="auto (tiny)",
        baseline_model="tiny",
        settings={"seed": 0, "sampling": {"n": 4, "temperature": 0.7, "max_new_tokens": 64}},
        metrics={"accuracy": m(acc, acc - 0.1, acc + 0.1), "format_rate": m(0.9, 0.8, 1.0)},
        baseline_metrics={"accuracy": m(base, 0.0, base + 0.05)},
        difference={"accuracy": m(acc - base, acc - base - 0.08, acc - base + 0.08)},
        details={"prompts": {"n_prompts": 40}, "cache": {"target": "miss", "baseline": "hit"}},
    )


# ---------------------------------------------------------------------------------------------
# The cache key
# ---------------------------------------------------------------------------------------------


def test_cache_key_is_model_settings_and_prompts_and_nothing_else():
    cfg = EvalConfig(target="a", baseline="auto", cache_dir="/x")
    key = model_key(cfg, "fp-base", "prompts-1")
    # what names the models and where the cache lives do not change the numbers
    same = EvalConfig(target="other-run", baseline="tiny", cache_dir="/elsewhere")
    assert model_key(same, "fp-base", "prompts-1") == key
    assert {"target", "baseline", "cache_dir"}.isdisjoint(settings_of(cfg))
    # the weights, the prompt set and every setting do
    assert model_key(cfg, "fp-other", "prompts-1") != key
    assert model_key(cfg, "fp-base", "prompts-2") != key
    for changed in (
        {"seed": 1},
        {"sampling": {"n": 2}},
        {"sampling": {"temperature": 1.0}},
        {"prompts": {"size": 32}},
        {"bootstrap": {"resamples": 500}},
    ):
        other = EvalConfig.model_validate({"target": "a", **changed})
        assert model_key(other, "fp-base", "prompts-1") != key, changed


# ---------------------------------------------------------------------------------------------
# The ledger's Evaluation block and compare
# ---------------------------------------------------------------------------------------------


def test_evaluation_block_shows_before_after_with_intervals_and_keeps_jobs_out_of_runs(lab_root):
    api.create_campaign(CAMPAIGN, "Does GRPO beat its warm start?")
    grpo = write_run(lab_root, "grpo-20260101-000000-0001", "policy_gradients", "grpo")
    job = write_eval_job(lab_root, "reasoning-20260101-000001-0002", grpo, acc=0.6, base=0.25)
    pending = write_run(lab_root, "reasoning-20260101-000002-0003", "evaluation", "reasoning")
    pending.joinpath("summary.json").unlink()
    for run_dir in (grpo, job, pending):
        api.record_results(run_dir.name)

    md = api.campaign_markdown(CAMPAIGN)
    section = md.split("## Evaluation", 1)[1].split("## Comparison", 1)[0]
    row = (
        f"| `{job.name}` | {grpo.name} | reasoning | accuracy (headline) | 0.6 [0.5, 0.7] | "
        "0.25 [0, 0.3] | +0.35 [0.27, 0.43] | 40 |"
    )
    assert row in section
    assert "| format_rate | 0.9 [0.8, 1] | — | — | 40 |" in section
    assert f"`{pending.name}`" in section  # a job without eval.json yet is listed as such
    assert "baseline auto (tiny); n=4, T=0.7, max_new=64, seed 0; 40 prompts" in section
    assert "cache target miss, baseline hit" in section
    runs_block = md.split("## Runs", 1)[1].split("## Plots", 1)[0]
    assert grpo.name in runs_block and job.name not in runs_block

    # the block is spliced into a ledger written before it existed (under its own heading)
    path = lab_root / "experiments" / f"{CAMPAIGN}.md"
    start = md.index("## Evaluation")
    end = md.index("## Comparison")
    path.write_text(md[:start] + md[end:])
    api.record_results(job.name)
    assert row in path.read_text().split("## Evaluation", 1)[1]


def test_compare_tables_evaluations_and_adds_them_to_the_runs_they_evaluated(lab_root):
    api.create_campaign(CAMPAIGN, "q")
    dpo = write_run(lab_root, "dpo-20260101-000000-0001", "direct_alignment", "dpo")
    simpo = write_run(lab_root, "simpo-20260101-000000-0002", "direct_alignment", "simpo")
    a = write_eval_job(lab_root, "reasoning-20260101-000001-0003", dpo, acc=0.5, base=0.2)
    b = write_eval_job(lab_root, "reasoning-20260101-000001-0004", simpo, acc=0.4, base=0.2)

    table = api.compare_runs([a.name, b.name], record_in=CAMPAIGN)
    assert table.family == "evaluation"
    assert table.columns == ["accuracy", "baseline accuracy", "Δ accuracy"]
    assert [r.values["accuracy"] for r in table.rows] == [0.5, 0.4]
    assert table.rows[1].values["Δ accuracy"] == pytest.approx(0.2)
    assert "0.5 [0.4, 0.6]" in table.markdown and "+0.3 [0.22, 0.38]" in table.markdown
    assert table.recorded_in == CAMPAIGN
    assert "evaluations: 2 job(s)" in api.campaign_markdown(CAMPAIGN)

    trained = api.compare_runs([dpo.name, simpo.name]).markdown
    part = trained.split("Evaluations of these runs:", 1)[1]
    assert f"`{a.name}`" in part and f"`{b.name}`" in part
    assert "+0.2 [0.12, 0.28]" in part  # simpo's paired difference with its interval


def test_eval_summary_and_interval_text(lab_root):
    run = write_run(lab_root, "grpo-20260101-000000-0001", "policy_gradients", "grpo")
    job = write_eval_job(lab_root, "reasoning-20260101-000001-0002", run, acc=0.6, base=0.25)
    summary, warning = read_eval_summary(job)
    assert warning is None and summary is not None
    assert summary.target_run == run.name and summary.n_prompts == 40
    assert [r.metric for r in summary.rows] == ["accuracy", "format_rate"]  # headline first
    assert fmt_interval(summary.row("accuracy").difference, signed=True) == "+0.35 [0.27, 0.43]"
    (job / "eval.json").write_text("{not json")
    assert read_eval_summary(job)[0] is None and "eval.json" in read_eval_summary(job)[1]


# ---------------------------------------------------------------------------------------------
# Bad input: one clear line in the caller's terms, nothing written
# ---------------------------------------------------------------------------------------------


def bad_targets(root: Path) -> dict[str, tuple[list[str], dict, str]]:
    """case -> (CLI argv, MCP arguments, a phrase the message must hold)."""
    write_run(root, "dpo-20260101-000000-0001", "direct_alignment", "dpo", state="failed")
    write_run(
        root,
        "sft-20260101-000000-0002",
        "sft",
        "sft",
        config={"model": {"name": "tiny"}, "checkpoint": {"save_final_model": False}},
    )
    write_run(root, "sft-20260101-000000-0003", "sft", "sft")
    return {
        "unknown suite": (
            ["eval", "sft-20260101-000000-0003", "--suite", "reasonin"],
            {"target": "sft-20260101-000000-0003", "suite": ["reasonin"]},
            "unknown evaluation suite 'reasonin' (did you mean reasoning?)",
        ),
        "failed run": (
            ["eval", "dpo-20260101-000000-0001"],
            {"target": "dpo-20260101-000000-0001"},
            "is failed: it has no final model to evaluate",
        ),
        "no final model": (
            ["eval", "run:sft-20260101-000000-0002"],
            {"target": "run:sft-20260101-000000-0002"},
            "does not save its final model",
        ),
        "judge not a reward model": (
            [
                "eval",
                "sft-20260101-000000-0003",
                "--suite",
                "winrate",
                "--judge",
                "sft-20260101-000000-0003",
            ],
            {
                "target": "sft-20260101-000000-0003",
                "suite": ["winrate"],
                "judge": "sft-20260101-000000-0003",
            },
            "judge sft-20260101-000000-0003: that run is sft (sft), not a preference",
        ),
        "unknown model": (
            ["eval", "no-such-model-here"],
            {"target": "no-such-model-here"},
            "neither a run of this lab nor a model that resolves",
        ),
        "auto without a run": (
            ["eval", "tiny", "--baseline", "auto"],
            {"target": "tiny", "baseline": "auto"},
            "baseline auto is the target run's starting model",
        ),
        "bad setting": (
            ["eval", "sft-20260101-000000-0003", "--set", "sampling.n=0"],
            {"target": "sft-20260101-000000-0003", "overrides": ["sampling.n=0"]},
            "sampling.n:",
        ),
    }


def _written(root: Path) -> set[Path]:
    return {p for p in (root / "experiments").rglob("*") if ".lab" not in p.parts}


def test_bad_arguments_on_the_cli_are_one_line_in_flags_and_write_nothing(lab_root):
    cases = bad_targets(lab_root)
    before = _written(lab_root)
    for case, (argv, _, phrase) in cases.items():
        result = runner.invoke(app, argv)
        err = result.stderr.strip()
        assert result.exit_code == 2, (case, result.output)
        assert err.startswith("error: ") and "\n" not in err, (case, err)
        assert phrase in err, (case, err)
        assert "Traceback" not in result.output
    assert (
        "`rlhf-lab eval ... --suite reasoning`"
        in runner.invoke(app, cases["unknown suite"][0]).stderr
    )
    assert _written(lab_root) == before


@pytest.mark.anyio
async def test_bad_arguments_on_mcp_are_named_as_arguments_and_write_nothing(lab_root):
    cases = bad_targets(lab_root)
    before = _written(lab_root)
    async with Client(server) as client:
        for case, (_, args, phrase) in cases.items():
            result = await client.call_tool("evaluate_model", args)
            text = "\n".join(c.text for c in result.content if getattr(c, "text", None))
            assert result.is_error, (case, text)
            assert phrase in text, (case, text)
            assert "--" not in text.replace("—", ""), (case, text)  # no CLI flag on MCP
        result = await client.call_tool("evaluate_model", {"target": "x", "suite": "reasoning"})
        assert result.is_error  # a suite list, not a string: an argument error
    assert _written(lab_root) == before


# ---------------------------------------------------------------------------------------------
# The plan proposes an evaluation after every training run, with its cost
# ---------------------------------------------------------------------------------------------


def test_plan_proposes_an_evaluation_after_each_training_run_with_its_cost():
    from rlhf_lab.evaluation.cost import estimate_evaluation
    from rlhf_lab.planning.memory import blocks, model_facts

    plan = api.plan_experiment("compare dpo and simpo", model="tiny")
    step = plan.steps[-1]
    assert "evaluate_model" in step and step.startswith(f"{len(plan.steps)}. ")
    for name in ("dpo on pair_accuracy", "dpo on generation", "simpo on generation"):
        assert name in step, step

    cost = estimate_evaluation("tiny", "reasoning", device="cpu")
    assert cost.generated_tokens == 128 * 8 * 256 * 2  # prompts × n × new tokens × 2 policies
    assert (
        estimate_evaluation("tiny", "reasoning", baseline=False).generated_tokens == 128 * 8 * 256
    )
    assert estimate_evaluation("tiny", "pair_accuracy").generated_tokens == 0
    # weights (fp32 on the CPU) + one batch's KV cache + the process, then 10% slack
    arch = model_facts("tiny").params
    kv, _ = blocks.kv_cache_gb(arch.arch, 4, 16 * 8, blocks.DEFAULT_PROMPT_TOKENS + 256)
    want = (blocks.weights_gb(arch.total, 4) + kv + blocks.CPU_BASELINE_GB) * 1.1
    assert cost.memory_gb == pytest.approx(want, abs=1e-3)
    bigger = estimate_evaluation("tiny", "reasoning", ["sampling.batch_size=64"], device="cpu")
    assert bigger.memory_gb > cost.memory_gb


def test_a_run_still_queued_is_evaluated_after_it(lab_root, no_queue_worker):
    """The job waits for its target like any dependent run (nothing trains here: the queue
    worker is not started)."""
    from rlhf_lab import runs

    queued = write_run(lab_root, "grpo-20260101-000000-0001", "policy_gradients", "grpo")
    record = json.loads((queued / "run.json").read_text())
    (queued / "run.json").write_text(json.dumps({**record, "state": "queued"}))
    for name in ("summary.json", "exit.json"):
        (queued / name).unlink()
    launched = api.evaluate_model(queued.name, overrides=["prompts.size=8"])
    (job_id,) = launched.run_ids
    assert launched.campaign == CAMPAIGN and launched.baseline == "auto"
    job = json.loads((runs.find_run(job_id) / "run.json").read_text())
    assert job["family"] == "evaluation" and job["state"] == "queued"
    assert job["after"] == [queued.name] and job["device"] == "cpu"  # the target run's device
    config = yaml.safe_load((runs.find_run(job_id) / "config.yaml").read_text())
    assert config["target"] == str(queued) and config["baseline"] == "auto"
    assert config["cache_dir"].endswith("experiments/.lab/eval-cache")
    assert config["prompts"]["size"] == 8 and config["device"] == "cpu"
    assert job["argv"][1:3] == ["-m", "trainers.evaluation.run"]
