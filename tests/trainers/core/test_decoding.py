"""The sampling loop (trainers/core/decoding.py), checked against transformers as the independent
source: its logits warpers for the filters, ``model.generate`` for greedy decoding; and the
rollout engine under it checked against the loop it replaced (the oracle in
trainers/core/decoding_oracles.py: the same draws from the same generator) and against a
prefill of the concatenation (``append``)."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tests._helpers.decoding import QUESTIONS, SMOLLM2, SMOLLM2_DIR, staggered_stops
from trainers.core.decoding import (
    GREEDY,
    NonFiniteLogitsError,
    RolloutEngine,
    Sampling,
    _last_logits_only,
    choose_next,
    cut_after_first_stop,
    draw,
    draw_dense,
    draw_within_top_k,
    filter_logits,
    left_pad,
    pick_by_inverse_cdf,
    sample_tokens,
)
from trainers.core.decoding_oracles import generate_greedy, previous_sample_tokens
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids, generate_completions
from trainers.core.logprobs import position_ids_of
from trainers.core.models import load_causal_lm, load_tokenizer


def hf_filter(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """transformers' warpers in the order ``generate`` builds them."""
    warpers = LogitsProcessorList([TemperatureLogitsWarper(s.temperature)])
    if s.top_k:
        warpers.append(TopKLogitsWarper(top_k=s.top_k))
    if s.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=s.top_p))
    if s.min_p:
        warpers.append(MinPLogitsWarper(min_p=s.min_p))
    return warpers(torch.zeros(logits.shape[0], 1, dtype=torch.long), logits.clone())


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(temperature=0.7),
        Sampling(temperature=1.0, top_k=5),
        Sampling(temperature=0.6, top_p=0.9),
        Sampling(temperature=1.3, min_p=0.1),
        Sampling(temperature=0.6, top_k=20, top_p=0.95),
        Sampling(temperature=0.8, top_k=50, top_p=0.5, min_p=0.05),
        Sampling(temperature=1.0, top_k=1),
        Sampling(temperature=2.0, top_p=0.01),
    ],
    ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}-minp{s.min_p}",
)
def test_filters_equal_transformers_warpers(sampling):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=gen) * 3
    logits[0, :10] = 4.0  # ties at the top: top-k keeps every tied token, as transformers does
    ours, theirs = filter_logits(logits, sampling), hf_filter(logits, sampling)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    kept = ~torch.isinf(ours)
    assert torch.allclose(ours[kept], theirs[kept])
    assert kept.any(dim=-1).all(), "every filter keeps at least the most likely token"


def test_top_k_one_is_greedy_and_draws_follow_the_filtered_distribution():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 50, generator=gen)
    assert torch.equal(choose_next(logits, Sampling(top_k=1)), logits.argmax(-1))
    assert torch.equal(choose_next(logits, GREEDY), logits.argmax(-1))

    row = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    sampling = Sampling(temperature=0.8, top_k=4)
    expected = filter_logits(row, sampling).softmax(-1)[0]
    draws = choose_next(row.expand(20000, -1), sampling, torch.Generator().manual_seed(2))
    freq = torch.bincount(draws, minlength=6).float() / draws.numel()
    assert freq[4:].sum() == 0, "a token outside the top 4 was drawn"
    assert torch.allclose(freq, expected, atol=0.015), (freq, expected)


def test_inverse_cdf_pick_by_hand_and_never_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.5, 0.25, 0.0]]).expand(7, -1)
    # cumulative 0, .25, .25, .75, 1, 1: u in [0, .25) -> 1, [.25, .75) -> 3, [.75, 1) -> 4
    uniforms = torch.tensor([0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0 - 2**-24])
    assert pick_by_inverse_cdf(probs, uniforms).tolist() == [1, 1, 3, 3, 4, 4, 4]
    # u = 1 exactly (what rounding of u x total can reach) still picks the last possible token
    assert pick_by_inverse_cdf(probs[:1], torch.tensor([1.0])).tolist() == [4]
    # unnormalised rows (fp32 softmax sums to 1 only approximately) are scaled by their total
    assert pick_by_inverse_cdf(torch.tensor([[2.0, 0.0, 6.0]]), torch.tensor([0.3])).tolist() == [2]


