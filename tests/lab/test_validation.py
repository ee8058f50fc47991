"""Validation before launch (issue 13, item 5): learning rates, lengths against the model's
context, models that cannot be resolved, the memory fit (free memory of the device, RAM on the
CPU) and the busy-device rule, each refused before anything is written, at the API and on the
CLI; plus the same ledger recording for direct and queued launches and `rlhf-lab gpu`'s one
"no GPU" line.

No trainer is started: queued runs stay queued (the queue worker is not spawned) and direct
launches run a one-line fake trainer (the pattern of tests/lab/test_runs.py). The machine's
facts a test names (free/total RAM, a GPU and its free memory) are set with the ``machine``
fixture (tests/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlhf_lab import api
from rlhf_lab.cli import app
from rlhf_lab.errors import Conflict, InvalidArgument, NotFound, Unavailable
from rlhf_lab.planning.validation import (
    LR_CEILING_PRESET,
    LR_CEILING_PRETRAINED,
    LR_FLOOR,
    model_context,
)
from tests._helpers.lab_launches import queue_on_tiny
from tests.conftest import live_run_on
from trainers.core.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
QUICK = ["data.max_samples=48", "data.eval_size=16", "train.max_steps=2"]
HOLDER = "dpo-20260301-110000-cccc"


@pytest.fixture(autouse=True)
def lab_root(tmp_path, monkeypatch, no_queue_worker):  # queued runs stay queued
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


@pytest.fixture
def fake_trainer(stand_in_trainer):
    """Direct launches start this instead of a trainer: it exits 0 at once."""
    stand_in_trainer("print('fake trainer', flush=True)")


def nothing_written(root: Path) -> None:
    assert not (root / "experiments").exists(), sorted(map(str, root.rglob("*")))


def cli(*argv: str) -> tuple[int, str]:
    result = runner.invoke(app, list(argv))
    return result.exit_code, result.output


def sets(overrides: list[str]) -> list[str]:
    return [w for o in overrides for w in ("--set", o)]


# ------------------------------------------------------------------------------ learning rates


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ("direct_alignment/configs/dpo.yaml", "train"),
        ("policy_gradients/configs/grpo.yaml", "train"),
        ("rejection_sampling/configs/top_k_overall.yaml", "sft"),
        ("sft/configs/sft.yaml", "train"),
        ("reward_models/configs/preference_rm.yaml", "train"),
    ],
)
def test_trainer_configs_refuse_a_learning_rate_above_one(config, key):
    from rlhf_lab.planning.configs import config_model

    family = config.split("/")[0]
    model = config_model(family)
    path = ROOT / "trainers" / config
    with pytest.raises(ConfigError, match="learning rate above 1 is refused"):
        load_config(path, model, [f"{key}.learning_rate=1e9"])
    assert load_config(path, model, [f"{key}.learning_rate=1"])  # the limit itself passes


def test_learning_rate_above_one_is_refused_at_shrink_plan_and_launch(lab_root):
    bad = ["train.learning_rate=1e9"]
    for call in (
        lambda: api.shrink_config("dpo", bad, model="tiny"),
        lambda: api.plan_experiment(algorithm="dpo", model="tiny", overrides=bad),
        lambda: queue_on_tiny("dpo", bad),
    ):
        with pytest.raises(InvalidArgument, match="learning rate above 1 is refused"):
            call()
    code, out = cli("launch", "dpo", "--model", "tiny", "--queue", *sets(bad))
    assert code == 2 and "learning rate above 1 is refused" in out, out
    nothing_written(lab_root)


def test_implausible_learning_rates_warn_in_shrink_plan_and_launch(lab_root):
    high = [f"train.learning_rate={LR_CEILING_PRESET * 5}"]
    shrunk = api.shrink_config("dpo", high, model="tiny")
    assert any("plausible top for a random-init built-in preset" in n for n in shrunk.notes)
    plan = api.plan_experiment(algorithm="dpo", model="tiny", overrides=high)
    assert any("train.learning_rate=0.05 is above 0.01" in w for w in plan.warnings)
    low = api.shrink_config("dpo", [f"train.learning_rate={LR_FLOOR / 10}"], model="tiny")
    assert any("is below 1e-08" in n for n in low.notes)
    # a pretrained model has a lower ceiling than a random-init preset
    mid = [f"train.learning_rate={LR_CEILING_PRETRAINED * 5}"]
    assert not [n for n in api.shrink_config("dpo", mid, model="tiny").notes if "learning" in n]
    pretrained = api.shrink_config("dpo", mid)  # the recipe's OLMo-2 (hub, known architecture)
    assert any("plausible top for full fine-tuning" in n for n in pretrained.notes)
    # the launch goes ahead and says so, in the API result, the agent's result and the CLI
    launched = queue_on_tiny("dpo", high, campaign="lr")
    assert launched.queued and any("is above 0.01" in w for w in launched.warnings)
    # other seeds: the same config as a queued run would be refused as a repeat
    agent = api.launch_run_result(queue_on_tiny("dpo", [*high, "seed=2"], campaign="lr"))
    assert any("is above 0.01" in w for w in agent.warnings)
    code, out = cli(
        "launch", "dpo", "--model", "tiny", "--queue", "--campaign", "lr", *sets([*high, "seed=3"])
    )
    assert code == 0 and "warning: train.learning_rate=0.05 is above 0.01" in out, out


# ------------------------------------------------------------------------- lengths vs context


def test_max_length_above_the_context_is_refused_everywhere(lab_root):
    """`data.max_length=1e12` used to launch; it is refused at plan, shrink, estimate_memory and
    launch (direct and queued), naming the model's context."""
    bad = ["data.max_length=1e12"]
    calls = {
        "shrink": lambda: api.shrink_config("dpo", bad, model="tiny"),
        "plan": lambda: api.plan_experiment(algorithm="dpo", model="tiny", overrides=bad),
        "estimate": lambda: api.estimate_memory("dpo", "tiny", bad),
        "estimate full": lambda: api.estimate_memory("dpo", "tiny", bad, shrink=False),
        "launch": lambda: api.launch(
            api.RunRequest(recipe="dpo", overrides=bad, model="tiny", device="cpu")
        ),
        "queue": lambda: queue_on_tiny("dpo", bad),
        "full launch": lambda: api.launch(
            api.RunRequest(recipe="dpo", overrides=bad + ["model.name=tiny"], shrink=False)
        ),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidArgument, match="above the context of model tiny") as err:
            call()
        assert "2048 tokens" in err.value.message, name
        assert err.value.next_steps, name
    for argv in (["shrink", "dpo"], ["plan", "--algorithm", "dpo"], ["launch", "dpo", "--queue"]):
        code, out = cli(*argv, "--model", "tiny", *sets(bad))
        assert code == 2 and "above the context of model tiny (2048 tokens" in out, (argv, out)
    nothing_written(lab_root)


