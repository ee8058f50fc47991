"""Policy gradients on multi-turn trajectories: tool replies are context with loss mask 0 (no
policy-gradient, KL or entropy term, not counted by ``token_mean``), value-model estimators see
only the model's tokens, per-turn rewards reach the turns that earned them, and a run whose
model never calls a tool is the single-turn run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests._helpers.paths import configs_of
from tests._helpers.quick_runs import PG_TWO_STEPS_ON_TINY
from tests._helpers.refusals import assert_refused_before_writing
from tests._helpers.threads import one_torch_thread  # noqa: F401  (autouse)
from tests.conftest import trainer_argv
from trainers.core.environments import StepResult, register_environment
from trainers.core.multiturn import MODEL, TOOL, Segment, Trajectory
from trainers.core.rundir import read_jsonl
from trainers.policy_gradients import train as pg_train
from trainers.policy_gradients.advantages import (
    gae,
    model_token_order,
    over_model_tokens,
    returns_to_go,
    sequence_reward_to_tokens,
)
from trainers.policy_gradients.config import PolicyGradientConfig, algorithm_spec
from trainers.policy_gradients.experience import Experience
from trainers.policy_gradients.generation import experience_of
from trainers.policy_gradients.losses import (
    POLICY_LOSS_FUNCTIONS,
    PolicyLossInputs,
    PolicyLossParams,
    aggregate,
)
from trainers.policy_gradients.rollout import turn_reward_shift
from trainers.policy_gradients.spec import FAMILY as PG_FAMILY

CONFIGS = configs_of("policy_gradients")

TINY = [
    *PG_TWO_STEPS_ON_TINY,
    "rollout.num_rollouts=4",
    "rollout.max_new_tokens=12",
    "eval.eval_every=2",
    "eval.eval_batch_size=4",
    "eval.num_samples=2",
]


class NoToolEnvironment:
    """The task as it is (no tool offered); every turn is final."""

    def reset(self, prompt):
        return prompt.messages

    def step(self, text):
        return StepResult(done=True)


register_environment("no_tool_for_tests", "the task unchanged; the first turn ends it")(
    NoToolEnvironment
)


def run(config: str, run_dir: Path, overrides: list[str]) -> int:
    return pg_train.main(trainer_argv(CONFIGS / f"{config}.yaml", run_dir, overrides))


# ---------------------------------------------------------------------------------------------
# The mask
# ---------------------------------------------------------------------------------------------

# two rows: model, model, [tool, tool, tool], model, model | model, model, model, pad, ...
MASK = torch.tensor([[1, 1, 0, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0, 0]], dtype=torch.float32)
OBSERVATION = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0] * 7], dtype=torch.bool)
LOSSES = sorted({algorithm_spec(a).loss for a in PG_FAMILY.algorithm_names})


def loss_of(name: str, logp, old, ref, adv, mode: str) -> torch.Tensor:
    params = PolicyLossParams(beta=0.1, clip_eps_lo=0.2, clip_eps_hi=0.28)
    per_token, _ = POLICY_LOSS_FUNCTIONS[name](PolicyLossInputs(logp, old, adv, MASK, ref), params)
    return aggregate(
        per_token, MASK, mode, step_num_seqs=2, step_num_tokens=MASK.sum(), max_new_tokens=7
    )


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("name", LOSSES)
def test_an_observation_tokens_log_prob_moves_nothing(name, mode):
    """The gradient reaches no tool-reply position, and changing the current, old or reference
    log-prob there (or the advantage) leaves the loss, its KL term included, unchanged."""
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(MASK.shape, generator=g) - 0.1).requires_grad_()
    old = logp.detach() + 0.05 * torch.randn(MASK.shape, generator=g)
    ref = logp.detach() + 0.1 * torch.randn(MASK.shape, generator=g)
    adv = torch.randn(MASK.shape, generator=g)
    loss = loss_of(name, logp, old, ref, adv, mode)
    loss.backward()
    assert torch.all(logp.grad[OBSERVATION] == 0)
    assert torch.any(logp.grad[MASK > 0] != 0)
    moved = [x.detach().clone() for x in (logp, old, ref, adv)]
    for x in moved:
        x[OBSERVATION] += 3.0
    assert float(loss_of(name, *moved, mode)) == pytest.approx(float(loss.detach()), abs=1e-7)


def test_token_counts_and_lengths_leave_the_replies_out():
    traj = Trajectory(
        prompt_ids=[5, 6, 7],
        segments=[
            Segment(MODEL, [10, 11], "a"),
            Segment(TOOL, [20, 21, 22], "<result>1</result>"),
            Segment(MODEL, [12, 13], "b"),
        ],
        turn_rewards=[0.5, 0.0],
        finished=True,
    )
    exp = experience_of([traj], [None], pad_id=0)
    assert exp.completion_mask.tolist() == [[1, 1, 0, 0, 0, 1, 1]]
    assert exp.attention_mask[0, exp.prompt_width :].tolist() == [1] * 7  # replies are context
    assert exp.lengths.tolist() == [4.0]  # what token_mean divides by
    assert exp.token_ids() == ([[5, 6, 7]], [[10, 11, 20, 21, 22, 12, 13]])
    assert exp.turn_rewards.tolist() == [[0, 0.5, 0, 0, 0, 0, 0]]
    assert exp.texts == ["a\nb"] and not bool(exp.truncated[0])


# ---------------------------------------------------------------------------------------------
# Advantages on trajectories
# ---------------------------------------------------------------------------------------------


def test_gae_runs_over_the_model_tokens_as_one_episode():
    """A reply between turns does not end the episode: GAE on the row equals GAE on the row with
    the reply cut out, put back in place; on single-turn rows nothing changes."""
    g = torch.Generator().manual_seed(1)
    rewards = torch.randn(MASK.shape, generator=g) * MASK
    values = torch.randn(MASK.shape, generator=g)
    adv, ret = over_model_tokens(gae, rewards, values, MASK, 0.9, 0.8)
    cut = [0, 1, 5, 6]  # row 0 without its reply
    a0, r0 = gae(rewards[:1, cut], values[:1, cut], MASK[:1, cut], 0.9, 0.8)
    torch.testing.assert_close(adv[0, cut], a0[0])
    torch.testing.assert_close(ret[0, cut], r0[0])
    assert torch.all(adv[OBSERVATION] == 0) and torch.all(ret[OBSERVATION] == 0)
    a1, r1 = gae(rewards[1:], values[1:], MASK[1:], 0.9, 0.8)  # a prefix mask: the identity
    assert torch.equal(adv[1:], a1) and torch.equal(ret[1:], r1)
    assert model_token_order(MASK[1:]).tolist() == [list(range(7))]


def test_per_turn_rewards_reach_only_the_turns_before_them():
    """The environment's reward for turn 1 is in the return of turn 1's tokens, not of turn 2's;
    the sequence total still holds the sum (sequence-level estimators see that)."""
    turn = torch.tensor([[0, 1.0, 0, 0, 0, 0, 0.25]])
    mask = MASK[:1]
    exp = Experience(
        input_ids=torch.zeros((1, 9), dtype=torch.long),
        attention_mask=torch.ones((1, 9), dtype=torch.long),
        prompt_lens=torch.tensor([2]),
        completion_mask=mask,
        truncated=torch.tensor([False]),
        texts=["x"],
        prompts=[None],
        rewards={"env": torch.tensor([1.25]), "total": torch.tensor([2.25])},
        turn_rewards=turn,
    )
    shift = turn_reward_shift(exp)
    assert float(shift.sum()) == pytest.approx(0.0)
    tokens = sequence_reward_to_tokens(exp.rewards["total"], mask) + shift
    returns = returns_to_go(tokens, mask)
    # turn 1: its own 1.0 + turn 2's 0.25 + the verifier's 1.0 at the end; turn 2: 0.25 + 1.0
    assert returns[0, [0, 1]].tolist() == [2.25, 2.25]
    assert returns[0, [5, 6]].tolist() == [1.25, 1.25]


# ---------------------------------------------------------------------------------------------
# End to end on the tiny model
# ---------------------------------------------------------------------------------------------


def graded_rewards(texts, metas, lengths, *, format_weight=0.5, penalty=None):
    """Stand-in verifier: rollout j of each group of 4 gets correctness j/3 (contrast in every
    group, so the updates are not zero)."""
    correct = torch.tensor([(i % 4) / 3 for i in range(len(texts))])
    zero = torch.zeros(len(texts))
    return {
        "correctness": correct,
        "format": zero,
        "penalty": zero,
        "binary": (correct == 1.0).float(),
        "total": correct,
    }


def test_a_run_without_tool_calls_is_the_single_turn_run(tmp_path):
    """Same prompts (an environment that offers no tool): every logged number of the multi-turn
    run equals the single-turn run's, with updates that are not zero."""
    graded = pg_train.main.with_options(verifier=graded_rewards)
    assert graded(trainer_argv(CONFIGS / "grpo.yaml", tmp_path / "single", TINY)) == 0
    multi = [*TINY, "env.name=no_tool_for_tests"]
    assert graded(trainer_argv(CONFIGS / "grpo.yaml", tmp_path / "multi", multi)) == 0
    single = read_jsonl(tmp_path / "single" / "metrics.jsonl")
    multi = read_jsonl(tmp_path / "multi" / "metrics.jsonl")
    assert [(r["step"], r["phase"]) for r in single] == [(r["step"], r["phase"]) for r in multi]
    skip = ("time_s", "timing/", "throughput/", "memory/", "mfu/")
    for a, b in zip(single, multi, strict=True):
        for key, value in a.items():
            if not key.startswith(skip) and isinstance(value, float):
                assert b[key] == pytest.approx(value, rel=1e-6, abs=1e-7), (a["phase"], key)
        assert b.get("tools/calls", 0.0) == 0.0 and b.get("eval/tools/calls", 0.0) == 0.0
    assert all(r["grad_norm"] > 0 for r in multi if r["phase"] == "train")


