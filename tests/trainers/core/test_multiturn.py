"""Multi-turn rollouts (trainers/core/multiturn.py) on the tiny model steered by a script: the
model turn stops at the tool call's close tag, the environment's reply goes through the KV cache
(no second prefill), the trajectory ends at the end-of-turn token or at its limits, and each
segment is marked model or tool."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from trainers.core.decoding import GREEDY, RolloutEngine, Sampling, TextStop
from trainers.core.environments import make_environment
from trainers.core.environments.builtin import with_tool_in_system
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids
from trainers.core.models import load_causal_lm, load_tokenizer
from trainers.core.multiturn import (
    MODEL,
    TOOL,
    ObservationTemplate,
    TrajectoryRollout,
    TurnLimits,
    check_tool_format,
    trajectory_stats,
)
from trainers.core.records import Prompt


@pytest.fixture(scope="module")
def tiny():
    tok = load_tokenizer("tiny")
    model = load_causal_lm(
        "tiny", device="cpu", dtype="fp32", attn_implementation="sdpa", trainable=False
    )
    model.eval()
    return model, tok


class ScriptedLM(nn.Module):
    """The tiny model made to write ``script`` (token ids from position 0): at a row whose last
    input token sits at position p, the logit of ``script[p + 1]`` is raised far above the rest.
    Its forward is the real model's (the KV cache, masks and positions are exercised); the widths
    of the inputs it sees are recorded (to tell a prefill from a step)."""

    def __init__(self, base: nn.Module, script: list[int], eot: int) -> None:
        super().__init__()
        self.base, self.script, self.eot = base, script, eot
        self.config = base.config
        self.widths: list[int] = []

    def forward(
        self,
        input_ids,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        use_cache=None,
        logits_to_keep=0,
    ):
        self.widths.append(int(input_ids.shape[1]))
        out = self.base(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
        )
        nxt = [
            self.script[p + 1] if p + 1 < len(self.script) else self.eot
            for p in position_ids[:, -1].tolist()
        ]
        out.logits[torch.arange(len(nxt)), -1, torch.tensor(nxt)] += 1e4
        return out


def prompt_of(question: str) -> Prompt:
    return Prompt(
        messages=[{"role": "system", "content": "Answer."}, {"role": "user", "content": question}],
        question=question,
        answer="",
        meta={},
    )


def encode(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def scripted(tiny, turns: list[str], replies: list[str], env_name="calculator"):
    """A ScriptedLM that writes ``turns`` (model text, the last ending with end-of-turn) around
    ``replies`` (what the environment answers, rendered as the rollout renders it), and the
    script's parts."""
    model, tok = tiny
    eot = (
        end_of_turn_ids(tok)[0]
        if "<|im_end|>" not in tok.get_vocab()
        else tok.convert_tokens_to_ids("<|im_end|>")
    )
    env = make_environment(env_name)
    prompt = prompt_of("What is 1234 * 5678?")
    prompt_ids = chat_prompt_ids(tok, env.reset(prompt))
    template = ObservationTemplate(tok)
    parts, script = [], list(prompt_ids)
    for i, text in enumerate(turns):
        ids = encode(tok, text) + ([eot] if i == len(turns) - 1 else [])
        parts.append((MODEL, ids))
        script += ids
        if i < len(replies):
            reply = template.ids(replies[i], 64)[0]
            parts.append((TOOL, reply))
            script += reply
    return ScriptedLM(model, script, eot), prompt, parts


LIMITS = TurnLimits(max_turns=3, max_new_tokens=40, max_observation_tokens=64, max_total_tokens=400)


def test_a_call_is_answered_through_the_cache_and_the_answer_ends_the_trajectory(tiny):
    call = '<think>big</think><tool name="calc">1234*5678</tool>'
    lm, prompt, parts = scripted(
        tiny, [call, "<answer>7006652</answer>"], ["<result>7006652</result>"]
    )
    rollout = TrajectoryRollout(tiny[1], LIMITS)
    envs = [make_environment("calculator") for _ in range(2)]
    out = rollout.run(lm, [prompt], envs, repeats=2, sampling=GREEDY)
    for traj in out:
        assert [(s.role, s.ids) for s in traj.segments] == parts
        assert traj.tool_calls == 1 and traj.tool_errors == 0 and traj.finished
        assert traj.turns == 2 and traj.used_tool_result
        assert traj.segments[1].text == "<result>7006652</result>"
        mask = traj.model_mask
        assert len(mask) == len(traj.completion_ids)
        n_call, n_reply = len(parts[0][1]), len(parts[1][1])
        assert mask[:n_call] == [1.0] * n_call
        assert mask[n_call : n_call + n_reply] == [0.0] * n_reply
        assert traj.turn_ends == [n_call - 1, len(mask) - 1]
    # one prefill (the prompt, once for both rows); after it only single tokens and the appended
    # reply (the call's last token + the reply): no re-prefill of the trajectory
    prompt_width = len(out[0].prompt_ids)
    assert lm.widths[0] == prompt_width
    later = lm.widths[1:]
    assert max(later) == 1 + len(parts[1][1]) < prompt_width
    assert later.count(1 + len(parts[1][1])) == 1
    stats = trajectory_stats(out)
    assert stats["calls"].tolist() == [1.0, 1.0] and stats["used_result"].tolist() == [1.0, 1.0]