def test_generation_lengths_must_leave_room_for_the_prompt(lab_root):
    with pytest.raises(InvalidArgument, match="rollout.max_new_tokens=4096 new tokens leave no"):
        api.shrink_config("grpo", ["rollout.max_new_tokens=4096"], model="tiny")
    with pytest.raises(InvalidArgument, match="generation.max_new_tokens=2048"):
        queue_on_tiny("top_k_overall", ["generation.max_new_tokens=2048"])
    with pytest.raises(InvalidArgument, match="sft.max_seq_length=4096 is above the context"):
        api.shrink_config("top_k_overall", ["sft.max_seq_length=4096"], model="tiny")
    assert api.shrink_config("grpo", ["rollout.max_new_tokens=1024"], model="tiny")
    nothing_written(lab_root)


def test_the_context_comes_from_the_model_folders_config_json(lab_root, tmp_path):
    folder = tmp_path / "short-model"
    folder.mkdir()
    config = {
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
    }
    (folder / "config.json").write_text(json.dumps(config))
    assert model_context(str(folder)) == 256 and model_context("tiny") == 2048
    assert model_context("HuggingFaceTB/SmolLM2-135M-Instruct") == 8192  # built-in facts
    ok = api.shrink_config("sft", ["data.max_length=256", f"model.name={folder}"])
    assert ok.config["data"]["max_length"] == 256
    with pytest.raises(InvalidArgument, match=r"data.max_length=300 is above .*\(256 tokens"):
        api.launch(
            api.RunRequest(
                recipe="sft",
                overrides=[f"model.name={folder}", "data.max_length=300"],
                queue=True,
                shrink=False,
            )
        )
    nothing_written(lab_root)


