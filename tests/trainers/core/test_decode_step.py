"""The fixed-shape decode step (trainers/core/decode_step.py): what a CUDA graph records, run
eagerly on the CPU and checked against the dynamic step it replaces on a GPU (same tokens) and
against ``model.generate`` (greedy). The capture itself needs CUDA: bench/gpu checks it there."""

from __future__ import annotations

import pytest
import torch

from tests._helpers.decoding import QUESTIONS, SMOLLM2_DIR, staggered_stops
from trainers.core.decode_step import (
    STEP_ENV,
    FixedShapeStep,
    bucket_for,
    buckets_for,
    resolve_step_mode,
)
from trainers.core.decoding import GREEDY, RolloutEngine, Sampling, sample_tokens
from trainers.core.decoding_oracles import generate_greedy
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids
from trainers.core.kv_cache import buffer_cache_for
from trainers.core.models import load_causal_lm, load_tokenizer

CPU = torch.device("cpu")


def test_buckets_are_powers_of_two_up_to_the_slots():
    assert buckets_for(1) == (1,)
    assert buckets_for(8) == (1, 2, 4, 8)
    assert buckets_for(12) == (1, 2, 4, 8, 12)
    assert [bucket_for(n, buckets_for(12)) for n in (1, 3, 5, 8, 9, 12)] == [1, 4, 8, 8, 12, 12]
    with pytest.raises(ValueError, match="exceed the largest bucket"):
        bucket_for(13, buckets_for(12))


def test_step_mode_follows_the_device_and_the_environment(monkeypatch):
    monkeypatch.delenv(STEP_ENV, raising=False)
    assert resolve_step_mode("auto", CPU) == "dynamic"
    assert resolve_step_mode("auto", torch.device("cuda")) == "graphs"
    assert resolve_step_mode("fixed", CPU) == "fixed"
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        resolve_step_mode("graphs", CPU)
    with pytest.raises(ValueError, match="unknown decode step 'fast'"):
        resolve_step_mode("fast", CPU)
    monkeypatch.setenv(STEP_ENV, "fixed")
    assert resolve_step_mode("auto", CPU) == "fixed"
    assert resolve_step_mode("dynamic", CPU) == "dynamic"  # the caller's choice wins


@pytest.fixture(scope="module", params=["tiny", "tiny-llama", "tiny-eager"])
def lm(request):
    """The presets under sdpa, and ``tiny`` loaded with eager attention (its prefill takes the
    2-D mask; the fixed step runs its own attention function either way)."""
    name, attention = request.param.removesuffix("-eager"), "eager"
    if not request.param.endswith("-eager"):
        name, attention = request.param, "sdpa"
    tok = load_tokenizer(name)
    model = load_causal_lm(
        name, device="cpu", dtype="fp32", trainable=False, attn_implementation=attention
    )
    model.eval()
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    return model, tok, prompts


def decoded(model, prompts, step, seed=7, **kw):
    torch.manual_seed(seed)
    return sample_tokens(model, prompts, step=step, **kw)


@pytest.mark.parametrize(
    "sampling, repeats",
    [
        (GREEDY, 1),
        (GREEDY, 3),
        (Sampling(temperature=1.0), 4),
        (Sampling(temperature=0.7, top_k=20, top_p=0.95), 4),
    ],
    ids=["greedy", "greedy-groups", "sampled-groups", "filtered-groups"],
)
def test_fixed_steps_give_the_dynamic_steps_tokens(lm, sampling, repeats):
    """Rows that stop at different steps (so the batch shrinks into smaller buckets, and rows
    past the live ones are computed and dropped): the same tokens, greedy and sampled."""
    model, tok, prompts = lm
    kw = dict(max_new_tokens=16, pad_id=tok.pad_token_id, sampling=sampling, repeats=repeats)
    free = decoded(model, prompts, "dynamic", stop_ids=[], **kw)
    stops = [*end_of_turn_ids(tok), *staggered_stops(free[::repeats])]
    dynamic = decoded(model, prompts, "dynamic", stop_ids=stops, **kw)
    assert decoded(model, prompts, "fixed", stop_ids=stops, **kw) == dynamic
    assert decoded(model, prompts, "fixed", stop_ids=[], **kw) == free
    if sampling.do_sample:
        assert min(len(r) for r in dynamic) < 16  # some rows did stop early


def test_greedy_fixed_steps_equal_generate(lm):
    model, tok, prompts = lm
    pad_id, stops = tok.pad_token_id, set(end_of_turn_ids(tok))
    ours = sample_tokens(
        model, prompts, max_new_tokens=20, stop_ids=stops, pad_id=pad_id, step="fixed"
    )
    assert ours == generate_greedy(model, prompts, pad_id, stops, 20)


def test_each_step_runs_at_its_bucket_and_the_bucket_shrinks_as_rows_stop(
    lm, record_forward_shapes
):
    """12 rows (buckets 1, 2, 4, 8, 12): every decode step runs 12 or a power of two, never
    fewer rows than are live; once rows are set aside the steps drop to a smaller bucket."""
    model, tok, prompts = lm
    kw = dict(max_new_tokens=16, pad_id=tok.pad_token_id, repeats=4)
    kw["sampling"] = Sampling(temperature=2.0)
    free = decoded(model, prompts, "dynamic", stop_ids=[], **kw)
    stops = sorted({row[1] for row in free[::2]})  # half the rows stop by their second token
    shapes = record_forward_shapes(model)
    decoded(model, prompts, "fixed", stop_ids=stops, **kw)
    fixed = list(shapes)
    decoded(model, prompts, "dynamic", stop_ids=stops, **kw)
    steps, live = fixed[1:], shapes[len(fixed) + 1 :]  # decode steps (after each prefill)
    assert fixed[0][0] == 3  # the prefill: one row per prompt
    assert all(rows in (1, 2, 4, 8, 12) for rows, _ in steps), steps
    assert all(s[0] >= d[0] for s, d in zip(steps, live, strict=True))
    assert steps[0][0] == 12 and steps[-1][0] <= 8, steps


