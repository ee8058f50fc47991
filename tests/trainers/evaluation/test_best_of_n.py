"""The best_of_n evaluation suite: step splitting, PRM aggregates, the job end to end on the
``tiny`` preset with untrained ORM/PRM heads, and bad input refused before anything is written."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import trainer_argv

from tests._helpers.refusals import assert_refused_before_writing
from trainers.core.rundir import read_jsonl
from trainers.core.runfolder import EvalFile, read_file
from trainers.evaluation import best_of_n as bon
from trainers.evaluation import best_of_n_stats as bs
from trainers.evaluation import best_of_n_suite as bon_suite

EXIT_CONFIG_ERROR = 2


# ---------------------------------------------------------------------------------------------
# steps and aggregates
# ---------------------------------------------------------------------------------------------


def test_solution_steps_of_a_builtin_chain_sum_demonstration_match_the_prm_format():
    from trainers.core.builtin_data import builtin_demonstrations
    from trainers.core.tasks import extract_answer

    for rec in builtin_demonstrations(6, seed=3, tasks=["chain_sum"]):
        text = rec.messages[-1]["content"]
        expression = rec.meta["entry"]["metadata"]["expression"]
        tokens = expression.split()
        steps = bon_suite.solution_steps(text, extract_answer(text))
        # one "a op b = r" step per operation, then the built-in PRM set's final step
        assert len(steps) == len(tokens) // 2 + 1, (text, steps)
        total = int(tokens[0])
        for step, op, num in zip(steps, tokens[1::2], tokens[2::2], strict=False):
            total = total + int(num) if op == "+" else total - int(num)
            assert step.endswith(f" {op} {num} = {total}"), (step, text)
        assert steps[-1] == f"The answer is {rec.meta['entry']['answer']}."


def test_solution_steps_of_prose_and_of_nothing():
    assert bon_suite.solution_steps("First 3 + 4 = 7.\nThen 7 - 2 = 5. So it is 5!", None) == [
        "First 3 + 4 = 7",
        "Then 7 - 2 = 5",
        "So it is 5!",
    ]
    assert bon_suite.solution_steps("It is 2.5 apples. <answer>2.5</answer>", "2.5") == [
        "It is 2.5 apples",
        "The answer is 2.5.",
    ]
    assert bon_suite.solution_steps("<think>cut off mid way", None) == ["cut off mid way"]
    assert bon_suite.solution_steps("   ", None) == []


def test_aggregates():
    assert bon_suite.aggregate([0.9, 0.5, 0.8], "product") == pytest.approx(0.36)
    assert bon_suite.aggregate([0.9, 0.5, 0.8], "min") == 0.5
    assert bon_suite.aggregate([], "product") == 0.0
    with pytest.raises(ValueError):
        bon_suite.aggregate([0.5], "mean")


# ---------------------------------------------------------------------------------------------
# the job on tiny
# ---------------------------------------------------------------------------------------------


def _save_rm(folder: Path, kind: str) -> Path:
    import torch

    from trainers.core.models import load_tokenizer
    from trainers.core.reward_model import build_reward_model, save_reward_model

    torch.manual_seed(1)
    extra = {"num_labels": 3, "separator": "\n<step>\n", "max_length": 256} if kind == "prm" else {}
    model = build_reward_model("tiny", kind, device="cpu", trainable=False, **extra)
    save_reward_model(model, load_tokenizer("tiny"), folder)
    return folder


@pytest.fixture(scope="module")
def reward_models(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("rms")
    return _save_rm(root / "orm" / "final_model", "orm"), _save_rm(
        root / "prm" / "final_model", "prm"
    )


SMALL = [
    "target=tiny",
    "device=cpu",
    "prompts.tasks=[chain_sum]",
    "prompts.size=3",
    "sampling.n=4",
    "sampling.max_new_tokens=12",
    "bootstrap.resamples=200",
    "best_of_n.score_batch_size=5",
]


def test_best_of_n_on_tiny_writes_rows_that_recompute_the_table(tmp_path, capsys, reward_models):
    from trainers.core.reward_model import BAD_CLASS
    from trainers.core.reward_scorer import RewardScorer

    orm, prm = reward_models
    run_dir = tmp_path / "bon"
    argv = trainer_argv(
        bon.CONFIG, run_dir, [*SMALL, f"best_of_n.orm={orm}", f"best_of_n.prm={prm}"]
    )
    assert bon.main(argv[2:]) == 0  # the entry point's own default config

    ev, warning = read_file(run_dir / "eval.json", EvalFile)
    assert ev is not None, warning
    assert ev.suite == "best_of_n" and ev.headline == "prm_minus_orm"
    rows = read_jsonl(run_dir / "items.jsonl")
    assert len(rows) == 3 and all(len(r["samples"]) == 4 for r in rows)
    # the ledger's Evaluation section: the headline, then each selector at n_max
    from rlhf_lab.evaluation.records import read_eval_summary

    summary, _ = read_eval_summary(run_dir)
    assert [r.metric for r in summary.rows] == [
        "prm_minus_orm",
        "prm@4",
        "orm@4",
        "majority@4",
        "prm_minus_orm_growth",
        "prm_minus_majority",
    ]
    format_share = sum(s["format"] for r in rows for s in r["samples"]) / 12
    assert ev.details["format_rate"] == pytest.approx(format_share)

    # the table recomputed from the rows alone equals eval.json's
    values = [bs.prompt_values(bs.PromptSamples.from_row(r), [1, 2, 4]) for r in rows]
    table = bs.best_of_n_table(values, resamples=200)
    for sel in bs.SELECTORS:
        for n in (1, 2, 4):
            assert ev.metrics[f"{sel}@{n}"].value == pytest.approx(table.accuracy[sel][n].value)
    assert ev.metrics["prm_minus_orm@1"].value == pytest.approx(0.0)
    assert ev.metrics["prm_minus_orm"].value == pytest.approx(table.lead["prm-orm"][4].value)

    # the stored scores are the reward models' own, recomputed independently
    first = rows[0]
    question = first["question"]
    orm_scorer = RewardScorer.from_pretrained(orm, device="cpu")
    from trainers.evaluation.config import EvalConfig
    from trainers.evaluation.prompts import reasoning_prompts  # the same prompt messages
    from trainers.evaluation.targets import resolve_ref

    cfg = EvalConfig.model_validate({"prompts": ev.settings["prompts"], "target": "tiny"})
    prompts, _ = reasoning_prompts(cfg, resolve_ref("tiny", "target"))
    assert prompts[0].question == question
    conv = [*prompts[0].messages, {"role": "assistant", "content": first["samples"][0]["text"]}]
    assert first["samples"][0]["orm"] == pytest.approx(orm_scorer.score([conv])[0], abs=1e-5)
    prm_scorer = RewardScorer.from_pretrained(prm, device="cpu")
    with_steps = [s for r in rows for s in r["samples"] if s["steps"]]
    assert with_steps, "tiny wrote no step at all"
    s = with_steps[0]
    problem = next(r["question"] for r in rows if s in r["samples"])
    probs = prm_scorer.score_steps([problem], [s["steps"]])[0]
    expected = [1 - p[BAD_CLASS] for p in probs]
    assert s["step_scores"] == pytest.approx(expected, abs=1e-5)
    assert s["prm"] == pytest.approx(math.prod(expected), abs=1e-6)  # the default: product
    assert s["prm_min"] == pytest.approx(min(expected), abs=1e-6)
    for r in rows:
        for smp in r["samples"]:
            assert smp["correct"] is (smp["answer"] is not None and smp["answer"] == r["gold"])

    # another job scores the same completions again instead of sampling (other reward models,
    # here the same ones: the same numbers)
    again = tmp_path / "again"
    overrides = [*SMALL, f"best_of_n.orm={orm}", f"best_of_n.prm={prm}"]
    argv = trainer_argv(bon.CONFIG, again, [*overrides, f"best_of_n.samples_from={run_dir}"])
    capsys.readouterr()
    assert bon.main(argv[2:]) == 0
    printed = capsys.readouterr().out
    assert "samples: 12 completions from" in printed and "generating" not in printed
    rows_again = read_jsonl(again / "items.jsonl")
    assert [s["text"] for r in rows_again for s in r["samples"]] == [
        s["text"] for r in rows for s in r["samples"]
    ]
    ev_again, _ = read_file(again / "eval.json", EvalFile)
    assert ev_again.metrics["prm_minus_orm"].value == pytest.approx(
        ev.metrics["prm_minus_orm"].value
    )
    wrong_n = trainer_argv(
        bon.CONFIG,
        tmp_path / "bad",
        [*overrides, "sampling.n=2", f"best_of_n.samples_from={run_dir}"],
    )
    assert bon.main(wrong_n[2:]) == EXIT_CONFIG_ERROR
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["best_of_n.orm={prm}", "best_of_n.prm={prm}"], "is a 'prm' reward model"),
        (["best_of_n.orm={orm}", "best_of_n.prm={orm}"], "is a 'orm' reward model"),
        (["best_of_n.orm={orm}"], "best_of_n.prm"),
        (["best_of_n.orm={orm}", "best_of_n.prm=tiny"], "not a reward model"),
        (["best_of_n.orm={orm}", "best_of_n.prm={prm}", "sampling.n=1"], "at least 2"),
        (["best_of_n.orm={orm}", "best_of_n.prm={prm}", "baseline=tiny"], "no baseline"),
    ],
)
def test_bad_input_fails_before_writing(tmp_path, capsys, reward_models, extra, needle):
    orm, prm = reward_models
    run_dir = tmp_path / "bad"
    overrides = [*SMALL, *(e.format(orm=orm, prm=prm) for e in extra)]
    code = bon.main(trainer_argv(bon.CONFIG, run_dir, overrides)[2:])
    assert_refused_before_writing(code, run_dir, capsys, needle)
