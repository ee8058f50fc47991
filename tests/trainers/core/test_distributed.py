"""Trainers under torchrun on CPU (gloo, 2 processes, started for real): N steps on 2 ranks equal
1 process with the same global batch for SFT, DPO and the preference reward model (losses,
metrics, final parameters); gradients are the global mean, not the ranks' sum; a run stopped by
SIGTERM and resumed on 2 ranks equals an uninterrupted one; a crash on one rank ends the run
``failed`` with that rank's error; rank 0 alone writes the run folder and every rank's lines are
prefixed. One torchrun start serves several runs (``dist_driver.py``): on this 2-core machine
start-up costs more than the runs.

Also the pure helpers of trainers/core/distributed.py and the CUDA branches, reached through the
one device query (``query_cuda``) that the tests replace."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import trainer_argv

from tests._helpers.paths import ROOT
from tests._helpers.quick_runs import TINY_FP32_ON_CPU
from trainers.core import distributed as dist_mod
from trainers.core.config import ConfigError
from trainers.core.distributed import (
    CudaInfo,
    RankPrefixed,
    World,
    check_divisible,
    even_length,
    gather_blocks,
    merge_weighted,
    rank_block,
    rank_seed,
    rank_share,
    world_from_env,
)
from trainers.core.loop import count_steps
from trainers.core.rundir import read_jsonl
from trainers.core.tiny import cache_root

DRIVER = Path(__file__).resolve().parent / "dist_driver.py"

LR = 1.0e-4
COMMON = [  # every family: 28 examples, 4 held out, up to 96 tokens
    *TINY_FP32_ON_CPU,
    "checkpoint.save_final_model=true",
    "data.max_samples=28",
    "data.eval_size=4",
    "data.max_length=96",
    f"train.learning_rate={LR}",
]
SFT = (
    "trainers.sft.train",
    ROOT / "trainers/sft/configs/sft.yaml",
    [
        *COMMON,
        "model.chat_template_source=null",
        "data.dataset=builtin:reasoning-sft",
        "train.max_steps=3",
        "eval.eval_every=3",
        "eval.sample_every=3",
        "eval.num_samples=1",
        "eval.sample_max_new_tokens=4",
    ],
)
DPO = (
    "trainers.direct_alignment.train",
    ROOT / "trainers/direct_alignment/configs/dpo.yaml",
    [
        *COMMON,
        "data.dataset=builtin:reasoning-preferences",
        "train.max_steps=3",
        "eval.eval_every=3",
        "eval.sample_every=0",
    ],
)
RM = (
    "trainers.reward_models.train",
    ROOT / "trainers/reward_models/configs/preference_rm.yaml",
    [
        *COMMON,
        "data.dataset=builtin:reasoning-preferences",
        "train.max_steps=2",
        "eval.eval_every=2",
        "eval.eval_batch_size=4",
        "eval.num_samples=1",
    ],
)
FAMILIES = {"sft": SFT, "dpo": DPO, "rm": RM}
PER_RANK = 2  # micro-batch per rank on 2 ranks; one process gets 2 x 2 (same global batch)


def spec(family: str, run_dir: Path, extra: list[str] = (), **kw) -> dict:
    module, config, overrides = FAMILIES[family]
    over = [*overrides, f"train.batch_size={PER_RANK}", *extra]
    return {"module": module, "argv": trainer_argv(config, run_dir, over, **kw)}


def run_one_process(family: str, run_dir: Path) -> int:
    import importlib

    module, config, overrides = FAMILIES[family]
    over = [*overrides, f"train.batch_size={2 * PER_RANK}"]
    return importlib.import_module(module).main(trainer_argv(config, run_dir, over))


def torchrun(specs: list[dict], where: Path, timeout: int = 900) -> tuple[list[int], str]:
    """Start 2 ranks with torchrun running ``specs`` in turn; (exit codes, output)."""
    path = where / "spec.json"
    path.write_text(json.dumps(specs, default=str))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "PYTHONPATH": str(ROOT),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--standalone", str(DRIVER), str(path)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    codes_file = Path(str(path) + ".codes")
    codes = json.loads(codes_file.read_text()) if codes_file.is_file() else []
    return codes, out.stdout + out.stderr


def failure_text(output: str, tail: int = 3000) -> str:
    """What a failed torchrun said: every line that names an error, a signal or a traceback's
    last frame (a rank's own message is often far from the end), then the output's tail."""
    marks = ("Error", "error:", "Signal", "signal", "Traceback", "Fatal", "terminate", "abort")
    flagged = [line for line in output.splitlines() if any(m in line for m in marks)]
    return "\n".join(flagged[-60:]) + "\n--- tail ---\n" + output[-tail:]


def rows(run_dir: Path, phase: str) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["phase"] == phase]


def final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    folder = run_dir / "final_model"
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update({f"{f.stem}/{k}": v for k, v in load_file(str(f)).items()})
    return out


STEP_KEYS_SKIPPED = ("timing/", "throughput/", "memory/", "mfu/")


def assert_same_history(
    one: Path, two: Path, rel: float = 2e-4, abs_tol: float = 5e-5, skip=()
) -> None:
    """Every train and eval row of ``two`` equals ``one``'s (timings aside), step by step.

    Tolerance: sums in another order differ in the last float bits, and Adam turns a gradient
    component that is ~0 on both sides but of opposite sign into a full ``lr`` step either way,
    so after the first update the runs drift by a small multiple of the learning rate (1e-4
    here); the first step's loss and gradient norm (before any update) agree to float
    rounding. A rank-sum instead of a mean, a rank's share counted twice or a metric taken
    from one rank are off by far more (the gradient test below pins the sum)."""
    for phase in ("train", "eval"):
        a, b = rows(one, phase), rows(two, phase)
        assert [r["step"] for r in a] == [r["step"] for r in b], phase
        for ra, rb in zip(a, b, strict=True):
            keys = {k for k in ra if k not in ("time_s",) and not k.startswith(STEP_KEYS_SKIPPED)}
            assert keys == {k for k in rb if k != "time_s" and not k.startswith(STEP_KEYS_SKIPPED)}
            for k in keys:
                if (phase, ra["step"], k) in skip:
                    continue
                if isinstance(ra[k], float):
                    assert rb[k] == pytest.approx(ra[k], rel=rel, abs=abs_tol), (
                        phase,
                        ra["step"],
                        k,
                    )
                else:
                    assert rb[k] == ra[k], (phase, ra["step"], k)


def assert_same_params(one: Path, two: Path, steps: int | None = None) -> None:
    """The final weights agree to float rounding, but for the few elements (at most 1 in
    10,000) where Adam turned a ~0 gradient of opposite sign into a step of up to ``lr`` either
    way (``assert_same_history``); ``steps`` None: bit for bit up to 1e-7."""
    a, b = final_params(one), final_params(two)
    assert a and sorted(a) == sorted(b)
    diffs = torch.cat([(a[k].float() - b[k].float()).abs().flatten() for k in a])
    if steps is None:
        assert float(diffs.max()) < 1e-7
        return
    assert float(diffs.max()) <= 2 * LR * steps, float(diffs.max())
    assert int((diffs > 1e-6).sum()) <= diffs.numel() // 10_000


# ---------------------------------------------------------------------------------------------
# One torchrun start: SFT, DPO, RM on 2 ranks; a stopped-and-resumed SFT run; the gradient and
# bf16 checks
# ---------------------------------------------------------------------------------------------


# two-process runs under torchrun in the module fixtures: a long file (scheduled early)
pytestmark = pytest.mark.slow


def cache_without_reference_logps(where: Path) -> Path:
    """A cache of its own under ``where``, linking every entry of the real cache but the
    reference log-probs, so that DPO computes those here, on the ranks under test."""
    cache = where / "cache"
    cache.mkdir()
    real = cache_root()
    for entry in real.iterdir() if real.is_dir() else []:
        if entry.name != "ref_logps":
            (cache / entry.name).symlink_to(entry)
    return cache


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    where = tmp_path_factory.mktemp("two-ranks")
    runs = {name: where / name for name in ("sft", "dpo", "rm", "sft_stopped")}
    specs = [spec(name, runs[name]) for name in ("sft", "dpo", "rm")]
    # a stop at the 2nd step's micro-batch (each rank signals itself there): the step ends,
    # every rank checkpoints it, the run ends `stopped`; then --resume runs to the end
    specs.append(
        {**spec("sft", runs["sft_stopped"]), "env": {"RLHF_LAB_SIGTERM_AT": "micro_batch:2"}}
    )
    specs.append(spec("sft", runs["sft_stopped"], resume=True))
    specs.append({"call": "dist_driver:gradient_check", "args": [str(where / "grads.pt")]})
    specs.append({"call": "dist_driver:bf16_step", "args": [str(where / "bf16.json")]})
    # last (it ends the processes): a fault injected on rank 1 only
    runs["crash"] = where / "crash"
    specs.append({**spec("sft", runs["crash"]), "rank_env": {"1": {"RLHF_LAB_FAULT_AT_STEP": "1"}}})
    specs[1]["env"] = {"RLHF_LAB_CACHE": str(cache_without_reference_logps(where))}
    codes, output = torchrun(specs, where)
    return {"where": where, "runs": runs, "codes": codes, "output": output}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("one-process")
    runs = {}
    for family in ("sft", "dpo", "rm"):
        runs[family] = where / family
        assert run_one_process(family, runs[family]) == 0
    return runs


def test_the_two_rank_runs_succeed_and_rank_zero_alone_writes(two_ranks):
    codes, output = two_ranks["codes"], two_ranks["output"]
    # the last run crashes on rank 1, which records its code before it ends; torchrun then
    # stops rank 0, which may or may not have written that run's code (it is 1 when it did)
    rank1 = json.loads((two_ranks["where"] / "spec.json.codes.rank1").read_text())
    assert rank1 == [0, 0, 0, 143, 0, 0, 0, 1], failure_text(output)
    assert codes[:7] == [0, 0, 0, 143, 0, 0, 0] and codes[7:] in ([], [1]), failure_text(output)
    sft = two_ranks["runs"]["sft"]
    summary = json.loads((sft / "summary.json").read_text())
    assert summary["outcome"] == "succeeded"
    assert summary["distributed"] == {"world_size": 2, "backend": "gloo"}
    steps = [r["step"] for r in rows(sft, "train")]
    assert steps == [1, 2, 3]  # once each: rank 1 wrote no row
    assert [r["step"] for r in read_jsonl(sft / "samples.jsonl")] == [0, 3]  # once each
    lines = output.splitlines()
    assert any(line.startswith("[rank 1] step 3/3") for line in lines)
    assert any(line.startswith("[rank 0] step 3/3") for line in lines)


@pytest.mark.parametrize("family", ["sft", "dpo", "rm"])
def test_two_ranks_equal_one_process_with_the_same_global_batch(two_ranks, one_process, family):
    one, two = one_process[family], two_ranks["runs"][family]
    skip = set()
    if family == "dpo":  # its reference log-probs were computed on the 2 ranks, not read
        assert json.loads((two / "summary.json").read_text())["ref_cache"] == "miss"
        # at step 1 the policy is the reference: every margin is 0 up to float rounding, so
        # the share of positive margins counts rounding noise
        skip = {("train", 1, "accuracy")}
    first = rows(one, "train")[0]
    assert rows(two, "train")[0]["loss"] == pytest.approx(first["loss"], rel=1e-5)
    assert rows(two, "train")[0]["grad_norm"] == pytest.approx(first["grad_norm"], rel=1e-4)
    assert_same_history(one, two, skip=skip)
    assert_same_params(one, two, steps=len(rows(one, "train")))


def test_stop_on_two_ranks_checkpoints_and_resume_equals_an_uninterrupted_run(two_ranks):
    stopped, straight = two_ranks["runs"]["sft_stopped"], two_ranks["runs"]["sft"]
    ckpt = sorted((stopped / "checkpoints").glob("step-*"))
    assert [p.name for p in ckpt] == ["step-0000003"]  # keep_last 1: the final one
    assert {"rng-rank0.pt", "rng-rank1.pt", "state.pt", "shards"} <= {
        p.name for p in ckpt[0].iterdir()
    }
    assert "resumed from step-0000002" in two_ranks["output"]
    assert json.loads((stopped / "summary.json").read_text())["outcome"] == "succeeded"
    assert_same_history(straight, stopped, rel=1e-6, abs_tol=1e-7)
    assert_same_params(straight, stopped)


def test_gradients_are_the_global_mean_not_the_sum_of_ranks(two_ranks):
    """Each rank back-propagates its share of the global mean loss over 4 sequences (2 each);
    the sharded gradient must equal one process's gradient of the mean over all 4: a rank sum
    of per-rank means would be twice it."""
    from dist_driver import GRAD_BATCH, grad_model, mean_loss

    saved = torch.load(two_ranks["where"] / "grads.pt", weights_only=True)
    model = grad_model()
    mean_loss(model, GRAD_BATCH).backward()
    expected = {n: p.grad for n, p in model.named_parameters()}
    assert sorted(saved) == sorted(expected)
    for name, grad in expected.items():
        torch.testing.assert_close(saved[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    total = sum(float(g.norm() ** 2) for g in expected.values()) ** 0.5
    got = sum(float(g.norm() ** 2) for g in saved.values()) ** 0.5
    assert got == pytest.approx(total, rel=1e-4)  # not 2x: averaged, not summed


def test_fsdp_step_with_bf16_mixed_precision_on_gloo(two_ranks):
    """MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) as on CUDA, on gloo: one
    step's loss and gradient norm stay finite and within bf16 rounding of fp32."""
    result = json.loads((two_ranks["where"] / "bf16.json").read_text())
    assert math.isfinite(result["bf16_loss"]) and math.isfinite(result["bf16_grad_norm"])
    assert result["bf16_loss"] == pytest.approx(result["fp32_loss"], rel=2e-2)
    assert result["bf16_grad_norm"] == pytest.approx(result["fp32_grad_norm"], rel=5e-2)
    assert result["param_dtype_in_forward"] == "torch.bfloat16"
    assert result["sharded_param_dtype"] == "torch.float32"


