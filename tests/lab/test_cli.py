"""The `rlhf-lab` CLI: fast start without torch, --json on reading commands, clear errors."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from rlhf_lab.cli import app
from tests._helpers.algorithms import DIRECT_ALIGNMENT_LOSSES
from tests._helpers.imports import modules_left_imported

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("lab_root")


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["status"], ["runs"], ["gpu"], ["recipes"], ["tail", "--help"]],
)
def test_reading_commands_import_neither_torch_nor_transformers(argv, lab_root):
    code = (
        "from rlhf_lab.cli import app\n"
        "try:\n"
        f"    app({argv!r})\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
    )
    env = {**os.environ, "RLHF_LAB_ROOT": str(lab_root)}
    assert modules_left_imported(code, ("torch", "transformers"), env=env) == []


def test_recipes_json_lists_every_shipped_direct_alignment_config():
    result = runner.invoke(app, ["recipes", "--family", "direct_alignment", "--json"])
    assert result.exit_code == 0, result.output
    names = {r["name"] for r in json.loads(result.output)}
    assert DIRECT_ALIGNMENT_LOSSES <= names


def test_shrink_json_reports_diff_and_steps():
    result = runner.invoke(app, ["shrink", "dpo", "--model", "tiny", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["config"]["model"]["name"] == "tiny"
    assert data["expected_optimizer_steps"] == 32  # (640 − 128) / 16, one epoch
    assert any(c["key"] == "model.name" for c in data["diff"])


def test_plan_names_command_metrics_and_slug():
    result = runner.invoke(app, ["plan", "small SimPO sanity check", "--model", "tiny", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    run = plan["runs"][0]
    assert run["algorithm"] == "simpo"
    assert "rlhf-lab launch" in run["launch_command"]
    (crit,) = plan["criteria"]
    assert crit["algorithms"] == ["simpo"] and "accuracy" in " ".join(crit["key_metrics"])
    assert plan["campaign"] == "simpo-sanity"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["launch", "no-such-recipe"], "no-such-recipe"),
        (["status", "../etc"], "bad run id"),
        (["tail", "abc/def"], "bad run id"),
        (["campaign", "new", "Bad Slug!", "--question", "q"], "bad campaign slug"),
        (["launch", "dpo", "--set", "train.learning_rat=1"], "learning_rate"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(argv, message, lab_root):
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    # nothing was written outside experiments/ (and for these inputs, nothing at all)
    written = [p for p in lab_root.rglob("*") if p.is_file()]
    assert all("experiments" in p.parts for p in written), written


def test_campaign_new_show_list(lab_root):
    result = runner.invoke(app, ["campaign", "new", "cli-check", "--question", "does it work?"])
    assert result.exit_code == 0, result.output
    listed = runner.invoke(app, ["campaign", "list", "--json"])
    assert [c["slug"] for c in json.loads(listed.output)] == ["cli-check"]
    shown = runner.invoke(app, ["campaign", "show", "cli-check"])
    assert "does it work?" in shown.output
