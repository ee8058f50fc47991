"""Every proposal the lab makes is one the lab accepts (issue 25, item 5): the plan's launch
commands and its evaluation step, the ledger's Next commands (a campaign whose runs carry every
finding the Next block acts on) and the command lines of the skills go through the real CLI's
argument parsing and the lab's checks, on ``tiny`` and on a pretrained-model stand-in (a folder
with SmolLM2-135M-Instruct's config.json and the tiny preset's tokenizer).

Nothing trains: the trainer is a one-line script that leaves a ``final_model/`` (the starting
model's config and tokenizer, no weights) and exits 0, so a launched run succeeds at once and
its evaluation meets the real preflight; queued runs are started by the test (the queue worker
is not spawned). Pipelines and sweeps are only queued. A refused proposal fails the test with
the lab's error. Each walk starts processes (runs, recorders), so the walks are marked slow."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlhf_lab import api, runs
from rlhf_lab.cli import app
from rlhf_lab.evaluation.cost import suites_for_family
from rlhf_lab.ledger.campaigns import _load_data
from rlhf_lab.ledger.followups import next_items
from rlhf_lab.ledger.schema import ArmSummary, ComparisonEntry, Verdict
from tests.conftest import SMOLLM2_CONFIG

ROOT = Path(__file__).resolve().parents[2]
LAB = ["uv", "run", "rlhf-lab"]
runner = CliRunner()
FINDINGS = ["heldout_regression", "overoptimisation", "kl_blowup", "repetition", "flat"]
FAKE_TRAINER = (
    "import pathlib, shutil, sys\n"
    "run, src = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])\n"
    "out = run / 'final_model'\n"
    "out.mkdir(exist_ok=True)\n"
    "for p in src.iterdir():\n"
    "    if p.is_file() and p.suffix != '.safetensors':\n"
    "        shutil.copy(p, out / p.name)\n"
)


def tiny_folder() -> Path:
    from trainers.core.tiny import ensure_preset

    return ensure_preset("tiny")


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("models") / "smol-135m"
    folder.mkdir()
    for p in tiny_folder().iterdir():
        if p.is_file() and p.name.startswith(("tokenizer", "chat_template", "generation")):
            (folder / p.name).write_bytes(p.read_bytes())
    (folder / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    return str(folder)


@pytest.fixture(autouse=True)
def lab_root(offline_lab, cpu_box, no_queue_worker):
    return offline_lab


def fake_trainer(supervise, source: Path) -> None:
    def argv(family, run_dir, resume=False, nproc=None):  # noqa: ARG001
        if family == "evaluation":
            return [sys.executable, "-c", "pass"]
        return [sys.executable, "-c", FAKE_TRAINER, str(run_dir), str(source)]

    supervise(trainer_argv=argv)


def cli(command: str | list[str]) -> str:
    """Run a proposed ``uv run rlhf-lab ...`` command through the CLI; its output, or a failure
    naming the command and the lab's answer."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    assert argv[:3] == LAB, command
    result = runner.invoke(app, argv[3:])
    assert result.exit_code == 0, f"the lab refused its own proposal:\n{command}\n{result.output}"
    return result.output


def run_ids(output: str) -> list[str]:
    return re.findall(r"^run id:\s+(\S+)", output, flags=re.MULTILINE)


def finish(run_ids_: list[str]) -> None:
    """Start what is queued (the worker's job) and wait for every run to end, succeeded."""
    for run_id in run_ids_:
        if runs.run_state(run_id).state == "queued":
            runs.start_run(run_id)
        final = runs.wait_for_end(run_id, timeout_s=120)
        assert final.state == "succeeded", (run_id, final)
        api.record_results(run_id)


def model_name(kind: str, stand_in: str) -> str:
    return "tiny" if kind == "tiny" else stand_in