def test_draws_over_a_real_vocabulary_match_the_distribution():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 2000, generator=gen) * 2
    sampling = Sampling(temperature=0.9, top_p=0.8)
    expected = filter_logits(logits, sampling).softmax(-1)[0]
    draws = choose_next(logits.expand(40000, -1), sampling, torch.Generator().manual_seed(4))
    freq = torch.bincount(draws, minlength=2000).float() / draws.numel()
    assert freq[expected == 0].sum() == 0, "a token outside the top-p nucleus was drawn"
    top = expected.topk(5).indices
    assert torch.allclose(freq[top], expected[top], atol=0.01), (freq[top], expected[top])


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(temperature=0.6, top_k=20, top_p=0.95),  # the policy-gradient recipes'
        Sampling(temperature=0.8, top_k=20, top_p=0.95),  # rejection sampling's
        Sampling(temperature=1.0, top_k=5),
        Sampling(temperature=0.8, top_k=50, top_p=0.5, min_p=0.05),
        Sampling(temperature=1.3, top_k=2, top_p=0.3),
    ],
    ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}-minp{s.min_p}",
)
def test_a_top_k_draw_on_its_candidates_picks_what_the_whole_vocabulary_picks(sampling):
    """The draw computed on the k candidates (the fast path) against the draw over all 49,152
    tokens with the same uniforms: random rows, rows rounded to bfloat16 (many ties near the
    k-th value), rows that tie at the k-th on purpose, and rows with fewer finite logits than
    k (the dense draw takes those)."""
    gen = torch.Generator().manual_seed(5)
    vocab = 49152
    rows = torch.randn(64, vocab, generator=gen) * 4
    rounded = (torch.randn(64, vocab, generator=gen) * 4).bfloat16().float()
    tied = torch.randn(8, vocab, generator=gen)
    tied[:, :40] = 9.0  # 40 tokens share the top value: top-k keeps all of them
    tied[:4, 40:43] = 8.0
    short = torch.full((4, vocab), float("-inf"))
    short[:, 0] = 1.0  # one finite logit, fewer than any k here
    for logits in (rows, rounded, tied, short):
        uniforms = torch.rand(logits.shape[0], generator=gen)
        assert torch.equal(draw(logits, sampling, uniforms), draw_dense(logits, sampling, uniforms))
    assert draw_within_top_k(short, sampling, torch.rand(4)) is None  # the rest tie at -inf
    assert draw(short, sampling, torch.rand(4)).tolist() == [0, 0, 0, 0]
    kept = filter_logits(rounded, sampling)
    picks = draw(rounded, sampling, torch.rand(64, generator=gen))
    assert torch.isfinite(kept.gather(-1, picks[:, None])).all()  # never a filtered-out token


def test_bad_sampling_settings_are_refused_with_the_rule():
    for kwargs, words in [
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"min_p": 1.5}, "min_p must be in [0, 1]"),
    ]:
        with pytest.raises(ValueError) as err:
            Sampling(**kwargs)
        assert words in str(err.value)
    Sampling(do_sample=False, temperature=0.0)  # greedy ignores the temperature


