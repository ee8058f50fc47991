"""Policy-gradient trainer end to end on the tiny model: every algorithm, DAPO's dynamic sampling,
several updates per rollout, PPO's critic, resume, the π_old shortcut, and bad input that must
fail before anything is written.

A randomly initialised ``tiny`` model never earns a reward, so most tests run the trainer with a
stand-in verifier that guarantees contrast inside each group (``graded_rewards``, passed as the
trainer's ``verifier``): the update then has non-zero advantages and real gradients. The learning test (tests/trainers/policy_gradients/test_pg_learning.py)
uses the real rewards on an SFT warm start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_complete_run_dir, assert_same_gradients, trainer_argv
from stop_resume import assert_resume_equals_straight_run

from tests._helpers.paths import configs_of
from tests._helpers.quick_runs import PG_TWO_STEPS_ON_TINY
from tests._helpers.refusals import refused_before_writing_test
from tests._helpers.threads import one_torch_thread  # noqa: F401  (autouse)
from trainers.core.prompts import PromptStream
from trainers.core.rundir import read_jsonl
from trainers.core.verifier import Verifier, compute_rewards
from trainers.policy_gradients import rollout as pg_rollout
from trainers.policy_gradients import train as pg_train
from trainers.policy_gradients.config import PolicyGradientConfig, algorithm_spec
from trainers.policy_gradients.experience import assemble
from trainers.policy_gradients.spec import FAMILY as PG_FAMILY
from trainers.policy_gradients.token_passes import ValueModel, completion_token_stats

CONFIGS = configs_of("policy_gradients")
G = 4

TINY = [
    *PG_TWO_STEPS_ON_TINY,
    f"rollout.num_rollouts={G}",
    "rollout.max_new_tokens=16",
    "eval.eval_every=1",
    "eval.eval_batch_size=8",
    "eval.num_samples=1",
]
# no held-out prompts: a scripted verifier is called by the rollouts alone
NO_EVAL = [*TINY, "data.eval_size=0"]


def run(
    algorithm: str,
    run_dir: Path,
    overrides: list[str],
    resume: bool = False,
    verifier: Verifier = compute_rewards,
) -> int:
    """The trainer on ``algorithm``'s shipped config, ``verifier`` scoring the completions."""
    main = pg_train.main.with_options(verifier=verifier)
    return main(trainer_argv(CONFIGS / f"{algorithm}.yaml", run_dir, overrides, resume))


def graded_rewards(texts, metas, lengths, *, format_weight=0.5, penalty=None):
    """Stand-in for core.verifier.compute_rewards: rollout j of each group of G gets correctness
    j/(G−1) (so every group has contrast, and rollout G−1 is fully right)."""
    n = len(texts)
    correct = torch.tensor([(i % G) / (G - 1) for i in range(n)])
    fmt = torch.full((n,), 0.5)
    pen = torch.zeros(n)
    binary = (correct == 1.0).float()
    return {
        "correctness": correct,
        "format": fmt,
        "penalty": pen,
        "binary": binary,
        "total": correct + format_weight * fmt + pen,
    }


def rows_of(path: Path, phase: str) -> list[dict]:
    return [r for r in read_jsonl(path / "metrics.jsonl") if r["phase"] == phase]


ROLLOUT_KEYS = (
    "avg_total",
    "avg_correctness",
    "avg_format",
    "avg_binary",
    "avg_penalty",
    "response_length/mean",
    "response_length/clipped_frac",
    "timing/generate_s",
    "timing/score_s",
)
TRAIN_KEYS = (
    "loss",
    "pg_loss",
    "entropy",
    "grad_norm",
    "learning_rate",
    "timing/train_s",
    "throughput/tokens_per_s",
    "memory/peak_gb",
)


