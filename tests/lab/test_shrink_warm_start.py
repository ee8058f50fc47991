"""Shrink of a run that starts from another run's model (``model.name=run:<id>``): policy
gradients, online DPO and distillation take the task the upstream run was trained on from its
lineage, and policy gradients a fine-tuning learning rate; recipe flags (``# lab: cpu_sized``)
read from the recipe file."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhf_lab.planning.catalog import find_recipe, recipe_flags
from rlhf_lab.planning.configs import resolve_config
from rlhf_lab.planning.overrides import as_overrides
from rlhf_lab.planning.shrink import WARM_START_PG_LR, shrink_config
from rlhf_lab.runs.lineage import trained_task_specs
from tests._helpers.prepared_runs import prepared_run

WARM_TASK = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}


@pytest.fixture(autouse=True)
def _lab_root(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))


def _run_of(recipe: str, overrides: list[str] | None = None) -> str:
    """A queued run of ``recipe`` in the lab (its run folder, config.yaml and run.json)."""
    return prepared_run(recipe, overrides or [], campaign="warm", state="queued").id


def test_pg_shrink_of_the_warm_start_takes_its_task_and_a_fine_tuning_lr():
    warm = _run_of("sft_tiny_warmstart")
    res = shrink_config("grpo", model=f"run:{warm}")
    cfg = res.config
    assert cfg["train"]["learning_rate"] == WARM_START_PG_LR < 1e-3
    assert cfg["data"]["eval_size"] == 64  # held-out correctness is the result: n of 16 is noise
    assert [s["name"] for s in cfg["data"]["specs"]] == ["chain_sum"]
    assert {k: cfg["data"]["specs"][0]["config"][k] for k in WARM_TASK} == WARM_TASK
    assert any("is a trained run: lr" in n for n in res.notes)
    assert any("chain_sum" in n and "lineage" in n for n in res.notes)
    # the explicit values still win
    mine = shrink_config("grpo", as_overrides(["train.learning_rate=3e-5"]), model=f"run:{warm}")
    assert mine.config["train"]["learning_rate"] == 3e-5


def test_pg_shrink_of_a_preset_keeps_the_random_init_values():
    res = shrink_config("grpo", model="tiny")
    cfg = res.config
    assert cfg["train"]["learning_rate"] == 1e-3 and cfg["data"]["eval_size"] == 16
    shipped = resolve_config(find_recipe("grpo")).data
    assert cfg["data"]["specs"] == shipped["data"]["specs"]  # the book's task (spell_backward)
    assert not any("is a trained run" in n for n in res.notes)


def test_the_task_is_followed_back_through_the_lineage():
    """A policy-gradient run from a DPO run of the warm start (DPO's pairs are not a
    reasoning-gym prompt set of its own) draws from the warm start's task."""
    warm = _run_of("sft_tiny_warmstart")
    dpo = _run_of("dpo", [f"model.name=run:{warm}"])
    specs = trained_task_specs(f"run:{dpo}")
    assert specs is not None and [s["name"] for s in specs] == ["chain_sum"]
    res = shrink_config("reinforce_pp", model=f"run:{dpo}")
    assert res.config["data"]["specs"][0]["config"]["max_digits"] == 1
    # a policy-gradient run's own prompts come first
    grpo = _run_of("grpo", [f"model.name=run:{warm}"])
    assert [s["name"] for s in trained_task_specs(f"run:{grpo}")] == ["spell_backward"]


def test_an_unknown_task_keeps_the_recipe_task_and_says_so():
    dpo = _run_of("dpo", ["model.name=tiny"])  # preference pairs, not a reasoning-gym set
    res = shrink_config("grpo", model=f"run:{dpo}")
    assert res.config["data"]["specs"][0]["name"] == "spell_backward"
    assert res.config["train"]["learning_rate"] == WARM_START_PG_LR
    assert any("cannot be read" in n and "spell_backward" in n for n in res.notes)


def test_online_dpo_and_distill_from_the_warm_start_use_its_task():
    warm = _run_of("sft_tiny_warmstart", ["data.dataset=builtin:reasoning-sft:letter_counting"])
    online = shrink_config("online_dpo", model=f"run:{warm}").config
    assert online["data"]["dataset"] == "builtin:reasoning-preferences:letter_counting"
    assert set(online["data"]["builtin_task_configs"]) == {"letter_counting"}
    student = shrink_config(
        "distill", model=f"run:{warm}", overrides=as_overrides([f"teacher.name=run:{warm}"])
    )
    assert [s["name"] for s in student.config["data"]["specs"]] == ["letter_counting"]
    # a preset student distilled from the run takes the teacher's task
    fresh = shrink_config(
        "distill", model="tiny", overrides=as_overrides([f"teacher.name=run:{warm}"])
    )
    assert [s["name"] for s in fresh.config["data"]["specs"]] == ["letter_counting"]


# ---------------------------------------------------------------------------------------------
# recipe flags
# ---------------------------------------------------------------------------------------------


def test_recipe_flags_are_read_from_comment_lines():
    assert recipe_flags("# SFT\n# lab: cpu_sized (why)\nseed: 1\n") == {"cpu_sized"}
    assert recipe_flags("# lab: cpu_sized, other\n") == {"cpu_sized", "other"}
    assert recipe_flags("# a recipe about the lab: nothing\nseed: 1\n") == frozenset()
    assert find_recipe("sft_tiny_warmstart").cpu_sized
    assert not find_recipe("sft").cpu_sized


def test_a_recipe_file_flagged_cpu_sized_is_kept_whole_onto_a_preset(tmp_path: Path):
    shipped = find_recipe("sft_tiny_warmstart").path().read_text()
    unflagged = "\n".join(line for line in shipped.splitlines() if "lab: cpu_sized" not in line)
    flagged = tmp_path / "my_warmstart.yaml"
    plain = tmp_path / "my_plain.yaml"
    flagged.write_text(shipped)
    plain.write_text(unflagged + "\n")
    whole = shrink_config(str(flagged), model="tiny")
    assert whole.expected_optimizer_steps == 600
    assert whole.config["train"] == resolve_config(find_recipe(str(flagged))).data["train"]
    shrunk = shrink_config(str(plain), model="tiny")
    assert shrunk.config["train"]["num_epochs"] == 1 and shrunk.expected_optimizer_steps < 100


def test_the_plan_explains_the_warm_start_shrink(machine):
    """The plan of a sweep from the warm start carries the shrink's explanation (its notes)."""
    from rlhf_lab.planning import plan as plan_mod

    machine(gpus=[], free_ram_gb=30.0, total_ram_gb=32.0)
    warm = _run_of("sft_tiny_warmstart")
    plan = plan_mod.plan_experiment(algorithm="reinforce_pp", model=f"run:{warm}")
    text = " ".join([*plan.notes, *plan.warnings])
    assert "is a trained run: lr" in text and "(chain_sum)" in text


def test_pg_shrink_of_a_pretrained_models_warm_start_takes_its_task():
    """A warm start of SmolLM2 (not a preset) kept the recipe's spell_backward before: GRPO from
    an SFT on chain_sum must draw chain_sum prompts, as from the tiny warm start."""
    warm = _run_of(
        "sft",
        ["model.name=smollm2-135m-instruct", "data.dataset=builtin:reasoning-sft:chain_sum"],
    )
    res = shrink_config("grpo", model=f"run:{warm}")
    assert [s["name"] for s in res.config["data"]["specs"]] == ["chain_sum"]
    assert any("chain_sum" in n and "lineage" in n for n in res.notes)
    assert res.config["train"]["learning_rate"] != WARM_START_PG_LR  # the preset's rate stays there