# ---------------------------------------------------------------------------------------------
# A crash on one rank
# ---------------------------------------------------------------------------------------------


def test_a_crash_on_one_rank_fails_the_run_with_that_ranks_error(two_ranks):
    summary = json.loads((two_ranks["runs"]["crash"] / "summary.json").read_text())
    assert summary["outcome"] == "failed", two_ranks["output"][-3000:]
    assert summary["error"].startswith("rank 1: InjectedFault: injected fault at step 1")


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------


def test_world_from_torchrun_variables():
    w = world_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (w.rank, w.size, w.local_rank, w.distributed, w.is_main) == (3, 4, 1, True, False)
    assert not world_from_env({}).distributed
    with pytest.raises(ValueError, match="impossible"):
        world_from_env({"RANK": "4", "WORLD_SIZE": "4"})


def test_rank_shares_are_disjoint_and_cover_the_step():
    ids = [7, 3, 9, 1, 4, 8]
    shares = [rank_share(ids, r, 3) for r in range(3)]
    assert shares == [[7, 1], [3, 4], [9, 8]]
    assert sorted(sum(shares, [])) == sorted(ids)
    assert even_length(7, 2) == 6 and even_length(1, 2) == 0


def test_an_epoch_under_two_ranks_drops_a_last_step_smaller_than_the_world():
    assert count_steps(10, 4, 1, None, world_size=2) == (3, 3)  # last step: 2 examples
    assert count_steps(9, 4, 1, None, world_size=2) == (2, 2)  # last step would hold 1
    assert count_steps(9, 4, 1, None) == (3, 3)  # one process: as before


