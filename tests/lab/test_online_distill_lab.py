"""The lab knows online DPO and on-policy distillation: recipes, shrink rules and their notes,
expected steps, memory estimates that count the resident reference / teacher / reward model, the
teacher check before anything is written, teacher.name=run:<id> references, and the comparison
rule of the distillation family."""

from __future__ import annotations

import pytest

from rlhf_lab.api import list_recipes
from rlhf_lab.errors import InvalidArgument
from rlhf_lab.planning.catalog import find_recipe
from rlhf_lab.planning.memory import estimate_memory
from rlhf_lab.planning.overrides import as_overrides
from rlhf_lab.planning.shrink import shrink_config
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.planning.validation import check_config
from rlhf_lab.runs.lineage import REF_KEYS, find_refs


@pytest.fixture(autouse=True)
def _lab_root(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))


def test_both_recipes_are_listed_with_their_family():
    found = {r.name: (r.family, r.algorithm) for r in list_recipes().recipes}
    assert found["online_dpo"] == ("direct_alignment", "online_dpo")
    assert found["distill"] == ("distillation", "distill")


def test_shrink_distill_on_tiny_uses_the_warm_start_task_and_a_teacher_of_that_preset():
    res = shrink_config("distill", model="tiny")
    cfg = res.config
    assert cfg["model"]["name"] == "tiny" and cfg["teacher"]["name"] == "tiny"
    assert [s["name"] for s in cfg["data"]["specs"]] == ["chain_sum"]
    assert cfg["data"]["specs"][0]["config"]["max_digits"] == 1
    assert res.expected_optimizer_steps == 40  # 640 prompts / 16 per step, one epoch
    assert any("teacher.name=run:<its run id>" in n for n in res.notes)


def test_shrink_distill_keeps_a_teacher_that_is_a_run(tmp_path):
    res = shrink_config("distill", model="tiny", overrides=as_overrides(["teacher.name=tiny"]))
    assert res.config["teacher"]["name"] == "tiny"


def test_shrink_online_dpo_on_tiny_ranks_with_the_verifier_and_warns_about_ties():
    res = shrink_config("online_dpo", model="tiny")
    cfg = res.config
    assert cfg["loss"] == "online_dpo" and cfg["online"]["max_new_tokens"] == 48
    assert cfg["data"]["dataset"] == "builtin:reasoning-preferences"
    assert cfg["train"]["learning_rate"] == 1.0e-4
    assert any("tie_frac near 1" in n for n in res.notes)
    assert not any("were tested with dpo" in n for n in res.notes)
    assert res.expected_optimizer_steps == 14  # ceil((256 − 32) / 16)


def test_memory_of_online_dpo_counts_the_resident_reference_and_the_sampling_cache():
    cfg = shrink_config("online_dpo", model="tiny").config
    est = estimate_memory(
        "direct_alignment", "online_dpo", TrainerConfig("direct_alignment", cfg), device="cpu"
    )
    names = [c.name for c in est.components]
    assert "reference weights (frozen)" in names and "generation KV cache" in names
    ref = next(c for c in est.components if c.name == "reference weights (frozen)")
    assert "train" in ref.phases  # kept loaded while training, unlike offline DPO's pass
    offline = estimate_memory(
        "direct_alignment", "dpo", TrainerConfig("direct_alignment", cfg), device="cpu"
    )
    off_ref = next(c for c in offline.components if c.name == "reference weights (frozen)")
    assert off_ref.phases == ["reference"]
    simpo = dict(cfg, online={**cfg["online"], "loss": "simpo"})
    est = estimate_memory(
        "direct_alignment", "online_dpo", TrainerConfig("direct_alignment", simpo), device="cpu"
    )
    assert "reference weights (frozen)" not in [c.name for c in est.components]


def test_online_dpo_sampling_cache_grows_with_the_samples_per_prompt():
    cfg = shrink_config("online_dpo", model="tiny").config

    def kv_gb(k: int) -> float:
        c = dict(cfg, online={**cfg["online"], "num_samples": k})
        est = estimate_memory(
            "direct_alignment", "online_dpo", TrainerConfig("direct_alignment", c), device="cpu"
        )
        return next(x.gb for x in est.components if x.name == "generation KV cache")

    assert kv_gb(4) == pytest.approx(2 * kv_gb(2), rel=0.01)  # GiB rounded to 4 digits


def test_memory_of_distillation_counts_the_teacher_and_both_full_logits():
    cfg = shrink_config("distill", model="tiny").config
    est = estimate_memory(
        "distillation", "distill", TrainerConfig("distillation", cfg), device="cpu"
    )
    by_name = {c.name: c for c in est.components}
    assert "teacher weights (frozen)" in by_name
    assert "student logits (full vocabulary)" in by_name
    assert "teacher forward (no grad)" in by_name
    assert by_name["teacher weights (frozen)"].gb == pytest.approx(
        by_name["student weights"].gb, rel=1e-6
    )  # the same preset: the same size
    longer = dict(cfg, rollout={**cfg["rollout"], "max_new_tokens": 256})
    assert (
        estimate_memory(
            "distillation", "distill", TrainerConfig("distillation", longer), device="cpu"
        ).total_gb
        > est.total_gb
    )


def test_a_teacher_of_another_preset_is_refused_before_anything_is_written(tmp_path):
    cfg = shrink_config("distill", model="tiny").config
    bad = dict(cfg, teacher={"name": "tiny-llama"})
    with pytest.raises(InvalidArgument, match="cannot teach model.name='tiny'"):
        check_config("distillation", TrainerConfig("distillation", bad))
    with pytest.raises(InvalidArgument, match="cannot teach"):
        shrink_config("distill", model="tiny", overrides=as_overrides(["teacher.name=tiny-llama"]))
    assert not any(tmp_path.iterdir())


def test_teacher_name_takes_a_run_reference():
    assert "teacher.name" in REF_KEYS
    config = TrainerConfig("distillation", {"teacher": {"name": "run:abc"}})
    assert find_refs(config) == {"teacher.name": "abc"}


def test_distillation_recipe_file_is_found():
    assert find_recipe("distill").family == "distillation"
    assert find_recipe("distillation/distill").algorithm == "distill"
