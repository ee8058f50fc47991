"""Bad input, impossible shapes at launch: batch not divisible, one rollout for a group
method, prompt budget above max_length, unknown algorithm, missing model, hub offline, cuda
without a GPU; each is one clear message before anything starts.

The shared helpers and the fixtures are in _bad_input.py.
"""

from __future__ import annotations

import re

import pytest
from _bad_input import (  # noqa: F401  (lab_root, no_trainer: fixtures)
    QUICK,
    assert_one_clear_message,
    lab_root,
    lab_tree,
    no_trainer,
    runner,
)

from rlhf_lab import api, runs
from rlhf_lab.cli import app
from rlhf_lab.paths import LabError
from rlhf_lab.planning.overrides import as_overrides
from trainers.policy_gradients.spec import FAMILY as PG_FAMILY

pytestmark = pytest.mark.usefixtures("lab_root")


# ---------------------------------------------------------------------------------------------
# Impossible shapes
# ---------------------------------------------------------------------------------------------

IMPOSSIBLE = {
    "micro-batch does not divide the rollout batch": (
        "grpo",
        ["train.batch_size=3"],
        "is not divisible by train.batch_size = 3",
    ),
    "prompt budget above max_length": (
        "dpo",
        ["data.max_length=64", "data.max_prompt_length=128"],
        "data.max_prompt_length (128) must be smaller than data.max_length (64)",
    ),
    "prompt budget equal to max_length": (
        "simpo",
        ["data.max_length=64", "data.max_prompt_length=64"],
        "must be smaller than data.max_length",
    ),
    "eval split as large as the data (sft)": (
        "sft",
        ["data.max_samples=16", "data.eval_size=16"],
        "must be smaller than data.max_samples",
    ),
    "eval split as large as the data (reward model)": (
        "preference_rm",
        ["data.max_samples=16", "data.eval_size=32"],
        "must be smaller than data.max_samples",
    ),
    "unknown loss": ("dpo", ["loss=dpoo"], "'loss': Input should be 'dpo'"),
    "unknown policy-gradient algorithm": ("grpo", ["algorithm=grpoo"], "'algorithm': Input"),
    "misspelt key": ("dpo", ["train.lerning_rate=1e-4"], "Did you mean: learning_rate"),
    "zero batch": ("dpo", ["train.batch_size=0"], "'train.batch_size': Input should be greater"),
    "text where a number goes": ("dpo", ["train.max_steps=ten"], "'train.max_steps'"),
}
IMPOSSIBLE.update(
    {
        f"one rollout for {algorithm}": (
            algorithm,
            ["rollout.num_rollouts=1"],
            "needs rollout.num_rollouts >= 2 (got 1)",
        )
        for algorithm in sorted(s.name for s in PG_FAMILY.algorithms if s.needs_groups)
    }
)


QUICK_FOR = {"dpo": QUICK, "simpo": QUICK}  # launch checks run on the quick config's data sizes


@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
def test_impossible_shapes_are_refused_before_anything_starts(lab_root, no_trainer, case):
    recipe, overrides, needle = IMPOSSIBLE[case]
    before = lab_tree(lab_root)
    calls = {
        "resolve_config": lambda: api.resolve_config(recipe, as_overrides(overrides)),
        "shrink_config": lambda: api.shrink_config(recipe, overrides, model="tiny"),
        "plan_experiment": lambda: api.plan_experiment(
            algorithm=recipe, model="tiny", overrides=overrides
        ),
        "launch": lambda: api.launch(
            api.RunRequest(
                recipe=recipe,
                overrides=QUICK_FOR.get(recipe, []) + overrides,
                model="tiny",
                device="cpu",
            )
        ),
    }
    for name, fn in calls.items():
        with pytest.raises(LabError) as err:
            fn()
        text = str(err.value)
        assert needle in text, (name, text)
        assert_one_clear_message(text)
    argv = ["launch", recipe, "--model", "tiny", "--device", "cpu"]
    result = runner.invoke(app, argv + [a for o in overrides for a in ("--set", o)])
    assert result.exit_code == 2 and result.output.count("error: ") == 1, result.output
    assert needle in result.output
    assert lab_tree(lab_root) == before


def test_unknown_algorithm_names_the_close_ones(lab_root):
    for fn in (
        lambda: api.resolve_config("dpoo"),
        lambda: api.launch(api.RunRequest(recipe="dpoo", model="tiny")),
        lambda: api.plan_experiment(algorithm="dpoo"),
        lambda: api.plan_experiment("train a dragon"),
    ):
        with pytest.raises(LabError) as err:
            fn()
        text = str(err.value)
        assert re.search(r"unknown (recipe|algorithm) 'dpoo'|no algorithm found", text), text
        assert "dpo" in text
    result = runner.invoke(app, ["launch", "dpoo", "--model", "tiny"])
    assert (
        result.exit_code == 2 and "error: unknown recipe 'dpoo'. Did you mean: dpo" in result.output
    )
    assert not (lab_root / "experiments").exists()


