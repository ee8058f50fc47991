"""The gold evaluation of offline direct alignment (trainers/direct_alignment/gold.py): the sampled
KL against a naive per-token recomputation (a loaded reference and LoRA's base), the gold
correctness against reasoning-gym applied by hand, step-0 KL 0 end to end (full fine-tuning and
LoRA), and the config refusals."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import reasoning_gym
import torch
from conftest import trainer_argv

from tests._helpers.paths import configs_of
from tests._helpers.quick_runs import DPO_ON_TINY
from trainers.core.builtin_data import builtin_preference_records
from trainers.core.lora import add_adapters
from trainers.core.models import load_causal_lm, load_tokenizer
from trainers.core.rundir import read_jsonl
from trainers.core.tasks import extract_answer
from trainers.direct_alignment import train as da_train
from trainers.direct_alignment.config import DirectAlignmentConfig, EvalSection
from trainers.direct_alignment.gold import build_gold_eval, sampled_kl

DPO = configs_of("direct_alignment") / "dpo.yaml"
QUICK = [
    *DPO_ON_TINY,
    "train.gradient_accumulation_steps=2",
    "eval.gold_prompts=6",
    "eval.gold_max_new_tokens=12",
    "checkpoint.save_final_model=false",
]


def naive_sequence_logp(model, prompt: list[int], completion: list[int]) -> float:
    """One unpadded forward (dropout off), log-softmax at every position, the completion tokens
    summed."""
    ids = torch.tensor([prompt + completion])
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    model.train(was_training)
    logps = torch.log_softmax(logits, dim=-1)
    return sum(float(logps[len(prompt) - 1 + t, tok]) for t, tok in enumerate(completion))


def rows(tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """Three prompts of different lengths (padding is exercised) and completions of 1-5 tokens."""
    prompts = [tokenizer.encode(t) for t in ("What is 2+3?", "Hi", "Spell the word cat backward")]
    completions = [
        tokenizer.encode(t)[:n]
        for t, n in (("<answer>5</answer>", 5), ("ok", 1), ("tac is the answer", 4))
    ]
    return prompts, completions


def perturb(module: torch.nn.Module, names: tuple[str, ...], scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if any(n in name for n in names):
                p.add_(torch.randn(p.shape, generator=g) * scale)


def test_sampled_kl_equals_naive_per_token_recomputation_with_a_loaded_reference():
    tok = load_tokenizer("tiny")
    ref = load_causal_lm("tiny", device="cpu", dtype="fp32", trainable=False)
    policy = copy.deepcopy(ref).train()
    perturb(policy, ("",), 0.05, seed=1)
    prompts, completions = rows(tok)
    kl = sampled_kl(policy, ref, prompts, completions, tok.pad_token_id, batch_size=2)
    naive = [
        naive_sequence_logp(policy, p, c) - naive_sequence_logp(ref, p, c)
        for p, c in zip(prompts, completions, strict=True)
    ]
    assert kl.tolist() == pytest.approx(naive, abs=1e-4)
    assert max(abs(x) for x in naive) > 1e-2  # the perturbation moved the policy
    assert policy.training  # mode restored


def test_sampled_kl_under_lora_uses_the_base_with_adapters_off():
    from trainers.core.config import LoraSection

    tok = load_tokenizer("tiny")
    base = load_causal_lm("tiny", device="cpu", dtype="fp32", trainable=False)
    policy = add_adapters(
        load_causal_lm("tiny", device="cpu", dtype="fp32", trainable=True),
        LoraSection(enabled=True, rank=4, alpha=8),
    )
    prompts, completions = rows(tok)
    at_start = sampled_kl(policy, None, prompts, completions, tok.pad_token_id, batch_size=3)
    assert at_start.abs().max() < 1e-5  # LoRA's B starts at zero: policy == reference
    perturb(policy, ("lora_B",), 0.2, seed=2)
    kl = sampled_kl(policy, None, prompts, completions, tok.pad_token_id, batch_size=3)
    naive = [
        naive_sequence_logp(policy, p, c) - naive_sequence_logp(base, p, c)
        for p, c in zip(prompts, completions, strict=True)
    ]
    assert kl.tolist() == pytest.approx(naive, abs=1e-4)
    assert max(abs(x) for x in naive) > 1e-2


def by_hand(text: str, meta: dict) -> float:
    """reasoning-gym's own scorer on the text between the answer tags (no tags: 0)."""
    answer = extract_answer(text)
    if answer is None:
        return 0.0
    return float(reasoning_gym.get_score_answer_fn(meta["task"])(answer, meta["entry"]))


