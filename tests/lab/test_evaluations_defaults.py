"""What an evaluation asks when nobody names the tasks (issue 25, item 5): the tasks the target
run trained on, else the built-in mix, so `rlhf-lab eval <model>` and the evaluation the lab
proposes after a run trained on other data are never refused for want of ``prompts.tasks``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from rlhf_lab.evaluation.jobs import prepare_evaluation
from rlhf_lab.planning.configs import resolve_config
from rlhf_lab.planning.overrides import as_overrides
from tests.conftest import model_folder
from trainers.core.builtin_data import DEFAULT_BUILTIN_TASKS
from trainers.evaluation.config import EvalConfig
from trainers.evaluation.prompts import reasoning_prompts, reasoning_specs, tasks_source
from trainers.evaluation.targets import resolve_ref

pytestmark = pytest.mark.usefixtures("lab_root")


def trained_run(root: Path, recipe: str, overrides: list[str]) -> str:
    """A finished run folder of ``recipe`` on tiny (config.yaml and a final_model/ config)."""
    from trainers.core.tiny import ensure_preset

    run_dir = root / "runs" / recipe
    (run_dir / "final_model").mkdir(parents=True)
    data = resolve_config(recipe, as_overrides(["model.name=tiny", *overrides])).data
    (run_dir / "config.yaml").write_text(yaml.safe_dump(data))
    shutil.copy(ensure_preset("tiny") / "config.json", run_dir / "final_model" / "config.json")
    return str(run_dir)


def names(cfg: EvalConfig) -> list[str]:
    return [s.name for s in reasoning_specs(cfg, resolve_ref(cfg.target, "target"))]


def test_a_plain_model_is_evaluated_on_the_builtin_mix():
    cfg = EvalConfig(target="tiny")
    assert names(cfg) == list(DEFAULT_BUILTIN_TASKS)
    ref = resolve_ref("tiny", "target")
    assert tasks_source(cfg, ref) == "the built-in mix"
    prompts, info = reasoning_prompts(cfg.model_copy(update={"prompts": cfg.prompts}), ref)
    assert info["tasks_from"] == "the built-in mix" and len(prompts) == cfg.prompts.size
    assert {p.meta["task"] for p in prompts} == set(DEFAULT_BUILTIN_TASKS)
    # the lab's own check (what `rlhf-lab eval tiny` runs first) accepts it
    job = prepare_evaluation("tiny", "reasoning", baseline="none")
    assert job.config.get("prompts.tasks") == []


def test_a_run_is_evaluated_on_its_own_tasks_else_the_builtin_mix(lab_root):
    own = trained_run(lab_root, "sft", ["data.dataset=builtin:reasoning-sft:chain_sum"])
    assert names(EvalConfig(target=own)) == ["chain_sum"]
    pairs = lab_root / "pairs.jsonl"
    pairs.write_text("")
    other = trained_run(lab_root, "dpo", [f"data.dataset={pairs}"])  # not reasoning-gym data
    assert names(EvalConfig(target=other)) == list(DEFAULT_BUILTIN_TASKS)
    named = EvalConfig(target=other, prompts={"tasks": ["letter_counting"]})
    assert names(named) == ["letter_counting"]
    assert tasks_source(named, resolve_ref(other, "target")) == "prompts.tasks"


# ------------------------------------------------------------------ CPU-sized evaluation


def test_a_pretrained_model_on_a_cpu_is_evaluated_at_a_cpu_size(lab_root):
    from rlhf_lab.evaluation.jobs import (
        CPU_EVAL_NEW_TOKENS,
        CPU_EVAL_PROMPTS,
        EvalTarget,
        eval_config,
    )

    smol = EvalTarget(given="smol", path=model_folder(lab_root, "smol-135m"))
    cfg = eval_config("reasoning", smol, None, None, [], "cpu")
    # the shipped suite: 128 prompts x 8 samples x 256 tokens; here one sample of <= 128 tokens
    assert cfg["sampling"]["n"] == 1 and cfg["reasoning"]["pass_k"] == [1]
    assert cfg["sampling"]["max_new_tokens"] == CPU_EVAL_NEW_TOKENS
    assert cfg["prompts"]["size"] == CPU_EVAL_PROMPTS
    # the caller's overrides still win
    mine = eval_config(
        "reasoning", smol, None, None, ["sampling.n=4", "reasoning.pass_k=[1,4]"], "cpu"
    )
    assert mine["sampling"]["n"] == 4 and mine["reasoning"]["pass_k"] == [1, 4]
    # on a GPU, and for a built-in preset on a CPU, the shipped suite is kept
    gpu = eval_config("reasoning", smol, None, None, [], "cuda")
    tiny = eval_config("reasoning", EvalTarget(given="tiny", path="tiny"), None, None, [], "cpu")
    for shipped in (gpu, tiny):
        assert shipped["sampling"]["n"] == 8 and shipped["sampling"]["max_new_tokens"] == 256


def test_the_plans_evaluation_cost_counts_the_cpu_size(lab_root):
    from rlhf_lab.evaluation.cost import estimate_evaluation

    smol = model_folder(lab_root, "smol-135m")
    on_cpu = estimate_evaluation(smol, "reasoning", device="cpu")
    on_gpu = estimate_evaluation(smol, "reasoning", device="cuda")
    assert on_gpu.generated_tokens == 128 * 8 * 256 * 2  # target and its baseline
    assert on_cpu.generated_tokens == 128 * 1 * 128 * 2
