"""The built-in tool-use demonstrations (``builtin:tool-sft``): the share of tool calls, answers
that score 1.0, tool replies equal to what the calculator environment replies, the plain ones
equal to ``builtin:reasoning-sft``'s, and the refusals."""

from __future__ import annotations

import pytest

from trainers.core.builtin_data import (
    DEMONSTRATION_TASKS,
    TOOL_DEMONSTRATION_TASKS,
    builtin_demonstrations,
    default_demonstration_tasks,
)
from trainers.core.environments import make_environment
from trainers.core.environments.builtin import with_tool_in_system
from trainers.core.environments.tool_calls import parse_tool_call, result_value
from trainers.core.environments.tools import run_tool
from trainers.core.records import Prompt
from trainers.core.tasks import SYSTEM_PROMPT, extract_answer, import_reasoning_gym, score_response
from trainers.core.tool_demonstrations import (
    TOOL,
    builtin_tool_demonstrations,
    check_tool_tasks,
    demonstration_question,
    sft_demonstration_set,
    tool_conversation,
)

TASKS = list(TOOL_DEMONSTRATION_TASKS)


@pytest.fixture(scope="module")
def records():
    return builtin_tool_demonstrations(60, seed=11, tasks=TASKS)


def roles(record) -> list[str]:
    return [m["role"] for m in record.messages]


def test_exactly_the_asked_share_are_tool_demonstrations(records):
    tools = [r for r in records if r.meta["tool"]]
    assert len(tools) == 30
    assert {r.meta["task"] for r in tools} == set(TASKS)  # both tasks get tool calls
    for share, n, expected in ((0.0, 10, 0), (0.3, 10, 3), (1.0, 10, 10), (0.25, 12, 3)):
        got = builtin_tool_demonstrations(n, seed=2, tasks=TASKS, call_share=share)
        assert sum(r.meta["tool"] for r in got) == expected, share
    again = builtin_tool_demonstrations(60, seed=11, tasks=TASKS)
    assert [r.messages for r in again] == [r.messages for r in records]
    other = builtin_tool_demonstrations(60, seed=12, tasks=TASKS)
    assert [r.messages for r in other] != [r.messages for r in records]


def test_conversations_have_the_documented_shape(records):
    for r in records:
        if r.meta["tool"]:
            assert roles(r) == ["system", "user", "assistant", "tool", "assistant"]
            call = parse_tool_call(r.messages[2]["content"])
            assert call is not None and call.name == TOOL
            assert call.body == r.meta["entry"]["metadata"]["expression"]
            assert r.messages[2]["content"].startswith("<think>")
            value = result_value(r.messages[3]["content"])
            assert r.messages[4]["content"] == (
                f"<think>The calculator gives {value}.</think>\n<answer>{value}</answer>"
            )
        else:
            assert roles(r) == ["system", "user", "assistant"]
            if r.meta["offered"]:  # offered, answered without it: the calculator env's system
                assert r.messages[0]["content"].startswith(SYSTEM_PROMPT + " You can use a calc")
            else:
                assert r.messages[0]["content"] == SYSTEM_PROMPT  # no tool offered
        assert r.messages[1]["content"] == r.meta["entry"]["question"]
        assert demonstration_question(r) == r.meta["entry"]["question"]
    assert len({demonstration_question(r) for r in records}) == len(records)  # no repeats


def test_every_final_answer_scores_one(records):
    for r in records:
        assert score_response(r.reference, r.meta) == 1.0, r.messages


def test_the_tool_reply_is_what_the_calculator_environment_replies(records):
    tools = [r for r in records if r.meta["tool"]]
    for r in tools:
        env = make_environment("calculator")
        entry = r.meta["entry"]
        prompt = Prompt(
            messages=[
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": entry["question"]},
            ],
            question=entry["question"],
            answer=entry["answer"],
            meta=r.meta,
        )
        assert env.reset(prompt) == r.messages[:2]  # the system message offers calc as in RL
        step = env.step(r.messages[2]["content"])
        assert step.tool_call and not step.tool_error and not step.done
        assert step.observation == r.messages[3]["content"]
        assert run_tool(parse_tool_call(r.messages[2]["content"])) == (True, step.observation)
        assert env.step(r.messages[4]["content"]).done  # the answer turn ends the episode


