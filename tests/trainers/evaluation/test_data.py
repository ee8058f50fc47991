"""The math checker on GSM8K edge cases, the evaluation's data and prompt sets, and the input
checks that run before anything is written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainers.core.config import ConfigError
from trainers.evaluation.best_of_n_suite import reward_model_folder
from trainers.evaluation.config import EvalConfig
from trainers.evaluation.math_answers import (
    builtin_arithmetic_rows,
    gold_answer,
    is_correct,
    read_gsm8k_rows,
)
from trainers.evaluation.prompts import (
    EVAL_SEED_BASE,
    math_prompts,
    reasoning_prompts,
    training_questions,
)
from trainers.evaluation.targets import ModelRef, check_judge, resolve_ref

FIXTURES = Path(__file__).resolve().parent / "fixtures"


# ---------------------------------------------------------------------------------------------
# Exact match
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("#### 1,000", "1000", True),
        ("1000.0", "1000", True),
        ("The total is \\boxed{1000}.", "1000", True),
        ("$\\boxed{\\frac{9}{2}}$", "4.5", True),
        ("<think>36 + 72 = 108</think>\n<answer>108</answer>", "108", True),
        ("<think>it is 3</think>\n<answer>1,000</answer>", "1000", True),
        ("<answer>72 dollars</answer>", "72", True),
        ("<think>72? no</think><answer>71</answer>", "72", False),  # the tagged answer counts
        ("The answer is 1000.5", "1000", False),
        ("-72", "72", False),
        ("no number here", "72", False),
        ("", "72", False),
    ],
)
def test_exact_match_edge_cases(response, gold, expected):
    assert is_correct(response, gold)[0] is expected


def test_gold_answers_of_the_gsm8k_schema():
    rows = read_gsm8k_rows(str(FIXTURES / "gsm8k_sample.jsonl"), None, "test")
    assert [set(r) for r in rows] == [{"question", "answer"}] * 4
    assert [gold_answer(r["answer"]) for r in rows] == ["108", "1000", "72", "4.5"]
    assert gold_answer("no final line") is None
    assert gold_answer("a\n#### $1,250.") == "1250"


def test_a_file_without_the_gsm8k_schema_is_refused(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps({"prompt": "q", "completion": "a"}) + "\n")
    with pytest.raises(ValueError, match="GSM8K schema"):
        read_gsm8k_rows(str(path), None, "test")


def test_builtin_arithmetic_set_is_deterministic_unique_and_self_consistent():
    rows = builtin_arithmetic_rows(200, seed=5)
    assert rows == builtin_arithmetic_rows(200, seed=5)
    assert rows != builtin_arithmetic_rows(200, seed=6)
    assert len({r["question"] for r in rows}) == 200
    for row in rows:  # the worked steps end on the gold, and the checker accepts it
        steps, final = row["answer"].rsplit("\n", 1)
        gold = gold_answer(row["answer"])
        assert final == f"#### {gold}" and steps.endswith(f"= {gold}")
        assert is_correct(f"<answer>{gold}</answer>", gold)[0]
    assert any(int(gold_answer(r["answer"])) >= 1000 for r in rows)  # thousands appear


def test_math_prompts_carry_the_gold_and_the_tag_format_prompt():
    cfg = EvalConfig(suite="math", target="tiny", prompts={"size": 3})
    prompts, info = math_prompts(cfg)
    assert len(prompts) == 3 and info["n_prompts"] == 3
    assert (
        prompts[0].messages[0]["role"] == "system"
        and "<answer>" in prompts[0].messages[0]["content"]
    )
    assert prompts[0].meta["gold"] == gold_answer(
        builtin_arithmetic_rows(3, EVAL_SEED_BASE)[0]["answer"]
    )


# ---------------------------------------------------------------------------------------------
# Held-out reasoning prompts
# ---------------------------------------------------------------------------------------------


def _pg_run(tmp_path: Path, specs: list[dict], size: int) -> ModelRef:
    """A policy-gradient run folder (config.yaml and a final_model/ marker) of these tasks."""
    import yaml

    run = tmp_path / "pg"
    (run / "final_model").mkdir(parents=True)
    (run / "final_model" / "config.json").write_text("{}")
    config = {
        "algorithm": "grpo",
        "model": {"name": "tiny"},
        "data": {"specs": specs, "size": size, "eval_size": 8},
        "seed": 3,
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return resolve_ref(str(run), "target")


def test_reasoning_prompts_are_the_runs_tasks_never_its_training_questions(tmp_path):
    specs = [{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}]
    ref = _pg_run(tmp_path, specs, size=150)
    assert ref.family == "policy_gradients" and ref.model.endswith("final_model")
    cfg = EvalConfig(target=str(ref.run_dir), prompts={"size": 20})
    prompts, info = reasoning_prompts(cfg, ref)
    seen = training_questions(ref)
    assert len(seen) > 100
    assert len(prompts) == 20 and info["n_prompts"] == 20
    assert not {p.question for p in prompts} & seen
    assert info["dropped_as_training"] > 0  # two one-digit terms: few distinct questions
    assert {p.meta["task"] for p in prompts} == {"chain_sum"}
    assert info["tasks"][0]["config"]["max_terms"] == 2  # the run's own settings
    assert len({p.id for p in prompts}) == 20
    again, _ = reasoning_prompts(cfg, ref)
    assert [p.id for p in again] == [p.id for p in prompts]  # deterministic


def test_named_tasks_and_a_model_without_a_run():
    ref = resolve_ref("tiny", "target")
    # no tasks named and no run to read them from: the built-in mix (it used to be refused)
    mixed, info = reasoning_prompts(EvalConfig(target="tiny", prompts={"size": 6}), ref)
    assert info["tasks_from"] == "the built-in mix" and len(mixed) == 6
    cfg = EvalConfig(target="tiny", prompts={"size": 5, "tasks": ["spell_backward"]})
    prompts, info = reasoning_prompts(cfg, ref)
    assert len(prompts) == 5 and not info["training_questions_checked"]


def test_a_judge_must_be_a_scalar_reward_model(tmp_path):
    with pytest.raises(ConfigError, match="not a reward model"):
        check_judge(str(tmp_path))
    (tmp_path / "reward_model.json").write_text(json.dumps({"kind": "prm", "format_version": 1}))
    with pytest.raises(ConfigError, match="preference or orm"):
        check_judge(str(tmp_path))
    (tmp_path / "reward_model.json").write_text(json.dumps({"kind": "orm", "format_version": 1}))
    assert check_judge(str(tmp_path))[1]["kind"] == "orm"


@pytest.mark.parametrize(
    ("check", "label"),
    [
        (check_judge, "judge"),
        (lambda given: reward_model_folder(given, "orm"), "best_of_n.orm"),
    ],
    ids=["judge", "best_of_n slot"],
)
def test_a_reward_model_named_by_its_run_folder_or_final_model_is_read_once_for_both_uses(
    tmp_path, check, label
):
    run = tmp_path / "rm-run"
    final = run / "final_model"
    final.mkdir(parents=True)
    with pytest.raises(ConfigError, match=rf"^{re.escape(label)} '.*' is not a reward model"):
        check(str(run))  # a folder that holds no final model's metadata
    (run / "config.yaml").write_text("kind: orm\n")
    (final / "reward_model.json").write_text("{not json")
    with pytest.raises(ConfigError, match=rf"^{re.escape(label)} '.*': .*cannot be read"):
        check(str(run))
    (final / "reward_model.json").write_text(json.dumps({"kind": "orm", "format_version": 1}))
    found = check(str(run))  # the run folder resolves to its final_model/
    folder = found[0] if isinstance(found, tuple) else found
    assert Path(folder) == final.absolute()
