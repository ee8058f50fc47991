"""The gold evaluation of offline direct alignment, lab side: the shrink turns it on for a
pretrained model on the built-in reasoning preferences (and only there), with evaluations spread
along training, and the time predictor counts its decode and scoring (hand-computed on a stub
calibration). The pretrained model is the SmolLM2 config.json stand-in of
test_shrink_real_model.py."""

from __future__ import annotations

import math

import pytest

from rlhf_lab.planning import time as pt
from rlhf_lab.planning import time_formulas as tf
from rlhf_lab.planning.gold_eval import GOLD_EVAL_POINTS, GOLD_NEW_TOKENS, GOLD_PROMPTS
from rlhf_lab.planning.overrides import as_overrides
from rlhf_lab.planning.shrink import shrink_config
from rlhf_lab.planning.steps import expected_optimizer_steps
from rlhf_lab.planning.trainer_config import TrainerConfig
from tests.lab.test_time_predictor import STUB


@pytest.fixture(autouse=True)
def lab_root(offline_lab, cpu_box, no_queue_worker):
    return offline_lab


@pytest.mark.parametrize("recipe", ["dpo", "simpo", "ipo"])
def test_the_shrink_turns_gold_on_with_six_evaluations_along_training(smol, recipe):
    res = shrink_config(recipe, model=smol)
    ev = res.config["eval"]
    assert res.config["data"]["dataset"] == "builtin:reasoning-preferences"
    assert ev["gold_prompts"] == min(GOLD_PROMPTS, res.config["data"]["eval_size"]) == 32
    assert ev["gold_max_new_tokens"] == GOLD_NEW_TOKENS
    steps = expected_optimizer_steps("direct_alignment", res.trainer_config)[0]
    assert steps == 36  # 288 training pairs, 4 × 2 a step
    assert ev["eval_every"] == math.ceil(steps / GOLD_EVAL_POINTS) == 6
    assert tf.evals_in_run(steps, ev["eval_every"]) == 7  # step 0, then 6 along training
    assert res.config["checkpoint"]["save_final_model"] is True
    assert any("gold evaluation on" in n for n in res.notes)


def test_the_eval_interval_follows_the_users_data_size_and_user_values_win(smol):
    longer = shrink_config("dpo", as_overrides(["data.max_samples=512"]), model=smol).trainer_config
    steps = expected_optimizer_steps("direct_alignment", longer)[0]
    assert steps == 60 and longer.get("eval.eval_every") == 10  # (512 − 32) / 8
    # the recipe's own data set is resolved before the shrink swaps it: a user's gold setting
    # comes with the built-in data set
    builtin = "data.dataset=builtin:reasoning-preferences"
    mine = shrink_config(
        "dpo", as_overrides([builtin, "eval.eval_every=4", "eval.gold_prompts=8"]), model=smol
    ).config
    assert mine["eval"]["eval_every"] == 4 and mine["eval"]["gold_prompts"] == 8
    # the note tells the schedule the run will have (it told the rule's every 4 steps before)
    own = shrink_config(
        "dpo", as_overrides(["data.max_samples=224", "eval.eval_every=6"]), model=smol
    )
    assert own.config["eval"]["eval_every"] == 6
    assert any("every 6 steps and at step 0" in n for n in own.notes)
    off = shrink_config("dpo", as_overrides(["eval.gold_prompts=0"]), model=smol)
    assert off.config["eval"]["gold_prompts"] == 0
    assert not any("gold evaluation on" in n for n in off.notes)


def test_no_gold_on_a_preset_or_data_the_verifier_cannot_score(smol, tmp_path):
    assert shrink_config("dpo", model="tiny").config["eval"]["gold_prompts"] == 0
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    own = shrink_config("dpo", as_overrides([f"data.dataset={pairs}"]), model=smol)
    assert own.config["eval"]["gold_prompts"] == 0


def _dpo_config(gold: int, lora: bool = True) -> TrainerConfig:
    return TrainerConfig(
        "direct_alignment",
        {
            "model": {"name": "x", "gradient_checkpointing": False, "lora": {"enabled": lora}},
            "data": {
                "dataset": "builtin:reasoning-preferences",
                "max_samples": 320,
                "eval_size": 32,
                "max_length": 256,
            },
            "train": {"num_epochs": 1, "batch_size": 4, "gradient_accumulation_steps": 2},
            "eval": {
                "eval_every": 6,
                "eval_batch_size": 8,
                "sample_every": 0,
                "num_samples": 0,
                "gold_prompts": gold,
                "gold_max_new_tokens": 96,
            },
            "checkpoint": {"save_final_model": True},
        },
    )


def test_the_time_prediction_counts_the_gold_decodes_and_passes():
    off = pt.predict_from_calibration(STUB, "direct_alignment", "dpo", _dpo_config(0))
    on = pt.predict_from_calibration(STUB, "direct_alignment", "dpo", _dpo_config(32))
    assert off.parts["gold"] == 0.0
    # per event, the 32 prompts decoded in one batch (prompt p90 60 tokens, 96 new):
    #   decode: prefill 32·60/2000 = 0.96 s + 95 steps at 32 rows (0.09 s) = 9.51 s;
    #           greedy and sampled: 19.02 s
    #   scoring: 4 passes of 8 rows × 156 tokens: 4·(0.02 + 1248/4000) = 1.328 s; ×2 = 2.656 s
    # 36 steps, every 6: 7 events → 7 × 21.676 = 151.732 s
    assert on.parts["gold"] == pytest.approx(151.7, abs=0.06)
    assert on.total_s - off.total_s == pytest.approx(151.7, abs=0.2)
    # full fine-tuning keeps a reference for the KL: one more model load (reload_s 1.0)
    full_on = pt.predict_from_calibration(STUB, "direct_alignment", "dpo", _dpo_config(32, False))
    full_off = pt.predict_from_calibration(STUB, "direct_alignment", "dpo", _dpo_config(0, False))
    assert full_on.parts["start"] - full_off.parts["start"] == pytest.approx(1.0)


def test_three_sweeps_queue_the_beta_arms_with_three_seeds_in_one_campaign(smol):
    """The campaign's commands: one sweep per β into the same campaign (sweep's arms are
    recipes; a setting that differs between arms is one sweep each)."""
    import yaml

    from rlhf_lab import api
    from rlhf_lab.paths import find_run

    common = ["train.learning_rate=2e-4", "data.max_samples=224", "eval.eval_every=6"]
    results = [
        api.sweep(
            api.SweepRequest(
                recipes=["dpo"],
                overrides=[f"beta={b}", *common],
                model=smol,
                campaign="dpo-overopt",
                seeds=3,
            )
        )
        for b in (0.01, 0.1, 0.5)
    ]
    assert len({r.campaign for r in results}) == 1
    launches = [x for r in results for x in r.launches]
    assert len(launches) == 9 and all(x.queued for x in launches)
    configs = [yaml.safe_load((find_run(x.run.id) / "config.yaml").read_text()) for x in launches]
    assert sorted((c["beta"], c["seed"]) for c in configs) == sorted(
        (b, s) for b in (0.01, 0.1, 0.5) for s in results[0].seeds
    )
    for c in configs:
        assert c["eval"]["gold_prompts"] == 32 and c["eval"]["eval_every"] == 6
        assert c["train"]["learning_rate"] == 2e-4 and c["model"]["lora"]["enabled"] is True
