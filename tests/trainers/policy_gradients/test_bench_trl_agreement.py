"""bench/grpo_vs_trl.py's loss agreement, run as the bench runs it: our micro-batch loss and its
gradient against TRL's ``GRPOTrainer._compute_loss`` on one fixed batch, for each loss pair the two
trainers share. Also keeps the bench's own imports honest: a trainer function it calls that moved
(``micro_batch_loss`` went from train.py to update.py) fails here, not at the end of a 6-minute
bench run."""

from __future__ import annotations

import sys

import pytest

from tests._helpers.paths import ROOT

pytest.importorskip("trl")
sys.path.insert(0, str(ROOT / "bench"))

from _grpo_checks import LOSS_PAIRS, loss_agreement  # noqa: E402
from _grpo_contenders import Workload, load_bench_prompts  # noqa: E402


def test_our_grpo_losses_and_gradients_agree_with_trls_on_one_batch():
    w = Workload("tiny", 2, 4, max_new_tokens=24, micro_batch=8, grad_accum=1)
    results = loss_agreement(w, load_bench_prompts(w)[0])
    pairs = {k: v for k, v in results.items() if k != "batch"}
    assert len(pairs) == len(LOSS_PAIRS)
    for pair, found in pairs.items():
        first, off = found["first_step"], found["perturbed_pi_old"]
        # with identical advantages the two losses and gradients are the same computation
        assert abs(first["ours_loss"] - first["trl_loss_with_our_advantages"]) < 1e-6, pair
        assert first["grad_vs_trl_with_our_advantages"]["rel_l2_diff"] < 1e-5, pair
        # π_old ≠ π: the ratio and clipping are live, TRL's loss on our advantages
        assert off["loss_abs_diff"] < 1e-6, pair
        assert off["grad_vs_trl"]["rel_l2_diff"] < 1e-5, pair
