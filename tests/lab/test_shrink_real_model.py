"""The shrink for a pretrained model on a CPU (issue 25, item 1), the data-file check at plan and
launch (``--queue`` included) and the refusal of an identical launch (item 7).

The pretrained model is a stand-in: a folder holding SmolLM2-135M-Instruct's config.json (a
Llama of 134.5M parameters), which is all the shrink reads. The machine facts the rules read are
pinned (the ``cpu_box`` machine of tests/conftest.py): no GPU, so the run trains on the CPU, and
20 GiB of RAM free (a test names it when it changes them). The slow test runs one LoRA SFT step
of the pulled SmolLM2 through the lab."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from rlhf_lab import api, runs
from rlhf_lab.errors import Conflict, InvalidArgument, NotFound
from rlhf_lab.planning import offline_data, real_model
from rlhf_lab.planning.overrides import Override, as_overrides
from rlhf_lab.planning.shrink import shrink_config
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.runs.identical import identical_runs
from tests._helpers.lab_launches import queue_on_tiny
from tests.conftest import model_folder
from trainers.core.lora import DEFAULT_TARGETS

PULLED_NAME = "smollm2-135m-instruct"
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(autouse=True)
def lab_root(offline_lab, cpu_box, no_queue_worker):
    return offline_lab


def nothing_written(root: Path) -> None:
    assert not (root / "experiments").exists(), sorted(map(str, root.rglob("*")))


# ------------------------------------------------------------------------------ offline data


def test_an_uncached_hub_dataset_becomes_the_builtin_set_and_the_plan_says_so(smol):
    res = shrink_config("sft", model=smol)
    assert res.config["data"]["dataset"] == "builtin:reasoning-sft"
    note = next(n for n in res.notes if "HuggingFaceH4/no_robots" in n)
    assert (
        "builtin:reasoning-sft" in note and "override data.dataset=HuggingFaceH4/no_robots" in note
    )
    plan = api.plan_experiment(algorithm="sft", model=smol)
    assert any("HuggingFaceH4/no_robots" in w for w in plan.warnings)
    assert plan.runs[0].recipe == "sft/sft"


def test_every_family_swaps_its_hub_data(smol):
    wanted = {
        "dpo": "builtin:reasoning-preferences",
        "preference_rm": "builtin:reasoning-preferences",
        "orm": "builtin:reasoning-outcomes",
        "prm": "builtin:reasoning-steps",
        "top_per_prompt": "builtin:chain_sum",
        "grpo_rm": "builtin",  # preference prompts: those of the built-in pairs
    }
    for recipe, dataset in wanted.items():
        res = shrink_config(recipe, model=smol)
        assert res.config["data"]["dataset"] == dataset, recipe


def test_a_cached_hub_dataset_and_a_users_choice_are_kept(smol, lab_root):
    snapshot = lab_root / "hf" / "hub" / "datasets--HuggingFaceH4--no_robots" / "snapshots" / "a"
    snapshot.mkdir(parents=True)
    assert shrink_config("sft", model=smol).config["data"]["dataset"] == "HuggingFaceH4/no_robots"
    mine = shrink_config("sft", as_overrides(["data.dataset=someone/else"]), model=smol)
    assert mine.config["data"]["dataset"] == "someone/else"
    assert any("someone/else (yours) is not in the local" in n for n in mine.notes)


def test_no_builtin_equivalent_is_refused_with_the_override_to_use(smol):
    # policy gradients have no built-in set of their own: only the preference source's prompts
    with pytest.raises(InvalidArgument) as pg:
        shrink_config("grpo_rm", as_overrides(["data.source=reasoning_gym"]), model=smol)
    assert "has no built-in offline equivalent" in pg.value.message
    assert "overrides data.source=reasoning_gym data.dataset=null" in pg.value.message
    # a family that reads data files only (every such family has a set today) names a file
    err = offline_data._no_equivalent(
        TrainerConfig("sft", {}), "sft", "data.dataset", "org/hub-set"
    )
    assert "has no built-in offline equivalent" in err.message
    assert "override data.dataset=/path/to/data.jsonl" in err.message


# ------------------------------------------------------------------------------ LoRA, sizes


def test_lora_is_the_default_on_a_cpu_for_a_135m_model(smol):
    res = shrink_config("dpo", model=smol)
    lora = res.config["model"]["lora"]
    assert lora["enabled"] is True and lora["target_modules"] == LLAMA_TARGETS
    assert (lora["rank"], lora["alpha"]) == (16, 32.0)
    assert list(DEFAULT_TARGETS["llama"]) == LLAMA_TARGETS
    # the recipe's full fine-tuning learning rate ×10
    full = shrink_config("dpo", as_overrides(["model.lora.enabled=false"]), model=smol).config
    assert res.config["train"]["learning_rate"] == pytest.approx(
        min(10 * full["train"]["learning_rate"], real_model.LORA_LR_CEILING)
    )
    assert any(n.startswith("LoRA (rank 16, alpha 32)") for n in res.notes)


def test_full_fine_tuning_on_request_and_user_lora_settings_win(smol):
    full = shrink_config("sft", as_overrides(["model.lora.enabled=false"]), model=smol)
    assert full.config["model"]["lora"]["enabled"] is False
    assert not any(o.startswith("model.lora.") for o in full.shrink_overrides)
    assert full.config["train"]["learning_rate"] == 5e-6  # the recipe's, not the LoRA rate
    ranked = shrink_config(
        "sft", as_overrides(["model.lora.enabled=true", "model.lora.rank=4"]), model=smol
    )
    assert ranked.config["model"]["lora"]["rank"] == 4
    assert ranked.config["model"]["lora"]["target_modules"] is None  # the trainer's default
    mine = shrink_config("sft", as_overrides(["train.learning_rate=1e-4"]), model=smol)
    assert mine.config["train"]["learning_rate"] == 1e-4
    assert mine.config["model"]["lora"]["enabled"] is True


def test_no_lora_below_50m_parameters_or_off_the_cpu(tmp_path, smol, machine):
    small = model_folder(tmp_path, "smol-small", num_hidden_layers=2, hidden_size=256)
    res = shrink_config("sft", model=small)
    assert res.config["model"]["lora"]["enabled"] is False
    machine(gpus=[20.0])  # model.device=auto trains on it
    gpu = shrink_config("sft", model=smol)
    assert gpu.config["model"]["lora"]["enabled"] is False
    assert gpu.config["data"]["max_length"] == 1024  # the GPU rules: the book's habits


def test_cpu_sizes_for_a_135m_model(smol):
    sft = shrink_config("sft", model=smol)
    d, t = sft.config["data"], sft.config["train"]
    assert d["max_length"] == 256 and d["eval_size"] == 32
    assert (t["batch_size"], t["gradient_accumulation_steps"]) == (4, 2)
    assert sft.expected_optimizer_steps == 36  # ceil((320 - 32) / 8)
    grpo = shrink_config("grpo", model=smol)
    r, t, d = grpo.config["rollout"], grpo.config["train"], grpo.config["data"]
    assert (r["prompts_per_step"], r["num_rollouts"], r["max_new_tokens"]) == (4, 4, 128)
    assert d["eval_size"] == 32 and grpo.config["eval"]["max_new_tokens"] is None  # = rollouts
    assert t["batch_size"] * t["gradient_accumulation_steps"] == 16  # one step per rollout
    assert grpo.expected_optimizer_steps == grpo.expected_progress_steps == 20


def test_calibration_overrides_come_after_the_rules_and_before_the_users(smol):
    measured = [Override.of("rollout.max_new_tokens", 72)]
    res = shrink_config("grpo", model=smol, calibration=measured)
    assert res.config["rollout"]["max_new_tokens"] == 72
    assert "rollout.max_new_tokens=72" in res.shrink_overrides
    mine = shrink_config(
        "grpo", [Override.parse("rollout.max_new_tokens=40")], model=smol, calibration=measured
    )
    assert mine.config["rollout"]["max_new_tokens"] == 40


# ------------------------------------------------------------------- checkpointing, final model


def test_gradient_checkpointing_only_when_the_estimate_needs_it(smol, machine):
    res = shrink_config("grpo", model=smol)  # grpo.yaml turns it on
    assert res.config["model"]["gradient_checkpointing"] is False
    assert any(n.startswith("gradient checkpointing off") for n in res.notes)
    machine(free_ram_gb=1.0)
    tight = shrink_config("grpo", model=smol)
    assert tight.config["model"]["gradient_checkpointing"] is True
    assert any(n.startswith("gradient checkpointing on") for n in tight.notes)
    mine = shrink_config("grpo", as_overrides(["model.gradient_checkpointing=true"]), model=smol)
    assert mine.config["model"]["gradient_checkpointing"] is True


@pytest.mark.parametrize("recipe", ["sft", "dpo", "simpo", "grpo", "top_per_prompt"])
def test_the_final_model_is_kept_for_the_proposed_evaluation(smol, recipe):
    res = shrink_config(recipe, model=smol)
    assert res.config["checkpoint"]["save_final_model"] is True
    plan = api.plan_experiment(algorithm=recipe, model=smol)
    assert any("evaluate it against its starting model" in step for step in plan.steps)


def test_the_plan_proposes_no_evaluation_of_a_run_that_keeps_no_model(smol):
    plan = api.plan_experiment(
        algorithm="dpo", model=smol, overrides=["checkpoint.save_final_model=false"]
    )
    assert not any("evaluate it against its starting model" in step for step in plan.steps)


# ------------------------------------------------------------------------------ data files


def test_a_missing_data_file_is_refused_at_plan_launch_and_queue(lab_root):
    missing = ["data.dataset=/no/such/pairs.jsonl"]
    with pytest.raises(NotFound) as err:
        api.plan_experiment(algorithm="dpo", model="tiny", overrides=missing)
    assert "data.dataset='/no/such/pairs.jsonl': no such file" in err.value.message
    assert "override data.dataset=builtin:reasoning-preferences" in err.value.message
    for queue in (True, False):
        with pytest.raises(NotFound):
            api.launch(api.RunRequest(recipe="dpo", overrides=missing, model="tiny", queue=queue))
    nothing_written(lab_root)
    with pytest.raises(NotFound, match="data.test_dataset"):
        queue_on_tiny("top_per_prompt", ["data.test_dataset=held.jsonl"])
    nothing_written(lab_root)


def test_an_existing_data_file_is_accepted(lab_root):
    pairs = lab_root / "pairs.jsonl"
    pairs.write_text("")
    res = shrink_config("dpo", as_overrides([f"data.dataset={pairs}"]), model="tiny")
    assert res.config["data"]["dataset"] == str(pairs)


def test_the_cli_refuses_a_queued_launch_of_a_missing_file(lab_root):
    from typer.testing import CliRunner

    from rlhf_lab.cli import app

    result = CliRunner().invoke(
        app,
        ["launch", "sft", "--model", "tiny", "--queue", "--set", "data.dataset=./nope.jsonl"],
    )
    assert result.exit_code != 0 and "nope.jsonl" in result.output
    nothing_written(lab_root)


# ------------------------------------------------------------------------------ identical launch

QUICK = ["data.max_samples=48", "data.eval_size=16", "train.max_steps=2"]


def test_an_identical_launch_beside_a_queued_one_is_refused_with_its_id(lab_root):
    first = queue_on_tiny("dpo", QUICK, campaign="same")
    with pytest.raises(Conflict) as err:
        queue_on_tiny("dpo", QUICK, campaign="other")
    assert (
        first.run.id in err.value.message and "same resolved config and seed" in err.value.message
    )
    assert {s.operation for s in err.value.next_steps} == {"run_status", "launch_run"}
    assert len(list((lab_root / "experiments").glob("*/runs/*"))) == 1
    assert not list((lab_root / "experiments").glob("*-other*"))
    # another seed is another sample; --force runs the same one anyway
    queue_on_tiny("dpo", [*QUICK, "seed=7"], campaign="same")
    forced = queue_on_tiny("dpo", QUICK, force=True)
    assert forced.run.id != first.run.id
    assert len(list((lab_root / "experiments").glob("*/runs/*"))) == 3


def test_an_identical_config_of_a_finished_run_is_not_refused(lab_root):
    first = queue_on_tiny("dpo", QUICK)
    record = Path(first.run.run_dir) / "run.json"
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "state": "cancelled"}))
    again = queue_on_tiny("dpo", QUICK)
    assert again.run.id != first.run.id
    stored = yaml.safe_load((Path(again.run.run_dir) / "config.yaml").read_text())
    assert identical_runs("direct_alignment", TrainerConfig("direct_alignment", stored)) == [
        (again.run.id, "queued")
    ]


# ------------------------------------------------------------------------------ the real model


def pulled_smollm2() -> Path | None:
    """The pulled SmolLM2 folder: in the lab's cache (``RLHF_LAB_CACHE``, a fresh folder in a
    test session), else in the default cache a user's `rlhf-lab models pull` filled."""
    from trainers.core.models import pulled_dir

    default = Path.home() / ".cache" / "rlhf-lab" / "models" / "pulled" / PULLED_NAME
    for folder in (pulled_dir(PULLED_NAME), default):
        if (folder / "model.safetensors").is_file() and (folder / "config.json").is_file():
            return folder
    return None