def test_cuda_without_a_gpu_is_refused_at_launch(lab_root, no_trainer, machine):
    machine(gpus=[])  # the same answer on a GPU box
    for device, extra, needle in [
        ("cuda", [], "cuda:0 was asked for but this machine shows 0 GPU(s)"),
        ("cuda:1", [], "cuda:1 was asked for"),
        ("auto", ["model.device=cuda"], "model.device=cuda was asked for"),
        ("cpu", ["model.device=cuda"], "model.device=cuda was asked for"),
    ]:
        with pytest.raises(LabError) as err:
            api.launch(
                api.RunRequest(recipe="dpo", overrides=QUICK + extra, model="tiny", device=device)
            )
        assert needle in str(err.value)
        # the way on is a typed next step (the CLI renders it as `--device cpu`, see below)
        assert err.value.kind == "unavailable"
        assert ("launch_run", {"device": "cpu"}) in [
            (s.operation, dict(s.args)) for s in err.value.next_steps
        ]
    with pytest.raises(LabError, match="bad device 'tpu'"):
        api.launch(api.RunRequest(recipe="dpo", overrides=QUICK, model="tiny", device="tpu"))
    assert not (lab_root / "experiments").exists(), "a refused launch created its campaign"
    result = runner.invoke(app, ["launch", "dpo", "--model", "tiny", "--device", "cuda"])
    assert result.exit_code == 2 and result.output.count("error: ") == 1, result.output
    assert "was asked for but this machine shows 0 GPU(s)" in result.output
    assert "`rlhf-lab launch ... --device cpu`" in result.output
    # plan writes nothing and starts nothing: it warns instead
    plan = api.plan_experiment(algorithm="dpo", model="tiny", overrides=["model.device=cuda"])
    assert "the config asks for model.device=cuda but this machine has no GPU" in plan.warnings


@pytest.mark.parametrize(
    ("model", "lab_says", "trainer_says"),
    [
        (
            "/nonexistent/path",
            "cannot be resolved: No such file or folder: '/nonexistent/path'",
            "ModelNotFoundError: No such file or folder: '/nonexistent/path'",
        ),
        (
            "nobody/no-such-model",
            "cannot be loaded here: HF_HUB_OFFLINE=1 is set and its weights are not in the local",
            "HF_HUB_OFFLINE=1 is set and it is not in the local Hugging Face cache",
        ),
    ],
)
def test_a_model_that_cannot_load_is_one_message_before_launch_and_in_run_status(
    lab_root, monkeypatch, model, lab_says, trainer_says
):
    """The lab refuses the launch (and a plan of a model that resolves to nothing) before
    anything is written; a run that reaches the trainer anyway (started below the lab's checks,
    e.g. its model folder removed while it was queued) ends failed with the trainer's one-line
    reason in its status."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    overrides = [f"model.name={model}"] + QUICK
    if model.startswith("/"):
        with pytest.raises(LabError, match="cannot be resolved"):
            api.plan_experiment(algorithm="dpo", overrides=overrides)
    else:  # a hub id may be planned for another machine: the plan warns
        plan = api.plan_experiment(algorithm="dpo", overrides=overrides)
        assert any("local Hugging Face cache" in w for w in plan.warnings), plan.warnings
        assert any("tiny" in c for c in plan.offline_choices)
    with pytest.raises(LabError) as err:
        api.launch(
            api.RunRequest(
                recipe="dpo", overrides=QUICK + [f"model.name={model}"], device="cpu", shrink=False
            )
        )
    assert lab_says in err.value.message and "\n" not in err.value.message
    assert ("shrink_config", {"model": "tiny"}) in [
        (s.operation, dict(s.args)) for s in err.value.next_steps
    ]
    assert not (lab_root / "experiments").exists(), "a refused launch wrote something"
    config = api.resolve_config("dpo", as_overrides(QUICK + [f"model.name={model}"])).config
    launched = runs.start_or_queue(
        runs.NewRun(
            family="direct_alignment",
            algorithm="dpo",
            config=config,
            campaign="model-gone",
            source="dpo.yaml",
            overrides=[],
        )
    )
    status = runs.wait_for_end(launched.run.id, poll_s=0.5, timeout_s=120)
    assert status.state == "failed", status
    assert trainer_says in status.error and "tiny" in status.error
    assert "\n" not in status.error.strip() and "Traceback" not in status.error
    view = api.run_status(launched.run.id)
    assert any(trainer_says in a.message for a in view.alerts)