def test_left_pad_and_cut_after_first_stop():
    ids, mask = left_pad([[5, 6, 7], [8], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert cut_after_first_stop([1, 2, 9, 3, 9], {9}) == [1, 2, 9]
    assert cut_after_first_stop([1, 2, 3], {9}) == [1, 2, 3]


@pytest.fixture(scope="module", params=["tiny", "tiny-llama"])
def lm(request):
    tok = load_tokenizer(request.param)
    model = load_causal_lm(request.param, device="cpu", dtype="fp32", trainable=False)
    model.eval()
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    assert len({len(p) for p in prompts}) == len(prompts), "rows of different lengths (padding)"
    return model, tok, prompts


def test_greedy_tokens_equal_transformers_generate_on_left_padded_rows(lm):
    model, tok, prompts = lm
    pad_id, stops = tok.pad_token_id, set(end_of_turn_ids(tok))
    ours = sample_tokens(model, prompts, max_new_tokens=20, stop_ids=stops, pad_id=pad_id)
    assert ours == generate_greedy(model, prompts, pad_id, stops, 20)
    assert [len(r) for r in ours] == [20, 20, 20]

    # Make a token the greedy rows produce a stop token: rows end at different steps, a finished
    # row stops growing, and the loop ends when every row has stopped.
    stop = {ours[0][5], *stops}
    cut = sample_tokens(model, prompts, max_new_tokens=20, stop_ids=stop, pad_id=pad_id)
    assert cut == generate_greedy(model, prompts, pad_id, stop, 20)
    assert cut[0] == ours[0][: ours[0].index(ours[0][5]) + 1]
    assert all(r == cut_after_first_stop(o, stop) for r, o in zip(cut, ours, strict=True))


def test_stopped_rows_leave_the_batch(lm, record_forward_shapes):
    """Once a row has stopped (one of three: a quarter or more), the following steps run without
    it, and every later token is still drawn from its own row's distribution (top-3 of that
    row's logits, checked by re-scoring each row alone)."""
    model, tok, prompts = lm
    pad_id = tok.pad_token_id
    sampling = Sampling(temperature=3.0, top_k=3)

    def run(stop_ids):
        torch.manual_seed(11)
        return sample_tokens(
            model, prompts, max_new_tokens=12, stop_ids=stop_ids, pad_id=pad_id, sampling=sampling
        )

    free = run(set())

    def first_use(token: int) -> list[int]:  # per row: the step it first appears (12: never)
        return sorted(row.index(token) if token in row else 12 for row in free)

    # a token that one row draws first, at a step k >= 1, before the other rows do
    candidates = [(first_use(t)[0], t) for t in {t for row in free for t in row}]
    k, token = min((k, t) for k, t in candidates if 1 <= k < first_use(t)[1] and k < 10)
    shapes = record_forward_shapes(model)
    got = run({token})
    rows_per_step = [shape[0] for shape in shapes]
    assert rows_per_step[: k + 1] == [3] * (k + 1)  # prefill + steps with every row
    assert rows_per_step[k + 1 :] and max(rows_per_step[k + 1 :]) == 2, rows_per_step
    stopper = [token in row and row.index(token) == k for row in free].index(True)
    assert got[stopper] == free[stopper][: k + 1]  # cut after its stop token
    for prompt, row in zip(prompts, got, strict=True):
        ids = torch.tensor([prompt + row])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        top3 = logits.topk(3, dim=-1).indices
        assert all(t in top3[i].tolist() for i, t in enumerate(row)), row


def test_one_prefill_repeated_equals_repeating_the_prompt(lm):
    model, tok, prompts = lm
    pad_id, stops = tok.pad_token_id, set(end_of_turn_ids(tok))
    once = sample_tokens(model, prompts, max_new_tokens=12, stop_ids=stops, pad_id=pad_id)
    grouped = sample_tokens(
        model, prompts, max_new_tokens=12, stop_ids=stops, pad_id=pad_id, repeats=3
    )
    assert grouped == [row for row in once for _ in range(3)]

    # Sampled: the rows of a group are independent draws from the same prompt.
    torch.manual_seed(0)
    sampled = sample_tokens(
        model,
        prompts,
        max_new_tokens=12,
        stop_ids=stops,
        pad_id=pad_id,
        sampling=Sampling(temperature=1.0),
        repeats=4,
    )
    assert len(sampled) == 12
    for g in range(3):
        group = [tuple(r) for r in sampled[4 * g : 4 * g + 4]]
        assert len(set(group)) > 1, f"group {g}: four identical samples"


def test_sampled_first_tokens_stay_inside_top_k(lm):
    model, tok, prompts = lm
    pad_id = tok.pad_token_id
    ids, mask = left_pad(prompts, pad_id)
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
        ).logits[:, -1]
    top3 = logits.topk(3, dim=-1).indices.tolist()
    torch.manual_seed(3)
    rows = sample_tokens(
        model,
        prompts,
        max_new_tokens=1,
        stop_ids=[],
        pad_id=pad_id,
        sampling=Sampling(temperature=5.0, top_k=3),
        repeats=30,
    )
    firsts = [row[0] for row in rows]
    for p in range(len(prompts)):
        drawn = set(firsts[30 * p : 30 * p + 30])
        assert drawn <= set(top3[p]) and len(drawn) > 1, (drawn, top3[p])


def test_generate_completions_groups_samples_and_decodes_up_to_the_stop(lm):
    model, tok, _ = lm
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS[:2]]
    model.train()
    greedy = generate_completions(model, tok, chats, max_new_tokens=8, do_sample=False)
    assert model.training, "the model's mode is restored"
    many = generate_completions(
        model, tok, chats, max_new_tokens=8, do_sample=False, samples_per_prompt=2, batch_size=1
    )
    assert many == [greedy[0], greedy[0], greedy[1], greedy[1]]
    ids = [chat_prompt_ids(tok, c) for c in chats]
    model.eval()
    tokens = sample_tokens(
        model, ids, max_new_tokens=8, stop_ids=end_of_turn_ids(tok), pad_id=tok.pad_token_id
    )
    assert greedy == [tok.decode(t, skip_special_tokens=False) for t in tokens]


