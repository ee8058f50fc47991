"""Rejection sampling: the four selection strategies, the shared cache and its key, GSM8K loading
and answer matching, diagnostics on a hand-made pool, bad input, and end-to-end runs on the tiny
model (a warm start on chain_sum, verifier-scored; a GSM8K-fixture run scored by a reward model;
stop and resume)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from conftest import assert_complete_run_dir as assert_complete_trainer_run
from conftest import assert_phases, trainer_argv

from tests._helpers.learning_runs import trained_model
from tests._helpers.paths import FIXTURES, configs_of
from tests._helpers.quick_runs import RS_ON_GSM8K_FIXTURE
from tests._helpers.refusals import assert_refused_before_writing, refused_before_writing_test
from tests._helpers.threads import one_torch_thread  # noqa: F401  (autouse)
from trainers.core.config import load_config
from trainers.core.rundir import read_jsonl
from trainers.rejection_sampling import pipeline
from trainers.rejection_sampling import train as rs_train
from trainers.rejection_sampling.config import (
    MATCHED_CONTROL,
    RejectionSamplingConfig,
    selection_size,
)
from trainers.rejection_sampling.diagnostics import (
    PLOT_FILES,
    best_of_n_curve,
    decidable_counts,
    diagnose,
    diagnostic_metrics,
    win_rates,
    write_plots,
)
from trainers.rejection_sampling.selection import (
    argmax_first,
    random_k_overall,
    random_per_prompt,
    select,
    top_k_overall,
    top_per_prompt,
)
from trainers.rejection_sampling.spec import FAMILY as RS_FAMILY

CONFIGS = configs_of("rejection_sampling")
GSM8K_FIXTURE = FIXTURES / "gsm8k.jsonl"

EASY_CHAIN_SUM = "data.builtin_task_configs={chain_sum: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}"

QUICK = [
    "model.name=tiny",
    "model.dtype=fp32",
    "data.dataset=builtin:chain_sum",
    EASY_CHAIN_SUM,
    "data.max_train_samples=24",
    "data.max_test_samples=16",
    "generation.num_completions_per_prompt=6",
    "generation.temperature=0.7",
    "generation.top_p=1.0",
    "generation.top_k=0",
    "generation.max_new_tokens=32",
    "generation.rollout_batch_size=24",
    "top_k=24",
    "sft.learning_rate=1.0e-4",
    "sft.batch_size=8",
    "sft.gradient_accumulation_steps=1",
    "sft.num_epochs=1",
    "sft.max_seq_length=128",
    "eval.eval_max_new_tokens=32",
    "eval.eval_batch_size=16",
    "eval.num_samples=2",
]

GSM8K_QUICK = [
    *RS_ON_GSM8K_FIXTURE,
    "model.dtype=fp32",
    "sft.learning_rate=1.0e-4",
    "sft.batch_size=2",
]


def run(strategy: str, run_dir: Path, overrides: list[str], resume: bool = False) -> int:
    return rs_train.main(trainer_argv(CONFIGS / f"{strategy}.yaml", run_dir, overrides, resume))


def quick_config(strategy: str = "top_per_prompt", extra: list[str] | None = None):
    return load_config(
        CONFIGS / f"{strategy}.yaml", RejectionSamplingConfig, [*QUICK, *(extra or [])]
    )


# ---------------------------------------------------------------------------------------------
# Selection strategies
# ---------------------------------------------------------------------------------------------

SCORES = [
    [0.2, 0.9, 0.1, 0.9],  # a tie for the top: the first index (1) wins
    [0.5, 0.4, 0.3, 0.1],
    [0.0, 0.1, 0.8, 0.7],
]


def test_top_per_prompt_takes_the_argmax_and_breaks_ties_by_first_index():
    assert top_per_prompt(SCORES) == [(0, 1), (1, 0), (2, 2)]
    assert argmax_first([1.0, 1.0, 1.0]) == 0
    assert argmax_first([float("nan"), -5.0, float("nan")]) == 1  # NaN ranks lowest


def test_top_k_overall_is_a_stable_sort_of_the_flat_pool():
    assert top_k_overall(SCORES, 4) == [(0, 1), (0, 3), (2, 2), (2, 3)]
    assert top_k_overall(SCORES, 1) == [(0, 1)]
    assert len(top_k_overall(SCORES, 100)) == 12  # capped by the pool
    tied = [[1.0, 1.0], [1.0, 1.0]]
    assert top_k_overall(tied, 3) == [(0, 0), (0, 1), (1, 0)]  # ties keep pool order


def test_random_strategies_are_seeded_and_match_their_counterparts_sizes():
    a = random_per_prompt(SCORES, seed=42)
    assert a == random_per_prompt(SCORES, seed=42)
    assert [i for i, _ in a] == [0, 1, 2]  # one per prompt, every prompt
    assert all(0 <= j < 4 for _, j in a)
    draws = {tuple(random_per_prompt(SCORES, seed=s)) for s in range(20)}
    assert len(draws) > 1  # the seed matters

    b = random_k_overall(SCORES, 5, seed=7)
    assert b == random_k_overall(SCORES, 5, seed=7)
    assert len(set(b)) == 5  # without replacement
    assert random_k_overall(SCORES, 5, seed=8) != b
    assert sorted(random_k_overall(SCORES, 100, seed=1)) == sorted(
        (i, j) for i in range(3) for j in range(4)
    )

    for k in (1, 5, 12, 40):
        top = select("top_k_overall", SCORES, top_k=k, seed=0)
        rnd = select("random_k_overall", SCORES, top_k=k, seed=0)
        assert len(top) == len(rnd) == selection_size("top_k_overall", 3, 4, k)
    assert len(select("top_per_prompt", SCORES, top_k=1, seed=0)) == len(
        select("random_per_prompt", SCORES, top_k=1, seed=0)
    )
    assert {MATCHED_CONTROL[MATCHED_CONTROL[s]] for s in RS_FAMILY.algorithm_names} == set(
        RS_FAMILY.algorithm_names
    )
    with pytest.raises(ValueError, match="unknown strategy"):
        select("best_of_n", SCORES, top_k=1, seed=0)


# ---------------------------------------------------------------------------------------------
# The cache key
# ---------------------------------------------------------------------------------------------


def _key(cfg) -> str:
    prompts, _ = pipeline.load_prompts(cfg)
    fields = pipeline.cache_fields(cfg, prompts, device="cpu", dtype="float32", attn="sdpa")
    return pipeline.cache_key(fields)


def _fake_reward_model(folder: Path, head: bytes = b"head") -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "reward_head.safetensors").write_bytes(head)
    (folder / "reward_model.json").write_text('{"format_version": 1, "kind": "orm"}')
    return folder


def test_cache_key_leaves_out_the_strategy_and_keeps_everything_that_changes_the_pool(tmp_path):
    base = _key(quick_config())
    for strategy in RS_FAMILY.algorithm_names:  # one pool for the four strategies
        assert _key(quick_config(strategy)) == base
    same = [
        "top_k=3",
        "sft.learning_rate=1.0e-3",
        "sft.num_epochs=3",
        "eval.eval_max_new_tokens=64",
        "data.max_test_samples=4",
        "diagnostics.plots=false",
        "logging.log_every=5",
    ]
    for item in same:
        assert _key(quick_config(extra=[item])) == base, item
    changed = [
        "generation.num_completions_per_prompt=4",
        "generation.temperature=0.9",
        "generation.top_p=0.9",
        "generation.top_k=5",
        "generation.max_new_tokens=16",
        "generation.rollout_batch_size=8",
        "seed=7",
        "data.max_train_samples=12",
        "data.system_prompt=Answer briefly.",
        "model.name=tiny-llama",
        f"scorer.name={_fake_reward_model(tmp_path / 'rm')}",
    ]
    keys = {item: _key(quick_config(extra=[item])) for item in changed}
    for item, key in keys.items():
        assert key != base, item
    assert len(set(keys.values())) == len(changed)  # all different from each other too
    # a retrained reward model in the same folder is a different scorer
    rm_key = keys[changed[-1]]
    (tmp_path / "rm" / "reward_head.safetensors").write_bytes(b"retrained head")
    assert _key(quick_config(extra=[f"scorer.name={tmp_path / 'rm'}"])) != rm_key
    # runtime: device / dtype are part of the key
    cfg = quick_config()
    prompts, _ = pipeline.load_prompts(cfg)
    on_gpu = pipeline.cache_fields(cfg, prompts, device="cuda", dtype="bfloat16", attn="sdpa")
    assert pipeline.cache_key(on_gpu) != base


# ---------------------------------------------------------------------------------------------
# GSM8K: the fixture and exact match
# ---------------------------------------------------------------------------------------------


def test_gsm8k_fixture_loads_with_the_real_schema():
    rows = [json.loads(line) for line in GSM8K_FIXTURE.read_text().splitlines()]
    assert 6 <= len(rows) <= 10 and all(set(r) == {"question", "answer"} for r in rows)
    cfg = load_config(
        CONFIGS / "top_per_prompt.yaml",
        RejectionSamplingConfig,
        [f"data.dataset={GSM8K_FIXTURE}", "data.max_train_samples=4", "data.max_test_samples=3"],
    )
    train, test = pipeline.load_prompts(cfg)
    assert len(train) == 4 and len(test) == 3  # the last 3 rows are held out
    assert test[-1].question == rows[-1]["question"]
    assert {p.question for p in train}.isdisjoint(p.question for p in test)
    whole = load_config(
        CONFIGS / "top_per_prompt.yaml",
        RejectionSamplingConfig,
        [f"data.dataset={GSM8K_FIXTURE}", "data.max_train_samples=null", "data.max_test_samples=0"],
    )
    everything, none = pipeline.load_prompts(whole)
    assert none == []
    golds = [p.gold for p in everything]
    assert golds == ["12", "110", "1250", "-3", "36", "87", "45", "3950"]
    assert pipeline.system_prompt_for(cfg).endswith("within \\boxed{}.")
    assert train[0].messages(pipeline.system_prompt_for(cfg))[0]["role"] == "system"


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("Some work.\n#### 72", "72"),
        ("#### 1,250", "1250"),
        ("It drops below zero.\n#### -3", "-3"),
        ("#### $1,000.", "1000"),
        ("no final line", None),
    ],
)
def test_gold_answer_after_the_hash_line(answer, gold):
    assert pipeline.gsm8k_gold(answer) == gold


@pytest.mark.parametrize(
    ("completion", "prediction", "gold", "correct"),
    [
        ("So the answer is \\boxed{1,250}.", "1250", "1250", True),
        ("\\boxed{12} ... wait, recheck: \\boxed{\\frac{24}{2}}", "2", "12", False),
        ("\\boxed{x = 45 km}", "45", "45", True),
        ("First 3 + 4 = 7.\n#### -3", "-3", "-3", True),
        ("The temperature is \u22123 degrees", "-3", "-3", True),  # unicode minus
        ("12 apples and then 36", "36", "36", True),
        ("She has 36.0 dollars left.", "36.0", "36", True),
        ("I give up.", None, "36", False),
        ("#### 3,950", "3950", "3950", True),
        ("the answer is 3950", "3950", "3,950", False),  # gold is normalised by gsm8k_gold
    ],
)
def test_exact_match_extraction(completion, prediction, gold, correct):
    assert pipeline.extract_gsm8k_prediction(completion) == prediction
    assert pipeline.answers_match(prediction, gold) is correct


def test_verifier_scores_builtin_tasks_with_reasoning_gym():
    cfg = quick_config(extra=["data.max_train_samples=4", "data.max_test_samples=4"])
    train, test = pipeline.load_prompts(cfg)
    assert {p.question for p in train}.isdisjoint(p.question for p in test)
    p = train[0]
    right = f"<think>adding</think>\n<answer>{p.gold}</answer>"
    wrong = f"<think>adding</think>\n<answer>{int(p.gold) + 1}</answer>"
    assert pipeline.verify(p, right)[:2] == (1.0, True)
    assert pipeline.verify(p, wrong)[1] is False
    assert pipeline.verify(p, "no tags")[1] is False


# ---------------------------------------------------------------------------------------------
# Diagnostics on a hand-made pool
# ---------------------------------------------------------------------------------------------

POOL_SCORES = [
    [0.9, 0.1, 0.5, 0.2],  # decidable; the top pick (0) is correct
    [0.3, 0.8, 0.1, 0.0],  # decidable; the top pick (1) is wrong
    [0.5, 0.5, 0.5, 0.5],  # all correct
    [0.1, 0.2, 0.3, 0.4],  # all wrong
]
POOL_CORRECT = [
    [True, False, False, False],
    [True, False, True, True],
    [True, True, True, True],
    [False, False, False, False],
]


def test_diagnostics_numbers_on_a_hand_made_pool():
    d = decidable_counts(POOL_CORRECT)
    assert (d["all_correct"], d["all_wrong"], d["mixed"]) == (1, 1, 2)
    assert d["decidable_frac"] == pytest.approx(0.5)

    w = win_rates(POOL_SCORES, POOL_CORRECT)
    # prompt 0: t=1, p=1/4 -> 3/4 + ½·1/4 = 0.875; prompt 1: t=0, p=3/4 -> ½·1/4 = 0.125
    assert w["per_prompt_win"] == pytest.approx([0.875, 0.125])
    assert w["win_rate"] == pytest.approx(0.5)
    assert w["top_hit_rate"] == pytest.approx(0.5)
    assert w["random_hit_rate"] == pytest.approx((0.25 + 0.75) / 2)

    c = best_of_n_curve(POOL_SCORES, POOL_CORRECT)
    assert c["n"] == [1, 2, 3, 4]
    # n=1: the first completion of each prompt -> correct, correct, correct, wrong
    assert c["top"][0] == pytest.approx(0.75) and c["random"][0] == pytest.approx(0.75)
    # n=2: argmax over the first two -> idx0 (T), idx1 (F), idx0 (T), idx1 (F)
    assert c["top"][1] == pytest.approx(0.5)
    assert c["random"][1] == pytest.approx((0.5 + 0.5 + 1 + 0) / 4)
    assert c["oracle"] == pytest.approx([0.75, 0.75, 0.75, 0.75])
    # n=4: argmaxes 0 (T), 1 (F), 0 (T), 3 (F)
    assert c["top"][3] == pytest.approx(0.5)
    assert c["random"][3] == pytest.approx((0.25 + 0.75 + 1 + 0) / 4)

    diag = diagnose(POOL_SCORES, POOL_CORRECT)
    assert diag["pool_mean_correctness"] == pytest.approx(8 / 16)
    metrics = diagnostic_metrics(diag)
    assert metrics["diagnostics/decidable_frac"] == pytest.approx(0.5)
    assert metrics["diagnostics/win_rate"] == pytest.approx(0.5)
    assert metrics["diagnostics/best_of_n_top"] == pytest.approx(0.5)

    # a verifier-like scorer wins on every decidable prompt
    perfect = win_rates([[float(c) for c in row] for row in POOL_CORRECT], POOL_CORRECT)
    assert perfect["top_hit_rate"] == 1.0
    assert perfect["win_rate"] == pytest.approx(((1 - 0.125) + (1 - 0.375)) / 2)
    # no decidable prompt: nothing to report, no crash
    assert win_rates([[1.0]], [[True]])["win_rate"] is None


def test_diagnostic_plots_are_png_files(tmp_path):
    paths = write_plots(diagnose(POOL_SCORES, POOL_CORRECT), tmp_path / "plots", title="t")
    assert sorted(p.name for p in paths) == sorted(PLOT_FILES)
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list((tmp_path / "plots").glob(".*"))  # no temporary files left


def test_diagnostics_cli_reads_a_cache_file(tmp_path, capsys):
    from trainers.rejection_sampling.diagnostics import main as diag_main

    cache = tmp_path / "pool.json"
    cache.write_text(
        json.dumps(
            {
                "prompts": [
                    {"scores": s, "correct": c}
                    for s, c in zip(POOL_SCORES, POOL_CORRECT, strict=True)
                ]
            }
        )
    )
    assert diag_main(["--cache", str(cache), "--out-dir", str(tmp_path / "out")]) == 0
    assert "decidable fraction 0.500" in capsys.readouterr().out
    assert (tmp_path / "out" / "diagnostics.json").is_file()
    assert diag_main(["--cache", str(tmp_path / "missing.json")]) == 2


# ---------------------------------------------------------------------------------------------
# Bad input: one clear message, nothing written
# ---------------------------------------------------------------------------------------------


test_bad_input_fails_before_writing = refused_before_writing_test(
    [
        (["strategy=best_of_n"], "'strategy'"),
        (["generation.temperatur=1.0"], "Did you mean: temperature"),
        (["data.dataset=/no/such/file.jsonl"], "file not found"),
        (["data.dataset=builtin:no_such_task"], "unknown reasoning-gym task"),
        (["scorer.name=/no/such/reward_model"], "reward model folder"),
        (["model.name=/no/such/model"], "model.name"),
        (["data.dataset=openai/gsm8k"], "not in the local cache"),
        (["sft.eval_size=24"], "sft.eval_size"),
        (["data.builtin_task_configs={chain_sum: {}}", "data.dataset=openai/gsm8k"], "builtin"),
    ],
    lambda run_dir, overrides: run("top_per_prompt", run_dir, [*GSM8K_QUICK, *overrides]),
)


def test_wrong_schema_file_fails_before_writing(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "2 + 2?", "completion": "4"}\n' * 4)
    run_dir = tmp_path / "run"
    assert_refused_before_writing(
        run("top_per_prompt", run_dir, [*GSM8K_QUICK, f"data.dataset={bad}"]),
        run_dir,
        capsys,
        "GSM8K schema",
    )


# ---------------------------------------------------------------------------------------------
# End to end on the tiny model
# ---------------------------------------------------------------------------------------------


def assert_complete_run_dir(path: Path) -> dict:
    """The shared run-folder check (rows not checked, as before) plus what rejection sampling
    adds: the selection, diagnostics and plots, a final model and checkpoints."""
    summary = assert_complete_trainer_run(
        path, extra_files=("selection.jsonl", "diagnostics.json"), check_rows=False
    )
    for name in PLOT_FILES:
        assert (path / "plots" / name).is_file(), name
    assert (path / "final_model" / "config.json").is_file()
    assert list((path / "checkpoints").glob("step-*"))
    assert summary["steps"] > 0  # progress == total == steps: checked by the shared check
    rows = read_jsonl(path / "metrics.jsonl")
    assert all({"step", "time_s", "phase"} <= set(r) for r in rows)
    rollout = [r for r in rows if r["phase"] == "rollout"]
    assert len(rollout) == 1 and rollout[0]["step"] == 0
    for key in (
        "pool/mean_correctness",
        "selection/size",
        "selection/mean_correctness",
        "selection/control_mean_correctness",
        "diagnostics/decidable_frac",
        "timing/generate_s",
        "timing/score_s",
    ):
        assert key in rollout[0], key
    evals = [r for r in rows if r["phase"] == "eval" and "eval/exact_match" in r]
    assert [r["step"] for r in evals] == [0, summary["steps"]]  # before SFT, after SFT
    train_rows = [r for r in rows if r["phase"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, summary["steps"] + 1))
    assert all("loss" in r and "grad_norm" in r for r in train_rows)
    selection = read_jsonl(path / "selection.jsonl")
    assert (
        len(selection)
        == rollout[0]["selection/size"]
        == summary["rollout_metrics"]["selection/size"]
    )
    assert selection[0]["messages"][-1]["role"] == "assistant"
    kinds = {s.get("kind") for s in read_jsonl(path / "samples.jsonl")}
    assert {"selection", "eval"} <= kinds
    return summary


@pytest.fixture(scope="module")
def warm_start(tmp_path_factory) -> Path:
    """A brief SFT of `tiny` on easy chain_sum demonstrations (the trainers/sft warm-start
    recipe, shortened): sampled completions then get some, not all, answers right."""
    from trainers.sft import train as sft_train

    run_dir = tmp_path_factory.mktemp("warm") / "sft"
    overrides = [
        *sft_train.warm_start_overrides(),
        "data.dataset=builtin:reasoning-sft:chain_sum",
        EASY_CHAIN_SUM,
        "data.max_samples=1208",
        "data.eval_size=8",
        "data.max_length=128",
        "eval.eval_every=0",
        "eval.sample_every=0",
        "eval.num_samples=0",
    ]
    return trained_model(sft_train.main, sft_train.CONFIGS / "sft.yaml", run_dir, overrides)


@pytest.fixture(scope="module")
def strategy_pair(tmp_path_factory, warm_start):
    """top_per_prompt then random_per_prompt on one pool; counts the generation calls."""
    base = tmp_path_factory.mktemp("rs")
    calls = []
    real = pipeline.generate_pool

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    overrides = [*QUICK, f"model.name={warm_start}"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "generate_pool", counting)
        assert run("top_per_prompt", base / "top", overrides) == 0
        first_calls = len(calls)
        assert run("random_per_prompt", base / "random", overrides) == 0
    return {"top": base / "top", "random": base / "random", "calls": (first_calls, len(calls))}


@pytest.mark.slow
def test_reward_selected_set_beats_its_random_control(strategy_pair):
    """LEARNING: with the verifier as scorer, top_per_prompt's selection is more often correct
    than random_per_prompt's (same pool, same size), and the pool has contrast to select on."""
    top = assert_complete_run_dir(strategy_pair["top"])
    rnd = assert_complete_run_dir(strategy_pair["random"])
    t, r = top["rollout_metrics"], rnd["rollout_metrics"]
    assert t["diagnostics/decidable_frac"] > 0.1, t
    assert 0.0 < t["pool/mean_correctness"] < 1.0
    assert t["selection/size"] == r["selection/size"] == 24
    assert t["selection/mean_correctness"] > r["selection/mean_correctness"] + 0.05, (t, r)
    # each run also reports what its matched control would have selected from the pool
    assert t["selection/control_mean_correctness"] == pytest.approx(r["selection/mean_correctness"])
    assert r["selection/control_mean_correctness"] == pytest.approx(t["selection/mean_correctness"])
    # a verifier-scored top pick is correct on every decidable prompt
    assert t["diagnostics/top_hit_rate"] == 1.0
    assert top["diagnostics"] == rnd["diagnostics"]  # the same pool


