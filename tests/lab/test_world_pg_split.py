"""The lab refuses a policy-gradient world size whose per-rank rollouts do not split into whole
micro-batches, before anything is written (the trainer would refuse it too, after launch)."""

from __future__ import annotations

import pytest

from rlhf_lab.errors import InvalidArgument
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.runs.world import check_world_size


def test_each_ranks_rollouts_must_fill_whole_micro_batches():
    pg = TrainerConfig(
        "policy_gradients",
        {"rollout": {"prompts_per_step": 4, "num_rollouts": 2}, "train": {"batch_size": 4}},
    )
    check_world_size("policy_gradients", pg, 1)  # 8 sequences, 2 micro-batches
    check_world_size("policy_gradients", pg, 2)  # 4 a rank: one micro-batch
    with pytest.raises(InvalidArgument, match=r"1 prompts × 2 rollouts = 2 sequences.*=4"):
        check_world_size("policy_gradients", pg, 4)


@pytest.mark.parametrize(
    ("family", "config", "message"),
    [
        ("distillation", {}, "the distillation trainer runs on one process"),
        ("direct_alignment", {"loss": "online_dpo"}, "online DPO runs on one process"),
        (
            "policy_gradients",
            {"model": {"lora": {"enabled": True}}, "rollout": {"prompts_per_step": 4}},
            "LoRA runs of the policy_gradients trainer run on one process",
        ),
    ],
)
def test_what_the_trainers_refuse_under_torchrun_is_refused_before_launch(family, config, message):
    config = TrainerConfig(family, config)
    check_world_size(family, config, 1)  # one process: fine
    with pytest.raises(InvalidArgument, match=message) as caught:
        check_world_size(family, config, 2)
    assert caught.value.next_steps[0].args == {"nproc": 1}


def test_lora_in_a_family_that_shards_it_passes():
    lora = TrainerConfig("direct_alignment", {"model": {"lora": {"enabled": True}}})
    check_world_size("direct_alignment", lora, 2)