def test_bad_lengths_are_refused(lm):
    model, tok, prompts = lm
    with pytest.raises(ValueError, match="max_new_tokens and repeats must be >= 1"):
        sample_tokens(model, prompts, max_new_tokens=0, stop_ids=[], pad_id=0)
    assert sample_tokens(model, [], max_new_tokens=4, stop_ids=[], pad_id=0) == []


def test_nan_logits_stop_sampling_with_one_clear_error_not_an_out_of_range_token():
    """Found on an H100 (GRPO, bf16): a policy whose weights had become NaN gave NaN logits, the
    inverse-CDF pick answered one past the vocabulary and CUDA failed later inside the embedding
    lookup with a device-side assert. The pick now stays in range and the loop names the cause."""
    nan_row = torch.full((1, 5), float("nan"))
    assert pick_by_inverse_cdf(nan_row, torch.tensor([0.5])).tolist() == [4]
    tok = load_tokenizer("tiny")
    model = load_causal_lm("tiny", device="cpu", dtype="fp32", trainable=False)
    model.eval()
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": QUESTIONS[0]}])]
    with pytest.raises(NonFiniteLogitsError, match="learning rate"):
        sample_tokens(
            model,
            prompts,
            max_new_tokens=3,
            stop_ids=[],
            pad_id=tok.pad_token_id,
            sampling=Sampling(temperature=1.0),
        )


# ---------------------------------------------------------------------------------------------
# The rollout engine against the loop it replaced


def both(model, prompts, seed=None, **kw):
    """The engine's rows and the previous loop's, from the same random state."""
    if seed is not None:
        torch.manual_seed(seed)
    ours = sample_tokens(model, prompts, **kw)
    if seed is not None:
        torch.manual_seed(seed)
    return ours, previous_sample_tokens(model, prompts, **kw)


@pytest.mark.parametrize(
    "sampling, repeats",
    [
        (GREEDY, 1),
        (GREEDY, 3),
        (Sampling(temperature=1.0), 1),
        (Sampling(temperature=0.7, top_k=20, top_p=0.95), 4),
    ],
    ids=["greedy", "greedy-groups", "sampled", "sampled-groups"],
)
def test_engine_gives_the_previous_loops_tokens(lm, sampling, repeats):
    """Greedy and sampled (same seed), single rows and GRPO groups, rows that never stop and rows
    that stop at different steps (so some leave the batch while others go on): the same tokens
    as the loop the engine replaced."""
    model, tok, prompts = lm
    kw = dict(max_new_tokens=16, pad_id=tok.pad_token_id, sampling=sampling, repeats=repeats)
    ours, theirs = both(model, prompts, seed=7, stop_ids=[], **kw)
    assert ours == theirs and [len(r) for r in ours] == [16] * len(prompts) * repeats
    stops = [*end_of_turn_ids(tok), *staggered_stops(ours[::repeats])]
    ours, theirs = both(model, prompts, seed=7, stop_ids=stops, **kw)
    assert ours == theirs
    if sampling.do_sample:  # (greedy rows of the random-init presets repeat one token)
        lengths = {len(r) for r in ours}
        assert len(lengths) > 1 and min(lengths) < 16, lengths  # rows stop at different steps