# ------------------------------------------------------------------------------------ models


@pytest.mark.parametrize("model", ["/nonexistent/model-folder", "no-such-model-name"])
def test_a_model_that_cannot_be_resolved_is_refused_at_plan_shrink_and_launch(lab_root, model):
    calls = [
        lambda: api.shrink_config("dpo", model=model),
        lambda: api.plan_experiment(algorithm="dpo", model=model),
        lambda: api.estimate_memory("dpo", model),
        lambda: api.launch(api.RunRequest(recipe="dpo", model=model, queue=True)),
        lambda: api.launch(
            api.RunRequest(
                recipe="dpo", overrides=[f"model.name={model}"], queue=True, shrink=False
            )
        ),
        lambda: api.launch_run_result(
            api.launch(api.RunRequest(recipe="dpo", model=model, device="cpu"))
        ),
        lambda: api.launch(
            api.RunRequest(
                recipe="dpo", overrides=QUICK + [f"model.ref_name={model}"], model="tiny"
            )
        ),
    ]
    for call in calls:
        with pytest.raises(NotFound, match="cannot be resolved") as err:
            call()
        steps = {s.operation for s in err.value.next_steps}
        assert {"list_models", "pull_model", "shrink_config"} <= steps
    code, out = cli("launch", "dpo", "--model", model, "--queue")
    assert code == 2 and "cannot be resolved" in out, out
    assert "`rlhf-lab models list`" in out and "`rlhf-lab models pull smollm2-135m-instruct`" in out
    nothing_written(lab_root)


def test_an_uncached_hub_model_offline_is_refused_at_launch_and_warned_in_the_plan(lab_root):
    hub = "nobody/no-such-model"
    plan = api.plan_experiment(algorithm="dpo", model=hub, overrides=QUICK)
    assert any("local Hugging Face cache" in w for w in plan.warnings), plan.warnings
    for call in (
        lambda: api.launch(api.RunRequest(recipe="dpo", overrides=QUICK, model=hub, queue=True)),
        lambda: api.launch(
            api.RunRequest(recipe="dpo", overrides=QUICK, model=hub, device="cpu", force=True)
        ),
    ):
        with pytest.raises(Unavailable, match="HF_HUB_OFFLINE=1 is set and its weights"):
            call()
    code, out = cli("launch", "dpo", "--model", hub, "--queue")
    assert code == 2 and "cannot be loaded here" in out, out
    nothing_written(lab_root)


def test_a_scorer_that_is_no_reward_model_is_refused(lab_root, tmp_path):
    with pytest.raises(NotFound, match="scorer.name=.* is neither 'verifier'"):
        queue_on_tiny("top_k_overall", [f"scorer.name={tmp_path}"])
    nothing_written(lab_root)


# ------------------------------------------------------------------------- memory and devices


def test_launch_refuses_a_run_that_does_not_fit_free_memory_unless_forced(
    lab_root, machine, fake_trainer
):
    machine(free_ram_gb=0.001)
    with pytest.raises(Conflict, match=r"does not fit the free RAM \(0.00 GiB free on cpu") as err:
        api.launch(api.RunRequest(recipe="dpo", overrides=QUICK, model="tiny", device="cpu"))
    assert "memory estimate of this run (~" in err.value.message
    assert ("launch_run", {"force": True}) in [
        (s.operation, dict(s.args)) for s in err.value.next_steps
    ]
    code, out = cli("launch", "dpo", "--model", "tiny", "--device", "cpu", *sets(QUICK))
    assert code == 2 and "does not fit the free RAM" in out and "--force" in out, out
    nothing_written(lab_root)
    # a queued run is refused only when it could never fit the device
    machine(total_ram_gb=0.001)
    with pytest.raises(Conflict, match="queued, it could never start"):
        queue_on_tiny("dpo", QUICK, device="cpu")
    nothing_written(lab_root)
    # force starts it anyway
    code, out = cli("launch", "dpo", "--model", "tiny", "--device", "cpu", "--force", *sets(QUICK))
    assert code == 0 and "started" in out, out
    forced = api.launch_run_result(
        api.launch(
            api.RunRequest(
                recipe="dpo", overrides=QUICK, model="tiny", device="cpu", force=True, campaign="f"
            )
        )
    )
    assert forced.state == "running"


