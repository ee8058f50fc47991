"""Model FLOPs, the measured peak and the stage clock (trainers/core/flops.py), pinned to counts
made by hand on a small Llama shape."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trainers.core.flops import (
    ModelFlops,
    StageClock,
    StepAccount,
    Work,
    matrix_params,
    measured_peak,
    model_flops,
)
from trainers.core.loop import StepTimer, step_metrics
from trainers.policy_gradients.stages import StepShapes, StepTokens, stage_work

# hidden 64, MLP 128, 2 layers, 4 heads of 16 with 2 key/value heads, vocabulary 100
SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
# per layer: q 64·64 + k 64·32 + v 64·32 + o 64·64 + gate, up, down 3·64·128 = 36,864
BODY = 2 * (64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128)
HEAD = 100 * 64


def llama(tied: bool) -> torch.nn.Module:
    return LlamaForCausalLM(LlamaConfig(**SIZES, **HEADS, tie_word_embeddings=tied))


@pytest.mark.parametrize("tied", [False, True])
def test_model_flops_split_body_and_head_by_hand(tied):
    flops = model_flops(llama(tied))
    assert (flops.body, flops.head) == (BODY, HEAD) == (73_728, 6_400)
    # 10 tokens through the body, the head at 3 of them: 2·(73,728·10 + 6,400·3)
    assert flops.forward(10, 3) == 1_512_960
    assert flops.training(10, 3) == 4_538_880
    assert matrix_params(llama(tied).model) == BODY  # the decoder alone: no lookup, no head


def test_a_step_account_is_six_n_per_token_plus_two_n_per_frozen_pass():
    trained = ModelFlops(body=BODY, head=HEAD)
    # 6 · 80,128 · 10 tokens in 0.5 s against 1 GFLOP/s
    assert StepAccount(trained, peak=1e9).mfu(10, 0.5) == pytest.approx(0.00961536)
    with_reference = StepAccount(trained, peak=1e9, frozen=trained)
    assert with_reference.flops(10) == 8 * 80_128 * 10


def test_step_metrics_log_the_step_mfu_when_the_timer_carries_an_account():
    account = StepAccount(ModelFlops(body=BODY, head=HEAD), peak=1e9)
    row = step_metrics({"loss": 1.0}, 0.5, 1e-3, 10, StepTimer(account), torch.device("cpu"))
    assert row["mfu/step"] == pytest.approx(account.flops(10) / row["timing/step_s"] / 1e9)
    assert "mfu/step" not in step_metrics({}, 0.5, 1e-3, 10, StepTimer(), torch.device("cpu"))


def test_the_peak_is_measured_once_per_process():
    first = measured_peak("cpu", torch.float32)
    assert first > 0 and measured_peak("cpu", torch.float32) == first


def test_the_stage_clock_adds_up_and_takes_the_gather_out_of_its_stage():
    gathered = [0.0]
    clock = StageClock("cpu", gather_seconds=lambda: gathered[0])
    with clock.stage("generate"):
        gathered[0] += 0.25  # as if gathered() spent 0.25 s inside the stage
    with clock.stage("generate"):
        pass
    with clock.stage("advantages"):
        pass
    assert clock.seconds["weight_gather"] == 0.25
    assert clock.seconds["generate"] < 0.25 - 0.2  # the gather is not generation
    row = clock.row({"generate": Work(tokens=8, flops=1e6)}, peak=1e9, step_s=1.0)
    assert set(row) == {
        "timing/generate_s",
        "timing/advantages_s",
        "timing/weight_gather_s",
        "tokens/generate",
        "throughput/generate_tokens_per_s",
        "mfu/generate",
        "mfu/step",
    }
    assert row["mfu/step"] == pytest.approx(1e-3)


def test_policy_gradient_stage_work_by_hand():
    policy = ModelFlops(body=BODY, head=HEAD)
    shapes = StepShapes(policy=policy, peak=1e9, value=ModelFlops(body=BODY + 64))
    # 2 groups of prompts of 5 tokens, 24 completion tokens attended, 20 of them sampled
    tokens = StepTokens(prompt=10, completion=24, sampled=20, rows=4 * 5 + 24)
    work = stage_work(tokens, tokens, shapes, updates=2)
    assert work["generate"] == Work(20, 2 * (BODY * 34 + HEAD * 20))
    assert work["reference"] == work["old_logps"] == Work(34, 2 * (BODY * 34 + HEAD * 24))
    assert work["values"] == Work(34, 2 * (BODY + 64) * 34)
    assert work["score"] == Work(44, 0)  # no reward model: nothing counted
    update = 6 * (BODY * 34 + HEAD * 24) + 6 * (BODY + 64) * 34
    assert work["update"] == Work(68, 2 * update)
    # DAPO drew twice the groups it kept: generation and scoring did the work of every draw
    drawn = StepTokens(prompt=20, completion=48, sampled=40, rows=88)
    dapo = stage_work(drawn, tokens, shapes, updates=2)
    assert dapo["generate"] == Work(40, 2 * (BODY * 68 + HEAD * 40))
    assert dapo["score"].tokens == 88 and dapo["update"] == work["update"]
