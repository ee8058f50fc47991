"""SFT trainer: the loss mask, token-weighted accumulation, data loading (fixture schemas and the
built-in reasoning-gym demonstrations), end-to-end runs on the tiny model, resume, bad input, and
learning (held-out loss down, tag format up)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import assert_phases, assert_same_gradients, trainer_argv
from stop_resume import assert_resume_equals_straight_run

from tests._helpers.packing_models import model_names, trainable_model
from tests._helpers.paths import FIXTURES, configs_of
from tests._helpers.quick_runs import SFT_ON_TINY
from tests._helpers.refusals import refused_before_writing_test
from tests._helpers.run_folders import STEP_KEYS
from trainers.core.config import load_config
from trainers.core.models import load_causal_lm, load_tokenizer
from trainers.core.rundir import read_jsonl
from trainers.core.tasks import SYSTEM_PROMPT
from trainers.core.verifier import has_tag_format
from trainers.sft import train as sft_train
from trainers.sft.config import SFTConfig
from trainers.sft.data import (
    SFTRecord,
    TokenizedSFT,
    builtin_sft_records,
    collate,
    load_sft_records,
    score_record_response,
    split_train_eval,
    tokenize_records,
)

CONFIGS = configs_of("sft")

QUICK = [
    *SFT_ON_TINY,
    "data.dataset=builtin:reasoning-sft",
    "data.max_samples=48",
    "data.eval_size=8",
    "data.max_length=128",
    "train.gradient_accumulation_steps=2",
]


def run(run_dir: Path, overrides: list[str], resume: bool = False, config: str = "sft") -> int:
    return sft_train.main(trainer_argv(CONFIGS / f"{config}.yaml", run_dir, overrides, resume))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


def conversation() -> list[dict]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "Again."},
        {"role": "assistant", "content": "Hello again"},
    ]


def masked_text(tokenizer, example) -> str:
    return tokenizer.decode(
        [t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m]
    )


# ---------------------------------------------------------------------------------------------
# The loss mask and the loss
# ---------------------------------------------------------------------------------------------


def test_loss_mask_covers_only_the_final_assistant_turn(tokenizer):
    (ex,), stats = tokenize_records([SFTRecord(conversation())], tokenizer, 512, "final")
    assert stats["n_out"] == 1
    assert masked_text(tokenizer, ex) == "Hello again<|im_end|>"
    # everything before the final turn (system, users, the earlier assistant turn, the
    # generation prompt) and the template's trailing newline are untrained
    full = tokenizer.decode(ex.input_ids)
    assert full.endswith("<|im_start|>assistant\nHello again<|im_end|>\n")
    first = ex.loss_mask.index(1)
    assert tokenizer.decode(ex.input_ids[:first]).endswith(
        "Again.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ex.loss_mask[-1] == 0 and tokenizer.decode(ex.input_ids[-1:]) == "\n"
    assert ex.n_targets == sum(ex.loss_mask)


def test_loss_mask_all_assistant_turns(tokenizer):
    (ex,), _ = tokenize_records([SFTRecord(conversation())], tokenizer, 512, "all_assistant")
    assert masked_text(tokenizer, ex) == "Hi there<|im_end|>Hello again<|im_end|>"


def test_truncation_and_examples_without_targets(tokenizer):
    (full,), _ = tokenize_records([SFTRecord(conversation())], tokenizer, 512, "final")
    first = full.loss_mask.index(1)
    cut, stats = tokenize_records([SFTRecord(conversation())], tokenizer, first + 3, "final")
    assert stats["truncated"] == 1 and len(cut[0].input_ids) == first + 3
    assert cut[0].n_targets == 3
    # cut right where the final turn starts: nothing left to train, dropped and counted
    none, stats = tokenize_records([SFTRecord(conversation())], tokenizer, first, "final")
    assert none == [] and stats["dropped_no_targets"] == 1


class UniformLM(torch.nn.Module):
    """A 'model' with uniform logits: every target costs exactly log(V)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.bias = torch.nn.Parameter(torch.zeros(vocab))

    def forward(self, input_ids, attention_mask):
        logits = self.bias.expand(*input_ids.shape, self.vocab)
        return type("Out", (), {"logits": logits})()