def free_memory_on(machine, device: str, gb: float) -> None:
    """The machine has ``gb`` GiB free on ``device``: its RAM, or its one GPU."""
    machine(**({"free_ram_gb": gb} if device == "cpu" else {"gpus": [gb]}))


def _holder_run(lab_root: Path, device: str) -> subprocess.Popen:
    """A run that trains on ``device`` now (a live process behind its run.json)."""
    return live_run_on(lab_root / "experiments" / "2026-03-01-busy" / "runs" / HOLDER, device)


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_a_busy_device_takes_a_second_run_only_when_its_estimate_fits(
    lab_root, machine, fake_trainer, device
):
    """The same rule on the CPU and on a GPU: beside the running job when the estimate fits the
    free memory, refused (naming the job, the estimate and the free memory) otherwise; queue
    and force are the ways past it. What the CLI help and the launch_run description say."""
    holder = _holder_run(lab_root, device)
    try:
        free_memory_on(machine, device, 0.001)  # on cuda:0, this machine "shows" one GPU
        with pytest.raises(Conflict, match=f"device {device} is busy: run {HOLDER}") as err:
            api.launch(
                api.RunRequest(
                    recipe="dpo", overrides=QUICK, model="tiny", device=device, campaign="two"
                )
            )
        assert "both do not fit: ~" in err.value.message and "0.00 GiB" in err.value.message
        assert len(list(lab_root.glob("experiments/*/runs/*"))) == 1  # only the holder
        queued = queue_on_tiny("dpo", QUICK, device=device, campaign="two")
        assert queued.queued and HOLDER in queued.message
        free_memory_on(machine, device, 1000.0)
        # another seed: an identical config beside the queued one would be refused as a repeat
        again = [*QUICK, "seed=2"]
        beside = api.launch(
            api.RunRequest(
                recipe="dpo", overrides=again, model="tiny", device=device, campaign="two"
            )
        )
        assert beside.state == "running" and beside.sharing_device_with == [HOLDER]
    finally:
        holder.kill()
        holder.wait()
    help_text = " ".join(cli("launch", "--help")[1].split())
    assert "starts beside it when its estimate fits the free memory" in help_text
    from rlhf_lab.mcp_server import server

    tools = {t.name: t for t in _list_tools(server)}
    description = tools["launch_run"].description
    assert "a busy device is shared if the estimate fits" in description
    assert "memory that does not fit" in description and "force=true" in description


def _list_tools(server) -> list:
    import anyio
    from mcp import Client

    async def go():
        async with Client(server) as client:
            return (await client.list_tools()).tools

    return anyio.run(go)


# --------------------------------------------------------------------------------- recording


def _ledger_state(lab_root: Path, run_id: str) -> str | None:
    for path in lab_root.glob("experiments/*/ledger.json"):
        for row in json.loads(path.read_text()).get("runs", []):
            if row.get("run_id") == run_id:
                return row.get("state")
    return None


def test_direct_and_queued_launches_are_recorded_the_same_way(lab_root, fake_trainer):
    """Both get their ledger row at launch, and a direct launch is recorded again when it ends
    (by a recorder process, as the queue worker records the runs it starts)."""
    queued = queue_on_tiny("dpo", QUICK, campaign="rec")
    assert _ledger_state(lab_root, queued.run.id) == "queued"
    again = [*QUICK, "seed=2"]  # the queued run's config again would be refused as a repeat
    direct = api.launch(
        api.RunRequest(recipe="dpo", overrides=again, model="tiny", campaign="rec", device="cpu")
    )
    assert _ledger_state(lab_root, direct.run.id) in ("running", "succeeded")
    deadline = time.time() + 60
    while _ledger_state(lab_root, direct.run.id) != "succeeded" and time.time() < deadline:
        time.sleep(0.25)
    assert _ledger_state(lab_root, direct.run.id) == "succeeded"
    log = (lab_root / "experiments" / ".lab" / "queue.log").read_text()
    assert f"{direct.run.id} ended: succeeded; recording it" in log


# ---------------------------------------------------------------------------------- rlhf-lab gpu


def test_gpu_says_no_gpu_once(monkeypatch):
    def no_library():
        raise OSError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_library))
    code, out = cli("gpu")
    assert code == 0, out
    assert "no GPU: NVML is not available (NVML Shared Library Not Found)" in out
    assert out.count("no GPU") == 1, out