def test_engine_with_an_explicit_generator_draws_what_the_previous_loop_drew(lm):
    model, tok, prompts = lm
    kw = dict(max_new_tokens=10, stop_ids=[], pad_id=tok.pad_token_id, repeats=2)
    kw["sampling"] = Sampling(temperature=1.5, min_p=0.02)
    ours = sample_tokens(model, prompts, generator=torch.Generator().manual_seed(3), **kw)
    theirs = previous_sample_tokens(
        model, prompts, generator=torch.Generator().manual_seed(3), **kw
    )
    assert ours == theirs


class WithoutLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no ``logits_to_keep``: every position gets logits."""

    def __init__(self, lm):
        super().__init__()
        self.lm, self.config = lm, lm.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kw):
        return self.lm(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kw
        )


def test_a_model_without_logits_to_keep_gives_the_same_tokens(lm, record_forward_shapes):
    model, tok, prompts = lm
    plain = WithoutLogitsToKeep(model)
    assert _last_logits_only(plain) == {} and _last_logits_only(model) != {}
    kw = dict(max_new_tokens=12, stop_ids=end_of_turn_ids(tok), pad_id=tok.pad_token_id)
    assert sample_tokens(plain, prompts, **kw) == sample_tokens(model, prompts, **kw)


def test_lora_model_decodes_with_its_adapters(lm):
    """A peft model (adapters with non-zero B, so they change the output): the engine's greedy
    tokens equal the previous loop's and ``generate``'s, and differ from the base model's."""
    from trainers.core import lora
    from trainers.core.config import LoraSection

    model, tok, prompts = lm
    base = load_causal_lm(model.name_or_path, device="cpu", dtype="fp32", trainable=False)
    torch.manual_seed(0)
    adapted = lora.add_adapters(base, LoraSection(enabled=True, rank=8))
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    adapted.eval()
    pad_id, stops = tok.pad_token_id, set(end_of_turn_ids(tok))
    kw = dict(max_new_tokens=12, stop_ids=stops, pad_id=pad_id)
    ours = sample_tokens(adapted, prompts, **kw)
    assert ours == previous_sample_tokens(adapted, prompts, **kw)
    assert ours == generate_greedy(adapted, prompts, pad_id, stops, 12)
    assert ours != sample_tokens(model, prompts, **kw), "the adapters changed nothing"


HOT = Sampling(temperature=1.5)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def continuation(model, rows, pad_id, new, seed):
    """Tokens after each full row from a fresh prefill of it (the reference), drawn with
    ``gen(seed)``."""
    return sample_tokens(
        model,
        rows,
        max_new_tokens=new,
        stop_ids=[],
        pad_id=pad_id,
        sampling=HOT,
        generator=gen(seed),
    )


@torch.no_grad()
def last_logits(model, rows, pad_id) -> torch.Tensor:
    ids, mask = left_pad(rows, pad_id)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_of(mask))
    return out.logits[:, -1]


def test_append_then_decode_equals_prefilling_the_concatenation(lm):
    """Multi-turn: rows decode, stop at different steps (kept, not released), get observations
    of different lengths appended through their cache, and decode again: their next-token logits
    equal those of a prefill of prompt + first turn + observation, and so do their draws from the
    same generator. Rows not appended to wait; a released row is gone."""
    model, tok, prompts = lm
    pad_id = tok.pad_token_id
    free = previous_sample_tokens(
        model,
        prompts,
        max_new_tokens=8,
        stop_ids=[],
        pad_id=pad_id,
        sampling=HOT,
        generator=gen(1),
    )
    stops = staggered_stops(free)
    engine = RolloutEngine(model, pad_id=pad_id, keep_stopped=True)
    engine.prefill(prompts, room=8)
    turn1 = engine.decode(max_new_tokens=8, stop_ids=stops, sampling=HOT, generator=gen(1))
    assert list(turn1.values()) == previous_sample_tokens(
        model,
        prompts,
        max_new_tokens=8,
        stop_ids=stops,
        pad_id=pad_id,
        sampling=HOT,
        generator=gen(1),
    )
    assert len({len(t) for t in turn1.values()}) > 1, turn1  # some stopped early: kept

    observations = {0: [5, 6, 7, 8, 9], 2: [11]}
    engine.append(list(observations), list(observations.values()))
    full = [prompts[r] + turn1[r] + obs for r, obs in observations.items()]
    torch.testing.assert_close(engine.logits, last_logits(model, full, pad_id), atol=1e-4, rtol=0)
    turn2 = engine.decode(max_new_tokens=6, stop_ids=[], sampling=HOT, generator=gen(2))
    assert list(turn2) == [0, 2]  # row 1 waits
    assert list(turn2.values()) == continuation(model, full, pad_id, 6, seed=2)

    engine.append([1], [[4, 4]])  # the waiting row resumes with its own observation
    turn3 = engine.decode(max_new_tokens=5, stop_ids=[], sampling=HOT, generator=gen(3))
    full1 = prompts[1] + turn1[1] + [4, 4]
    assert turn3 == {1: continuation(model, [full1], pad_id, 5, seed=3)[0]}

    engine.release([0])
    with pytest.raises(ValueError, match="not held"):
        engine.append([0], [[1]])
    engine.append([2], [[3]])
    full2 = full[1] + turn2[2] + [3]
    turn4 = engine.decode(max_new_tokens=4, stop_ids=[], sampling=HOT, generator=gen(4))
    assert turn4 == {2: continuation(model, [full2], pad_id, 4, seed=4)[0]}