@pytest.mark.slow
def test_one_lora_sft_step_of_smollm2_through_the_lab(lab_root, monkeypatch):
    pulled = pulled_smollm2()
    if pulled is None:
        pytest.skip(f"SmolLM2-135M-Instruct is not pulled here: rlhf-lab models pull {PULLED_NAME}")
    steps = ["train.max_steps=1", "data.max_samples=40", "data.eval_size=8", "eval.eval_every=0"]
    steps += ["eval.sample_every=0", "eval.num_samples=0"]
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    monkeypatch.setenv("OMP_NUM_THREADS", env["OMP_NUM_THREADS"])
    result = api.launch(
        api.RunRequest(recipe="sft", overrides=steps, model=str(pulled), device="cpu")
    )
    final = runs.wait_for_end(result.run.id, timeout_s=900)
    run_dir = Path(result.run.run_dir)
    assert final.state == "succeeded", (run_dir / "train.log").read_text()[-3000:]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["lora"]["enabled"] is True
    assert config["data"]["dataset"] == "builtin:reasoning-sft"
    assert (run_dir / "final_adapter").is_dir() and (run_dir / "final_model").is_dir()


def test_the_device_and_rank_rules_read_the_config_and_the_width():
    assert real_model.runs_on_cpu(TrainerConfig("sft", {"model": {"device": "cpu"}})) is True
    assert real_model.runs_on_cpu(TrainerConfig("sft", {"model": {"device": "cuda:1"}})) is False
    assert [real_model.lora_rank(w) for w in (256, 576, 2048, 4096)] == [8, 16, 16, 32]
