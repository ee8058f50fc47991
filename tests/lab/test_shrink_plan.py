"""shrink and plan on every shipped recipe, request parsing, commands, device fit, offline
models, and the no-torch promise of the lab's import path."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_lab.demo import DPO_SANITY_OVERRIDES
from rlhf_lab.paths import LabError
from rlhf_lab.planning.catalog import FAMILIES, Recipe, get_dotted, list_recipes
from rlhf_lab.planning.configs import resolve_config
from rlhf_lab.planning.overrides import as_overrides
from rlhf_lab.planning.plan import parse_request, plan_experiment
from rlhf_lab.planning.shrink import format_override, shrink_config
from tests.conftest import fake_gpus
from trainers.core.config import parse_override
from trainers.core.tiny import PRESETS

ROOT = Path(__file__).resolve().parents[2]
RECIPES = list_recipes()


def criteria(plan, algorithm: str) -> dict[str, list[str]]:
    """A planned algorithm's key metrics, acceptance and watch items (shared entries too)."""
    out: dict[str, list[str]] = {"key_metrics": [], "acceptance": [], "watch": []}
    for entry in plan.criteria:
        if algorithm in entry.algorithms:
            for field, items in out.items():
                items += getattr(entry, field)
    return out


@pytest.fixture(autouse=True)
def _lab_root(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    return tmp_path


@pytest.fixture
def no_gpu(machine):
    """A machine with no GPU and 30 of its 32 GiB of RAM free."""
    return machine(gpus=[], free_ram_gb=30.0, total_ram_gb=32.0)


def _shrink_or_skip(recipe: Recipe, **kw):
    try:
        return shrink_config(recipe, **kw)
    except LabError as err:
        if "has no config model yet" in str(err):
            pytest.skip(str(err))
        raise


# ---------------------------------------------------------------------------------------------
# shrink on every shipped recipe
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [None, "tiny"])
@pytest.mark.parametrize("recipe", RECIPES, ids=[r.id for r in RECIPES])
def test_shrink_every_recipe(recipe, model):
    if recipe.cpu_sized:
        pytest.skip("sized for a CPU run already: test_the_warm_start_recipe_is_kept_whole")
    res = _shrink_or_skip(recipe, model=model)
    assert res.family == recipe.family and res.algorithm == recipe.algorithm
    assert res.shrink_overrides and res.diff
    # the overrides reproduce the config from the shipped file (what the launcher will pass)
    assert resolve_config(recipe, as_overrides(res.overrides)).data == res.config
    assert res.expected_optimizer_steps is not None and 0 < res.expected_optimizer_steps <= 200
    assert res.expected_progress_steps is not None and res.expected_progress_steps > 0
    cfg = res.config
    assert cfg["logging"]["log_every"] == 1
    assert cfg["checkpoint"]["save_every"] is None
    full = resolve_config(recipe).data
    if recipe.family in ("direct_alignment", "sft", "reward_models"):
        assert cfg["train"]["num_epochs"] == 1
        assert cfg["data"]["max_samples"] <= 640
        assert cfg["data"]["eval_size"] < cfg["data"]["max_samples"]
    if recipe.family == "policy_gradients":
        assert cfg["train"]["max_steps"] <= 20
        assert cfg["data"]["size"] <= full["data"]["size"]
    if model == "tiny":
        assert res.model == "tiny" and res.model_swap == "tiny"
        assert cfg["model"]["gradient_checkpointing"] is False
        builtin = FAMILIES[recipe.family].builtin_datasets
        wanted = builtin.get(res.algorithm) or builtin.get("*")
        if wanted:
            assert cfg["data"]["dataset"] == wanted
    else:
        assert res.model == full["model"]["name"] and res.model_swap is None


