"""The lab's side of multi-turn tool rollouts (issue #28) in planning: the completion length a
trajectory can reach (model turns and tool replies) in the memory and time estimates and in the
shrink, and bad ``env.*`` input refused in the lab's terms before anything is written.

The pretrained model is a stand-in folder holding SmolLM2-135M-Instruct's config.json (what the
estimates and the shrink read); the machine facts the CPU rules read are pinned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf_lab import api
from rlhf_lab.errors import InvalidArgument
from rlhf_lab.planning import real_model
from rlhf_lab.planning import time as pt
from rlhf_lab.planning.catalog import find_recipe
from rlhf_lab.planning.completion_length import completion_tokens, is_multi_turn
from rlhf_lab.planning.configs import resolve_config
from rlhf_lab.planning.memory import Assumptions, estimate_memory
from rlhf_lab.planning.overrides import as_overrides
from rlhf_lab.planning.shrink import shrink_config
from rlhf_lab.planning.trainer_config import TrainerConfig
from trainers.policy_gradients.config import REPLY_WRAPPER_TOKENS, PolicyGradientConfig

from .test_time_predictor import STUB


def pg(data: dict) -> TrainerConfig:
    """A policy-gradient config's data as the view planning reads."""
    return TrainerConfig("policy_gradients", data)


@pytest.fixture(autouse=True)
def lab_root(offline_lab, cpu_box, no_queue_worker):
    return offline_lab


def tools_config(*overrides: str) -> dict:
    """The shipped grpo_tools recipe, resolved with ``overrides``."""
    return resolve_config(find_recipe("grpo_tools"), as_overrides(list(overrides))).data


def without_env(config: dict, **rollout) -> dict:
    """The same config as a single-turn run (``env.name`` null), ``rollout`` keys changed."""
    out = json.loads(json.dumps(config))
    out["env"]["name"] = None
    out["rollout"].update(rollout)
    return out


# ------------------------------------------------------------------------- completion length


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["env.max_turns=1"],
        ["env.max_observation_tokens=100", "rollout.max_new_tokens=40"],
        ["env.max_total_tokens=300"],
        ["env.name=null"],
    ],
)
def test_the_lab_reads_the_completion_length_as_the_trainer_computes_it(overrides):
    data = tools_config(*overrides)
    trainer = PolicyGradientConfig.model_validate(data).max_completion_tokens
    assert completion_tokens(pg(data)) == trainer


def test_a_trajectory_holds_its_turns_and_tool_replies():
    data = tools_config("rollout.max_new_tokens=100")  # 3 turns, replies of 32 tokens
    assert is_multi_turn(pg(data))
    assert completion_tokens(pg(data)) == 3 * (100 + 32 + REPLY_WRAPPER_TOKENS)
    # held-out turns of 20 tokens: bounded by their own turns, never above the rollout's total
    assert completion_tokens(pg(data), per_turn=20) == 3 * (20 + 32 + REPLY_WRAPPER_TOKENS)
    capped = tools_config("rollout.max_new_tokens=100", "env.max_total_tokens=200")
    assert completion_tokens(pg(capped)) == 200
    assert completion_tokens(pg(capped), per_turn=500) == 200
    # a dict that leaves env keys out takes the trainer's defaults (4 turns, 64-token replies)
    assert completion_tokens(
        pg({"env": {"name": "calculator"}, "rollout": {"max_new_tokens": 10}})
    ) == (4 * (10 + 64 + REPLY_WRAPPER_TOKENS))
    assert completion_tokens(pg({"rollout": {"max_new_tokens": 10}})) == 10


# ----------------------------------------------------------------------------------- memory


def test_memory_of_grpo_tools_counts_the_tool_replies(smol):
    tools = tools_config(f"model.name={smol}", "rollout.max_new_tokens=64")
    plain = without_env(tools)
    assert tools["rollout"] == plain["rollout"]  # the same settings but for the environment
    multi = estimate_memory("policy_gradients", "grpo", pg(tools), device="cuda")
    single = estimate_memory("policy_gradients", "grpo", pg(plain), device="cuda")
    assert multi.total_gb > single.total_gb

    def kv(est) -> str:
        return next(c.detail for c in est.components if c.name == "generation KV cache")

    # the KV cache holds prompt + 3 × (64 + 32 + wrapper) tokens a row against prompt + 64
    prompt = Assumptions().prompt_tokens
    trajectory = 3 * (64 + 32 + REPLY_WRAPPER_TOKENS)
    assert f"seqs × {prompt + trajectory} tokens" in kv(multi)
    assert f"seqs × {prompt + 64} tokens" in kv(single)
    # by exactly the observation tokens: a single-turn run of the trajectory's length costs the same
    as_long = estimate_memory(
        "policy_gradients", "grpo", pg(without_env(tools, max_new_tokens=trajectory)), device="cuda"
    )
    assert multi.total_gb == pytest.approx(as_long.total_gb)
    assert any("multi-turn (env.name=calculator)" in n for n in multi.notes)
    assert not any("multi-turn" in n for n in single.notes)


