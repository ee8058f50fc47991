"""Policy gradients rewarded by a reward model: what ``reward.model`` may name (and the clear
errors before anything is written when it names something else), how the reward model scores a
rollout (its own tokenizer and chat template; the policy's ids reused only when the tokenizers are
the same; batched, frozen, eval mode), prompts from preference data (the real HH-RLHF and
UltraFeedback schemas of tests/fixtures, a prompt-only file, the offline built-in set), and two
rollout steps end to end that log proxy_reward, gold_reward and kl_ref.

Reward models here are untrained (a random head on the tiny preset, saved the way the
reward-model trainer saves them): what is tested is the plumbing, not the reward; the learning
test (test_pg_rm_learning.py) trains one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_complete_run_dir, trainer_argv

from tests._helpers.paths import FIXTURES, configs_of
from tests._helpers.refusals import assert_refused_before_writing
from tests._helpers.threads import one_torch_thread  # noqa: F401  (autouse)
from trainers.core.config import ConfigError
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids
from trainers.core.models import load_tokenizer
from trainers.core.prompts import preference_prompts
from trainers.core.reward_model import build_reward_model, save_reward_model
from trainers.core.reward_scorer import (
    PolicyCompletions,
    RewardScorer,
    inspect_reward_model,
    template_suffix,
)
from trainers.core.rundir import read_jsonl
from trainers.core.tiny import ensure_preset
from trainers.core.tokenization import same_tokenizer, text_ids
from trainers.policy_gradients import train as pg_train

CONFIGS = configs_of("policy_gradients")

OTHER_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '### ' + message['role'] + ':\\n' + message['content'] + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '### assistant:\\n' -}}{%- endif -%}"
)


def _save_rm(folder: Path, kind: str = "preference", seed: int = 0, template: str | None = None):
    torch.manual_seed(seed)
    model = build_reward_model(
        "tiny", kind, num_labels=3 if kind == "prm" else 1, device="cpu", dtype="fp32"
    )
    tokenizer = load_tokenizer("tiny")
    if template is not None:
        tokenizer.chat_template = template
    save_reward_model(model, tokenizer, folder)
    return folder


@pytest.fixture(scope="module")
def rm_dirs(tmp_path_factory) -> dict[str, Path]:
    """Saved reward models: preference (policy's tokenizer), orm, one whose chat template
    differs from the policy's, a second preference RM (the gold), and a prm."""
    base = tmp_path_factory.mktemp("rms")
    return {
        "preference": _save_rm(base / "preference"),
        "orm": _save_rm(base / "orm", "orm", seed=1),
        "other_template": _save_rm(base / "other", template=OTHER_TEMPLATE),
        "gold": _save_rm(base / "gold", seed=2),
        "prm": _save_rm(base / "prm", "prm", seed=3),
    }


MESSAGES = [
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "2 + 3 ="}],
    [{"role": "user", "content": "Spell cat backwards."}],
    [{"role": "user", "content": "Count the letters in apple."}],
]
TEXTS = ["<think>2 plus 3</think><answer>5</answer>", "t a c", "five letters, I think"]
COMPLETIONS = PolicyCompletions(MESSAGES, TEXTS)  # scored from their text alone


# ---------------------------------------------------------------------------------------------
# What reward.model may name
# ---------------------------------------------------------------------------------------------


def test_inspect_accepts_this_projects_reward_models(rm_dirs):
    pref = inspect_reward_model(str(rm_dirs["preference"]))
    assert (pref.kind, pref.own, pref.key) == ("preference", True, "reward.model")
    assert inspect_reward_model(str(rm_dirs["orm"]), "reward.gold_model").kind == "orm"


