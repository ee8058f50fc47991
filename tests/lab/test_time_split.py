"""Where the time goes (rlhf_lab/results/stages.py): `rlhf-lab status` and run_status show the
latest train row's stages, the ledger's run section the median step's, from recorded metric rows
(no training)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rlhf_lab import api, ledger
from rlhf_lab.cli import app
from rlhf_lab.results.stages import time_split
from tests.lab.test_ledger import da_rows, make_run

pytestmark = pytest.mark.usefixtures("lab_root")


def pg_train_row(step: int, generate: float) -> dict:
    """A policy-gradient train row's stage metrics (trainers/policy_gradients/stages.py)."""
    return {
        "step": step,
        "time_s": float(step),
        "phase": "train",
        "loss": 0.1,
        "timing/train_s": 0.2,
        "timing/step_s": 1.0,
        "timing/generate_s": generate,
        "mfu/generate": 0.0004,
        "timing/score_s": 0.05,
        "timing/reference_s": 0.1,
        "mfu/reference": 0.02,
        "timing/advantages_s": 0.01,
        "timing/update_s": 0.2,
        "mfu/update": 0.125,
        "mfu/step": 0.03,
    }


def test_the_split_names_each_stage_in_step_order_with_its_share_and_mfu():
    text = time_split(pg_train_row(1, 0.6))
    assert text == (
        "generate 60% (MFU 0.04%), score 5%, reference 10% (MFU 2.0%), advantages 1%, "
        "update 20% (MFU 12.5%); step 1 s, MFU 3.0%"
    )
    # a supervised step: no stages, the step's MFU alone; nothing to say without either
    assert time_split({"timing/step_s": 0.5, "mfu/step": 0.12}) == "step 0.5 s, MFU 12.0%"
    assert time_split({"timing/step_s": 0.5, "timing/train": 0.3}) is None
    assert time_split({}) is None


def test_status_shows_where_the_latest_step_went():
    camp = ledger.create_campaign("speed-stages", "where does the time go?")
    run_id = "grpo-20260101-000001-5eed"
    rows = [pg_train_row(1, 0.9), pg_train_row(2, 0.6)]
    make_run(camp.id, run_id, family="policy_gradients", algorithm="grpo", rows=rows)
    split = api.run_status(run_id).status.time_split
    assert split is not None and split.startswith("generate 60% (MFU")
    shown = CliRunner().invoke(app, ["status", run_id])
    assert shown.exit_code == 0, shown.output
    assert f"  time: {split}" in shown.output
    assert (
        '"time_split": "generate 60%'
        in CliRunner().invoke(app, ["status", run_id, "--json"]).output
    )


def test_the_ledger_has_a_where_the_time_went_line_per_run():
    camp = ledger.create_campaign("speed-ledger", "where does the time go?")
    pg_rows = [pg_train_row(s, g) for s, g in ((1, 0.9), (2, 0.5), (3, 0.6), (4, 0.7))]
    make_run(camp.id, "grpo-20260101-000002-5eed", rows=pg_rows)
    dpo = da_rows(steps=3)
    for row in dpo:
        row.update({"timing/step_s": 0.5, "mfu/step": 0.12})
    make_run(camp.id, "dpo-20260101-000003-5eed", rows=dpo)
    ledger.record_run("grpo-20260101-000002-5eed", plot=False)
    ledger.record_run("dpo-20260101-000003-5eed", plot=False)
    text = ledger.show_campaign("speed-ledger").markdown
    # the median of steps 2-4 (the first is warm-up): generate 0.6 s of a 1 s step
    assert "Where the time went (median step): generate 60% (MFU 0.04%), score 5%," in text
    assert "update 20% (MFU 12.5%); step 1 s, MFU 3.0%." in text
    assert "Where the time went (median step): step 0.5 s, MFU 12.0%." in text
    # the stages are not repeated in the speed line's per-step seconds
    assert "per step: step_s 1 s, train_s 0.2 s." in text