# ------------------------------------------------------------------------------------- time


def test_time_of_grpo_tools_counts_the_tool_replies():
    tools = tools_config("model.name=tiny", "rollout.max_new_tokens=64", "train.max_steps=10")
    tools["data"]["eval_size"] = 16
    multi = pt.predict_from_calibration(STUB, "policy_gradients", "grpo", pg(tools))
    single = pt.predict_from_calibration(STUB, "policy_gradients", "grpo", pg(without_env(tools)))
    assert multi.per_step_s > single.per_step_s
    assert multi.parts["eval"] > single.parts["eval"]
    trajectory = completion_tokens(pg(tools))
    assert trajectory == 3 * (64 + 32 + REPLY_WRAPPER_TOKENS)
    as_long = pt.predict_from_calibration(
        STUB, "policy_gradients", "grpo", pg(without_env(tools, max_new_tokens=trajectory))
    )
    assert multi.per_step_s == pytest.approx(as_long.per_step_s)
    assert multi.parts["eval"] == pytest.approx(as_long.parts["eval"])


# ----------------------------------------------------------------------------------- shrink


def test_the_shrink_onto_a_real_model_keeps_the_environment_and_sizes_the_trajectory(smol):
    res = shrink_config("grpo_tools", model=smol)
    env = res.config["env"]
    assert env["name"] == "calculator" and env["max_turns"] == 3
    assert env["max_observation_tokens"] == real_model.CPU_OBSERVATION_TOKENS
    assert res.config["rollout"]["max_new_tokens"] == real_model.CPU_NEW_TOKENS
    # 3 turns of 128 could reach 3 × (128 + 32 + wrapper) = 528; the CPU run stops at 256
    assert env["max_total_tokens"] == real_model.CPU_TRAJECTORY_TOKENS
    assert PolicyGradientConfig.model_validate(res.config).max_completion_tokens == 256
    assert any("trajectories of at most 3 model turns and 256 tokens" in n for n in res.notes)
    # one turn fills at most 128 + 32 + wrapper: the bound is that, not the CPU cap
    one = shrink_config("grpo_tools", as_overrides(["env.max_turns=1"]), model=smol).config["env"]
    assert one["max_total_tokens"] == 128 + 32 + REPLY_WRAPPER_TOKENS
    # the user's value wins over the rule
    mine = shrink_config("grpo_tools", as_overrides(["env.max_total_tokens=400"]), model=smol)
    assert mine.config["env"]["max_total_tokens"] == 400


def test_the_shrink_onto_tiny_keeps_the_environment():
    res = shrink_config("grpo_tools", model="tiny")
    assert res.config["env"] == {
        "name": "calculator",
        "max_turns": 3,
        "max_observation_tokens": 32,
        "max_total_tokens": None,
    }
    assert res.config["rollout"]["max_new_tokens"] == 64
    assert not any(k.startswith("env.") for k in res.shrink_overrides)


def test_a_single_turn_shrink_is_unchanged(smol):
    res = shrink_config("grpo", model=smol)
    assert res.config["env"]["name"] is None
    assert not any(k.startswith("env.") for k in res.shrink_overrides)
    assert not any("trajectories" in n for n in res.notes)


# -------------------------------------------------------------------------------- bad input


def nothing_written(root: Path) -> None:
    assert not (root / "experiments").exists(), sorted(map(str, root.rglob("*")))


@pytest.mark.parametrize(
    "override, says",
    [
        ("env.name=abacus", "env.name='abacus' is not an environment; known: calculator, python"),
        ("env.max_turns=0", "env.max_turns=0: a trajectory needs at least one model turn"),
    ],
)
def test_a_bad_environment_is_one_clear_error_before_anything_is_written(override, says, lab_root):
    with pytest.raises(InvalidArgument) as shrunk:
        api.shrink_config("grpo_tools", model="tiny", overrides=[override])
    assert says in shrunk.value.message
    with pytest.raises(InvalidArgument) as planned:
        api.plan_experiment("grpo with a calculator on tiny", overrides=[override])
    assert says in planned.value.message
    request = api.RunRequest(
        recipe="grpo", shrink=True, model="tiny", overrides=[override], campaign="bad-env"
    )
    with pytest.raises(InvalidArgument) as launched:
        api.launch(request)
    assert says in launched.value.message
    nothing_written(lab_root)


@pytest.mark.parametrize(
    "argv",
    [
        ["shrink", "grpo", "--model", "tiny", "--set", "env.name=abacus"],
        ["launch", "grpo_tools", "--shrink", "--model", "tiny", "--set", "env.name=abacus"],
        ["plan", "grpo with a calculator on tiny", "--set", "env.max_turns=0"],
    ],
)
def test_the_cli_refuses_a_bad_environment_with_one_clear_line(argv, lab_root):
    from typer.testing import CliRunner

    from rlhf_lab.cli import app

    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    said = result.output.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("error: invalid config"), said
    if "abacus" in argv[-1]:
        assert "known: calculator, python, scripted_tool" in said[0]
    else:
        assert "at least one model turn" in said[0]
    nothing_written(lab_root)