def test_token_nll_counts_only_target_tokens_hand_checked(tokenizer):
    """Two conversations of different lengths, right-padded: the loss sums log(V) over exactly
    the hand-counted assistant tokens (targets), never over prompt or padding positions."""
    records = [SFTRecord(conversation()), SFTRecord(conversation()[:3])]
    examples, _ = tokenize_records(records, tokenizer, 512, "final")
    hello = len(tokenizer("Hello again", add_special_tokens=False)["input_ids"]) + 1  # + im_end
    hi = len(tokenizer("Hi there", add_special_tokens=False)["input_ids"]) + 1
    assert [ex.n_targets for ex in examples] == [hello, hi]
    batch = collate(examples, pad_id=tokenizer.pad_token_id)
    lengths = [len(ex.input_ids) for ex in examples]
    assert batch["input_ids"].shape == (2, max(lengths))  # padded to the longest row only
    assert batch["loss_mask"][1, lengths[1] :].sum() == 0  # padding is never a target
    model = UniformLM(vocab=len(tokenizer))
    nll, n, _ = sft_train.token_nll(
        model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    )
    assert n == hello + hi
    assert float(nll.detach()) == pytest.approx((hello + hi) * math.log(len(tokenizer)), rel=1e-5)


def test_token_nll_matches_cross_entropy_with_ignore_index(tokenizer):
    model = load_causal_lm("tiny", device="cpu")
    records = builtin_sft_records(4, seed=1)
    examples, _ = tokenize_records(records, tokenizer, 256, "final")
    batch = collate(examples, pad_id=tokenizer.pad_token_id)
    ids, attn, mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    nll, n, hits = sft_train.token_nll(model, ids, attn, mask)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    expected = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
    )
    assert n == int((labels != -100).sum())
    assert float(nll.detach()) == pytest.approx(float(expected), rel=1e-4)
    predicted = logits.argmax(-1)
    assert hits == int(((predicted == ids[:, 1:]) & (labels != -100)).sum())


def test_token_weighted_accumulation_equals_one_big_batch(tokenizer):
    """sum over micro-batches of NLL_mb / N_step gives the gradient of one batch's token mean,
    even though the micro-batches hold very different token counts."""
    records = builtin_sft_records(6, seed=5)
    records[0].messages[-1]["content"] += " " + "and so on " * 12  # an unusually long one
    examples, _ = tokenize_records(records, tokenizer, 512, "final")
    counts = [ex.n_targets for ex in examples]
    assert max(counts) > 2 * min(counts)
    total = sum(counts)

    def grads(splits):
        torch.manual_seed(0)
        model = load_causal_lm("tiny", device="cpu")
        for chunk in splits:
            nll, _, _, _ = sft_train.micro_batch_terms(model, chunk, tokenizer.pad_token_id, "cpu")
            (nll / total).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    one = grads([examples])
    accumulated = grads([examples[:1], examples[1:4], examples[4:]])
    assert torch.allclose(one, accumulated, rtol=1e-4, atol=1e-7)
    # the naive alternative (mean of per-micro-batch means) gives a different gradient
    torch.manual_seed(0)
    model = load_causal_lm("tiny", device="cpu")
    for chunk in [examples[:1], examples[1:4], examples[4:]]:
        nll, n, _, _ = sft_train.micro_batch_terms(model, chunk, tokenizer.pad_token_id, "cpu")
        (nll / n / 3).backward()
    naive = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert not torch.allclose(one, naive, rtol=1e-3, atol=1e-6)