@pytest.mark.parametrize("model", [None, "tiny"])
def test_the_warm_start_recipe_is_kept_whole(model):
    """Shrunk to one epoch of 640 samples (36 steps) the tiny SFT warm start never learns the
    answer format (greedy format rate 0, seen when launched with --model tiny), so the GRPO of
    pipeline r1-zero had nothing to start from; onto a preset the shrink keeps it whole."""
    recipe = next(r for r in RECIPES if r.id == "sft/sft_tiny_warmstart")
    assert recipe.cpu_sized  # the `# lab: cpu_sized` line of its file
    res = shrink_config(recipe, model=model)
    full = resolve_config(recipe).data
    assert res.config["train"] == full["train"] and res.config["data"] == full["data"]
    assert res.expected_optimizer_steps == 600
    assert any("already sized for a CPU run" in n for n in res.notes)
    # the generic SFT recipe is still shrunk onto tiny
    generic = shrink_config(next(r for r in RECIPES if r.id == "sft/sft"), model="tiny")
    assert generic.config["train"]["num_epochs"] == 1 and generic.expected_optimizer_steps <= 200


def test_tiny_dpo_shrink_is_the_tested_demo_recipe():
    res = shrink_config("dpo", model="tiny")
    demo = resolve_config("dpo", as_overrides(DPO_SANITY_OVERRIDES)).data
    # the shrink keeps the final model for the evaluation the plan proposes; the demo does not
    assert res.config["checkpoint"]["save_final_model"] is True
    demo["checkpoint"]["save_final_model"] = True
    assert res.config == demo
    assert res.expected_optimizer_steps == 32  # ceil((640 - 128) / 16) × 1 epoch
    assert res.progress_unit == "optimizer steps"


def test_keep_model_dpo_shrink_follows_the_book_habits(machine):
    """On a GPU the pretrained model keeps the book's sizes (a CPU gets its own:
    tests/lab/test_shrink_real_model.py); the hub data is not cached here, so it is swapped."""
    machine(gpus=[80.0])
    res = shrink_config("dpo")
    d, t = res.config["data"], res.config["train"]
    assert res.model == "allenai/OLMo-2-0425-1B-SFT"
    assert (d["max_samples"], d["eval_size"], d["max_length"]) == (640, 64, 512)
    assert (t["num_epochs"], t["batch_size"], t["gradient_accumulation_steps"]) == (1, 4, 4)
    assert res.expected_optimizer_steps == 36  # ceil(576 / 16)
    assert d["dataset"] == "builtin:reasoning-preferences"
    assert res.config["model"]["lora"]["enabled"] is False  # LoRA by default on a CPU only
    assert {c.key for c in res.diff} >= {"data.max_samples", "train.num_epochs"}


def test_user_overrides_win_and_change_the_step_count():
    res = shrink_config(
        "dpo",
        as_overrides(["data.max_samples=64", "data.eval_size=16", "train.batch_size=8"]),
        model="tiny",
    )
    assert res.user_overrides == ["data.max_samples=64", "data.eval_size=16", "train.batch_size=8"]
    assert res.overrides[-3:] == res.user_overrides
    assert res.config["data"]["max_samples"] == 64 and res.config["train"]["batch_size"] == 8
    assert res.expected_optimizer_steps == 6  # ceil(48 / 8)
    capped = shrink_config("dpo", as_overrides(["train.max_steps=2"]), model="tiny")
    assert capped.expected_optimizer_steps == 2


def test_model_name_given_with_set_counts_as_a_preset_swap():
    res = shrink_config("dpo", as_overrides(["model.name=tiny"]))
    assert res.model_swap == "tiny"
    assert res.config["data"]["dataset"] == "builtin:reasoning-preferences"
    other = shrink_config("dpo", as_overrides(["model.name=some/other-model"]))
    assert other.model_swap is None and other.model == "some/other-model"


