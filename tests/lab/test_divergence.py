"""Divergence made visible (rlhf_lab/results/divergence.py), on synthetic run folders with the real row
schema: the KL blow-up rule and the degenerate-repetition rule fire on a diverging run (the
kl_ref series and the samples the tiny rlhf pipeline's PPO stage logged at lr 1e-3 with k3 in
the reward) and not on a healthy one (the same stage at lr 1e-4 with k1); diagnose's alerts
name the exact overrides, and the ledger's Next section proposes the commands."""

from __future__ import annotations

import json
import os
import shlex

import pytest

from rlhf_lab import ledger
from rlhf_lab.results.diagnosis import diagnose
from rlhf_lab.results.divergence import degenerate_samples, divergence_advice, kl_blowup
from tests.lab.test_overoptimisation import CAMP, make_run, pg

# kl_ref per rollout step, as logged (tiny rlhf pipeline, PPO stage, seed 42)
DIVERGED_KL = [0.0, 4.1, 5.0, 19.1, 24.3, 72.4, 142.3, 120.0, 112.4, 107.4]
HEALTHY_KL = [0.0, 0.0, 0.1, 0.2, 0.3, 0.8, 0.9, 0.9, 1.0, 1.8, 2.2, 2.0, 3.3, 2.6, 2.9, 1.7]
COLLAPSED = "Your Your Your Your Your Your Your Your Your Your Your Your Your Your Your Your Your"
HEALTHY_TEXT = "<think>3 + 4 = 7, then 7 + 2 = 9</think>\n<answer>9</answer>"
PPO_RM = (
    "model.name=tiny",
    "data.source=preference",
    "data.dataset=builtin",
    "reward.model=/runs/rm/final_model",
    "loss.beta=0.05",
    "loss.kl_estimator=k3",
    "train.learning_rate=0.001",
    "train.max_steps=10",
)


pytestmark = pytest.mark.usefixtures("lab_root")


def ppo_run(run_id: str, rows: list[dict], overrides: tuple[str, ...] = PPO_RM):
    """A run of the ppo_rm recipe (algorithm ppo), as the launcher writes it."""
    path = make_run(run_id, rows, recipe="ppo_rm", overrides=overrides)
    meta = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps({**meta, "algorithm": "ppo"}))
    return path


def kl_rows(kls: list[float]) -> list[dict]:
    out = []
    for step, kl in enumerate(kls, start=1):
        out.append({"step": step, "phase": "rollout", "kl_ref": kl, "proxy_reward": 1.0})
        out.append({"step": step, "phase": "train", "loss": 0.1})
    return out


def samples(text: str, step: int = 10) -> list[dict]:
    return [{"step": step, "kind": "rollout", "question": "q", "completion": text}] * 2


def test_kl_blowup_fires_on_a_diverging_run_and_not_on_a_healthy_one():
    found = kl_blowup(kl_rows(DIVERGED_KL))
    assert found is not None and found.peak == 142.3 and found.peak_step == 7
    assert "142.3 nats at step 7" in found.message
    assert kl_blowup(kl_rows(HEALTHY_KL)) is None
    # a large KL that was large from the start did not blow up; too few rows say nothing
    assert kl_blowup(kl_rows([60.0, 70.0, 80.0, 90.0])) is None
    assert kl_blowup(kl_rows([0.0, 100.0, 200.0])) is None


def test_degenerate_samples_fire_on_repetition_only():
    assert "repeat themselves" in degenerate_samples(samples(COLLAPSED))
    assert degenerate_samples(samples(HEALTHY_TEXT)) is None
    # only the latest sampled step counts: a run that recovered is not flagged
    assert degenerate_samples([*samples(COLLAPSED, 5), *samples(HEALTHY_TEXT, 10)]) is None


def test_advice_lowers_the_lr_tightens_beta_and_swaps_k3_in_the_reward():
    cfg = {"train": {"learning_rate": 1e-3}, "loss": {"beta": 0.05, "kl_estimator": "k3"}}
    overrides = [a.override for a in divergence_advice("policy_gradients", "ppo", pg(cfg).get)]
    assert overrides == ["train.learning_rate=0.0001", "loss.beta=0.1", "loss.kl_estimator=k1"]
    # GRPO keeps its KL in the loss: k3 is fine there; flat dotted settings work the same
    flat = {"train.learning_rate": 1e-3, "loss.beta": 0.0, "loss.kl_estimator": "k3"}
    overrides = [a.override for a in divergence_advice("policy_gradients", "grpo", flat.get)]
    assert overrides == ["train.learning_rate=0.0001", "loss.beta=0.05"]