@pytest.mark.slow
def test_second_strategy_reuses_the_cached_pool(strategy_pair):
    first_calls, total_calls = strategy_pair["calls"]
    assert first_calls == 1 and total_calls == 1  # the second run generated nothing
    top = json.loads((strategy_pair["top"] / "summary.json").read_text())
    rnd = json.loads((strategy_pair["random"] / "summary.json").read_text())
    assert top["cache"]["status"] == "miss" and rnd["cache"]["status"] == "hit"
    assert top["cache"]["path"] == rnd["cache"]["path"]
    assert Path(top["cache"]["path"]).parent.name == "rs_generations"
    assert rnd["cache"]["baseline_eval"] == "hit"
    assert top["baseline_eval"]["eval/exact_match"] == rnd["baseline_eval"]["eval/exact_match"]
    assert rnd["rollout_metrics"]["timing/generate_s"] == 0.0


def test_gsm8k_fixture_scored_by_a_reward_model(tmp_path):
    """The GSM8K path (local file, verifier correctness) with a reward model as the scorer."""
    from trainers.core.models import load_tokenizer
    from trainers.core.reward_model import build_reward_model, save_reward_model

    torch.manual_seed(0)
    rm = build_reward_model("tiny", "orm", max_length=256, device="cpu", dtype="fp32")
    folder = save_reward_model(rm, load_tokenizer("tiny"), tmp_path / "orm")
    overrides = [*GSM8K_QUICK, f"scorer.name={folder}", "scorer.device=cpu"]
    assert run("top_k_overall", tmp_path / "run", overrides) == 0
    summary = assert_complete_run_dir(tmp_path / "run")
    m = summary["rollout_metrics"]
    assert m["pool/num_prompts"] == 6 and m["pool/size"] == 12 and m["selection/size"] == 5
    scores = json.loads(Path(summary["cache"]["path"]).read_text())["prompts"][0]["scores"]
    assert all(0.0 < s < 1.0 for s in scores)  # ORM probabilities, not verifier 0/1
    assert summary["baseline_eval"]["eval/num_prompts"] == 2
    eval_samples = [
        s for s in read_jsonl(tmp_path / "run" / "samples.jsonl") if s["kind"] == "eval"
    ]
    assert eval_samples[0]["gold"] in {"45", "3950"}