def test_swap_to_a_non_preset_model_keeps_cached_data_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    hub = "argilla/ultrafeedback-binarized-preferences-cleaned"
    res = shrink_config("dpo", model="HuggingFaceTB/SmolLM2-135M-Instruct")
    assert res.model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert res.config["data"]["dataset"] == "builtin:reasoning-preferences"
    assert any(hub in n and "not in the local Hugging Face cache" in n for n in res.notes)
    prepared = tmp_path / "hf" / "datasets" / hub.replace("/", "___")
    prepared.mkdir(parents=True)
    (prepared / "dataset_info.json").write_text("{}")
    cached = shrink_config("dpo", model="HuggingFaceTB/SmolLM2-135M-Instruct")
    assert cached.config["data"]["dataset"] == hub


def test_policy_gradient_steps_count_rollouts_and_updates():
    pytest.importorskip("trainers.policy_gradients.config")
    res = shrink_config("grpo", model="tiny")
    # 10 rollout steps × ceil(4×8 sequences / 2 per micro-batch / 4 accumulation) = 10 × 4
    assert res.expected_progress_steps == 10 and res.progress_unit == "rollout steps"
    assert res.expected_optimizer_steps == 40
    two_updates = shrink_config("grpo", as_overrides(["loss.updates_per_rollout=2"]), model="tiny")
    assert two_updates.expected_optimizer_steps == 80


def test_shrink_of_a_family_without_config_model(monkeypatch, tmp_path):
    fake = FAMILIES["sft"].model_copy(
        update={"name": "fake", "config_module": "trainers.fake_family.config"}
    )
    monkeypatch.setitem(FAMILIES, "fake", fake)
    path = tmp_path / "fake.yaml"
    path.write_text("seed: 1\n")
    recipe = Recipe(
        id="fake/fake",
        family="fake",
        algorithm="sft",
        name="fake",
        config_path=str(path),
        description="",
        shipped=False,
    )
    with pytest.raises(LabError, match="has no config model yet"):
        shrink_config(recipe)


def test_shrink_errors():
    with pytest.raises(LabError, match="unknown recipe"):
        shrink_config("dpoo")
    with pytest.raises(LabError, match="data.eval_size"):
        shrink_config("dpo", as_overrides(["data.eval_size=-1"]))  # the user's own value is invalid
    # valid alone, invalid with the shrink rules (640 samples, 700 held out): say so
    with pytest.raises(LabError, match="does not validate") as err:
        shrink_config("sft", as_overrides(["data.eval_size=700"]), model="tiny")
    assert "data.max_samples=640" in str(err.value)


@pytest.mark.parametrize(
    "key,value",
    [("a.b", None), ("a", True), ("a", 3.0e-4), ("a", 1e-05), ("a", [1, 2]), ("a", "builtin:x")],
)
def test_format_override_round_trips(key, value):
    parts, parsed = parse_override(format_override(key, value))
    assert ".".join(parts) == key and parsed == value


@pytest.mark.slow
def test_expected_steps_match_the_trainer(tmp_path):
    """Run the shrunk tiny DPO recipe (cut to a few steps) through the real trainer: its
    progress.json total equals the shrink's expected optimizer steps."""
    from trainers.direct_alignment import train as da_train

    extra = [
        "data.max_samples=48",
        "data.eval_size=16",
        "train.batch_size=8",
        "eval.eval_every=0",
        "eval.sample_every=0",
        "eval.num_samples=0",
    ]
    res = shrink_config("dpo", as_overrides(extra), model="tiny")
    argv = ["--config", str(res.recipe.path()), "--run-dir", str(tmp_path / "run")]
    for item in res.overrides:
        argv += ["--set", item]
    assert da_train.main(argv) == 0
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert res.expected_optimizer_steps == 4  # ceil(32 / 8)
    assert progress["total_steps"] == res.expected_progress_steps == 4


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["sft.max_steps=2"],  # the plan had ignored the cap: 8 steps said, 2 run
        ["sft.eval_size=12", "sft.num_epochs=3"],
        ["top_k=20"],
    ],
)
@pytest.mark.parametrize("strategy", ["top_per_prompt", "top_k_overall"])
def test_rejection_sampling_steps_are_the_trainers(strategy, extra):
    """The plan's SFT-stage steps follow the trainer's own rule (its selection size and
    ``planned_sft_steps``) for each strategy, cap and held-out share."""
    from trainers.core.config import validate_config
    from trainers.rejection_sampling.config import RejectionSamplingConfig, selection_size
    from trainers.rejection_sampling.train import planned_sft_steps

    res = shrink_config(strategy, as_overrides(extra), model="tiny")
    cfg = validate_config(res.config, RejectionSamplingConfig, source="test")
    n = cfg.generation.num_completions_per_prompt
    size = selection_size(cfg.strategy, cfg.data.max_train_samples, n, cfg.top_k)
    assert res.expected_optimizer_steps == planned_sft_steps(cfg, size)


