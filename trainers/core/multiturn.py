"""Multi-turn rollouts: the model and an environment take turns over one KV cache.

For each trajectory, as in the rollout loop of a tool-using agent:

1. ``env.reset(prompt)`` gives the first chat; its ids are prefilled once per prompt and the
   cache repeated for the prompt's ``repeats`` trajectories (:class:`~.decoding.RolloutEngine`).
2. The model's turn is decoded until its end-of-turn token, the tool call's close tag
   (:data:`~.environments.tool_calls.CLOSE_TAG`, a text stop) or the turn's token budget.
3. ``env.step(turn text)`` answers. When the trajectory goes on, the reply is rendered as a
   ``tool`` message by the chat template (the model turn's close, the tool message, the opening
   of the next assistant turn: :class:`ObservationTemplate`) and appended through the cache:
   no trajectory is prefilled again.
4. The trajectory ends when the environment says done, after ``max_turns`` model turns, when a
   turn runs out of tokens, or when the next turn would pass ``max_total_tokens`` (model and
   observation tokens after the prompt).

Each trajectory comes back as segments of token ids marked ``model`` or ``tool``: the trainer
gives the tool segments loss mask 0 (they are context, not actions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainers.core.decoding import GREEDY, RolloutEngine, Sampling, TextStop
from trainers.core.distributed import gathered
from trainers.core.environments import Environment
from trainers.core.environments.tool_calls import CLOSE_TAG, result_value
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids
from trainers.core.records import Prompt
from trainers.core.tasks import extract_answer

MODEL, TOOL = "model", "tool"


@dataclass(frozen=True)
class TurnLimits:
    """How long a trajectory may get: model turns, tokens per model turn, tokens of one tool
    reply's content, and model + observation tokens after the prompt."""

    max_turns: int
    max_new_tokens: int
    max_observation_tokens: int
    max_total_tokens: int

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_observation_tokens", "max_total_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class Segment:
    role: str  # MODEL or TOOL
    ids: list[int]
    text: str


@dataclass
class Trajectory:
    """One prompt's multi-turn rollout."""

    prompt_ids: list[int]
    segments: list[Segment] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)  # one per model turn
    tool_calls: int = 0
    tool_errors: int = 0
    finished: bool = False  # the last model turn ended with its end-of-turn token
    done: bool = False

    @property
    def completion_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.ids]

    @property
    def model_mask(self) -> list[float]:
        """1.0 on the model's tokens, 0.0 on the tools' (one per completion token)."""
        return [1.0 if s.role == MODEL else 0.0 for s in self.segments for _ in s.ids]

    @property
    def turn_ends(self) -> list[int]:
        """The completion position of each model turn's last token."""
        ends, at = [], 0
        for s in self.segments:
            at += len(s.ids)
            if s.role == MODEL and s.ids:
                ends.append(at - 1)
        return ends

    @property
    def model_text(self) -> str:
        """What the model wrote, its turns joined (the text a verifier scores)."""
        return "\n".join(s.text for s in self.segments if s.role == MODEL)

    @property
    def model_tokens(self) -> int:
        return sum(len(s.ids) for s in self.segments if s.role == MODEL)

    @property
    def observation_tokens(self) -> int:
        return sum(len(s.ids) for s in self.segments if s.role == TOOL)

    @property
    def turns(self) -> int:
        return sum(1 for s in self.segments if s.role == MODEL)

    @property
    def used_tool_result(self) -> bool:
        """The final answer equals (or contains) a value a tool returned."""
        answer = extract_answer(self.segments[-1].text if self.segments else "")
        if not answer:
            return False
        values = [result_value(s.text) for s in self.segments if s.role == TOOL]
        return any(v and v.strip() and v.strip() in answer for v in values)

    def transcript(self) -> list[dict[str, str]]:
        """The turns as ``{"role": "model"|"tool", "text": ...}`` (for samples and ledgers)."""
        return [{"role": s.role, "text": s.text} for s in self.segments]


class ObservationTemplate:
    """A tool reply's token ids as the chat template renders it after a model turn: the
    assistant turn's close, the ``tool`` message, the next assistant turn's opening. The text
    around the content is taken once from the template; the content's ids are cut to the
    budget (a marker says so)."""

    MARK_MODEL, MARK_TOOL = "\u2063MODELTURN\u2063", "\u2063TOOLREPLY\u2063"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        chat = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": self.MARK_MODEL},
            {"role": "tool", "content": self.MARK_TOOL},
        ]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        if self.MARK_MODEL not in text or self.MARK_TOOL not in text:
            raise ValueError(
                "the tokenizer's chat template does not render a 'tool' message after an "
                "assistant turn, so tool replies cannot be expressed for this model"
            )
        after_model = text.split(self.MARK_MODEL, 1)[1]
        before, after = after_model.split(self.MARK_TOOL, 1)
        self.before = self._ids(before)
        self.after = self._ids(after)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def ids(self, content: str, max_content_tokens: int) -> tuple[list[int], str]:
        """(ids of the whole reply, the content as the model sees it)."""
        body = self._ids(content)
        if len(body) > max_content_tokens:
            body = body[:max_content_tokens] + self._ids(" …[cut]")
            content = self.tokenizer.decode(body, skip_special_tokens=True)
        return self.before + body + self.after, content