@pytest.mark.parametrize("config", ["grpo_tools", "reinforce_pp_tools"])
def test_the_tool_recipes_run_and_log_trajectories(tmp_path, config):
    extra = (
        ["rollout.num_rollouts=1", "rollout.prompts_per_step=4"] if "reinforce" in config else []
    )
    run_dir = tmp_path / "run"
    assert run(config, run_dir, [*TINY, *extra]) == 0
    rollout = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["phase"] == "rollout"][-1]
    for key in ("turns", "calls", "errors", "called", "used_result", "observation_tokens"):
        assert f"tools/{key}" in rollout
    evals = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["phase"] == "eval"]
    assert "eval/tools/called" in evals[-1]
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert {s["kind"] for s in samples} == {"rollout", "eval"}
    assert all(s["turns"] and s["turns"][0]["role"] == "model" for s in samples)
    config_text = (run_dir / "config.yaml").read_text()
    assert "name: calculator" in config_text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.name=abacus"], "env.name='abacus' is not an environment; known: "),
        (["env.name=calculator", "env.max_turns=0"], "at least one model turn"),
        (["algorithm=remax", "env.name=calculator"], "greedy single-turn completion"),
    ],
)
def test_bad_environment_settings_fail_before_writing(tmp_path, capsys, overrides, message):
    run_dir = tmp_path / "run"
    assert_refused_before_writing(
        run("grpo", run_dir, [*TINY, *overrides]), run_dir, capsys, message
    )


def test_the_completion_budget_counts_the_replies():
    cfg = PolicyGradientConfig.model_validate(
        {"rollout": {"max_new_tokens": 100}, "env": {"name": "calculator", "max_turns": 3}}
    )
    assert cfg.multi_turn and cfg.max_completion_tokens == 3 * (100 + 64 + 16)
    single = PolicyGradientConfig.model_validate({"rollout": {"max_new_tokens": 100}})
    assert not single.multi_turn and single.max_completion_tokens == 100