# ---------------------------------------------------------------------------------------------
# plan on every shipped recipe
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.id for r in RECIPES])
def test_plan_every_recipe(recipe, no_gpu):
    try:
        plan = plan_experiment(algorithm=recipe.id, model="tiny")
    except LabError as err:
        if "has no config model yet" in str(err):
            pytest.skip(str(err))
        raise
    run = plan.runs[0]
    assert run.recipe == recipe.id and run.name == run.algorithm
    algo = run.algorithm.replace("_", "-")
    assert plan.campaign == f"{algo}-sanity"
    assert plan.campaign_name.endswith(f"-{algo}-sanity")
    # the launch command and the trainer command
    launch = shlex.split(run.launch_command)
    assert launch[:4] == ["uv", "run", "rlhf-lab", "launch"]
    assert "--shrink" in launch and ["--model", "tiny"] == launch[6:8]
    assert launch[launch.index("--campaign") + 1] == plan.campaign
    assert ("--queue" in launch) == (len(plan.runs) > 1)  # the runs of a plan take turns
    trainer = shlex.split(run.trainer_command)
    assert trainer[4] == FAMILIES[recipe.family].trainer_module
    assert trainer[6] == recipe.config_path == run.config_path
    sets = [trainer[i + 1] for i, a in enumerate(trainer) if a == "--set"]
    shrunk = shrink_config(recipe, [], model="tiny")
    assert sets == shrunk.overrides
    resolved = resolve_config(recipe, as_overrides(sets))
    assert resolved.data == shrunk.config
    assert run.changes == resolved.diff == shrunk.diff  # one ConfigChange shape
    # memory next to every device
    assert set(run.memory) == {"cuda", "cpu"}
    assert run.memory["cpu"].total_gb > 0 and run.memory["cuda"].dtype == "bf16"
    assert run.memory["cpu"].largest
    assert [d.device for d in run.devices] == ["cpu"]
    assert run.devices[0].estimate_gb == run.memory["cpu"].total_gb
    assert run.recommended_device == "cpu"  # tiny fits in RAM
    crit = criteria(plan, run.algorithm)
    assert crit["key_metrics"] and crit["acceptance"] and crit["watch"]
    assert run.expected_optimizer_steps == shrunk.expected_optimizer_steps
    text = json.dumps(plan.model_dump(mode="json"))
    # compact: each fact once (no recipe record, no full config, no override lists twice)
    assert '"shrink"' not in text and "shrink_overrides" not in text and '"config":' not in text
    assert all(text.count(json.dumps(a)) == 1 for a in crit["acceptance"])
    assert len(text) < 12_000


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.id for r in RECIPES])
def test_plan_every_recipe_with_its_own_model_offline(recipe, no_gpu, monkeypatch, empty_hub_cache):
    try:
        plan = plan_experiment(algorithm=recipe.id)
    except LabError as err:
        if "has no config model yet" in str(err):
            pytest.skip(str(err))
        raise
    run = plan.runs[0]
    assert run.model == resolve_config(recipe).data["model"]["name"]
    if run.model in PRESETS:  # e.g. the SFT tiny warm-start recipe: loadable offline
        assert not any("cannot be loaded here" in w for w in plan.warnings)
        return
    assert any("cannot be loaded here" in w for w in plan.warnings)
    assert any("tiny" in c for c in plan.offline_choices)
    assert any("rlhf-lab models pull smollm2-135m-instruct" in c for c in plan.offline_choices)
    assert not any("--model" in c for c in plan.offline_choices)  # neutral words, no CLI flag
    assert "--model" not in shlex.split(run.launch_command)


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,targets,model,compare",
    [
        ("small SimPO sanity check", ["algo:simpo"], None, False),
        ("compare dpo and ipo", ["algo:dpo", "algo:ipo"], None, True),
        ("grpo on tiny", ["algo:grpo"], "tiny", False),
        ("Dr. GRPO on tiny", ["algo:drgrpo"], "tiny", False),
        ("dr grpo vs grpo", ["algo:drgrpo", "algo:grpo"], None, True),
        ("bradley-terry reward models on tiny-llama", ["algo:preference"], "tiny-llama", False),
        ("a process reward model", ["algo:prm"], None, False),
        ("best-of-n with Qwen/Qwen3-0.6B", ["algo:top_per_prompt"], "Qwen/Qwen3-0.6B", False),
        ("dpo-norm on the small model", ["algo:dpo_norm"], "small", False),
        ("run direct_alignment/kto", ["recipe:direct_alignment/kto"], None, False),
        ("try cDPO against DPO", ["algo:cdpo", "algo:dpo"], None, True),
        ("dpo on my preference data", ["algo:dpo"], None, False),
        ("direct preference optimization and/or nothing", ["algo:dpo"], None, False),
        ("Group Relative Policy Optimization", ["algo:grpo"], None, False),
    ],
)
def test_parse_request(text, targets, model, compare):
    parsed = parse_request(text)
    assert parsed.targets == targets
    assert parsed.model == model
    assert parsed.compare == compare


