"""``builtin:tool-sft``: offline SFT demonstrations of the calculator protocol, from reasoning-gym
arithmetic tasks (``basic_arithmetic``, ``chain_sum``, or any task whose entries carry
``metadata["expression"]``).

A small instruct model does not call a tool it has only been told about, so RL with a tool gets
no signal from it; these conversations teach the protocol of
:mod:`trainers.core.environments.tool_calls` before RL starts. A share ``call_share`` of them is
a **tool** demonstration, written exactly as a rollout with the ``calculator`` environment
(:class:`~trainers.core.environments.builtin.ToolEnvironment`) would see it::

    system:    SYSTEM_PROMPT + the calc tool's instructions   (ToolEnvironment.reset)
    user:      the question
    assistant: <think>Use the calculator.</think>
               <tool name="calc">12 + 7</tool>
    tool:      <result>19</result>                            (ToolEnvironment.step)
    assistant: <think>The calculator gives 19.</think>
               <answer>19</answer>

the rest are **plain** demonstrations, the same conversations ``builtin:reasoning-sft`` writes
(the task's worked reasoning, no call), so the model also keeps answering without the tool; half
of them (:func:`offered_rows`) carry the tool's instructions in their system message all the same
(the tool offered, not used), so that a warm start offered the tool calls it in only some of its
samples: whether to call is then something RL can learn. Every final answer scores 1.0 with the task's own scorer: an entry whose
expression the calculator does not turn into a scoring answer (reasoning-gym's ``/`` is floor
division, the calculator's is exact) is skipped. Both kinds are trained on every assistant turn
(the SFT family refuses ``train_on=final`` for this set).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from trainers.core.builtin_data import (
    DEMONSTRATION_SET_SIZE,
    TOOL_DEMONSTRATION_TASKS,
    TOOL_SFT_DATASET,
    builtin_demonstrations,
    default_demonstration_tasks,
    draw_demonstrations,
    entry_meta,
    split_builtin_name,
    task_datasets,
    worked_response,
)
from trainers.core.environments.builtin import ToolEnvironment, with_tool_in_system
from trainers.core.environments.tool_calls import result_value
from trainers.core.messages import system_and_user
from trainers.core.records import Prompt, SFTRecord
from trainers.core.splits import split_seed
from trainers.core.tasks import SYSTEM_PROMPT, extract_answer

__all__ = [
    "TOOL",
    "TOOL_DEMONSTRATION_TASKS",
    "TOOL_SFT_DATASET",
    "answer_turn",
    "builtin_tool_demonstrations",
    "check_tool_tasks",
    "default_demonstration_tasks",
    "demonstration_question",
    "sft_demonstration_set",
    "tool_call_turn",
]

TOOL = "calc"
"""The tool the demonstrations call (the ``calculator`` environment's)."""


def tool_call_turn(expression: str) -> str:
    """The first assistant turn of a tool demonstration: a short thought, then the call. Kept
    short on purpose: a rollout's turn budget must hold it (29 tokens for ``3 + 9`` with
    ``tiny``'s tokenizer, whose vocabulary has no ``<tool`` token)."""
    return f'<think>Use the calculator.</think>\n<tool name="{TOOL}">{expression}</tool>'


def answer_turn(value: str) -> str:
    """The last assistant turn of a tool demonstration: the tool's value as the answer."""
    return f"<think>The calculator gives {value}.</think>\n<answer>{value}</answer>"


def _expression(name: str, entry: dict) -> str:
    expression = entry.get("metadata", {}).get("expression")
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError(
            f"{TOOL_SFT_DATASET} needs arithmetic tasks whose entries carry "
            f"metadata['expression'] (e.g. {', '.join(TOOL_DEMONSTRATION_TASKS)}); reasoning-gym "
            f"task {name!r} has none"
        )
    return expression.strip()


def tool_conversation(ds: Any, name: str, entry: dict) -> list[dict] | None:
    """The five messages of a tool demonstration for ``entry``, the system message and the
    tool's reply taken from :class:`ToolEnvironment` itself; None when the calculator's value
    does not score 1.0 (or the calculator refuses the expression)."""
    env = ToolEnvironment(TOOL)
    question = entry["question"]
    first = env.reset(
        Prompt(
            messages=system_and_user(SYSTEM_PROMPT, question),
            question=question,
            answer=str(entry["answer"]),
            meta={"task": name, "entry": entry},
        )
    )
    call = tool_call_turn(_expression(name, entry))
    reply = env.step(call)
    if not reply.tool_call or reply.tool_error or reply.observation is None:
        return None
    value = result_value(reply.observation)
    if value is None:
        return None
    final = answer_turn(value)
    if ds.score_answer(extract_answer(final), entry) != 1.0:
        return None
    return [
        *first,
        {"role": "assistant", "content": call},
        {"role": "tool", "content": reply.observation},
        {"role": "assistant", "content": final},
    ]


def _plain_conversation(ds: Any, name: str, entry: dict) -> list[dict] | None:
    """The ``builtin:reasoning-sft`` conversation of ``entry`` (None when it does not score)."""
    response = worked_response(ds, name, entry)
    if response is None:
        return None
    return [
        *system_and_user(SYSTEM_PROMPT, entry["question"]),
        {"role": "assistant", "content": response},
    ]


def tool_rows(n: int, call_share: float, seed: int) -> set[int]:
    """Which of ``n`` rows are tool demonstrations: ``round(n * call_share)`` of them, drawn
    with ``seed``."""
    if not 0.0 <= call_share <= 1.0:
        raise ValueError(f"call_share must be within [0, 1], got {call_share}")
    return set(random.Random(seed + 1).sample(range(n), round(n * call_share)))


def offered_rows(n: int, calls: set[int], seed: int) -> set[int]:
    """Which plain rows (of ``n``, ``calls`` being the tool ones) offer the tool in their system
    message without calling it: half of them (rounded down), drawn with ``seed``."""
    plain = sorted(set(range(n)) - calls)
    return set(random.Random(seed + 2).sample(plain, len(plain) // 2))


def builtin_tool_demonstrations(
    n: int,
    seed: int,
    tasks: Sequence[str],
    task_configs: dict[str, dict] | None = None,
    call_share: float = 0.5,
) -> list[SFTRecord]:
    """``n`` demonstrations of ``tasks`` (module doc): ``round(n * call_share)`` tool
    demonstrations, the rest plain ones. Tasks take turns; questions are unique within the set
    (as in :func:`~trainers.core.builtin_data.builtin_demonstrations`, which also draws the same
    entries); every final answer scores 1.0. The result is shuffled with ``seed``. ``meta`` =
    ``{"task", "entry", "tool": bool}``."""
    calls = tool_rows(n, call_share, seed)
    offered = offered_rows(n, calls, seed)

    def respond_for(i: int):
        return tool_conversation if i in calls else _plain_conversation

    records = []
    for i, (name, entry, messages) in enumerate(
        draw_demonstrations(n, seed, tasks, task_configs, respond_for)
    ):
        if i in offered:
            messages = with_tool_in_system(messages, TOOL)
        meta = {
            "task": name,
            "entry": entry_meta(entry, str(entry["answer"])),
            "tool": i in calls,
            "offered": i in calls or i in offered,
        }
        records.append(SFTRecord(messages=messages, meta=meta))
    random.Random(seed).shuffle(records)
    return records


def check_tool_tasks(tasks: Sequence[str], task_configs: dict[str, dict] | None = None) -> None:
    """ValueError naming the first of ``tasks`` whose entries carry no expression for the
    calculator (checked on one generated entry per task)."""
    sources = task_datasets(list(tasks), [0] * len(tasks), 1, task_configs)
    for name, ds in sources.items():
        _expression(name, ds[0])


def sft_demonstration_set(
    dataset: str,
    split: str,
    max_samples: int | None,
    seed: int,
    tasks: Sequence[str] | None = None,
    task_configs: dict[str, dict] | None = None,
) -> list[SFTRecord]:
    """The demonstrations a built-in SFT set name stands for in an SFT run (and in an evaluation
    that holds that run's questions out): ``builtin:tool-sft[:task_a,task_b]`` the calculator
    demonstrations here, any other name ``builtin:reasoning-sft[:task_a,task_b]``'s (checking
    the name is the caller's job). The tasks are those of the name, else ``tasks``, else the
    set's own (:func:`~trainers.core.builtin_data.default_demonstration_tasks`); a split other
    than ``train`` draws from a far-away seed so its questions differ."""
    name, named = split_builtin_name(dataset)
    n = DEMONSTRATION_SET_SIZE if max_samples is None else max_samples
    chosen = list(named or tasks or default_demonstration_tasks(dataset))
    build = builtin_tool_demonstrations if name == TOOL_SFT_DATASET else builtin_demonstrations
    return build(n, split_seed(seed, split), chosen, task_configs)


def demonstration_question(record: SFTRecord) -> str:
    """The question of a built-in demonstration: its last user message (a tool demonstration's
    prompt ends with the tool's reply, not the question)."""
    return next(m["content"] for m in reversed(record.messages) if m["role"] == "user")
