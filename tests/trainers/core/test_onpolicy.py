"""The shared "sample from the current policy" step (trainers/core/onpolicy.py) that online DPO and
on-policy distillation both start each step with: rows per prompt, the RNG fixed by (seed, step),
dropout off while sampling and the training mode restored, chunked greedy = unchunked greedy."""

from __future__ import annotations

import pytest
import torch

from trainers.core.decoding import GREEDY, Sampling, sample_tokens
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids
from trainers.core.models import load_causal_lm, load_tokenizer
from trainers.core.onpolicy import pad_id_of, rows_of, sample_policy, step_generator


@pytest.fixture(scope="module")
def tiny():
    tok = load_tokenizer("tiny")
    model = load_causal_lm("tiny", device="cpu", dtype="fp32", trainable=True)
    questions = ["What is 3 + 4?", "Spell 'cat' backward.", "Sort: b, a, c."]
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    return model, tok, prompts


def test_rows_of_repeats_each_owner_in_order():
    assert rows_of(["a", "b"], 3) == ["a", "a", "a", "b", "b", "b"]
    assert rows_of([], 2) == []


def test_step_generator_is_fixed_by_seed_and_step():
    def draw(seed, step):
        return torch.rand(4, generator=step_generator("cpu", seed, step)).tolist()

    assert draw(42, 3) == draw(42, 3)
    assert draw(42, 3) != draw(42, 4)
    assert draw(42, 3) != draw(43, 3)


def test_samples_are_the_decoding_loops_with_dropout_off_and_mode_restored(tiny):
    model, tok, prompts = tiny
    sampling = Sampling(temperature=0.9)
    model.train()
    got = sample_policy(
        model,
        tok,
        prompts,
        max_new_tokens=8,
        sampling=sampling,
        repeats=3,
        generator=step_generator("cpu", 7, 2),
    )
    assert model.training  # restored
    model.eval()
    expected = sample_tokens(
        model,
        prompts,
        max_new_tokens=8,
        stop_ids=set(end_of_turn_ids(tok)),
        pad_id=pad_id_of(tok),
        sampling=sampling,
        repeats=3,
        generator=step_generator("cpu", 7, 2),
    )
    assert got == expected and len(got) == 9
    model.train()


def test_mode_is_restored_when_sampling_raises(tiny):
    model, tok, prompts = tiny
    model.train()
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        sample_policy(model, tok, prompts, max_new_tokens=4, sampling=GREEDY, repeats=0)
    assert model.training


def test_chunked_greedy_equals_one_batch(tiny):
    model, tok, prompts = tiny
    whole = sample_policy(model, tok, prompts, max_new_tokens=8, sampling=GREEDY)
    chunked = sample_policy(model, tok, prompts, max_new_tokens=8, sampling=GREEDY, batch_size=2)
    assert chunked == whole and len(whole) == 3
    assert sample_policy(model, tok, [], max_new_tokens=8, sampling=GREEDY) == []