def test_plan_small_simpo_sanity(no_gpu, monkeypatch, empty_hub_cache):
    plan = plan_experiment("small SimPO sanity check")
    assert plan.intent == "sanity" and plan.campaign == "simpo-sanity"
    run = plan.runs[0]
    assert run.recipe == "direct_alignment/simpo" and run.model == "allenai/OLMo-2-0425-1B-SFT"
    assert run.launch_command == "uv run rlhf-lab launch simpo --shrink --campaign simpo-sanity"
    assert run.memory["cuda"].param_count == 1_484_916_736
    assert run.recommended_device is None  # a 1B model on 2 CPU cores is not recommended
    assert any("samples stay coherent" in a for a in criteria(plan, "simpo")["acceptance"])


def test_plan_compare_dpo_and_ipo(no_gpu):
    plan = plan_experiment("compare dpo and ipo", model="tiny")
    assert plan.intent == "compare" and plan.campaign == "dpo-vs-ipo"
    assert [r.algorithm for r in plan.runs] == ["dpo", "ipo"]
    assert "IPO" in plan.comparison and "seed" in plan.comparison
    assert all(r.launch_command.endswith("--campaign dpo-vs-ipo --queue") for r in plan.runs)
    assert plan.steps and not plan.matched  # nothing to match beyond the shared shrink rules


def test_plan_grpo_on_tiny(no_gpu):
    pytest.importorskip("trainers.policy_gradients.config")
    plan = plan_experiment("grpo on tiny")
    run = plan.runs[0]
    assert run.model == "tiny" and plan.campaign == "grpo-sanity"
    assert "frac_reward_zero_std" in criteria(plan, "grpo")["key_metrics"]
    assert any("warm start" in w for w in plan.warnings)
    assert run.expected_optimizer_steps == 40


def test_plan_explicit_arguments_and_campaign(no_gpu):
    plan = plan_experiment(algorithm="conservative dpo", model="tiny", campaign="cdpo-eps-sweep")
    assert plan.runs[0].algorithm == "cdpo"
    assert plan.campaign == "cdpo-eps-sweep" and plan.campaign_name.endswith("-cdpo-eps-sweep")
    assert plan.runs[0].launch_command.endswith("--campaign cdpo-eps-sweep")
    with pytest.raises(LabError, match="bad campaign slug"):
        plan_experiment(algorithm="dpo", model="tiny", campaign="../escape")


