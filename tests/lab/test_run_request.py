"""One typed request from surface to trainer: a launch is one ``RunRequest`` (overrides as typed
pairs, parsed the way the trainer's ``--set`` parses them), built once by the CLI or the MCP
tool, validated when it is built, and handed to the one ``api.launch``."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main
import yaml
from mcp import Client
from typer.testing import CliRunner

from rlhf_lab import api, cli, mcp_server, runs
from rlhf_lab.api.launching import _resolve
from rlhf_lab.errors import InvalidArgument, LabError
from trainers.core.config import parse_override


@pytest.fixture(autouse=True)
def lab_root(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    monkeypatch.setenv("RLHF_LAB_CALIBRATE", "0")
    return tmp_path


ITEMS = ["train.learning_rate=1e-5", "data.max_samples=64", "model.lora.target_modules=[q, v]"]


def test_overrides_are_typed_pairs_parsed_as_set_parses_them():
    request = api.RunRequest(recipe="dpo", overrides=ITEMS)
    for item, override in zip(ITEMS, request.overrides, strict=True):
        parts, value = parse_override(item)
        assert (override.key, override.value) == (".".join(parts), value)
        assert override.text == item  # kept as written: the run's record shows it so
    assert request.overrides[0].value == 1e-5 and request.overrides[2].value == ["q", "v"]
    assert request.override_texts() == ITEMS


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("nokeyvalue", "override 'nokeyvalue' must look like key=value"),
        ("a..b=1", "override key 'a..b' must be dotted identifiers"),
    ],
)
def test_a_malformed_override_is_refused_when_the_request_is_built(item, message):
    with pytest.raises(InvalidArgument) as err:
        api.RunRequest(recipe="dpo", overrides=["data.max_samples=64", item])
    assert message in err.value.message
    assert [s.operation for s in err.value.next_steps] == ["shrink_config"]


def test_a_field_of_the_wrong_type_is_one_line_naming_it():
    with pytest.raises(InvalidArgument) as err:
        api.RunRequest(recipe=3, after="dpo-1")
    lines = err.value.message.splitlines()
    assert lines == [
        "argument `recipe`: got 3; expected a string",
        'argument `after`: got "dpo-1"; expected a list of strings',
    ]


def test_the_seed_of_a_request_is_applied_after_its_overrides():
    request = api.RunRequest(recipe="dpo", model="tiny", overrides=["seed=1"], seed=5)
    assert request.override_texts() == ["seed=1", "seed=5"]
    resolved = _resolve(request)
    assert resolved.config.get("seed") == 5 and resolved.applied[-1] == "seed=5"
    assert "seed" not in api.RunRequest.model_json_schema()["properties"]  # the lab's own


def test_launching_has_one_name():
    assert callable(api.launch) and api.launch.__lab_operation__
    for old in ("launch_experiment", "launch_run", "_launch", "resume_run_detached"):
        assert not hasattr(api, old), old
    for old in ("launch", "launch_slurm"):
        assert not callable(getattr(runs, old, None)), old  # runs.launch is the module


def test_a_queued_launch_writes_the_request_once_as_the_runs_config(lab_root, no_queue_worker):
    quick = ["train.max_steps=2", "data.max_samples=16", "data.eval_size=8"]
    request = api.RunRequest(recipe="dpo", model="tiny", overrides=quick, seed=3, queue=True)
    result = api.launch(request)
    info = api.run_state(result.run.id)
    assert result.queued and info.state == "queued"
    config = yaml.safe_load((Path(result.run.run_dir) / "config.yaml").read_text())
    assert config["seed"] == 3 and config["train"]["max_steps"] == 2
    assert result.run.overrides[-1] == "seed=3" and set(quick) <= set(result.run.overrides)


@pytest.mark.anyio
async def test_the_launch_tool_reports_a_malformed_override_as_the_lab_does():
    async with Client(mcp_server.server) as client:
        result = await client.call_tool("launch_run", {"recipe": "dpo", "overrides": ["x"]})
    text = "\n".join(c.text for c in result.content if getattr(c, "text", None))
    assert result.is_error
    assert text.startswith(
        "Error executing tool launch_run: override 'x' must look like key=value"
    ), text
    assert "shrink_config(" in text and "argument `" not in text


def test_the_cli_builds_the_request_from_its_flags(monkeypatch):
    seen = []

    def record(request):
        seen.append(request)
        raise LabError("RECORDED")

    monkeypatch.setattr(api, "launch", record)
    argv = ["launch", "dpo", "--set", "train.max_steps=3", "--model", "tiny", "--after", "a-1"]
    argv += ["--slurm", "--nodes", "2", "--nproc", "4", "--partition", "gpu", "--no-calibrate"]
    result = CliRunner().invoke(cli.app, argv)
    assert "error: RECORDED" in result.output, result.output
    (request,) = seen
    assert isinstance(request, api.RunRequest)
    assert [(o.key, o.value) for o in request.overrides] == [("train.max_steps", 3)]
    assert request.model == "tiny" and request.after == ["a-1"] and not request.calibrate
    assert request.shrink is False  # the CLI's --shrink is off unless given
    assert request.slurm == {
        "nodes": 2,
        "gpus_per_node": 0,
        "nproc_per_node": 4,
        "partition": "gpu",
    }


def test_the_cli_launch_takes_one_option_per_flag_in_order():
    """The flags dataclass (its Slurm flags in place) is what click sees, option by option."""
    command = typer.main.get_command(cli.app).commands["launch"]
    assert [p.name for p in command.params] == [
        "recipe",
        *("set_", "shrink_", "model", "campaign", "device", "force", "queue", "foreground"),
        *("after", "gpus", "nproc", "slurm", "nodes", "gpus_per_node", "partition", "time"),
        *("account", "no_calibrate", "as_json"),
    ]
    assert [p.opts for p in command.params if p.name in ("set_", "as_json", "shrink_")] == [
        ["--set"],
        ["--shrink"],
        ["--json"],
    ]