def test_the_fixed_step_scores_what_the_dynamic_step_scores(lm):
    """Teacher-forced along one path: the next-token logits of the two steps agree to float
    rounding at every position (attention over the whole capacity, unwritten keys masked)."""
    model, tok, prompts = lm
    path = sample_tokens(model, prompts, max_new_tokens=6, stop_ids=[], pad_id=tok.pad_token_id)
    logits = {}
    for step in ("dynamic", "fixed"):
        engine = RolloutEngine(model, pad_id=tok.pad_token_id, step=step)
        engine.prefill(prompts, room=8)
        if step == "fixed":
            engine._fixed = FixedShapeStep(
                model, engine.cache, engine.key_ok, pad_id=tok.pad_token_id, graphs=False, extra={}
            )
        running = torch.zeros(len(prompts), dtype=torch.bool)
        fed = [engine._step(torch.tensor([row[i] for row in path]), running) for i in range(6)]
        logits[step] = torch.stack(fed)
    torch.testing.assert_close(logits["fixed"], logits["dynamic"], atol=1e-5, rtol=0)


def test_a_multi_turn_engine_decodes_the_same_with_fixed_steps(lm):
    """Decode, append an observation to some rows (the others wait, kept behind the live ones
    and inside the bucket), decode again: the same tokens either way."""
    model, tok, prompts = lm
    runs = {}
    for step in ("dynamic", "fixed"):
        torch.manual_seed(3)
        engine = RolloutEngine(model, pad_id=tok.pad_token_id, keep_stopped=True, step=step)
        engine.prefill(prompts, repeats=2, room=40)
        sampling = Sampling(temperature=1.0)
        first = engine.decode(max_new_tokens=6, stop_ids=[], sampling=sampling)
        engine.append([1, 4], [[5, 6, 7], [8]])
        second = engine.decode(max_new_tokens=6, stop_ids=[], sampling=sampling)
        engine.append([0, 1, 2, 3, 4, 5], [[9]] * 6)
        third = engine.decode(max_new_tokens=5, stop_ids=[], sampling=sampling)
        runs[step] = (first, second, third)
    assert runs["fixed"] == runs["dynamic"]
    assert sorted(runs["fixed"][1]) == [1, 4]


def test_the_cache_refuses_a_bad_write_position_and_an_overflow(lm):
    model, _, _ = lm
    cache = buffer_cache_for(model, slots=2, capacity=4)
    with pytest.raises(ValueError, match="one position"):
        cache.begin_fixed_steps(torch.zeros(2, dtype=torch.long))
    cache.advance(4)
    with pytest.raises(RuntimeError, match="KV cache full"):
        cache.advance(1)


@pytest.mark.slow
@pytest.mark.skipif(not (SMOLLM2_DIR / "config.json").is_file(), reason="SmolLM2 not pulled")
def test_smollm2_fixed_steps_greedy_equal_generate_and_sampled_rows_mostly_the_same():
    """On a real model the two steps' logits differ in the last bits (the attention sums over a
    longer, masked key range), so greedy output is the same and a sampled row differs only where
    a uniform falls on a rounding boundary: with the same seed nearly every row is the same."""
    tok = load_tokenizer(str(SMOLLM2_DIR))
    model = load_causal_lm(str(SMOLLM2_DIR), device="cpu", dtype="fp32", trainable=False).eval()
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    pad_id, stops = tok.pad_token_id, set(end_of_turn_ids(tok))
    kw = dict(max_new_tokens=24, stop_ids=stops, pad_id=pad_id)
    greedy = sample_tokens(model, prompts, step="fixed", **kw)
    assert greedy == generate_greedy(model, prompts, pad_id, stops, 24)
    kw.update(max_new_tokens=12, repeats=8, sampling=Sampling(temperature=1.0))
    fixed, dynamic = (decoded(model, prompts, step, seed=11, **kw) for step in ("fixed", "dynamic"))
    same = sum(f == d for f, d in zip(fixed, dynamic, strict=True))
    assert same >= 0.9 * len(fixed), f"{same} of {len(fixed)} rows the same"


@pytest.mark.parametrize("kv_heads", [1, 2, 8])
def test_grouped_decode_attention_equals_sdpa_with_repeated_heads(kv_heads):
    """One query position per row, 8 query heads over ``kv_heads`` key/value heads, a key mask
    with holes (padding, unwritten positions): the same output as transformers' sdpa function,
    which repeats the key/value heads; a longer query goes to that function unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from trainers.core.decode_step import grouped_decode_attention

    gen = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 8 // kv_heads, True
    query = torch.randn(3, 8, 1, 16, generator=gen)
    key, value = (torch.randn(3, kv_heads, 10, 16, generator=gen) for _ in range(2))
    mask = torch.rand(3, 1, 1, 10, generator=gen) > 0.3
    mask[:, :, :, 0] = True
    ours, _ = grouped_decode_attention(module, query, key, value, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert ours.shape == (3, 1, 8, 16)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    longer = torch.randn(3, 8, 4, 16, generator=gen)
    causal = mask.expand(3, 1, 4, 10)
    ours, _ = grouped_decode_attention(module, longer, key, value, causal, scaling=0.25)
    theirs, _ = sdpa_attention_forward(module, longer, key, value, causal, scaling=0.25)
    torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