def _seq_cls_folder(folder: Path, num_labels: int = 1) -> Path:
    """A tiny Qwen2ForSequenceClassification checkpoint with the tiny preset's tokenizer."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    preset = ensure_preset("tiny")
    config = AutoConfig.from_pretrained(preset)
    config.num_labels = num_labels
    config.pad_token_id = load_tokenizer("tiny").pad_token_id
    torch.manual_seed(5)
    model = AutoModelForSequenceClassification.from_config(config)
    model.save_pretrained(folder)
    load_tokenizer("tiny").save_pretrained(folder)
    return folder


def _broken_tokenizer(rm_dir: Path, folder: Path) -> Path:
    shutil.copytree(rm_dir, folder)
    (folder / "tokenizer.json").write_text("{ not json")
    return folder


def _causal_lm_folder(folder: Path) -> Path:
    shutil.copytree(ensure_preset("tiny"), folder)
    return folder


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d, rms: str(d / "missing"), "No such file or folder"),
        (lambda d, rms: "tiny", "randomly initialised causal LM, not a reward model"),
        (lambda d, rms: str(_causal_lm_folder(d / "lm")), "not a reward model: its config.json"),
        (lambda d, rms: str(rms["prm"]), "a process reward model (kind prm)"),
        (
            lambda d, rms: str(_broken_tokenizer(rms["preference"], d / "broken")),
            "its tokenizer cannot be loaded",
        ),
        (
            lambda d, rms: str(_seq_cls_folder(d / "three", num_labels=3)),
            "not a scalar reward model",
        ),
        (lambda d, rms: "run:abc123", "run:<id> references are resolved by the lab"),
        (lambda d, rms: "nobody/no-such-rm", "reward.model='nobody/no-such-rm'"),
    ],
)
def test_inspect_refuses_what_is_not_a_scalar_reward_model(tmp_path, rm_dirs, make, message):
    name = make(tmp_path, rm_dirs)
    with pytest.raises(ConfigError) as err:
        inspect_reward_model(name)
    assert message in str(err.value)
    assert str(err.value).startswith("reward.model")


def test_bad_reward_model_fails_the_trainer_before_writing(tmp_path, rm_dirs, capsys):
    lm = _causal_lm_folder(tmp_path / "lm")
    for key, name in (
        ("reward.model", str(lm)),
        ("reward.gold_model", str(_broken_tokenizer(rm_dirs["preference"], tmp_path / "b"))),
    ):
        run_dir = tmp_path / f"run-{key}"
        argv = trainer_argv(CONFIGS / "grpo.yaml", run_dir, [*TINY, f"{key}={name}"])
        if key == "reward.gold_model":
            argv += ["--set", f"reward.model={rm_dirs['preference']}"]
        assert_refused_before_writing(pg_train.main(argv), run_dir, capsys, key)


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------


def test_policy_ids_are_reused_only_with_the_same_tokenizer(rm_dirs):
    policy_tok = load_tokenizer("tiny")
    same = RewardScorer.load(
        inspect_reward_model(str(rm_dirs["preference"])),
        device="cpu",
        dtype="fp32",
        policy_tokenizer=policy_tok,
    )
    other = RewardScorer.load(
        inspect_reward_model(str(rm_dirs["other_template"])),
        device="cpu",
        dtype="fp32",
        policy_tokenizer=policy_tok,
    )
    assert same.reuse_ids and not other.reuse_ids
    assert same_tokenizer(policy_tok, same.tokenizer)
    assert not same_tokenizer(policy_tok, other.tokenizer)
    assert policy_tok.decode(template_suffix(policy_tok)) == "<|im_end|>\n"  # ChatML's turn end
    assert not (same.model.training or any(p.requires_grad for p in same.model.parameters()))

    # reused ids = the RM's own rendering of the conversation (for text whose ids round-trip)
    stops = set(end_of_turn_ids(policy_tok))
    prompt_ids = [chat_prompt_ids(policy_tok, m) for m in MESSAGES]
    completion_ids = [text_ids(policy_tok, t) + [min(stops)] for t in TEXTS]
    completion_ids[1] = completion_ids[1][:-1]  # a completion cut at max_new_tokens
    with_ids = PolicyCompletions(MESSAGES, TEXTS, prompt_ids, completion_ids, stops)
    reused = same.encode_completions(with_ids)
    rendered = same.encode_completions(COMPLETIONS)
    assert reused == rendered
    scores_ids = same.score_completions(with_ids)
    scores_text = same.score_completions(COMPLETIONS)
    assert torch.allclose(scores_ids, scores_text)

    # another template: ids come from the RM's template, never from the policy's ids
    encoded = other.encode_completions(with_ids)
    assert other.tokenizer.decode(encoded[1]).startswith("### user:\nSpell cat backwards.")


def test_scores_are_batched_frozen_and_per_kind(rm_dirs):
    pref = RewardScorer.load(
        inspect_reward_model(str(rm_dirs["preference"])), device="cpu", dtype="fp32", batch_size=2
    )
    alone = RewardScorer.load(
        inspect_reward_model(str(rm_dirs["preference"])), device="cpu", dtype="fp32", batch_size=1
    )
    s = pref.score_completions(COMPLETIONS)
    assert s.shape == (3,) and s.dtype == torch.float32 and not s.requires_grad
    assert torch.allclose(
        s, alone.score_completions(COMPLETIONS), atol=1e-5
    )  # padding changes nothing
    # the same value the scorer gives the conversations (this project's RM folder)
    scorer = RewardScorer.from_pretrained(rm_dirs["preference"], device="cpu", dtype="fp32")
    convs = [
        [*m, {"role": "assistant", "content": t}] for m, t in zip(MESSAGES, TEXTS, strict=True)
    ]
    assert s.tolist() == pytest.approx(scorer.score(convs), abs=1e-5)
    orm = RewardScorer.load(inspect_reward_model(str(rm_dirs["orm"])), device="cpu", dtype="fp32")
    p = orm.score_completions(COMPLETIONS)
    assert bool(((p > 0) & (p < 1)).all())  # P(correct)


def test_a_sequence_classification_checkpoint_scores_with_its_logit(tmp_path):
    folder = _seq_cls_folder(tmp_path / "seqcls")
    info = inspect_reward_model(str(folder))
    assert info.kind == "sequence_classification" and not info.own
    rm = RewardScorer.load(info, device="cpu", dtype="fp32", batch_size=2)
    scores = rm.score_completions(COMPLETIONS)
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    for ids, value in zip(rm.encode_completions(COMPLETIONS), scores.tolist(), strict=True):
        with torch.no_grad():
            logit = model(input_ids=torch.tensor([ids])).logits[0, 0]
        assert value == pytest.approx(float(logit), abs=1e-4)


# ---------------------------------------------------------------------------------------------
# Prompts from preference data
# ---------------------------------------------------------------------------------------------


def test_hh_rlhf_prompts_keep_the_conversation_before_the_last_answer():
    train, held, stats = preference_prompts(str(FIXTURES / "hh_rlhf.jsonl"), "train", 3, 2, 0)
    assert stats["format"] == "hh" and stats["distinct_prompts"] == 5
    assert len(train) == 3 and len(held) == 2
    prompts = train + held
    keys = {json.dumps(p.messages) for p in prompts}
    assert len(keys) == 5  # all distinct, none on both sides
    multi = next(p for p in prompts if len(p.messages) > 1)
    assert [m["role"] for m in multi.messages][-1] == "user"
    assert all(m["role"] in ("user", "assistant") for m in multi.messages)
    assert all(p.meta == {} and p.answer == "" for p in prompts)  # scored by a reward model only
    goldfish = next(p for p in prompts if "goldfish" in p.question)
    assert goldfish.messages == [{"role": "user", "content": "What is a good name for a goldfish?"}]


def test_ultrafeedback_and_prompt_only_files(tmp_path):
    train, held, stats = preference_prompts(
        str(FIXTURES / "ultrafeedback_cleaned.jsonl"), "train", 4, 2, 0
    )
    assert stats["format"] == "ultrafeedback" and len(train) == 4 and len(held) == 2
    assert {p.messages[-1]["content"] for p in train + held} >= {"Name three primary colours."}
    rows = [{"prompt": "Write a limerick."}, {"prompt": "Write a limerick."}]
    rows += [{"prompt": [{"role": "user", "content": f"Question {i}?"}]} for i in range(4)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train, held, stats = preference_prompts(str(path), "train", 10, 1, 0)
    assert stats["format"] == "prompt" and stats["distinct_prompts"] == 5  # the repeat dropped
    assert len(train) == 4 and len(held) == 1
    bad = tmp_path / "nothing.jsonl"
    bad.write_text(json.dumps({"text": "no prompt here"}) + "\n")
    with pytest.raises(ConfigError, match="needs a `prompt` column"):
        preference_prompts(str(bad), "train", 4, 1, 0)
    with pytest.raises(ConfigError, match="data.dataset"):
        preference_prompts(str(tmp_path / "missing.jsonl"), "train", 4, 1, 0)


def test_builtin_prompts_carry_the_verifier_entry():
    train, held, stats = preference_prompts("builtin", "train", 12, 6, 3)
    assert stats["format"] == "builtin" and len(train) == 12 and len(held) == 6
    assert {p.meta["task"] for p in train} <= {"spell_backward", "chain_sum", "letter_counting"}
    assert not {p.question for p in train} & {p.question for p in held}
    only = preference_prompts("builtin:chain_sum", "train", 4, 2, 3)[0]
    assert {p.meta["task"] for p in only} == {"chain_sum"}
    again = preference_prompts("builtin", "train", 12, 6, 3)[0]
    assert [p.question for p in again] == [p.question for p in train]  # seeded


# ---------------------------------------------------------------------------------------------
# End to end: two rollout steps against a reward model
# ---------------------------------------------------------------------------------------------

TINY = [
    "model.name=tiny",
    "model.gradient_checkpointing=false",
    "data.size=16",
    "data.eval_size=4",
    "rollout.prompts_per_step=2",
    "rollout.num_rollouts=4",
    "rollout.max_new_tokens=12",
    "train.batch_size=8",
    "train.gradient_accumulation_steps=1",
    "train.learning_rate=1.0e-3",
    "train.max_steps=2",
    "eval.eval_every=2",
    "eval.eval_batch_size=8",
    "eval.max_new_tokens=8",
    "eval.num_samples=1",
    "checkpoint.save_every=null",
    "checkpoint.save_final_model=false",
]


def rows_of(path: Path, phase: str) -> list[dict]:
    return [r for r in read_jsonl(path / "metrics.jsonl") if r["phase"] == phase]


def test_grpo_with_a_reward_model_and_a_gold_model_logs_the_overoptimisation_signals(
    tmp_path, rm_dirs
):
    run_dir = tmp_path / "grpo"
    overrides = [
        *TINY,
        "data.source=preference",
        f"data.dataset={FIXTURES / 'hh_rlhf.jsonl'}",
        "data.size=3",
        "data.eval_size=2",
        f"reward.model={rm_dirs['preference']}",
        f"reward.gold_model={rm_dirs['gold']}",
        "reward.normalize=batch",
        "reward.missing_eos_penalty=0.5",
        "loss.beta=0.1",
    ]
    assert pg_train.main(trainer_argv(CONFIGS / "grpo.yaml", run_dir, overrides)) == 0
    summary = assert_complete_run_dir(run_dir)
    rollouts, evals = rows_of(run_dir, "rollout"), rows_of(run_dir, "eval")
    for row in rollouts:
        assert {"proxy_reward", "gold_reward", "kl_ref", "avg_total", "avg_format"} <= set(row)
        assert "avg_correctness" not in row  # HH prompts have no verifier
    assert rollouts[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # π = π_ref at the start
    assert rollouts[1]["kl_ref"] > 0
    assert {"eval/proxy_reward", "eval/gold_reward"} <= set(evals[-1])
    assert summary["best_metrics"].keys() == {"eval/gold_reward"}  # the gold is the headline
    assert summary["data"]["format"] == "hh"
    assert summary["reward_models"]["reward.model"]["tokens"] == "policy ids reused"
    samples = [s for s in read_jsonl(run_dir / "samples.jsonl") if s["kind"] == "rollout"]
    assert {"model", "model_norm", "gold", "total"} <= set(samples[0])


def test_ppo_on_builtin_prompts_whitens_with_running_statistics(tmp_path, rm_dirs):
    run_dir = tmp_path / "ppo"
    overrides = [
        *TINY,
        "rollout.prompts_per_step=8",
        "rollout.num_rollouts=1",
        "data.source=preference",
        "data.dataset=builtin",
        f"reward.model={rm_dirs['other_template']}",
        "reward.normalize=running",
        "reward.clip=3.0",
        "loss.beta=0.05",
    ]
    assert pg_train.main(trainer_argv(CONFIGS / "ppo.yaml", run_dir, overrides)) == 0
    summary = assert_complete_run_dir(run_dir)
    rollouts = rows_of(run_dir, "rollout")
    assert {"proxy_reward", "gold_reward", "kl_ref", "kl_reward", "avg_correctness"} <= set(
        rollouts[-1]
    )
    assert rollouts[-1]["gold_reward"] == rollouts[-1]["avg_correctness"]  # the verifier is gold
    assert [r["reward_norm/mean"] is not None for r in rollouts] == [True, True]
    assert summary["reward_models"]["reward.model"]["tokens"] == "re-tokenised from text"
    assert summary["best_metrics"].keys() == {"eval/gold_reward"}  # = held-out correctness
    samples = [s for s in read_jsonl(run_dir / "samples.jsonl") if s["kind"] == "rollout"]
    assert all(abs(s["total"]) <= 3.0 for s in samples)


def test_running_moments_survive_a_stop_and_resume(tmp_path, rm_dirs, sigterm_at):
    """The running statistics are in the checkpoint: 3 rollout steps straight == stop after
    step 1, resume, 2 more (same reward statistics at every step)."""
    overrides = [
        *TINY,
        "train.max_steps=3",
        "data.source=preference",
        "data.dataset=builtin",
        f"reward.model={rm_dirs['preference']}",
        "reward.normalize=running",
        "eval.eval_every=0",
    ]
    argv = lambda d, resume=False: trainer_argv(CONFIGS / "grpo.yaml", d, overrides, resume)  # noqa: E731
    straight, half = tmp_path / "straight", tmp_path / "half"
    assert pg_train.main(argv(straight)) == 0

    sigterm_at("step_end:1")  # a real SIGTERM at the end of step 1
    assert pg_train.main(argv(half)) == 143
    sigterm_at(None)
    assert pg_train.main(argv(half, resume=True)) == 0
    a, b = rows_of(straight, "rollout"), rows_of(half, "rollout")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    for x, y in zip(a, b, strict=True):
        for key in ("proxy_reward", "reward_norm/mean", "reward_norm/std", "avg_total"):
            assert y[key] == pytest.approx(x[key], rel=1e-5), (x["step"], key)
