"""The lab's catalog (families, recipes, algorithm names) and config resolution (overrides,
validation with the family's pydantic model, diff against the shipped default)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlhf_lab.paths import LabError
from rlhf_lab.planning import catalog
from rlhf_lab.planning.catalog import (
    FAMILIES,
    FamilyInfo,
    Recipe,
    find_recipe,
    infer_family,
    key_metrics_for,
    list_recipes,
    normalize_algorithm,
)
from rlhf_lab.planning.configs import config_model, resolve_config
from rlhf_lab.planning.overrides import as_overrides

ROOT = Path(__file__).resolve().parents[2]
DPO_YAML = ROOT / "trainers" / "direct_alignment" / "configs" / "dpo.yaml"


@pytest.fixture(autouse=True)
def _lab_root(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path / "lab"))


def shipped_files() -> list[Path]:
    files = []
    for info in FAMILIES.values():
        folder = ROOT / info.configs_dir
        if folder.is_dir():
            files += sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    return files


def _has_family(family: str) -> bool:
    return any(r.family == family for r in list_recipes())


# ---------------------------------------------------------------------------------------------
# Recipes
# ---------------------------------------------------------------------------------------------


def test_list_recipes_covers_every_shipped_yaml():
    recipes = list_recipes()
    files = shipped_files()
    assert len(recipes) == len(files) >= 9
    assert sorted(r.path() for r in recipes) == sorted(files)
    ids = [r.id for r in recipes]
    assert len(ids) == len(set(ids))
    for r in recipes:
        assert r.shipped
        assert not Path(r.config_path).is_absolute()
        assert r.config_path == r.path().relative_to(ROOT).as_posix()
        assert r.algorithm in FAMILIES[r.family].algorithms, r
        assert r.id == f"{r.family}/{r.name}"
        first = r.path().read_text().splitlines()[0]
        assert first.startswith("#") and r.description == first.lstrip("#").strip()


def test_direct_alignment_recipes_name_their_losses():
    da = {r.name: r for r in list_recipes("direct_alignment")}
    assert set(FAMILIES["direct_alignment"].algorithms) <= set(da)
    for name, recipe in da.items():
        assert recipe.algorithm == name
        assert recipe.model == "allenai/OLMo-2-0425-1B-SFT"
    assert da["dpo"].description.startswith("DPO")
    assert all(r.family == "direct_alignment" for r in list_recipes("direct_alignment"))


def test_list_recipes_unknown_family():
    with pytest.raises(LabError, match="direct_alignment"):
        list_recipes("direct_alignmnt")


@pytest.mark.parametrize(
    "query", ["dpo", "direct_alignment/dpo", "trainers/direct_alignment/configs/dpo.yaml"]
)
def test_find_recipe_by_name_id_or_path(query):
    assert find_recipe(query).id == "direct_alignment/dpo"


def test_find_recipe_absolute_path_and_path_object():
    assert find_recipe(str(DPO_YAML)).id == "direct_alignment/dpo"
    assert find_recipe(DPO_YAML).id == "direct_alignment/dpo"


def test_find_recipe_by_algorithm_alias():
    assert find_recipe("DPO-norm").id == "direct_alignment/dpo_norm"
    assert find_recipe("conservative dpo").id == "direct_alignment/cdpo"
    if _has_family("policy_gradients"):
        assert find_recipe("dr. grpo").id == "policy_gradients/drgrpo"
    if _has_family("reward_models"):
        assert find_recipe("bradley-terry").algorithm == "preference"


def test_find_recipe_unknown_lists_close_matches():
    with pytest.raises(LabError) as err:
        find_recipe("dpoo")
    message = str(err.value)
    assert "Did you mean" in message and "dpo" in message
    with pytest.raises(LabError, match="empty recipe"):
        find_recipe("  ")


def test_find_recipe_missing_yaml_path():
    with pytest.raises(LabError, match="not found"):
        find_recipe("nowhere/at/all.yaml")


@pytest.mark.parametrize(
    "alias,canonical",
    [
        ("dr grpo", "drgrpo"),
        ("Dr. GRPO", "drgrpo"),
        ("dr-grpo", "drgrpo"),
        ("bradley-terry", "preference"),
        ("reward model", "preference"),
        ("best-of-n", "top_per_prompt"),
        ("rejection sampling", "top_per_prompt"),
        ("DPO", "dpo"),
        ("apo-zero", "apo_zero"),
        ("instruction tuning", "sft"),
        ("max rl", "maxrl"),
    ],
)
def test_normalize_algorithm(alias, canonical):
    assert normalize_algorithm(alias) == canonical


def test_normalize_algorithm_unknown():
    assert normalize_algorithm("frobnicate") is None


# ---------------------------------------------------------------------------------------------
# Family inference for files outside the shipped folders
# ---------------------------------------------------------------------------------------------


def test_user_yaml_family_from_algorithm_key(tmp_path):
    data = yaml.safe_load(DPO_YAML.read_text())
    data["loss"] = "simpo"
    path = tmp_path / "mine.yaml"
    path.write_text("# my simpo variant\n" + yaml.safe_dump(data))
    recipe = find_recipe(str(path))
    assert (recipe.family, recipe.algorithm, recipe.shipped) == ("direct_alignment", "simpo", False)
    assert recipe.description == "my simpo variant"
    assert recipe.path() == path


def test_user_yaml_family_from_run_json(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": 1}))
    (run / "run.json").write_text(json.dumps({"family": "sft"}))
    assert infer_family(run / "config.yaml") == "sft"


def test_user_yaml_family_by_validation(tmp_path):
    path = tmp_path / "sft_like.yaml"
    path.write_text(yaml.safe_dump({"data": {"train_on": "all_assistant"}}))
    assert find_recipe(str(path)).family == "sft"


def test_user_yaml_ambiguous_family(tmp_path):
    path = tmp_path / "vague.yaml"
    path.write_text(yaml.safe_dump({"seed": 3}))
    with pytest.raises(LabError, match="cannot tell which family"):
        find_recipe(str(path))


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


def test_families_registry_matches_the_contract():
    assert set(FAMILIES) == {
        "direct_alignment",
        "policy_gradients",
        "reward_models",
        "rejection_sampling",
        "sft",
        "distillation",
    }
    assert {"reverse_kl", "teacher_logp", "eval/avg_correctness"} <= set(
        key_metrics_for("distillation", "distill")
    )
    assert {"tie_frac", "eval/score"} <= set(key_metrics_for("direct_alignment", "online_dpo"))
    da = key_metrics_for("direct_alignment", "dpo")
    assert {"accuracy", "margins", "chosen_rewards", "rejected_rewards", "eval/accuracy"} <= set(da)
    pg = key_metrics_for("policy_gradients", "grpo")
    assert {"avg_correctness", "avg_format", "avg_binary", "loss", "frac_reward_zero_std"} <= set(
        pg
    )
    assert "eval/auroc" in key_metrics_for("reward_models", "orm")
    assert "eval/step_accuracy" in key_metrics_for("reward_models", "prm")
    assert "eval/reward_margin" in key_metrics_for("reward_models", "preference")
    assert {"loss", "mean_token_accuracy", "eval/loss"} <= set(key_metrics_for("sft"))
    assert "or_loss" in key_metrics_for("direct_alignment", "orpo")
    for info in FAMILIES.values():
        assert info.acceptance and info.watch and info.comparison
        assert info.trainer_module == f"trainers.{info.name}.train"


def test_config_models_of_existing_families_are_found():
    from trainers.direct_alignment.config import DirectAlignmentConfig

    assert config_model("direct_alignment") is DirectAlignmentConfig
    for family in {r.family for r in list_recipes()}:
        assert config_model(family).__name__ == FAMILIES[family].config_class


def test_missing_config_module_is_a_clear_lab_error(monkeypatch):
    fake = FAMILIES["sft"].model_copy(
        update={"name": "fake", "config_module": "trainers.fake_family.config"}
    )
    monkeypatch.setitem(FAMILIES, "fake", fake)
    with pytest.raises(LabError, match="has no config model yet"):
        config_model("fake")


def test_config_class_found_when_named_differently(monkeypatch):
    other = FAMILIES["direct_alignment"].model_copy(update={"config_class": "RenamedConfig"})
    monkeypatch.setitem(FAMILIES, "direct_alignment", other)
    assert config_model("direct_alignment").__name__ == "DirectAlignmentConfig"


def test_family_info_is_typed():
    assert isinstance(FAMILIES["sft"], FamilyInfo)
    with pytest.raises(LabError, match="Did you mean: sft"):
        catalog.family_info("sftt")


# ---------------------------------------------------------------------------------------------
# Resolving configs
# ---------------------------------------------------------------------------------------------


def test_resolve_config_without_overrides_has_no_diff():
    rc = resolve_config("dpo")
    assert rc.family == "direct_alignment" and rc.algorithm == "dpo"
    assert rc.diff == []
    assert rc.data == rc.default
    assert rc.data["beta"] == 0.1 and rc.data["data"]["max_samples"] == 6400
    assert yaml.safe_load(rc.to_yaml()) == rc.data


def test_resolve_config_overrides_and_diff():
    rc = resolve_config(
        "dpo", as_overrides(["train.learning_rate=1e-5", "data.max_samples=64", "loss=ipo"])
    )
    assert rc.algorithm == "ipo"
    assert rc.data["train"]["learning_rate"] == 1e-5
    diff = {d.key: (d.shipped, d.used) for d in rc.diff}
    assert diff == {
        "loss": ("dpo", "ipo"),
        "train.learning_rate": (5e-6, 1e-5),
        "data.max_samples": (6400, 64),
    }
    assert rc.overrides == ["train.learning_rate=1e-5", "data.max_samples=64", "loss=ipo"]


def test_resolve_config_fills_defaults_like_the_trainer():
    rc = resolve_config("simpo")
    assert rc.data["beta"] == 2.0 and rc.data["gamma"] == 0.5
    # keys the YAML leaves out are present after validation
    assert "builtin_tasks" in rc.data["data"]


def test_resolve_config_bad_key_names_the_closest_field():
    with pytest.raises(LabError) as err:
        resolve_config("dpo", as_overrides(["train.learnin_rate=1e-5"]))
    assert "train.learnin_rate" in str(err.value)
    assert "Did you mean: learning_rate" in str(err.value)


def test_resolve_config_bad_value_and_bad_override_syntax():
    with pytest.raises(LabError, match="train.batch_size"):
        resolve_config("dpo", as_overrides(["train.batch_size=zero"]))
    with pytest.raises(LabError, match="key=value"):
        resolve_config("dpo", as_overrides(["train.batch_size"]))
    with pytest.raises(LabError, match="loss"):
        resolve_config("dpo", as_overrides(["loss=not_a_loss"]))


def test_resolve_user_yaml_diffs_against_the_shipped_recipe_of_its_algorithm(tmp_path):
    data = yaml.safe_load(DPO_YAML.read_text())
    data["train"]["learning_rate"] = 1.0e-6
    path = tmp_path / "slow_dpo.yaml"
    path.write_text(yaml.safe_dump(data))
    rc = resolve_config(str(path))
    assert not rc.recipe.shipped
    assert rc.default_source == "trainers/direct_alignment/configs/dpo.yaml"
    assert [(d.key, d.shipped, d.used) for d in rc.diff] == [("train.learning_rate", 5e-6, 1e-6)]


def test_resolve_accepts_a_recipe_object():
    recipe = find_recipe("kto")
    assert isinstance(recipe, Recipe)
    assert resolve_config(recipe).algorithm == "kto"


def test_every_shipped_recipe_validates():
    for recipe in list_recipes():
        rc = resolve_config(recipe)
        assert rc.algorithm == recipe.algorithm
        assert rc.diff == []