def test_rank_blocks_pad_with_repeats_and_gather_back_in_order():
    blocks = [rank_block(5, r, 4) for r in range(4)]
    assert blocks == [[0, 1], [2, 3], [4, 4], [4, 4]]
    assert all(len(b) == len(blocks[0]) for b in blocks)
    n = 5
    gathered = torch.cat([torch.tensor(b, dtype=torch.float) for b in blocks])[:n]
    assert gathered.tolist() == [0, 1, 2, 3, 4]
    assert gather_blocks(torch.arange(3.0), 2).tolist() == [0.0, 1.0]  # one process


def test_metric_sums_and_weights_merge_across_ranks():
    # rank 0: loss 1.0 over 3 tokens; rank 1: loss 2.0 over 1 token -> 1.25 token-weighted
    sums, weights = merge_weighted([({"loss": 3.0}, {"loss": 3.0}), ({"loss": 2.0}, {"loss": 1.0})])
    assert sums["loss"] / weights["loss"] == pytest.approx(1.25)


def test_a_batch_the_ranks_cannot_share_is_one_clear_error():
    check_divisible(8, "rollout.prompts_per_step", size=4)
    with pytest.raises(ConfigError, match=r"is 6.*4 processes cannot share evenly.*\[1, 2, 3\]"):
        check_divisible(6, "rollout.prompts_per_step", size=4)