def test_gold_correctness_equals_the_verifier_by_hand(tmp_path):
    """The greedy "completions" are the records' chosen answers (right) for even prompts and
    their rejected ones for odd prompts: gold correctness = the share the verifier, applied by
    hand to the logged texts, scores 1.0."""
    tok = load_tokenizer("tiny")
    cfg = DirectAlignmentConfig(
        model={"name": "tiny"},
        data={"dataset": "builtin:reasoning-preferences", "max_length": 256},
        eval=EvalSection(gold_prompts=6, gold_max_new_tokens=64),
    )
    records = builtin_preference_records(6, seed=3)
    answers = [r.chosen if i % 2 == 0 else r.rejected for i, r in enumerate(records)]
    scripted = [tok.encode(a, add_special_tokens=False) for a in answers]

    def fake_sample(model, tokenizer, ids, *, sampling, **kw):
        return scripted[: len(ids)] if not sampling.do_sample else [s[:3] for s in scripted]

    model = load_causal_lm("tiny", device="cpu", dtype="fp32", trainable=False)
    out = tmp_path / "eval_gold.jsonl"
    ev = build_gold_eval(cfg, tok, records, model, out, ("cpu", torch.float32, "eager"))
    ev = dataclasses.replace(ev, sample=fake_sample)  # the scripted "completions"
    metrics = ev.run(model, step=0)
    line = read_jsonl(out)[0]
    metas = [r.meta for r in records]
    hand = [by_hand(t, m) for t, m in zip(line["completion"], metas, strict=True)]
    hand_right = [1.0 if h == 1.0 else 0.0 for h in hand]
    assert line["right"] == hand_right
    assert metrics["eval/gold_correctness"] == pytest.approx(sum(hand_right) / 6)
    assert metrics["eval/gold_reward"] == metrics["eval/gold_correctness"]
    assert hand_right[0::2] == [1.0, 1.0, 1.0]  # the chosen answers are right by construction
    assert metrics["eval/num_prompts"] == 6
    assert metrics["eval/kl_ref"] == pytest.approx(0.0, abs=1e-5)  # reference == policy


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_step0_kl_is_zero_and_every_eval_logs_gold(tmp_path, lora):
    extra = ["model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8"] if lora else []
    argv = trainer_argv(DPO, tmp_path / "run", QUICK + extra, False)
    assert da_train.main(argv) == 0
    evals = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "eval"]
    assert [r["step"] for r in evals][0] == 0 and len(evals) >= 3
    assert evals[0]["eval/kl_ref"] == pytest.approx(0.0, abs=1e-4)
    for r in evals:
        assert r["eval/num_prompts"] == 6
        assert r["eval/gold_reward"] == r["eval/gold_correctness"]
        assert r["eval/sqrt_kl"] == pytest.approx(max(r["eval/kl_ref"], 0.0) ** 0.5)
    lines = [json.loads(s) for s in (tmp_path / "run" / "eval_gold.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [r["step"] for r in evals]
    assert all(len(x["right"]) == len(x["kl"]) == 6 for x in lines)
    assert abs(evals[-1]["eval/kl_ref"]) > 1e-4  # training moved the policy


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"data": {"dataset": "x.jsonl"}, "eval": {"gold_prompts": 4}}, "reasoning-gym verifier"),
        (
            {
                "data": {"dataset": "builtin:reasoning-preferences", "max_length": 64},
                "eval": {"gold_prompts": 4, "gold_max_new_tokens": 64},
            },
            "must be smaller than data.max_length",
        ),
    ],
)
def test_gold_config_refusals(overrides, message):
    with pytest.raises(ValueError, match=message):
        DirectAlignmentConfig(model={"name": "tiny"}, **overrides)