def assert_stage_breakdown(train: dict, rollout: dict, algorithm: str) -> None:
    """The step's stages (README "Where the time goes"): those the algorithm runs, their seconds
    within the step's, tokens and MFU where a model ran; the rollout row's phases from them."""
    spec = algorithm_spec(algorithm)
    stages = {
        k.removeprefix("timing/").removesuffix("_s") for k in train if k.startswith("timing/")
    }
    expected = {"generate", "score", "advantages", "update"}
    expected |= {"values"} if spec.needs_value_model else set()
    assert expected <= stages, (algorithm, stages)
    assert ("values" in stages) == spec.needs_value_model
    assert "weight_gather" not in stages  # one process: nothing gathered
    parts = stages - {"step", "train"}
    assert sum(train[f"timing/{s}_s"] for s in parts) <= train["timing/step_s"], algorithm
    assert train["timing/update_s"] == train["timing/train_s"]
    assert rollout["timing/generate_s"] == train["timing/generate_s"]
    for stage in ("generate", "update", *({"reference", "old_logps", "values"} & stages)):
        assert train[f"tokens/{stage}"] > 0 and train[f"throughput/{stage}_tokens_per_s"] > 0
        assert 0 < train[f"mfu/{stage}"] < 1, (algorithm, stage)
    assert "mfu/advantages" not in train and "mfu/score" not in train  # no model runs there
    assert 0 < train["mfu/step"] < 1


# ---------------------------------------------------------------------------------------------
# Every algorithm end to end
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", PG_FAMILY.algorithm_names)
def test_every_algorithm_runs_two_rollout_steps(tmp_path, algorithm):
    extra = []
    if algorithm in ("reinforce", "ppo"):  # one rollout per prompt, as their configs
        extra = ["rollout.prompts_per_step=4", "rollout.num_rollouts=1"]
    if algorithm == "ppo":
        extra.append("checkpoint.save_final_model=true")
    run_dir = tmp_path / "run"
    assert run(algorithm, run_dir, [*TINY, *extra], verifier=graded_rewards) == 0
    summary = assert_complete_run_dir(run_dir)
    assert summary["steps"] == 2 and summary["algorithm"] == algorithm

    rollout_rows, train_rows = rows_of(run_dir, "rollout"), rows_of(run_dir, "train")
    assert [r["step"] for r in rollout_rows] == [1, 2]
    assert [r["step"] for r in train_rows] == [1, 2]
    for key in ROLLOUT_KEYS:
        assert key in rollout_rows[-1], (algorithm, key)
    for key in TRAIN_KEYS:
        assert key in train_rows[-1], (algorithm, key)
    assert all(r["grad_norm"] > 0 for r in train_rows), algorithm  # advantages were not all 0
    assert_stage_breakdown(train_rows[-1], rollout_rows[-1], algorithm)
    if algorithm not in ("reinforce", "ppo"):
        assert rollout_rows[-1]["frac_reward_zero_std"] == 0.0
    if algorithm == "ppo":
        assert "value_loss" in train_rows[-1] and "explained_variance" in rollout_rows[-1]
        assert (run_dir / "final_model" / "config.json").is_file()
    if algorithm == "dapo":
        assert rollout_rows[-1]["dynamic_sampling/kept_frac"] == 1.0

    evals = rows_of(run_dir, "eval")
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert {"eval/avg_correctness", "eval/avg_format"} <= set(evals[-1])
    samples = [s for s in read_jsonl(run_dir / "samples.jsonl") if s["kind"] == "rollout"]
    assert samples and {"step", "question", "answer", "completion", "correctness"} <= set(
        samples[0]
    )
    config = (run_dir / "config.yaml").read_text()
    assert f"loss_agg: {algorithm_spec(algorithm).loss_agg}" in config


def test_real_rewards_and_final_model_warm_start(tmp_path):
    """The real reward path (no stand-in), then a second run started from the first run's
    final_model folder (how an SFT warm start is used)."""
    first = tmp_path / "first"
    assert run("grpo", first, [*TINY, "train.max_steps=1", "checkpoint.save_final_model=true"]) == 0
    row = rows_of(first, "rollout")[0]
    assert 0.0 <= row["avg_correctness"] <= 1.0 and 0.0 <= row["avg_format"] <= 1.0
    second = tmp_path / "second"
    warm = [*TINY, "train.max_steps=1", f"model.name={first / 'final_model'}"]
    assert run("grpo", second, warm) == 0
    assert_complete_run_dir(second)


# ---------------------------------------------------------------------------------------------
# DAPO dynamic sampling
# ---------------------------------------------------------------------------------------------