def test_plain_demonstrations_are_the_reasoning_sft_ones():
    """The same conversations as reasoning-sft's; half of them with the tool offered in the
    system message (and not called), so a warm start offered the tool calls only sometimes."""
    plain = builtin_tool_demonstrations(16, seed=5, tasks=TASKS, call_share=0.0)
    reference = builtin_demonstrations(16, 5, TASKS)
    assert [r.messages[1:] for r in plain] == [r.messages[1:] for r in reference]
    offered = [r for r in plain if r.meta["offered"]]
    assert len(offered) == 8
    for r, ref in zip(plain, reference, strict=True):
        want = with_tool_in_system(ref.messages, TOOL) if r.meta["offered"] else ref.messages
        assert r.messages == want
    assert all(r.meta["tool"] is False for r in plain)
    assert [r.meta["entry"] for r in plain] == [r.meta["entry"] for r in reference]


def test_with_tool_calls_a_quarter_offer_the_tool_unused():
    mixed = builtin_tool_demonstrations(40, seed=3, tasks=TASKS)
    kinds = [(r.meta["tool"], r.meta["offered"]) for r in mixed]
    assert kinds.count((True, True)) == 20
    assert kinds.count((False, True)) == 10 and kinds.count((False, False)) == 10


def test_entries_the_calculator_gets_wrong_are_skipped():
    """reasoning-gym's simple basic_arithmetic with ``/`` writes an expression that does not
    give its answer (and ``/`` is floor division there): such entries are never demonstrated."""
    config = {
        "basic_arithmetic": {
            "min_terms": 2,
            "max_terms": 3,
            "min_digits": 1,
            "max_digits": 2,
            "operators": ["+", "-", "*", "/"],
            "allow_parentheses": False,
            "allow_negation": False,
        }
    }
    rg = import_reasoning_gym()
    ds = rg.create_dataset("basic_arithmetic", seed=0, size=60, **config["basic_arithmetic"])
    skipped = [e for e in ds if tool_conversation(ds, "basic_arithmetic", e) is None]
    assert skipped  # the case exists with these settings
    wrong = dict(ds[0], answer=str(int(ds[0]["answer"]) + 1))
    assert tool_conversation(ds, "basic_arithmetic", wrong) is None
    got = builtin_tool_demonstrations(40, 3, ["basic_arithmetic"], config, call_share=1.0)
    assert len(got) == 40 and all(r.meta["tool"] for r in got)
    assert all(score_response(r.reference, r.meta) == 1.0 for r in got)
    assert all(extract_answer(r.reference) == r.meta["entry"]["answer"] for r in got)


def test_sets_by_name_and_their_default_tasks():
    assert default_demonstration_tasks("builtin:tool-sft") == TOOL_DEMONSTRATION_TASKS
    assert default_demonstration_tasks("builtin:tool-sft:chain_sum") == TOOL_DEMONSTRATION_TASKS
    assert default_demonstration_tasks("builtin:reasoning-sft") == DEMONSTRATION_TASKS
    tools = sft_demonstration_set("builtin:tool-sft", "train", 8, 1)
    assert {r.meta["task"] for r in tools} == set(TOOL_DEMONSTRATION_TASKS)
    assert sum(r.meta["tool"] for r in tools) == 4
    named = sft_demonstration_set("builtin:tool-sft:chain_sum", "train", 6, 1, ["basic_arithmetic"])
    assert {r.meta["task"] for r in named} == {"chain_sum"}  # the name wins over `tasks`
    configured = sft_demonstration_set("builtin:tool-sft", "train", 6, 1, ["basic_arithmetic"])
    assert {r.meta["task"] for r in configured} == {"basic_arithmetic"}
    held = sft_demonstration_set("builtin:tool-sft", "test", 8, 1)
    assert not {demonstration_question(r) for r in held} & {
        demonstration_question(r) for r in tools
    }
    plain = sft_demonstration_set("builtin:reasoning-sft", "train", 4, 1)
    assert all("tool" not in r.meta for r in plain)
    assert {r.meta["task"] for r in plain} == set(DEMONSTRATION_TASKS)


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="call_share"):
        builtin_tool_demonstrations(4, 1, TASKS, call_share=1.5)
    with pytest.raises(ValueError, match=r"metadata\['expression'\].*spell_backward"):
        builtin_tool_demonstrations(4, 1, ["spell_backward"], call_share=1.0)
    with pytest.raises(ValueError, match="spell_backward"):
        check_tool_tasks(["chain_sum", "spell_backward"])
    check_tool_tasks(TASKS)  # the defaults pass
    with pytest.raises(ValueError, match="at least one task"):
        builtin_tool_demonstrations(4, 1, [])
    assert builtin_tool_demonstrations(0, 1, TASKS) == []