def test_sampling_seeds_differ_per_rank_and_rank_zero_keeps_the_config_seed():
    assert [rank_seed(7, r) for r in range(3)] == [7, 8, 9]


def test_rank_prefix_on_every_line():
    import io

    buf = io.StringIO()
    out = RankPrefixed(buf, 1)
    out.write("a\nb")
    out.write("c\n")
    out.write("d\n")
    assert buf.getvalue() == "[rank 1] a\n[rank 1] bc\n[rank 1] d\n"


# ---------------------------------------------------------------------------------------------
# The CUDA branches through the one device query
# ---------------------------------------------------------------------------------------------


TWO_GPUS = CudaInfo(count=2, bf16=True)


def test_with_gpus_the_backend_is_nccl_and_each_rank_takes_its_own_gpu():
    from trainers.core.models import pick_attn_implementation, pick_device, pick_dtype

    with dist_mod.world_as(World(rank=1, size=2, local_rank=1)) as rank_1:
        assert dist_mod.wants_cuda("auto", TWO_GPUS) and dist_mod.backend_for("cuda") == "nccl"
        device = dist_mod.rank_device(pick_device("auto", TWO_GPUS), TWO_GPUS)
        assert device == torch.device("cuda", 1)
        dtype = pick_dtype("auto", device, TWO_GPUS)
        assert dtype == torch.bfloat16
        attn = pick_attn_implementation("auto", device, dtype, TWO_GPUS)
        assert attn in ("flash_attention_2", "sdpa")
        # FSDP on CUDA keeps fp32 parameters and computes in bf16
        assert dist_mod.plan_precision(device, dtype) == torch.float32
        assert rank_1.mixed_precision == torch.bfloat16
        assert dist_mod.describe()["mixed_precision"] == "bf16 params, fp32 reductions"
    assert dist_mod.world() != rank_1  # the block's world is gone


def test_more_ranks_than_gpus_is_one_clear_error():
    with dist_mod.world_as(World(rank=2, size=3, local_rank=2)):
        with pytest.raises(dist_mod.WorldError, match="local rank 2 has no GPU: 2 CUDA device"):
            dist_mod.rank_device(torch.device("cuda"), TWO_GPUS)


def test_without_gpus_auto_means_cpu_and_gloo():
    from trainers.core.models import pick_device

    assert pick_device("auto", CudaInfo()) == torch.device("cpu")
    assert not dist_mod.wants_cuda("auto", CudaInfo()) and dist_mod.backend_for("cpu") == "gloo"
