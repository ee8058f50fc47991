"""LoRA under torchrun (gloo, 2 processes, started for real): peft's adapters first, then FSDP2
per decoder layer. LoRA DPO on 2 ranks equals 1 process with the same global batch (losses,
metrics, adapter tensors); the reward model with adapters and its trained head runs on 2 ranks;
a LoRA SFT run stopped and resumed on 2 ranks equals an uninterrupted one (the sharded
checkpoint holds the adapters and their optimizer state, not the frozen base); the final adapter
and the merged model that rank 0 writes from the consolidated state load and agree. The merge of
a consolidated state dict is checked against peft's own ``merge_and_unload``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_distributed import (
    DPO,
    FAMILIES,
    PER_RANK,
    RM,
    SFT,
    assert_same_history,
    cache_without_reference_logps,
    failure_text,
    rows,
    torchrun,
)

from trainers.core import lora
from trainers.core.config import LoraSection
from trainers.core.models import load_causal_lm

# dropout 0: a dropout mask is drawn per rank, so with dropout the ranks' shares would not see
# the masks one process draws for the whole batch (the runs would differ by design)
LORA = [
    "model.lora.enabled=true",
    "model.lora.rank=4",
    "model.lora.alpha=8",
    "model.lora.dropout=0",
]
LORA_FAMILIES = {"dpo": DPO, "rm": RM, "sft": SFT}
LORA_LR = "train.learning_rate=1.0e-3"  # adapters start at B = 0: a visible move in 3 steps


def lora_spec(family: str, run_dir: Path, extra=(), resume: bool = False) -> dict:
    from conftest import trainer_argv

    module, config, overrides = LORA_FAMILIES[family]
    over = [*overrides, *LORA, LORA_LR, f"train.batch_size={PER_RANK}", *extra]
    return {"module": module, "argv": trainer_argv(config, run_dir, over, resume=resume)}


def adapter_tensors(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / lora.ADAPTER_DIR / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory) -> dict:
    where = tmp_path_factory.mktemp("lora-two-ranks")
    runs = {name: where / name for name in ("dpo", "rm", "sft", "sft_stopped")}
    specs = [lora_spec("dpo", runs["dpo"]), lora_spec("rm", runs["rm"])]
    specs.append(lora_spec("sft", runs["sft"]))
    stopped = lora_spec("sft", runs["sft_stopped"])
    specs.append({**stopped, "env": {"RLHF_LAB_SIGTERM_AT": "micro_batch:2"}})
    specs.append(lora_spec("sft", runs["sft_stopped"], resume=True))
    specs[0]["env"] = {"RLHF_LAB_CACHE": str(cache_without_reference_logps(where))}
    import time

    t0 = time.time()
    codes, output = torchrun(specs, where)
    print(f"torchrun: {time.time() - t0:.1f}s")
    t0 = time.time()
    one = where / "one-process-dpo"
    import importlib

    from conftest import trainer_argv

    module, config, overrides = FAMILIES["dpo"]
    over = [*overrides, *LORA, LORA_LR, f"train.batch_size={2 * PER_RANK}"]
    one_code = importlib.import_module(module).main(trainer_argv(config, one, over))
    print(f"one process: {time.time() - t0:.1f}s")
    return {"runs": runs, "codes": codes, "output": output, "one": one, "one_code": one_code}


@pytest.mark.slow  # one torchrun start of five LoRA runs, and one process
def test_lora_runs_succeed_on_two_ranks(lora_runs):
    assert lora_runs["codes"] == [0, 0, 0, 143, 0], failure_text(lora_runs["output"])
    assert lora_runs["one_code"] == 0
    for name in ("dpo", "rm", "sft"):
        summary = json.loads((lora_runs["runs"][name] / "summary.json").read_text())
        assert summary["outcome"] == "succeeded", name
        assert summary["distributed"]["world_size"] == 2


@pytest.mark.slow  # one torchrun start of five LoRA runs, and one process
def test_lora_dpo_on_two_ranks_equals_one_process(lora_runs):
    one, two = lora_runs["one"], lora_runs["runs"]["dpo"]
    assert json.loads((two / "summary.json").read_text())["ref_cache"] == "miss"
    first = rows(one, "train")[0]
    assert rows(two, "train")[0]["loss"] == pytest.approx(first["loss"], rel=1e-5)
    assert rows(two, "train")[0]["grad_norm"] == pytest.approx(first["grad_norm"], rel=1e-4)
    # step 1: the adapters are zero, the policy is its reference, accuracy counts rounding
    assert_same_history(one, two, skip={("train", 1, "accuracy")})
    a, b = adapter_tensors(one), adapter_tensors(two)
    assert a and sorted(a) == sorted(b)
    moved = max(float(t.abs().max()) for k, t in a.items() if "lora_B" in k)
    assert moved > 1e-3  # the adapters trained (B starts at zero)
    # as assert_same_params: Adam may turn a ~0 gradient of opposite sign into a step of up to
    # lr either way, so an element may differ by up to 2·lr·steps; nearly all agree closely
    steps = len(rows(one, "train"))
    diffs = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    assert float(diffs.max()) <= 2 * 1e-3 * steps, float(diffs.max())
    assert int((diffs > 1e-5).sum()) <= diffs.numel() // 1000, int((diffs > 1e-5).sum())


@pytest.mark.slow  # one torchrun start of five LoRA runs, and one process
def test_the_final_adapter_and_the_merged_model_load_and_agree(lora_runs):
    from peft import PeftModel

    run = lora_runs["runs"]["dpo"]
    assert (run / lora.ADAPTER_DIR / "adapter_config.json").is_file()
    merged = load_causal_lm(str(run / "final_model"), device="cpu", dtype="fp32")
    base = load_causal_lm("tiny", device="cpu", dtype="fp32")
    adapted = PeftModel.from_pretrained(base, str(run / lora.ADAPTER_DIR))
    assert not any("lora_" in k for k in merged.state_dict())
    ids = torch.tensor([[5, 17, 42, 99, 3, 250]])
    with torch.no_grad():
        via_adapter = adapted(input_ids=ids).logits
        via_merge = merged(input_ids=ids).logits
        plain = load_causal_lm("tiny", device="cpu", dtype="fp32")(input_ids=ids).logits
    torch.testing.assert_close(via_merge, via_adapter, rtol=1e-4, atol=1e-4)
    assert float((via_merge - plain).abs().max()) > 1e-4  # the adapters are in it


@pytest.mark.slow  # one torchrun start of five LoRA runs, and one process
def test_lora_reward_model_on_two_ranks_keeps_its_trained_head(lora_runs):
    from safetensors.torch import load_file

    from trainers.core.reward_model import load_reward_model

    run = lora_runs["runs"]["rm"]
    heads = load_file(str(run / lora.ADAPTER_DIR / lora.HEAD_FILE))
    assert heads and all(k.startswith("head.") for k in heads)
    model, _ = load_reward_model(str(run / "final_model"), device="cpu")
    saved_head = dict(model.head.state_dict())
    for k, v in heads.items():
        torch.testing.assert_close(saved_head[k.removeprefix("head.")].float(), v)


@pytest.mark.slow  # one torchrun start of five LoRA runs, and one process
def test_lora_stop_and_resume_on_two_ranks_equals_an_uninterrupted_run(lora_runs):
    stopped, straight = lora_runs["runs"]["sft_stopped"], lora_runs["runs"]["sft"]
    assert "resumed from step-0000002" in lora_runs["output"]
    from torch.distributed.checkpoint import FileSystemReader

    ckpt = sorted((stopped / "checkpoints").glob("step-*"))[-1]
    keys = FileSystemReader(str(ckpt / "shards")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    optim_keys = [k for k in keys if k.startswith("optimizer.state.")]
    frozen = [k for k in model_keys + optim_keys if ".lora_" not in k]
    assert model_keys and optim_keys and not frozen, frozen  # not the frozen base
    assert_same_history(straight, stopped, rel=1e-6, abs_tol=1e-7)


# ---------------------------------------------------------------------------------------------
# The merge from a consolidated state dict (one process)
# ---------------------------------------------------------------------------------------------


def test_merged_state_equals_peft_merge_and_unload():
    model = lora.add_adapters(
        load_causal_lm("tiny", device="cpu", dtype="fp32"),
        LoraSection(enabled=True, rank=4, alpha=8.0, dropout=0.0),
    )
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    mine = lora.merged_state(state, model)
    theirs = model.merge_and_unload().state_dict()
    assert sorted(mine) == sorted(theirs)
    for k in theirs:
        torch.testing.assert_close(mine[k], theirs[k], rtol=0, atol=1e-6, msg=k)


def test_sixteen_bit_weights_with_lora_under_torchrun_are_one_clear_error():
    from trainers.core import distributed as dist_mod
    from trainers.core.config import ConfigError

    model = load_causal_lm("tiny", device="cpu", dtype="bf16")
    with dist_mod.world_as(dist_mod.World(rank=0, size=2)):  # rank 0 of 2, no group joined
        with pytest.raises(ConfigError, match="model.dtype=fp32"):
            lora.add_adapters(model, LoraSection(enabled=True, rank=4, alpha=8.0))


@pytest.mark.parametrize(
    ("module", "config", "sets", "message"),
    [
        (  # a trainer whose LoRA runs were not checked under torchrun
            "policy_gradients",
            "grpo.yaml",
            ["model.lora.enabled=true"],
            ["LoRA runs on one process for this trainer", "model.lora.enabled=false"],
        ),
        (  # a trainer not checked under torchrun at all
            "distillation",
            "distill.yaml",
            [],
            ["runs on one process in this version, not under torchrun", "python -m"],
        ),
        (  # the online loop of a family that otherwise runs under torchrun
            "direct_alignment",
            "online_dpo.yaml",
            [],
            ["online DPO runs on one process in this version", "python -m"],
        ),
    ],
)
def test_unchecked_torchrun_cases_are_refused_before_writing(
    tmp_path, module, config, sets, message
):
    """Each refuses with one clear error before the run folder exists (the torchrun variables
    set by hand: the refusal comes before the process group is joined)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "HF_HUB_OFFLINE": "1"}
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", f"trainers.{module}.train", "--config"]
    argv += [str(root / "trainers" / module / "configs" / config), "--run-dir", str(run_dir)]
    for kv in ["model.name=tiny", *sets]:
        argv += ["--set", kv]
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    for part in message:
        assert part in done.stderr, done.stderr[-2000:]
    assert not run_dir.exists()