def test_a_malformed_call_gets_an_error_reply_and_the_model_goes_on(tiny):
    bad = '<tool name="calc">1234*</tool>'  # the calculator cannot parse it
    lm, prompt, parts = scripted(tiny, [bad, "<answer>1</answer>"], ["<error>placeholder</error>"])
    rollout = TrajectoryRollout(tiny[1], LIMITS)
    (traj,) = rollout.run(lm, [prompt], [make_environment("calculator")], sampling=GREEDY)
    assert traj.tool_calls == 1 and traj.tool_errors == 1
    assert traj.segments[1].role == TOOL and traj.segments[1].text.startswith("<error>")
    assert traj.segments[0].ids == parts[0][1]


def test_the_turn_limit_ends_a_trajectory_on_an_unanswered_call(tiny):
    call = '<tool name="calc">2+3</tool>'
    lm, prompt, _ = scripted(tiny, [call, call, "<answer>5</answer>"], ["<result>5</result>"] * 2)
    one_turn = TurnLimits(
        max_turns=1, max_new_tokens=40, max_observation_tokens=64, max_total_tokens=400
    )
    (traj,) = TrajectoryRollout(tiny[1], one_turn).run(
        lm, [prompt], [make_environment("calculator")], sampling=GREEDY
    )
    assert [s.role for s in traj.segments] == [MODEL] and traj.done and not traj.finished
    tight = TurnLimits(
        max_turns=3, max_new_tokens=40, max_observation_tokens=64, max_total_tokens=60
    )
    (traj,) = TrajectoryRollout(tiny[1], tight).run(
        lm, [prompt], [make_environment("calculator")], sampling=GREEDY
    )
    assert len(traj.completion_ids) <= 60 and not traj.finished


def test_a_turn_out_of_tokens_ends_the_trajectory(tiny):
    lm, prompt, _ = scripted(tiny, ["<think>" + "a b c d " * 20 + "</think>"], [])
    short = TurnLimits(
        max_turns=3, max_new_tokens=5, max_observation_tokens=64, max_total_tokens=400
    )
    (traj,) = TrajectoryRollout(tiny[1], short).run(
        lm, [prompt], [make_environment("calculator")], sampling=GREEDY
    )
    assert len(traj.segments) == 1 and len(traj.segments[0].ids) == 5
    assert traj.done and not traj.finished and traj.tool_calls == 0


def test_the_text_stop_cuts_after_the_token_that_completes_the_tag(tiny):
    """Rows stop at the close tag whatever tokens spell it; other rows decode on."""
    model, tok = tiny
    stop = TextStop.for_tokenizer("</tool>", tok)
    call = encode(tok, 'x <tool name="calc">1+1</tool>')
    script_prompt = encode(tok, "Q:")
    lm = ScriptedLM(model, script_prompt + call + encode(tok, " more text here"), 0)
    engine = RolloutEngine(lm, pad_id=tok.pad_token_id, keep_stopped=True)
    engine.prefill([script_prompt], room=40)
    got = engine.decode(max_new_tokens=30, stop_ids=[], text_stop=stop)
    assert got[0] == call
    assert tok.decode(got[0]).endswith("</tool>")


def test_without_tool_calls_a_trajectory_is_the_single_turn_completion(tiny):
    """Sampled, no environment reply: the same tokens as the single-turn sampler draws."""
    from trainers.core.decoding import sample_tokens

    model, tok = tiny
    prompt = prompt_of("Spell cat backward.")
    env = make_environment("calculator")
    ids = chat_prompt_ids(tok, env.reset(prompt))
    hot = Sampling(temperature=1.0, top_k=0, top_p=1.0)
    stops = set(end_of_turn_ids(tok))
    torch.manual_seed(3)
    single = sample_tokens(
        model,
        [ids],
        max_new_tokens=12,
        stop_ids=stops,
        pad_id=tok.pad_token_id,
        sampling=hot,
        repeats=3,
    )
    torch.manual_seed(3)
    limits = TurnLimits(
        max_turns=2, max_new_tokens=12, max_observation_tokens=8, max_total_tokens=100
    )
    trajs = TrajectoryRollout(tok, limits).run(
        model, [prompt], [make_environment("calculator") for _ in range(3)], repeats=3, sampling=hot
    )
    assert all(t.tool_calls == 0 for t in trajs)  # the tiny model never writes the tag
    assert [t.completion_ids for t in trajs] == single
    assert all(set(t.model_mask) == {1.0} for t in trajs)


def test_a_tokenizer_that_cannot_write_the_tags_is_refused():
    class NoAngles:
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text if c not in "<>"]

        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids)

    with pytest.raises(ValueError, match="cannot express the tool-call format"):
        check_tool_format(NoAngles())


def test_limits_and_environment_names_are_checked():
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        TurnLimits(max_turns=0, max_new_tokens=4, max_observation_tokens=4, max_total_tokens=4)
    with pytest.raises(ValueError, match="no environment named .abacus.; known: .*calculator"):
        make_environment("abacus")


def test_the_tool_instructions_go_into_the_system_message():
    chat = with_tool_in_system(
        [{"role": "system", "content": "S."}, {"role": "user", "content": "Q"}], "calc"
    )
    assert chat[0]["content"].startswith("S. You can use a calculator")
    assert '<tool name="calc">1234*5678</tool>' in chat[0]["content"]
    assert len(chat) == 2
    assert inspect.signature(ScriptedLM.forward).parameters["logits_to_keep"]  # engine asks for it