def test_plan_user_overrides_reach_both_commands(no_gpu):
    plan = plan_experiment("dpo on tiny", overrides=["train.learning_rate=1e-4"])
    run = plan.runs[0]
    assert shlex.split(run.launch_command)[-4:-2] == ["--set", "train.learning_rate=1e-4"]
    assert shlex.split(run.trainer_command)[-2:] == ["--set", "train.learning_rate=1e-4"]
    changed = {c.key: c.used for c in run.changes}
    assert changed["train.learning_rate"] == 1e-4


def test_plan_unknown_algorithm_lists_close_matches(no_gpu):
    with pytest.raises(LabError) as err:
        plan_experiment(algorithm="dpoo")
    assert "Did you mean" in str(err.value) and "dpo" in str(err.value)
    with pytest.raises(LabError) as err:
        plan_experiment("run grpoo please")
    assert "no algorithm found" in str(err.value) and "grpo" in str(err.value)
    with pytest.raises(LabError, match="say what to run"):
        plan_experiment()


def test_plan_rejection_sampling_adds_its_matched_control(no_gpu):
    if not any(r.family == "rejection_sampling" for r in RECIPES):
        pytest.skip("rejection_sampling ships no recipes yet")
    plan = plan_experiment("best-of-n on tiny")
    assert [r.algorithm for r in plan.runs] == ["top_per_prompt", "random_per_prompt"]


# ---------------------------------------------------------------------------------------------
# Matched plans
# ---------------------------------------------------------------------------------------------


def _planned_config(run) -> dict:
    """The config a planned run's launch command would train with (its --set items applied to
    the shrunk recipe, as `launch --shrink` does)."""
    argv = shlex.split(run.launch_command)
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    sets = [s for s in sets if "-run-id>" not in s]  # filled in once the upstream run exists
    model = argv[argv.index("--model") + 1] if "--model" in argv else None
    return shrink_config(run.recipe, as_overrides(sets), model=model).config


@pytest.mark.parametrize(
    "request_text",
    [
        "compare PPO and GRPO",
        "grpo vs reinforce vs rloo",
        "ppo against reinforce",
        "compare grpo, gmpo, remax and reinforce++",
    ],
)
def test_policy_gradient_comparisons_match_sample_budget_and_prompts(no_gpu, request_text):
    """Every arm trains on the same prompts with the same completions per step: PPO is not
    planned as 16 prompts × 1 rollout against GRPO's 4 × 8 (the shipped recipes differ)."""
    plan = plan_experiment(request_text, model="tiny")
    assert len(plan.runs) >= 2 and {r.family for r in plan.runs} == {"policy_gradients"}
    configs = {r.name: _planned_config(r) for r in plan.runs}
    for key in ("rollout.prompts_per_step", "rollout.num_rollouts", "data.specs", "data.size"):
        values = {json.dumps(get_dotted(c, key)) for c in configs.values()}
        assert len(values) == 1, f"{key} differs across {list(configs)}: {values}"
    for key in ("data.eval_size", "seed", "train.max_steps", "rollout.max_new_tokens"):
        assert len({json.dumps(get_dotted(c, key)) for c in configs.values()}) == 1, key
    budget = {
        get_dotted(c, "rollout.prompts_per_step") * get_dotted(c, "rollout.num_rollouts")
        for c in configs.values()
    }
    assert len(budget) == 1
    if any(r.algorithm in ("grpo", "rloo") for r in plan.runs):  # groups need > 1 rollout
        assert get_dotted(next(iter(configs.values())), "rollout.num_rollouts") > 1
    (per_step,) = budget
    assert any(f"{per_step} completions per step" in n for n in plan.notes)
    assert (
        "rollout.num_rollouts="
        + str(get_dotted(next(iter(configs.values())), "rollout.num_rollouts"))
        in plan.matched
    )
    # the shipped recipes really differ: without the matching PPO would get 16 × 1
    if "ppo" in configs and "grpo" in configs:
        shipped = shrink_config("ppo", [], model="tiny").config
        assert get_dotted(shipped, "rollout.num_rollouts") == 1
        assert "--set rollout.num_rollouts=" in next(
            r.launch_command for r in plan.runs if r.name == "ppo"
        )


