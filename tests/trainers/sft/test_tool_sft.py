"""SFT on the built-in tool-use demonstrations (``builtin:tool-sft``): both assistant turns are
trained and the tool's reply is not, the reply is tokenised as a rollout appends it, the config
and preflight refusals, a short run on ``tiny``, and the evaluation's view of such a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import trainer_argv

from tests._helpers.paths import SMOLLM2_DIR, configs_of
from tests._helpers.quick_runs import SFT_ON_TINY
from tests._helpers.refusals import assert_refused_before_writing, refused_before_writing_test
from trainers.core.config import load_config
from trainers.core.generation import chat_prompt_ids
from trainers.core.models import load_tokenizer
from trainers.core.multiturn import ObservationTemplate, check_tool_format
from trainers.core.rundir import read_jsonl
from trainers.core.tool_demonstrations import demonstration_question, tool_call_turn
from trainers.sft import train as sft_train
from trainers.sft.config import SFTConfig
from trainers.sft.data import load_sft_records, longest_tool_demonstration, tokenize_records

CONFIGS = configs_of("sft")

QUICK = [
    *SFT_ON_TINY,
    "data.dataset=builtin:tool-sft",
    "data.train_on=all_assistant",
    "data.max_samples=24",
    "data.eval_size=4",
    "data.max_length=288",
    "train.gradient_accumulation_steps=1",
]


def run(run_dir: Path, overrides: list[str]) -> int:
    return sft_train.main(trainer_argv(CONFIGS / "sft.yaml", run_dir, overrides))


def tokenizers() -> list:
    marks = pytest.mark.skipif(
        not (SMOLLM2_DIR / "config.json").is_file(), reason="smollm2-135m-instruct not pulled"
    )
    return [
        pytest.param("tiny", id="tiny"),
        pytest.param(str(SMOLLM2_DIR), id="smollm2", marks=marks),
    ]


def contains(seq: list[int], part: list[int]) -> int | None:
    """Where ``part`` first occurs in ``seq`` (None when it does not)."""
    for at in range(len(seq) - len(part) + 1):
        if seq[at : at + len(part)] == part:
            return at
    return None


@pytest.mark.parametrize("model", tokenizers())
def test_loss_mask_covers_both_assistant_turns_and_not_the_tool_reply(model):
    tok = load_tokenizer(model)
    check_tool_format(tok)  # the model can express the calls and the replies
    records = [r for r in load_sft_records("builtin:tool-sft", max_samples=8) if r.meta["tool"]]
    examples, stats = tokenize_records(records, tok, 512, "all_assistant")
    assert stats["n_out"] == len(records) == 4 and not stats["prefix_fallback"]
    assert not stats["turns_skipped"] and not stats["truncated"]
    template = ObservationTemplate(tok)
    eot = "<|im_end|>"  # both are ChatML models
    for rec, ex in zip(records, examples, strict=True):
        call, reply, answer = (m["content"] for m in rec.messages[2:])
        trained = tok.decode([t for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m])
        assert trained == f"{call}{eot}{answer}{eot}"
        # the rollout's tokens: the first observation, then the reply as it appends it
        prompt = chat_prompt_ids(tok, rec.messages[:2])
        assert ex.input_ids[: len(prompt)] == prompt and not any(ex.loss_mask[: len(prompt)])
        reply_ids, shown = template.ids(reply, 10_000)
        assert shown == reply
        body = tok.encode(reply, add_special_tokens=False)
        at = contains(ex.input_ids, body)
        assert at is not None and not any(ex.loss_mask[at : at + len(body)])
        assert contains(ex.input_ids, reply_ids[1:]) is not None  # after the call's end of turn


@pytest.mark.parametrize(("model", "tokens"), [("tiny", 29), (str(SMOLLM2_DIR), 24)])
def test_the_call_turn_fits_a_small_turn_budget(model, tokens):
    """The README's figures: a rollout's ``max_new_tokens`` must hold the whole call."""
    if not Path(model).is_dir() and model != "tiny":
        pytest.skip("smollm2-135m-instruct not pulled")
    turn = tool_call_turn("3 + 9")
    assert len(load_tokenizer(model).encode(turn, add_special_tokens=False)) == tokens


test_bad_input_fails_before_writing = refused_before_writing_test(
    [
        (["data.train_on=final"], "data.train_on=all_assistant"),
        (["data.dataset=builtin:tool-sft:spell_backward"], "metadata['expression']"),
        (["data.builtin_tasks=[letter_counting]"], "letter_counting"),
        (["data.dataset=builtin:tool-sft:no_such_task"], "no_such_task"),
        (["data.dataset=builtin:tools-sft"], "builtin:tool-sft"),
    ],
    lambda run_dir, overrides: run(run_dir, [*QUICK, *overrides]),
)


def test_a_max_length_that_cuts_tool_demonstrations_is_refused(tmp_path, capsys):
    tok = load_tokenizer("tiny")
    records = load_sft_records("builtin:tool-sft", max_samples=24)
    longest = longest_tool_demonstration(records, tok)
    plain = [r for r in records if not r.meta["tool"]]
    assert longest_tool_demonstration(plain, tok) == 0
    examples, _ = tokenize_records(records, tok, 10_000, "all_assistant")
    assert longest == max(len(e.input_ids) for e in examples)
    run_dir = tmp_path / "run"
    code = run(run_dir, [*QUICK, f"data.max_length={longest - 1}"])
    assert_refused_before_writing(code, run_dir, capsys, f"set data.max_length={longest} or more")


def test_builtin_tasks_and_settings_apply():
    cfg = load_config(
        CONFIGS / "sft.yaml",
        SFTConfig,
        [
            *QUICK,
            "data.builtin_tasks=[chain_sum]",
            'data.builtin_task_configs={"chain_sum": {"min_terms": 4, "max_terms": 4}}',
        ],
    )
    d = cfg.data
    records = load_sft_records(
        d.dataset,
        max_samples=6,
        builtin_tasks=d.builtin_tasks,
        builtin_task_configs=d.builtin_task_configs,
    )
    assert {r.meta["task"] for r in records} == {"chain_sum"}
    assert {r.meta["entry"]["metadata"]["num_terms"] for r in records} == {4}


def test_short_run_on_tiny_trains_on_tool_demonstrations(tmp_path):
    run_dir = tmp_path / "run"
    held_out = ["data.eval_size=6", "eval.num_samples=6"]  # two of them are tool ones
    assert run(run_dir, [*QUICK, "train.max_steps=2", *held_out]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "succeeded" and summary["steps"] == 2
    assert summary["data"]["n_train"] == 18 and summary["data"]["schema"] == "builtin"
    rows = read_jsonl(run_dir / "metrics.jsonl")
    losses = [r["loss"] for r in rows if r["phase"] == "train"]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    assert any("eval/loss" in r for r in rows if r["phase"] == "eval")
    assert (run_dir / "final_model" / "config.json").is_file()
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert any("The calculator gives" in s["reference"] for s in samples)  # a tool one
    assert samples and all(not s["prompt"].startswith("<result>") for s in samples)
    assert all(s["score"] is not None for s in samples)
    tool_record = next(
        r for r in load_sft_records("builtin:tool-sft", max_samples=4) if r.meta["tool"]
    )
    assert sft_train.last_user_text(tool_record) == tool_record.messages[1]["content"]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["data"]["train_on"] == "all_assistant"


def test_the_evaluation_reads_a_tool_sft_runs_tasks_and_questions(tmp_path):
    from trainers.evaluation.prompts import run_task_specs, training_questions
    from trainers.evaluation.targets import resolve_ref

    run_dir = tmp_path / "sft"
    (run_dir / "final_model").mkdir(parents=True)
    (run_dir / "final_model" / "config.json").write_text("{}")
    cfg = load_config(CONFIGS / "sft.yaml", SFTConfig, QUICK)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    ref = resolve_ref(str(run_dir), "target")
    assert [s.name for s in run_task_specs(ref)] == ["basic_arithmetic", "chain_sum"]
    records = load_sft_records("builtin:tool-sft", max_samples=24, seed=cfg.seed)
    assert training_questions(ref) == {demonstration_question(r) for r in records}
    assert all(not q.startswith("<result>") for q in training_questions(ref))