def test_diagnose_raises_both_alerts_with_exact_overrides():
    run = ppo_run("ppo-20260302-000000-0001", kl_rows(DIVERGED_KL))
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples(COLLAPSED)))
    healthy = ppo_run("ppo-20260302-000000-0002", kl_rows(HEALTHY_KL))
    alerts = {a.kind: a for a in diagnose(run.name)}
    for kind in ("kl_blowup", "repetition"):
        assert "override train.learning_rate=0.0001 " in alerts[kind].hint
        assert "override loss.beta=0.1 " in alerts[kind].hint
    assert alerts["kl_blowup"].step == 7
    assert not {"kl_blowup", "repetition"} & {a.kind for a in diagnose(healthy.name)}


def test_ledger_flags_the_divergence_and_next_proposes_the_commands():
    run = ppo_run("ppo-20260302-000000-0001", kl_rows(DIVERGED_KL))
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples(COLLAPSED)))
    rec = ledger.record_run(run.name, plot=False)
    assert {"kl_blowup", "repetition"} <= set(rec.flags)
    text = ledger.show_campaign(CAMP).campaign.path
    nxt = open(text).read().split("<!-- rlhf-lab:begin next -->")[1].split("<!-- rlhf-lab:end")[0]
    assert "blew up" in nxt and "degenerated" in nxt
    sets = [shlex.split(c.strip()) for c in nxt.splitlines() if c.strip().startswith("uv run")]
    assert any("train.learning_rate=0.0001" in c and "loss.beta=0.05" in c for c in sets)
    assert any("loss.beta=0.1" in c for c in sets)
    assert any("loss.kl_estimator=k1" in c for c in sets)
    healthy = ppo_run("ppo-20260302-000000-0002", kl_rows(HEALTHY_KL))
    assert not {"kl_blowup", "repetition"} & set(ledger.record_run(healthy.name, plot=False).flags)


def test_looping_present_at_step_0_is_inherited_not_diverged():
    """The starting model already loops (the instruct model on tiny's tag prompt, a broken
    end-of-turn token): the alert says inherited, and no divergence advice follows."""
    from rlhf_lab.results.divergence import repetition_finding

    start_loops = [*samples(COLLAPSED, 0), *samples(COLLAPSED, 10)]
    found = repetition_finding(start_loops)
    assert found.inherited and (found.start_collapsed, found.start_of) == (2, 2)
    assert "inherited, not diverged: 2/2 at step 0 already did" in found.message
    assert degenerate_samples(start_loops) is None
    # healthy at step 0, looping at the end: diverged, compared with the start
    grew = [*samples(HEALTHY_TEXT, 0), *samples(COLLAPSED, 10)]
    assert not repetition_finding(grew).inherited
    assert "diverged from the start (0/2 at step 0)" in degenerate_samples(grew)
    # one of two looping at the start counts as present (at least half)
    half = [*samples(HEALTHY_TEXT, 0)[:1], *samples(COLLAPSED, 0)[:1], *samples(COLLAPSED, 10)]
    assert repetition_finding(half).inherited
    # only step 0 sampled: inherited; only a later step: nothing to compare, a divergence
    assert repetition_finding(samples(COLLAPSED, 0)).inherited
    assert not repetition_finding(samples(COLLAPSED, 10)).inherited


def test_diagnose_and_ledger_call_inherited_looping_inherited():
    run = ppo_run("ppo-20260302-000000-0001", kl_rows(HEALTHY_KL))
    rows = [*samples(COLLAPSED, 0), *samples(COLLAPSED, 10)]
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in rows))
    alerts = {a.kind: a for a in diagnose(run.name)}
    assert "repetition" not in alerts
    inherited = alerts["repetition_inherited"]
    assert inherited.severity == "info" and "inherited" in inherited.message
    assert "train.learning_rate" not in inherited.hint  # no divergence advice
    rec = ledger.record_run(run.name, plot=False)
    assert "repetition_inherited" in rec.flags and "repetition" not in rec.flags
    text = open(ledger.show_campaign(CAMP).campaign.path).read()
    nxt = text.split("<!-- rlhf-lab:begin next -->")[1].split("<!-- rlhf-lab:end")[0]
    assert "degenerated" not in nxt


def test_diagnose_reads_the_config_and_the_samples_of_a_run_once(files_read):
    """Every check of a diagnosis reads the same config.yaml and samples.jsonl: they are read
    once and handed to the checks, not once a check."""
    run = ppo_run("ppo-20260302-000000-0001", kl_rows(DIVERGED_KL))
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples(COLLAPSED)))
    files_read.clear()
    kinds = {a.kind for a in diagnose(run.name)}
    assert {"kl_blowup", "repetition"} <= kinds  # the checks that read both still ran
    opened = [os.path.relpath(p, run) for p in files_read if p.startswith(str(run))]
    assert opened.count("config.yaml") == 1 and opened.count("samples.jsonl") == 1, opened