def check_tool_format(tokenizer: Any) -> None:
    """ValueError when ``tokenizer`` cannot express tool calls and replies: the close tag must
    come back from its ids unchanged, and the chat template must render a ``tool`` message."""
    probe = '<tool name="calc">1+1</tool>'
    ids = tokenizer.encode(probe, add_special_tokens=False)
    if tokenizer.decode(ids, skip_special_tokens=True) != probe:
        raise ValueError(
            f"the tokenizer cannot express the tool-call format: {probe!r} does not survive "
            "encoding and decoding (characters outside its vocabulary?)"
        )
    ObservationTemplate(tokenizer)


class TrajectoryRollout:
    """Rolls out trajectories for one model and tokenizer (the text stop and the reply
    template are built once)."""

    def __init__(self, tokenizer: Any, limits: TurnLimits) -> None:
        self.tokenizer, self.limits = tokenizer, limits
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.stop_ids = set(end_of_turn_ids(tokenizer))
        self.text_stop = TextStop.for_tokenizer(CLOSE_TAG, tokenizer)
        self.template = ObservationTemplate(tokenizer)

    @torch.no_grad()
    def run(
        self,
        model: Any,
        prompts: list[Prompt],
        envs: list[Environment],
        *,
        repeats: int = 1,
        sampling: Sampling = GREEDY,
    ) -> list[Trajectory]:
        """``len(prompts) * repeats`` trajectories (a prompt's ``repeats`` consecutive), one
        environment each (``envs`` in the same order)."""
        if len(envs) != len(prompts) * repeats:
            raise ValueError(f"{len(envs)} environments for {len(prompts) * repeats} rows")
        firsts = [env.reset(prompts[i // repeats]) for i, env in enumerate(envs)]
        firsts_ids = [chat_prompt_ids(self.tokenizer, m) for m in firsts]
        per_prompt = [firsts_ids[p * repeats] for p in range(len(prompts))]
        for i, ids in enumerate(firsts_ids):
            if ids != per_prompt[i // repeats]:
                raise ValueError("an environment's first observation differs within a group")
        trajectories = [Trajectory(prompt_ids=ids) for ids in firsts_ids]
        with gathered(model):
            engine = RolloutEngine(model, pad_id=self.pad_id, keep_stopped=True)
            engine.prefill(per_prompt, repeats=repeats, room=self.limits.max_new_tokens)
            live = list(range(len(trajectories)))
            for turn in range(self.limits.max_turns):
                live = self._turn(engine, trajectories, envs, live, turn, sampling)
                if not live:
                    break
        return trajectories

    def _turn(self, engine, trajectories, envs, live, turn, sampling) -> list[int]:
        """One model turn for every live row, the environments' replies appended; the rows
        that go on."""
        drawn = engine.decode(
            max_new_tokens=self.limits.max_new_tokens,
            stop_ids=self.stop_ids,
            sampling=sampling,
            text_stop=self.text_stop,
        )
        going, replies = [], []
        for row in live:
            reply = self._answer(trajectories[row], envs[row], drawn[row], turn)
            if reply is None:
                continue
            going.append(row)
            replies.append(reply)
        ended = [r for r in live if r not in set(going)]
        if ended:
            engine.release(ended)
        if going:
            engine.append(going, replies)
        return going

    def _answer(self, traj: Trajectory, env: Environment, tokens: list[int], turn: int):
        """Record the model's turn and the environment's answer; the reply's ids when the
        trajectory goes on, else None (it is over)."""
        ended_turn = bool(tokens) and tokens[-1] in self.stop_ids
        body = tokens[:-1] if ended_turn else tokens
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        traj.segments.append(Segment(MODEL, list(tokens), text))
        called = CLOSE_TAG in text  # text after the tag: the parser's error reply says so
        if not ended_turn and not called:  # out of tokens mid-turn
            traj.turn_rewards.append(0.0)
            traj.done = True
            return None
        result = env.step(text)
        traj.turn_rewards.append(float(result.reward))
        traj.tool_calls += int(result.tool_call)
        traj.tool_errors += int(result.tool_error)
        if result.done or result.observation is None or ended_turn:
            traj.finished, traj.done = ended_turn, True
            return None
        ids, shown = self.template.ids(result.observation, self.limits.max_observation_tokens)
        used = len(traj.completion_ids) + len(ids)
        last_turn = turn + 1 >= self.limits.max_turns
        if last_turn or used + self.limits.max_new_tokens > self.limits.max_total_tokens:
            traj.done = True  # no room for another turn: ends on the call, unanswered
            return None
        traj.segments.append(Segment(TOOL, ids, shown))
        return ids


def trajectory_stats(trajectories: list[Trajectory]) -> dict[str, torch.Tensor]:
    """Per-trajectory figures (float (N,) each), for means over a step or a held-out set:
    ``turns`` (model turns), ``calls`` and ``errors`` (tool calls, and those answered with an
    error), ``called`` (1 when at least one call), ``used_result`` (1 when the final answer
    repeats a value a tool returned) and ``observation_tokens`` (tool-reply tokens)."""
    rows = {
        "turns": [t.turns for t in trajectories],
        "calls": [t.tool_calls for t in trajectories],
        "errors": [t.tool_errors for t in trajectories],
        "called": [float(t.tool_calls > 0) for t in trajectories],
        "used_result": [float(t.used_tool_result) for t in trajectories],
        "observation_tokens": [t.observation_tokens for t in trajectories],
    }
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in rows.items()}
