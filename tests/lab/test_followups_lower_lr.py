"""The Next block's rule for a comparison where every arm fell on its held-out headline from
its starting model: the same arms and seeds at a learning rate ten times lower (one command,
parsed by the real CLI), and silence on a healthy comparison."""

from __future__ import annotations

import pytest

from rlhf_lab import ledger
from rlhf_lab.results.compare import compare_runs
from tests.lab.test_results import (
    commands_in,
    grpo_rows,
    make_run,
    next_block,
    parse_with_the_cli,
)

CAMP = "2026-03-01-warm-pg"
PG = ("model.name=tiny", "data.eval_size=64", "train.max_steps=20", "train.learning_rate=0.001")


pytestmark = pytest.mark.usefixtures("lab_root")


def healthy_rows() -> list[dict]:
    """Held-out correctness 0.30 -> 0.55 on 64 prompts, sampled correctness rising."""
    rows = [{"step": 0, "phase": "eval", "eval/avg_correctness": 0.30}]
    for step in range(1, 21):
        rows.append(
            {"step": step, "phase": "train", "avg_correctness": 0.2 + step / 50, "loss": 0.01}
        )
    rows.append({"step": 20, "phase": "eval", "eval/avg_correctness": 0.55})
    return rows


def _campaign(rows_of) -> list[str]:
    """Two arms (grpo, reinforce_pp) × two seeds, each run's metrics from ``rows_of(arm)``."""
    ledger.create_campaign(CAMP, "Do the new PG algorithms hold the warm start?")
    ids = []
    for recipe in ("grpo", "reinforce_pp"):
        for i, seed in enumerate((42, 43)):
            run_id = f"{recipe.replace('_', '-')}-20260301-00000{i}-000{seed - 42}"
            make_run(
                CAMP,
                run_id,
                "policy_gradients",
                recipe,
                rows_of(recipe),
                overrides=(*PG, f"seed={seed}"),
            )
            ledger.record_run(run_id, plot=False)
            ids.append(run_id)
    compare_runs(ids, record_in=CAMP)
    return ids


def test_every_arm_regressed_proposes_the_sweep_at_a_tenth_of_the_lr(monkeypatch):
    _campaign(lambda recipe: grpo_rows())
    block = next_block(CAMP)
    assert "every arm (grpo, reinforce_pp) regressed on held-out" in block
    lowered = [c for c in commands_in(block) if "train.learning_rate=0.0001" in c]
    assert len(lowered) == 1
    seen = parse_with_the_cli(lowered[0], monkeypatch)
    assert seen["args"][0] == ["grpo", "reinforce_pp"]
    assert "train.learning_rate=0.0001" in seen["args"][1]
    assert seen["kwargs"]["seeds"] == 2 and seen["kwargs"]["base_seed"] == 42
    assert seen["kwargs"]["campaign"] == CAMP
    # the per-run held-out items (fewer steps, stronger KL) are folded into it
    assert "train.max_steps=10" not in block


def test_one_healthy_arm_keeps_the_rule_quiet():
    _campaign(lambda recipe: grpo_rows() if recipe == "grpo" else healthy_rows())
    block = next_block(CAMP)
    assert "every arm (" not in block
    assert "train.learning_rate=0.0001" not in block
    # the regressed arm's own runs still get their per-run item
    assert "train.max_steps=10" in block


def test_a_healthy_comparison_gets_no_lower_lr_item():
    _campaign(lambda recipe: healthy_rows())
    block = next_block(CAMP)
    assert "every arm (" not in block and "learning rate ten times lower" not in block


def test_a_diverged_run_of_an_all_regressed_comparison_is_not_proposed_twice():
    """Every arm regressed and every run's KL blew up: the comparison's sweep at lr ×0.1 already
    reruns each arm at a tenth of its learning rate, so each run's divergence item offers only
    its other change (a tighter KL leash). Before, it proposed the same run a second time (a
    launch at lr ×0.1, same seed), which the lab refuses as identical while the first is queued."""

    def diverged(recipe: str) -> list[dict]:
        rows = grpo_rows()
        for step in range(1, 21):
            rows.append({"step": step, "phase": "rollout", "kl_ref": 0.5 if step < 10 else 120.0})
        return sorted(rows, key=lambda r: (r["step"], r["phase"] != "rollout"))

    _campaign(diverged)
    block = next_block(CAMP)
    assert "every arm (grpo, reinforce_pp) regressed on held-out" in block
    # one divergence item per arm (its two seeds share the command, so one is dropped as a repeat)
    assert block.count("the policy diverged") == 2
    lowered = [c for c in commands_in(block) if "train.learning_rate=0.0001" in c]
    assert len(lowered) == 1 and lowered[0].split()[3] == "sweep"
    leash = [c for c in commands_in(block) if "loss.beta=" in c]
    assert len(leash) == 2  # grpo's and reinforce_pp's tighter KL leash (seeds share a command)
    assert "smaller steps, lr now" not in block  # the folded alternative's text is gone too


def test_a_diverged_run_alone_keeps_its_lower_lr_alternative():
    _campaign(lambda recipe: healthy_rows())
    from rlhf_lab.ledger.followups import NextItem, without_folded

    item = NextItem(
        why="r: its KL blew up",
        action="train.learning_rate=0.0001 (smaller steps) or loss.beta=0.05 (a tighter leash)",
        commands=["launch lr", "launch beta"],
        lower_lr_command="launch lr",
        lower_lr_action="train.learning_rate=0.0001 (smaller steps)",
    )
    assert without_folded([item], "r", folded=set()) == [item]
    (kept,) = without_folded([item], "r", folded={"r"})
    assert kept.commands == ["launch beta"] and kept.action == "loss.beta=0.05 (a tighter leash)"