def test_stop_during_sft_then_resume_keeps_one_history(tmp_path, sigterm_at):

    overrides = [*GSM8K_QUICK, "sft.num_epochs=2", "eval.baseline=true"]
    run_dir = tmp_path / "run"

    sigterm_at("step_end:1")  # a real SIGTERM at the end of step 1
    assert run("top_per_prompt", run_dir, overrides) == 143
    assert json.loads((run_dir / "summary.json").read_text())["outcome"] == "stopped"
    sigterm_at(None)
    assert run("top_per_prompt", run_dir, overrides, resume=True) == 0
    summary = assert_complete_run_dir(run_dir)
    assert summary["steps"] == 6  # 6 prompts / batch 2 × 2 epochs
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [(r["step"], r["phase"]) for r in rows if r["phase"] != "train"] == [
        (0, "rollout"),
        (0, "eval"),
        (6, "eval"),
    ]
    assert summary["cache"]["status"] == "hit"
    assert not math.isnan(summary["final_eval"]["eval/exact_match"])


def test_wandb_offline_gets_every_stage_in_one_run(tmp_path, monkeypatch, progress_writes, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "rlhf-lab-tests")
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert run("random_k_overall", tmp_path / "run", GSM8K_QUICK) == 0
    # no blind start: every stage says what it does, the total known once the prompts are read
    assert_phases(progress_writes, "tokenizing", "loading_model", "generating", "training")
    assert_phases(progress_writes, "training", "evaluating", "done")
    steps = json.loads((tmp_path / "run" / "summary.json").read_text())["steps"]
    assert progress_writes[2] == ("loading_model", 0, steps)
    out = capsys.readouterr().out
    for step in (0, steps):  # train.log: a line for the evaluation before and after SFT
        assert re.search(rf"^eval step {step}/{steps}: .*exact_match", out, re.M), out
    offline_runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1, offline_runs  # the SFT stage logs into the same W&B run
    data = b"".join(p.read_bytes() for p in offline_runs[0].glob("*.wandb"))
    for key in (b"pool/mean_correctness", b"grad_norm", b"eval/exact_match"):
        assert key in data, key