# ---------------------------------------------------------------------------------------------
# The plan: launch commands, then the evaluation it proposes; then the ledger's Next block
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tiny", "pretrained"])
@pytest.mark.parametrize("request_", ["sft sanity check", "compare dpo and simpo", "grpo"])
def test_plan_and_next_proposals_are_accepted(kind, request_, stand_in, supervise):
    model = model_name(kind, stand_in)
    fake_trainer(supervise, tiny_folder() if kind == "tiny" else Path(stand_in))
    plan = api.plan_experiment(request_, model=model)
    launched: dict[str, str] = {}
    for run in plan.runs:
        (run_id,) = run_ids(cli(run.launch_command))
        launched[run.name] = run_id
    finish(list(launched.values()))

    # the evaluation step names every run it evaluates, each on its family's suites
    (step,) = [s for s in plan.steps if "evaluate_model" in s]
    for run in plan.runs:
        for suite in suites_for_family(run.family):
            assert f"{run.name} on {suite}" in step, step
            cli([*LAB, "eval", launched[run.name], "--suite", suite])

    # Next: every finding on every run, and a tie and a clear winner between the arms
    data = _load_data(plan.campaign_name)
    assert data is not None and len(data.runs) >= len(plan.runs)
    trained = [r for r in data.runs if r.run_id in launched.values()]
    for record in trained:
        record.flags = list(FINDINGS)
    if len(trained) == 2:
        data.comparisons = [comparison(trained, "tie within noise"), comparison(trained, "better")]
    commands = [c for item in next_items(data) for c in item.commands]
    assert commands, "no Next command to walk"
    for command in commands:  # alternatives: each is run, and ends, before the next one
        started = run_ids(cli(command))
        pending = list(dict.fromkeys([*started, *(s.id for s in runs.unfinished_runs())]))
        assert pending, f"nothing launched by {command}"
        finish(pending)


def comparison(records, verdict: str) -> ComparisonEntry:
    arms = [
        ArmSummary(
            label=r.algorithm or r.run_id,
            recipe=r.recipe,
            run_ids=[r.run_id],
            seeds=[r.seed],
            overrides=r.overrides,
            settings=r.settings,
        )
        for r in records
    ]
    verdicts = [Verdict(a=arms[0].label, b=arms[1].label, verdict=verdict)]
    return ComparisonEntry(
        key=verdict,
        title=verdict,
        family=records[0].family,
        run_ids=[r.run_id for r in records],
        markdown="",
        headline="eval/accuracy",
        arms=arms,
        verdicts=verdicts,
    )


# ---------------------------------------------------------------------------------------------
# The skills' command lines
# ---------------------------------------------------------------------------------------------

# not walked: a download (the pull needs PyPI), the MCP server, an installer of files elsewhere
_NOT_WALKED = ("models pull", " mcp", "skills install")


def skill_commands() -> list[str]:
    """Every complete ``uv run rlhf-lab ...`` line of skills/*/SKILL.md, optional ``[...]``
    parts dropped; lines with placeholders (``<...>``, ``...``, ``A|B``) are templates."""
    out = []
    for path in sorted((ROOT / "skills").glob("*/SKILL.md")):
        text = path.read_text().replace("\n", " ")
        for found in re.findall(r"`(uv run rlhf-lab [^`]+)`", text):
            command = re.sub(r"\s*\[[^\]]*\]", "", " ".join(found.split()))
            if any(mark in command for mark in ("<", "...", "|", "RUN")):
                continue
            if any(skip in command for skip in _NOT_WALKED):
                continue
            out.append(command)
    return list(dict.fromkeys(out))


def test_the_skills_name_complete_commands():
    commands = skill_commands()
    assert any(" sweep " in c for c in commands) and any(" pipeline " in c for c in commands)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tiny", "pretrained"])
def test_skill_commands_are_accepted(kind, stand_in):
    model = model_name(kind, stand_in)
    for command in skill_commands():
        argv = shlex.split(command)
        verb = argv[3]
        if verb in ("launch", "sweep", "pipeline", "plan", "shrink") and argv[4:5] != ["list"]:
            if "--model" in argv:
                argv[argv.index("--model") + 1] = model
            else:
                argv += ["--model", model]
        cli(argv)