def test_append_after_prefill_extends_the_prompt_and_the_cache_grows(lm):
    """Tokens appended right after the prefill extend the prompts; the cache reserved only the
    prompts' width, so it grows to take them and the decode."""
    model, tok, prompts = lm
    pad_id = tok.pad_token_id
    engine = RolloutEngine(model, pad_id=pad_id)
    engine.prefill(prompts, repeats=2)
    width = engine.cache.capacity
    extra = {0: [7, 8, 9], 3: [10], 5: [12, 13]}
    engine.append(list(extra), list(extra.values()))
    got = engine.decode(max_new_tokens=6, stop_ids=[], sampling=HOT, generator=gen(5))
    assert engine.cache.capacity > width
    full = [prompts[r // 2] + obs for r, obs in extra.items()]
    assert list(got.values()) == continuation(model, full, pad_id, 6, seed=5)


def test_eager_attention_takes_the_2d_mask_path(lm):
    """Under eager attention the engine hands the model the 2-D mask of valid keys (the model
    builds its own additive mask): same draws as the previous loop, and an append still equals a
    prefill of the concatenation."""
    model, tok, prompts = lm
    eager = load_causal_lm(
        model.name_or_path,
        device="cpu",
        dtype="fp32",
        attn_implementation="eager",
        trainable=False,
    )
    assert eager.config._attn_implementation == "eager"
    pad_id = tok.pad_token_id
    kw = dict(max_new_tokens=10, pad_id=pad_id, sampling=HOT, repeats=2)
    ours, theirs = both(eager, prompts, seed=9, stop_ids=[], **kw)
    assert ours == theirs
    stops = staggered_stops(ours[::2])
    ours, theirs = both(eager, prompts, seed=9, stop_ids=stops, **kw)
    assert ours == theirs and len({len(r) for r in ours}) > 1
    engine = RolloutEngine(eager, pad_id=pad_id, keep_stopped=True)
    engine.prefill(prompts)
    first = engine.decode(max_new_tokens=5, stop_ids=[], sampling=HOT, generator=gen(6))
    engine.append([1], [[9, 9, 9]])
    full = [prompts[1] + first[1] + [9, 9, 9]]
    torch.testing.assert_close(engine.logits, last_logits(eager, full, pad_id), atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.skipif(
    not (SMOLLM2_DIR / "config.json").is_file(),
    reason=f"{SMOLLM2} not pulled (rlhf-lab models pull {SMOLLM2})",
)
def test_smollm2_greedy_equals_generate_and_the_previous_loop():
    tok = load_tokenizer(str(SMOLLM2_DIR))
    model = load_causal_lm(str(SMOLLM2_DIR), device="cpu", dtype="fp32", trainable=False)
    questions = [*QUESTIONS, "Name a colour."]
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    pad_id, stops = tok.pad_token_id, set(end_of_turn_ids(tok))
    kw = dict(max_new_tokens=24, stop_ids=stops, pad_id=pad_id)
    ours = sample_tokens(model, prompts, **kw)
    assert ours == generate_greedy(model, prompts, pad_id, stops, 24)
    assert ours == previous_sample_tokens(model, prompts, **kw)