def mixed_length_examples() -> list[TokenizedSFT]:
    """Conversations of very different lengths (one much longer than the rest, a two-token
    one whose first token is marked: no position predicts it), random ids in every vocabulary."""
    g = torch.Generator().manual_seed(0)
    out = []
    for n in (60, 7, 23, 2, 31, 12):
        ids = torch.randint(5, 200, (n,), generator=g).tolist()
        out.append(TokenizedSFT(ids, [0] * (n // 3) + [1] * (n - n // 3)))
    return out


@pytest.mark.parametrize("name", model_names())
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_packed_micro_batch_gives_the_padded_loss_and_gradients(name, attn):
    """Several conversations per row (trainers/core/seq_packing.py): the same summed NLL,
    target count, argmax hits, token count and gradients as one padded row each."""
    examples = mixed_length_examples()

    def terms(pack: bool):
        model = trainable_model(name, attn)
        nll, n, hits, n_tok = sft_train.micro_batch_terms(model, examples, 0, "cpu", pack)
        nll.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return float(nll), (n, hits, n_tok), grads, model

    padded, padded_counts, padded_grads, model = terms(pack=False)
    packed_rows = sft_train.packed_batch(model, examples, 0, "cpu")
    assert packed_rows is not None and packed_rows["input_ids"].shape == (3, 60)  # not 6 rows
    packed, packed_counts, packed_grads, _ = terms(pack=True)
    assert packed == pytest.approx(padded, rel=1e-5)
    assert packed_counts == padded_counts
    assert padded_counts[0] == sum(ex.n_targets for ex in examples)
    assert_same_gradients(packed_grads, padded_grads, rel=1e-4)
    # no two conversations share a row: the padded layout (plain causal attention) is kept
    assert sft_train.packed_batch(model, examples[:1], 0, "cpu") is None


def test_packing_changes_nothing_in_the_training_loop(tmp_path):
    """One optimizer step and the held-out evaluation over conversations of very different
    lengths, packed and not: the same loss, accuracy, gradient norm and held-out loss."""
    rows = [
        {"prompt": f"Count {i}.", "completion": " ".join(["one two three"] * (1 + (i * 7) % 11))}
        for i in range(24)
    ]
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = [*QUICK, f"data.dataset={data}", "data.max_samples=null", "train.max_steps=1"]
    common += ["eval.sample_every=0", "eval.num_samples=0", "eval.eval_every=1"]
    common += ["checkpoint.save_final_model=false", "train.batch_size=8"]
    assert run(tmp_path / "packed", [*common, "data.packing=true"]) == 0
    assert run(tmp_path / "padded", [*common, "data.packing=false"]) == 0
    packed = read_jsonl(tmp_path / "packed" / "metrics.jsonl")
    padded = read_jsonl(tmp_path / "padded" / "metrics.jsonl")
    assert len(packed) == len(padded) and any("eval/loss" in r for r in packed)
    for a, b in zip(packed, padded, strict=True):
        for key in ("loss", "mean_token_accuracy", "grad_norm", "num_tokens", "eval/loss"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-4), key


def test_accumulation_in_the_training_loop_matches_one_big_batch(tmp_path):
    """One optimizer step over 8 conversations: 1 × 8 and 4 × 2 micro-batches log the same
    loss, accuracy and gradient norm and reach the same held-out loss."""
    common = [*QUICK, "train.max_steps=1", "eval.sample_every=0", "eval.num_samples=0"]
    common += ["checkpoint.save_final_model=false", "eval.eval_every=1"]
    big = ["train.batch_size=8", "train.gradient_accumulation_steps=1"]
    assert run(tmp_path / "big", [*common, *big]) == 0
    small = ["train.batch_size=2", "train.gradient_accumulation_steps=4"]
    assert run(tmp_path / "small", [*common, *small]) == 0
    big_rows = [r for r in read_jsonl(tmp_path / "big" / "metrics.jsonl") if r["step"] == 1]
    small_rows = [r for r in read_jsonl(tmp_path / "small" / "metrics.jsonl") if r["step"] == 1]
    big_rows = [r for r in big_rows if r["phase"] == "train"] + [
        r for r in big_rows if r["phase"] == "eval"
    ]
    for a, b in zip(big_rows, small_rows, strict=True):
        for key in ("loss", "mean_token_accuracy", "grad_norm", "num_tokens"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-4), key
        if "eval/loss" in a:
            assert a["eval/loss"] == pytest.approx(b["eval/loss"], rel=1e-4)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def test_no_robots_fixture_loads_in_messages_format(tokenizer):
    stats: dict = {}
    records = load_sft_records(str(FIXTURES / "no_robots.jsonl"), stats=stats)
    rows = read_jsonl(FIXTURES / "no_robots.jsonl")
    assert {"prompt", "prompt_id", "messages", "category"} <= set(rows[0])
    assert stats["schema"] == "messages" and len(records) == len(rows) == stats["n_records"]
    chats = [r for r in records if r.messages[0]["role"] == "system"]
    assert chats and all(len(r.messages) >= 4 for r in chats)  # multi-turn history kept
    assert all(r.messages[-1]["role"] == "assistant" for r in records)
    assert records[0].reference == rows[0]["messages"][-1]["content"]
    examples, tok_stats = tokenize_records(records, tokenizer, 512, "final")
    assert tok_stats["n_out"] == len(records) and tok_stats["prefix_fallback"] == 0
    for rec, ex in zip(records, examples, strict=True):
        assert masked_text(tokenizer, ex) == rec.reference + "<|im_end|>"
    # max_samples shuffles with the seed, then keeps N
    few = load_sft_records(str(FIXTURES / "no_robots.jsonl"), max_samples=3, seed=1)
    assert len(few) == 3 and few == load_sft_records(
        str(FIXTURES / "no_robots.jsonl"), max_samples=3, seed=1
    )


def test_prompt_completion_columns_and_odd_rows(tmp_path, tokenizer):
    path = tmp_path / "pc.jsonl"
    rows = [
        {"prompt": "What is 2 + 2?", "completion": "4"},
        {"prompt": [{"role": "user", "content": "Name a colour."}], "completion": "Green."},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = load_sft_records(str(path))
    assert [r.messages for r in records] == [
        [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}],
        [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Green."}],
    ]
    # messages after the last assistant turn are dropped; rows with no assistant turn skipped
    odd = tmp_path / "odd.jsonl"
    odd_rows = [
        {"messages": [*conversation(), {"role": "user", "content": "Thanks!"}]},
        {"messages": [{"role": "user", "content": "Anyone there?"}]},
    ]
    odd.write_text("".join(json.dumps(r) + "\n" for r in odd_rows))
    stats: dict = {}
    records = load_sft_records(str(odd), stats=stats)
    assert len(records) == 1 and stats["skipped"] == 1
    assert records[0].messages == conversation()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "just text"}) + "\n")
    with pytest.raises(ValueError, match="messages"):
        load_sft_records(str(bad))


def test_builtin_demonstrations_are_deterministic_and_score_one():
    a = builtin_sft_records(40, seed=3)
    b = builtin_sft_records(40, seed=3)
    assert [r.messages for r in a] == [r.messages for r in b]
    assert [r.messages for r in builtin_sft_records(40, seed=4)] != [r.messages for r in a]
    assert {r.meta["task"] for r in a} == {"spell_backward", "chain_sum"}
    assert len({r.messages[1]["content"] for r in a}) == 40  # distinct questions
    for rec in a:
        assert [m["role"] for m in rec.messages] == ["system", "user", "assistant"]
        assert rec.messages[0]["content"] == SYSTEM_PROMPT
        assert has_tag_format(rec.reference)
        assert score_record_response(rec.reference, rec) == 1.0
        assert score_record_response("<think>x</think><answer>wrong</answer>", rec) < 1.0
    only = load_sft_records("builtin:reasoning-sft:chain_sum", max_samples=10)
    assert {r.meta["task"] for r in only} == {"chain_sum"}
    # another split draws other questions
    test_q = {
        r.messages[1]["content"]
        for r in load_sft_records("builtin:reasoning-sft", split="test", max_samples=40, seed=3)
    }
    assert len(test_q & {r.messages[1]["content"] for r in a}) < 10


def test_tag_format_check():
    assert has_tag_format("<think>a b</think>\n<answer>ba</answer>")
    assert has_tag_format("  <think></think><answer>3</answer> ")
    assert not has_tag_format("<answer>3</answer>")
    assert not has_tag_format("<think>x</think><answer></answer>")
    assert not has_tag_format("<think>x</think><answer>3</answer> more text")
    assert not has_tag_format("<think>x</think><answer>3</answer><answer>4</answer>")


def test_split_keeps_sizes():
    train, held = split_train_eval(list(range(50)), 10, seed=0)
    assert len(held) == 10 and sorted(train + held) == list(range(50))
    with pytest.raises(ValueError):
        split_train_eval(list(range(5)), 5, seed=0)


# ---------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------


def test_short_run_writes_a_complete_run_dir_and_a_loadable_final_model(
    tmp_path, progress_writes, capsys
):
    run_dir = tmp_path / "run"
    assert run(run_dir, [*QUICK, "train.max_steps=3"]) == 0
    assert_phases(progress_writes, "tokenizing", "loading_model", "evaluating", "generating")
    assert_phases(progress_writes, "training", "evaluating", "training", "saving", "done")
    assert progress_writes[2] == ("loading_model", 0, 3)  # the total, once tokenised
    out = capsys.readouterr().out
    assert all(f"eval step {s}/3: loss " in out for s in (0, 2, 3)), out
    for name in ("config.yaml", "metrics.jsonl", "samples.jsonl", "progress.json", "summary.json"):
        assert (run_dir / name).is_file(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "succeeded" and summary["steps"] == 3
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["step"] == progress["total_steps"] == 3
    rows = read_jsonl(run_dir / "metrics.jsonl")
    train_rows = [r for r in rows if r["phase"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2, 3]
    for key in ("loss", "mean_token_accuracy", *STEP_KEYS):
        assert key in train_rows[-1], key
    evals = [r for r in rows if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2, 3]
    assert {"eval/loss", "eval/mean_token_accuracy", "eval/sample_format_rate"} <= set(evals[-1])
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert samples and {"step", "prompt", "completion", "reference", "score"} <= set(samples[0])
    assert samples[0]["step"] == 0  # the starting point is sampled too
    model = load_causal_lm(str(run_dir / "final_model"), device="cpu")
    tok = load_tokenizer(str(run_dir / "final_model"))
    assert tok.chat_template is not None and model.config.model_type == "qwen2"
    assert summary["final_model"] == str(run_dir / "final_model")


def test_stop_then_resume_equals_straight_run(tmp_path, sigterm_at):
    """4 steps straight == 2 steps, stop (the SIGTERM path: checkpoint + 'stopped'), resume, 2."""
    common = [*QUICK, "train.max_steps=4", "eval.sample_every=1"]
    keys = ("loss", "mean_token_accuracy", "grad_norm", "learning_rate", "eval/loss")
    half = assert_resume_equals_straight_run(
        lambda d, resume: run(d, common, resume), tmp_path, sigterm_at, 2, keys, "completion"
    )
    progress = json.loads((half / "progress.json").read_text())
    assert (
        progress["tokens_seen"]
        == json.loads((tmp_path / "straight" / "progress.json").read_text())["tokens_seen"]
    )


test_bad_input_fails_before_writing = refused_before_writing_test(
    [
        (["train.learning_rat=1"], "Did you mean: learning_rate"),
        (["data.train_on=everything"], "data.train_on"),
        (["data.dataset=/no/such/file.jsonl"], "file not found"),
        (["data.dataset=builtin:reasoning-prefs"], "builtin:reasoning-sft"),
        (["data.dataset=builtin:reasoning-sft:no_such_task"], "no_such_task"),
        (["data.dataset=someone/not-cached-dataset"], "builtin:reasoning-sft"),
        (["data.max_samples=8", "data.eval_size=8"], "eval_size"),
    ],
    lambda run_dir, overrides: run(run_dir, [*QUICK, *overrides]),
)


def test_shipped_configs_validate_and_warm_start_recipe_matches_its_yaml():
    book = load_config(CONFIGS / "sft.yaml", SFTConfig)
    assert book.model.name == "allenai/OLMo-2-0425-1B"
    assert book.model.chat_template_source == "allenai/OLMo-2-0425-1B-SFT"
    assert book.data.dataset == "HuggingFaceH4/no_robots" and book.data.max_length == 2048
    assert book.train.learning_rate == 5e-6 and book.train.num_epochs == 3
    assert (book.train.batch_size, book.train.gradient_accumulation_steps) == (4, 8)
    assert book.model.gradient_checkpointing and book.data.train_on == "final"
    recipe = load_config(CONFIGS / "sft_tiny_warmstart.yaml", SFTConfig)
    assert recipe == sft_train.warm_start_config()
    assert recipe.model.name == "tiny" and recipe.data.dataset.startswith("builtin:")


# ---------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------


def held_out_records(overrides: list[str], config: str = "sft"):
    cfg = load_config(CONFIGS / f"{config}.yaml", SFTConfig, overrides)
    d = cfg.data
    records = load_sft_records(
        d.dataset,
        max_samples=d.max_samples,
        seed=cfg.seed,
        builtin_task_configs=d.builtin_task_configs,
    )
    return split_train_eval(records, d.eval_size, cfg.seed)[1]


def test_sft_lowers_held_out_loss_and_teaches_the_tag_format(tmp_path):
    overrides = [
        *QUICK,
        "data.dataset=builtin:reasoning-sft:chain_sum",
        f"data.builtin_task_configs={json.dumps(sft_train.WARM_START_TASKS)}",
        "data.max_samples=680",
        "data.eval_size=40",
        "data.max_length=160",
        "train.num_epochs=2",
        "train.batch_size=16",
        "train.gradient_accumulation_steps=1",
        "train.learning_rate=3.0e-3",
        "train.warmup_ratio=0.05",
        "eval.eval_every=80",
        "eval.sample_every=0",
        "eval.num_samples=4",
        "eval.sample_max_new_tokens=48",
        "eval.sample_do_sample=false",
        "logging.log_every=10",
    ]
    run_dir = tmp_path / "run"
    assert run(run_dir, overrides) == 0
    evals = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [0, 80]
    start, end = evals
    assert end["eval/loss"] < 0.3 * start["eval/loss"], (start, end)
    assert end["eval/mean_token_accuracy"] > start["eval/mean_token_accuracy"] + 0.5

    held_out = held_out_records(overrides)
    tok = load_tokenizer("tiny")
    before = sft_train.score_generations(
        load_causal_lm("tiny", device="cpu"), tok, held_out, max_new_tokens=48
    )
    after = sft_train.score_generations(
        load_causal_lm(str(run_dir / "final_model"), device="cpu"), tok, held_out, max_new_tokens=48
    )
    assert before["format_rate"] < 0.1
    assert after["format_rate"] >= 0.8, after["completions"][:4]


@pytest.mark.slow
def test_warm_start_recipe_gives_format_and_reward_contrast():
    """The recipe the policy-gradient family starts from: greedy completions in the tag format,
    some (not all) held-out answers right, greedy and sampled."""
    final = sft_train.warm_start_model()  # cached per session: later callers reuse it
    summary = json.loads((final.parent / "summary.json").read_text())
    assert summary["outcome"] == "succeeded"
    assert summary["final_eval"]["eval/loss"] < 0.2
    held_out = held_out_records([], config="sft_tiny_warmstart")
    model = load_causal_lm(str(final), device="cpu")
    tok = load_tokenizer(str(final))
    greedy = sft_train.score_generations(model, tok, held_out, max_new_tokens=64)
    torch.manual_seed(0)
    sampled = sft_train.score_generations(
        model, tok, held_out, max_new_tokens=64, do_sample=True, temperature=1.0
    )
    assert greedy["format_rate"] >= 0.95 and sampled["format_rate"] >= 0.9
    assert 0.2 <= greedy["correct_rate"] <= 0.95, greedy["correct_rate"]
    assert 0.15 <= sampled["correct_rate"] <= 0.9, sampled["correct_rate"]