def test_matched_overrides_for_launching_without_a_plan():
    """A sweep can match its runs the way a plan does."""
    from rlhf_lab.planning.plan import matched_overrides

    matched = matched_overrides(["ppo", "grpo"], model="tiny")
    assert matched["grpo"] == [] and "rollout.num_rollouts=8" in [o.text for o in matched["ppo"]]
    assert matched_overrides(["dpo", "ipo"], model="tiny") == {"dpo": [], "ipo": []}


def test_user_overrides_still_win_over_the_matching(no_gpu):
    plan = plan_experiment(
        "compare ppo and grpo", model="tiny", overrides=["rollout.num_rollouts=4"]
    )
    assert {get_dotted(_planned_config(r), "rollout.num_rollouts") for r in plan.runs} == {4}


def test_best_of_n_prm_vs_orm_is_one_campaign_with_scorers_and_a_control(no_gpu):
    """'Does a PRM beat an ORM for best-of-n?': the two reward models, the best-of-n strategy
    once per reward model with that model as its scorer (launched after it), and the matched
    random control, in one campaign whose comparison names the scorers."""
    plan = plan_experiment("does a PRM beat an ORM for best-of-n?", model="tiny")
    names = [r.name for r in plan.runs]
    assert names == [
        "prm",
        "orm",
        "top_per_prompt[prm]",
        "top_per_prompt[orm]",
        "random_per_prompt",
    ]
    assert {r.launch_command.split("--campaign ")[1].split()[0] for r in plan.runs} == {
        plan.campaign
    }
    by_name = {r.name: r for r in plan.runs}
    for rm in ("prm", "orm"):
        arm = by_name[f"top_per_prompt[{rm}]"]
        assert arm.after == [rm]
        # the RM run's final model, by run id (known once launched; the launch then waits for it)
        scorer = f"run:<{rm}-run-id>"
        assert f"--set 'scorer.name={scorer}'" in arm.launch_command
        assert {c.key: c.used for c in arm.changes}["scorer.name"] == scorer
        assert f"scored by the {rm} run" in plan.comparison
        assert set(arm.memory) == {"cuda", "cpu"}  # sized although the scorer does not exist yet
    control = by_name["random_per_prompt"]
    assert control.after == [] and "scorer.name" not in control.launch_command
    assert "random_per_prompt" in plan.comparison and "eval/exact_match" in plan.comparison
    # the same pool for every rejection-sampling arm: only the strategy and the scorer differ
    pools = [_planned_config(by_name[n]) for n in names[2:]]
    for config in pools:  # (the W&B run name follows the recipe file)
        config.pop("strategy", None)
        config["scorer"].pop("name")
        config["logging"].pop("wandb_run_name")
    assert pools[0] == pools[1] == pools[2]
    # the reward models score the prompts' task; the order is written out
    assert "chain_sum" in " ".join(by_name["orm"].launch_command.split("--set")[1:])
    text = " ".join(plan.steps)
    assert "wait until prm and orm have succeeded" in text and "queued" in text
    assert "<prm-run-id>" in text and "<orm-run-id>" in text
    assert any("one control serves every scorer" in n for n in plan.notes)


# ---------------------------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------------------------