class ScriptedCorrectness:
    """compute_rewards stand-in whose correctness per group follows a script: one entry per
    call, one pattern per group ('0' all wrong, '1' all right, 'm' mixed)."""

    def __init__(self, script: list[str], default: str):
        self.script, self.default, self.calls = list(script), default, 0

    def __call__(self, texts, metas, lengths, *, format_weight=0.5, penalty=None):
        pattern = self.script[self.calls] if self.calls < len(self.script) else self.default
        self.calls += 1
        values = []
        for group in pattern:
            if group == "m":
                values += [float(j % 2) for j in range(G)]
            else:
                values += [float(group)] * G
        correct = torch.tensor(values)
        zeros = torch.zeros_like(correct)
        return {
            "correctness": correct,
            "format": zeros,
            "penalty": zeros,
            "binary": correct.clone(),
            "total": correct.clone(),
        }


def test_dapo_drops_uniform_groups_and_refills(tmp_path):
    # step 1: draw 1 keeps group 1 only, draw 2 keeps its group 0 -> 2 of 4 groups kept
    # step 2: draw 1 keeps both
    scripted = ScriptedCorrectness(["0m", "m1", "mm"], default="mm")
    run_dir = tmp_path / "run"
    assert run("dapo", run_dir, [*NO_EVAL, "loss.max_draw_factor=3"], verifier=scripted) == 0
    assert scripted.calls == 3
    rows = rows_of(run_dir, "rollout")
    assert rows[0]["dynamic_sampling/kept_frac"] == 0.5
    assert rows[0]["dynamic_sampling/prompts_drawn"] == 4
    assert rows[1]["dynamic_sampling/kept_frac"] == 1.0
    # the update batch always holds prompts_per_step × G sequences: 8 / micro-batch 4 = 2 steps
    assert [r["optimizer_steps"] for r in rows_of(run_dir, "train")] == [2, 2]
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["data"] == {"epoch": 0, "index": 6}  # 4 + 2 prompts consumed


def test_dapo_gives_up_after_the_draw_bound(tmp_path):
    scripted = ScriptedCorrectness([], default="00")  # no group ever shows contrast
    run_dir = tmp_path / "run"
    assert run("dapo", run_dir, [*NO_EVAL, "loss.max_draw_factor=3"], verifier=scripted) == 1
    assert scripted.calls == 3  # 3 × prompts_per_step prompts drawn, then the error
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "failed"
    assert "DynamicSamplingError" in summary["error"]
    assert "identical correctness" in summary["error"] and "max_draw_factor" in summary["error"]
    assert rows_of(run_dir, "train") == []


# ---------------------------------------------------------------------------------------------
# Several updates per rollout, and the π_old shortcut
# ---------------------------------------------------------------------------------------------


def test_two_updates_per_rollout_reuse_the_batch_off_policy(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [*TINY, "loss.updates_per_rollout=2", "train.gradient_accumulation_steps=2"]
    assert run("grpo", run_dir, overrides, verifier=graded_rewards) == 0
    rows = rows_of(run_dir, "train")
    assert [r["optimizer_steps"] for r in rows] == [2, 2]  # 1 optimizer step per pass, 2 passes
    # the second pass sees a policy that moved: the ratio left 1 (it is exactly 1 in pass one)
    assert all(abs(r["ratio/mean"] - 1.0) > 1e-6 for r in rows)
    assert "clip_frac" in rows[-1]


def _final_weights(run_dir: Path) -> dict:
    from trainers.core.training import list_checkpoints

    return torch.load(list_checkpoints(run_dir / "checkpoints")[-1] / "model.pt")


def test_skipping_the_old_logp_forward_changes_nothing(tmp_path, monkeypatch):
    """One optimizer step per rollout: π = π_old during the update, so logπ.detach() replaces
    the extra rollout-time forward. Forcing that forward must give the same run."""
    one_step = [*TINY, "train.gradient_accumulation_steps=2"]  # 8 sequences = 2 × 4 = 1 step
    cfg = PolicyGradientConfig.model_validate(
        {
            "algorithm": "grpo",
            "rollout": {"prompts_per_step": 2, "num_rollouts": G},
            "train": {"batch_size": 4, "gradient_accumulation_steps": 2},
        }
    )
    assert cfg.optimizer_steps_per_update == 1 and not cfg.needs_old_logps
    calls = []
    real = pg_rollout.sequence_logps

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pg_rollout, "sequence_logps", counting)
    assert run("grpo", tmp_path / "skip", one_step, verifier=graded_rewards) == 0
    assert calls == []  # no extra forward
    monkeypatch.setattr(PolicyGradientConfig, "needs_old_logps", property(lambda self: True))
    assert run("grpo", tmp_path / "forced", one_step, verifier=graded_rewards) == 0
    assert len(calls) == 2  # one per rollout step

    skip, forced = rows_of(tmp_path / "skip", "train"), rows_of(tmp_path / "forced", "train")
    for a, b in zip(skip, forced, strict=True):
        assert b["ratio/mean"] == pytest.approx(1.0, abs=1e-5)
        for key in ("loss", "pg_loss", "grad_norm", "entropy"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    wa, wb = _final_weights(tmp_path / "skip"), _final_weights(tmp_path / "forced")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5


def test_left_padding_does_not_change_log_probs():
    """Scoring a left-padded batch gives each row the log-probs it has alone (position ids
    follow the attention mask, as in generate)."""
    from trainers.core.models import load_causal_lm

    model = load_causal_lm("tiny", device="cpu", dtype="fp32", trainable=False)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12]]
    completions = [[20, 21, 22], [23, 24, 25, 26]]
    ids, attn, lens, cmask = assemble(prompts, completions, pad_id=0)
    together, _ = completion_token_stats(model, ids, attn, ids.shape[1] - 4)
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        alone_ids = torch.tensor([p + c])
        alone, _ = completion_token_stats(model, alone_ids, torch.ones_like(alone_ids), len(p))
        assert torch.allclose(together[row, : len(c)], alone[0], atol=1e-5)