def test_a_trajectory_longer_than_the_context_is_refused(lab_root):
    # tiny's context is 2048 tokens: 20 turns of 64 + 32 + wrapper reach 2240
    with pytest.raises(InvalidArgument) as err:
        shrink_config("grpo_tools", as_overrides(["env.max_turns=20"]), model="tiny")
    assert "a trajectory of up to 2240 tokens" in err.value.message
    assert "context of model tiny (2048 tokens)" in err.value.message
    # a total above what the turns can fill is no longer than the turns: accepted
    ok = shrink_config("grpo_tools", as_overrides(["env.max_total_tokens=9000"]), model="tiny")
    assert completion_tokens(ok.trainer_config) == 3 * (64 + 32 + REPLY_WRAPPER_TOKENS)
    nothing_written(lab_root)


# ------------------------------------------------------------------------- plan: tools in text


@pytest.mark.parametrize(
    "text, envs",
    [
        ("GRPO with a calculator on 4-digit arithmetic", ["calculator"]),
        ("grpo using the calculator", ["calculator"]),
        ("grpo with tools on tiny", ["calculator"]),
        ("grpo with python", ["python"]),
        ("GRPO with a python tool", ["python"]),
        ("grpo without a calculator", [None]),
        ("grpo, no tools", [None]),
        ("GRPO with vs without a calculator", ["calculator", None]),
        ("grpo with and without the calculator", ["calculator", None]),
        ("grpo with/without tools", ["calculator", None]),
        ("grpo with a calculator vs without", ["calculator", None]),
        ("compare grpo with ppo", []),
        ("grpo on tiny", []),
    ],
)
def test_the_request_names_its_tools(text, envs):
    from rlhf_lab.planning.request import parse_request

    parsed = parse_request(text)
    assert parsed.envs == envs
    assert parsed.targets[0] == "algo:grpo"
    assert parsed.compare == (len(envs) > 1 or "compare" in text)


def test_grpo_with_a_calculator_plans_the_tools_recipe():
    plan = api.plan_experiment("GRPO with a calculator on 4-digit arithmetic on tiny")
    assert plan.intent == "sanity" and len(plan.runs) == 1
    run = plan.runs[0]
    assert (run.name, run.recipe, run.algorithm) == (
        "grpo+calculator",
        "policy_gradients/grpo_tools",
        "grpo",
    )
    assert run.launch_command.startswith("uv run rlhf-lab launch grpo_tools --shrink")
    assert plan.campaign == "grpo-with-calculator-sanity"


def test_grpo_without_a_calculator_plans_plain_grpo():
    for text in ("grpo without a calculator on tiny", "grpo_tools with no tools on tiny"):
        plan = api.plan_experiment(text)
        assert [(r.name, r.recipe) for r in plan.runs] == [("grpo", "policy_gradients/grpo")], text


def test_with_vs_without_a_calculator_is_a_matched_campaign_of_two_arms():
    plan = api.plan_experiment("GRPO with vs without a calculator on tiny")
    assert plan.intent == "compare" and plan.campaign == "grpo-with-calculator-vs-grpo"
    tools, plain = plan.runs
    assert (tools.name, tools.recipe) == ("grpo+calculator", "policy_gradients/grpo_tools")
    assert (plain.name, plain.recipe) == ("grpo", "policy_gradients/grpo")
    # the run without the tool takes the tools recipe's task (4-digit arithmetic), matched
    assert "data.specs=" in plain.launch_command and "basic_arithmetic" in plain.launch_command
    assert "data.specs (as in grpo+calculator)" in plan.matched
    assert any("differ in the environment (env.name) alone" in n for n in plan.notes)
    assert "env.name" not in tools.launch_command and "env.name" not in plain.launch_command


def test_a_tool_for_an_algorithm_without_a_tools_recipe_sets_the_environment():
    plan = api.plan_experiment("rloo with a python tool on tiny")
    (run,) = plan.runs
    assert (run.name, run.recipe) == ("rloo+python", "policy_gradients/rloo")
    assert "--set env.name=python" in run.launch_command
    assert any("no rloo_tools recipe ships" in n for n in plan.notes)
    # the tools recipe with another tool: the recipe, its env.name overridden
    (py,) = api.plan_experiment("grpo with python on tiny").runs
    assert (
        py.recipe == "policy_gradients/grpo_tools" and "--set env.name=python" in py.launch_command
    )


def test_a_tool_for_another_family_is_refused(lab_root):
    with pytest.raises(InvalidArgument) as err:
        api.plan_experiment("dpo with a calculator on tiny")
    assert (
        "policy-gradient family" in err.value.message
        and "dpo (direct_alignment)" in err.value.message
    )
    nothing_written(lab_root)