def test_plan_picks_a_free_gpu_that_fits(machine, empty_hub_cache):
    h100s = fake_gpus([79.0, 3.0, 60.0], total_gb=80.0, name="NVIDIA H100")
    h100s[0].lab_runs.append("dpo-20260101-000000-aaaa")  # held by a lab run
    machine(gpus=h100s, free_ram_gb=100.0, total_ram_gb=128.0)
    plan = plan_experiment("dpo sanity check")
    run = plan.runs[0]
    est = run.memory["cuda"].total_gb
    assert 3.0 < est < 60.0
    fit = {d.device: d for d in run.devices}
    assert fit["cuda:0"].fits and fit["cuda:0"].held_by == ["dpo-20260101-000000-aaaa"]
    assert fit["cuda:1"].fits is False and fit["cuda:2"].fits
    assert run.recommended_device == "cuda:2"  # fits and no lab run holds it
    assert run.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2"}
    assert shlex.split(run.launch_command)[-4:] == [
        "--device",
        "cuda:2",
        "--campaign",
        "dpo-sanity",
    ]
    assert run.trainer_command.startswith("CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2 ")


def test_plan_warns_when_nothing_fits(machine, empty_hub_cache):
    machine(gpus=fake_gpus([2.0], total_gb=80.0), free_ram_gb=4.0, total_ram_gb=8.0)
    plan = plan_experiment("dpo sanity check")
    assert plan.runs[0].recommended_device is None
    assert any("does not fit in the free memory of any GPU" in w for w in plan.warnings)


# ---------------------------------------------------------------------------------------------
# Fast start: no torch, no transformers
# ---------------------------------------------------------------------------------------------


def test_lab_modules_import_and_plan_without_torch(tmp_path):
    code = """
import sys
import rlhf_lab.planning.catalog, rlhf_lab.planning.configs, rlhf_lab.planning.shrink, rlhf_lab.planning.memory
import rlhf_lab.runs.resources, rlhf_lab.planning.plan
from rlhf_lab.planning.catalog import list_recipes
from rlhf_lab.planning.plan import plan_experiment
from rlhf_lab.planning.shrink import shrink_config
assert "torch" not in sys.modules and "transformers" not in sys.modules, "at import"
plan_experiment("compare dpo and simpo on tiny")
for recipe in list_recipes():
    try:
        shrink_config(recipe, model="tiny")
    except Exception as err:
        if "has no config model yet" not in str(err):
            raise
bad = [m for m in ("torch", "transformers") if m in sys.modules]
print("LOADED", bad)
"""
    env = {
        **__import__("os").environ,
        "RLHF_LAB_ROOT": str(tmp_path),
        "HF_HUB_OFFLINE": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout


# ---------------------------------------------------------------------------------------------
# A user value valid only beside what the shrink changes
# ---------------------------------------------------------------------------------------------

CHAIN_SUM_TASK = "data.builtin_task_configs={chain_sum: {min_terms: 3, max_terms: 5}}"


def test_a_task_config_for_the_offline_set_the_shrink_picks_is_accepted():
    # the PRM recipe names a hub dataset; the task config applies only to the offline set the
    # shrink swaps in, so the recipe alone refuses it (a PRM sweep of the PRM-vs-ORM campaign
    # was refused this way before the shrink ever ran)
    with pytest.raises(LabError, match="applies only to the offline sets"):
        resolve_config("prm", as_overrides([CHAIN_SUM_TASK]))
    result = shrink_config("prm", as_overrides([CHAIN_SUM_TASK]), model="tiny")
    assert get_dotted(result.config, "data.dataset") == "builtin:reasoning-steps"
    assert get_dotted(result.config, "data.builtin_task_configs") == {
        "chain_sum": {"min_terms": 3, "max_terms": 5}
    }


def test_a_bad_user_value_is_still_refused_in_the_users_terms():
    with pytest.raises(LabError, match="unknown key 'data.bogus_key'"):
        shrink_config("prm", as_overrides(["data.bogus_key=1"]), model="tiny")
    # a value the shrink does not make valid stays refused, beside a task config it does
    with pytest.raises(LabError, match="batch_size"):
        shrink_config("prm", as_overrides([CHAIN_SUM_TASK, "train.batch_size=0"]), model="tiny")