def _grads(model) -> torch.Tensor:
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama"])
def test_shared_prompt_forward_equals_full_rows_with_gradients(preset, record_forward_shapes):
    """A group's prompt runs once (KV cache gathered per row): log-probs, entropies, values and
    every gradient equal one forward of the full rows; the prompt really runs once. Packed
    (each prompt once, its rows' completions after it: where that costs less than the full
    rows, here under gradient checkpointing) they are the same again."""
    from trainers.core.models import load_causal_lm

    model = load_causal_lm(preset, device="cpu", dtype="fp32", trainable=True)
    # Two groups of three rollouts (one of them with a shorter prompt: left padding) and one
    # lone row, shuffled as a micro-batch would be; ragged completions (right padding).
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [5, 6, 7, 8, 9, 10], [11, 12, 13]]
    prompts += [[30, 31, 32, 33], [11, 12, 13], [5, 6, 7, 8, 9, 10]]
    completions = [[20, 21, 22], [23, 24, 25, 26], [27], [20, 21], [40, 41, 42, 43], [44], [9, 8]]
    ids, attn, lens, cmask = assemble(prompts, completions, pad_id=0)
    width_p = ids.shape[1] - cmask.shape[1]
    decoder = model.get_decoder()
    forwards = record_forward_shapes(decoder)
    shared, shared_ent = completion_token_stats(model, ids, attn, width_p, True)  # packing: no gain
    (shared * cmask).sum().backward()
    shared_grads = _grads(model)
    # 3 distinct prompts x width_p, then 7 rows x (completion width - 1)
    assert forwards == [(3, width_p), (7, cmask.shape[1] - 1)]

    # gradient checkpointing (training) cannot keep a KV cache: the full-row path
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.training
    forwards.clear()
    full, full_ent = completion_token_stats(model, ids, attn, width_p, True, pack=False)
    (full * cmask).sum().backward()
    full_grads = _grads(model)
    assert forwards == [(7, ids.shape[1] - 1)]  # the last token predicts nothing
    forwards.clear()
    packed, packed_ent = completion_token_stats(model, ids, attn, width_p, True)
    (packed * cmask).sum().backward()
    packed_grads = _grads(model)
    assert forwards == [(4, ids.shape[1])]  # 7 rows of 10 columns in 4 (seq_packing)

    m = cmask.bool()
    assert torch.allclose(shared[m], full[m], atol=1e-5)
    assert torch.allclose(shared_ent[m], full_ent[m], atol=1e-5)
    assert_same_gradients(shared_grads, full_grads)
    assert torch.allclose(packed[m], full[m], atol=1e-5)
    assert torch.allclose(packed_ent[m], full_ent[m], atol=1e-5)
    assert_same_gradients(packed_grads, full_grads)
    assert full_grads.abs().sum() > 0

    value = ValueModel(model)
    torch.nn.init.normal_(value.head.weight)
    v_full = value(ids, attn, width_p)
    model.gradient_checkpointing_disable()
    v_shared = value(ids, attn, width_p)
    assert torch.allclose(v_shared[m], v_full[m], atol=1e-5)

    one_token = completion_token_stats(
        model, ids[:, : width_p + 1], attn[:, : width_p + 1], width_p
    )[0]
    assert torch.allclose(one_token[:, 0], full[:, 0], atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Resume
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_stop_then_resume_equals_straight_run(tmp_path, sigterm_at, algorithm):
    """4 rollout steps straight == 2, stop (the SIGTERM path), resume, 2 more."""
    common = [*TINY, "train.max_steps=4", "eval.eval_every=2"]
    if algorithm == "ppo":
        common += ["rollout.prompts_per_step=4", "rollout.num_rollouts=1"]

    def graded_run(run_dir: Path, resume: bool) -> int:
        return run(algorithm, run_dir, common, resume=resume, verifier=graded_rewards)

    keys = ("loss", "grad_norm", "entropy", "avg_total", "response_length/mean", "value_loss")
    keys += ("explained_variance", "eval/avg_format")
    assert_resume_equals_straight_run(graded_run, tmp_path, sigterm_at, 2, keys, "completion")


# ---------------------------------------------------------------------------------------------
# Data stream and bad input
# ---------------------------------------------------------------------------------------------


def test_prompt_stream_is_seeded_resumable_and_drops_the_tail():
    a = PromptStream(10, seed=3)
    first = [a.take(4) for _ in range(3)]  # 4 + 4, then the tail of 2 is dropped
    assert a.state() == {"epoch": 1, "index": 4}
    assert len(set(first[0] + first[1])) == 8
    b = PromptStream.from_state(10, 3, {"epoch": 0, "index": 8})
    assert b.take(4) == first[2]


test_bad_input_fails_before_writing = refused_before_writing_test(
    [
        ("grpo", ["rollout.num_rollouts=1"], "num_rollouts >= 2"),
        ("rloo", ["rollout.num_rollouts=1"], "num_rollouts >= 2"),
        ("grpo", ["train.batch_size=3"], "not divisible by train.batch_size"),
        ("grpo", ["algorithm=trpo"], "'algorithm'"),
        ("grpo", ["loss.kl_estimator=kl3"], "loss.kl_estimator"),
        ("grpo", ["rollout.temprature=1"], "Did you mean: temperature"),
        ("grpo", ["data.specs=[{name: no_such_task}]"], "no_such_task"),
        ("dapo", ["loss.l_cache=600"], "l_cache"),
    ],
    lambda run_dir, algorithm, overrides: run(algorithm, run_dir, [*TINY, *overrides]),
)


def test_shipped_configs_hold_the_book_defaults():
    from trainers.core.config import load_config

    # REINFORCE++ puts a token-level KL in the reward by design: its papers' β (the book's
    # algorithms run without a KL term)
    paper_beta = {"reinforce_pp": 0.01, "reinforce_pp_baseline": 0.001}
    for algorithm in PG_FAMILY.algorithm_names:
        cfg = load_config(CONFIGS / f"{algorithm}.yaml", PolicyGradientConfig)
        assert cfg.algorithm == algorithm
        assert cfg.model.name == "Qwen/Qwen3-1.7B" and cfg.train.learning_rate == 5e-6
        assert (cfg.train.batch_size, cfg.train.gradient_accumulation_steps) == (2, 4)
        assert cfg.rollout.temperature == 0.6 and cfg.seed == 42
        assert cfg.loss.beta == paper_beta.get(algorithm, 0.0), algorithm
        assert cfg.loss.loss_agg == algorithm_spec(algorithm).loss_agg
    ppo = load_config(CONFIGS / "ppo.yaml", PolicyGradientConfig)
    assert (ppo.rollout.prompts_per_step, ppo.rollout.num_rollouts) == (16, 1)
    assert (ppo.loss.gamma, ppo.loss.lam, ppo.loss.vf_coef, ppo.loss.clip_eps_val) == (
        1.0,
        0.98,
        0.5,
        0.4,
    )
    eps = {
        a: (c.loss.clip_eps_lo, c.loss.clip_eps_hi)
        for a in ("gspo", "cispo", "dapo")
        for c in [load_config(CONFIGS / f"{a}.yaml", PolicyGradientConfig)]
    }
    assert eps == {"gspo": (3e-4, 4e-4), "cispo": (1.0, 4.0), "dapo": (0.2, 0.28)}
