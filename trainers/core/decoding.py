"""The rollout engine every family samples with: prefill each prompt once, then decode over a
preallocated KV cache (:class:`RolloutEngine`; :func:`sample_tokens` is the one-call form).

Why our own loop rather than ``model.generate``:

1. **One prefill per prompt.** The ``G`` rollouts of a GRPO group (or the ``N`` samples of
   rejection sampling) share their prompt. The prompt goes through the model once and its KV cache
   is copied to its ``G`` rows, instead of ``G`` identical prefills.
2. **Less per-token work.** The KV cache is one buffer per layer, sized prompt + budget and
   written in place (``trainers/core/kv_cache.py``), where ``generate``'s dynamic cache copies
   every layer's keys and values at each token (``torch.cat``); under sdpa the attention mask
   of a step is a view of the rows' valid keys, not a mask grown and rebuilt per token; the
   prefill asks for the last position's logits only (no LM head over the prompt). One forward
   of one token per row and a few tensor operations per step.
3. **Stopped rows leave the batch**: once they are a quarter of it, the rows still decoding move
   to the cache's first slots (only the slots that change are copied) and every later step runs
   on those, so a group whose completions end early stops paying for them while its long ones
   finish.
4. **The sampling distribution is the one written here** — temperature, then top-k, then top-p,
   then min-p, in the order and with the tie and "keep at least one" rules transformers uses —
   and nothing else. A checkpoint's ``generation_config.json`` (repetition penalty, its own top-k)
   cannot silently make the behaviour policy differ from the π we score.

Rows are left-padded; position ids are ``cumsum(attention_mask) − 1`` (clamped at 0 on padding),
as ``generate`` and the policy-gradient scoring pass use, so greedy output equals ``generate``'s.
A decode step costs mostly the weights' matrix products (reading 135M fp32 weights per step on
SmolLM2): rows decoded together share that read, which is why rollouts are batched.

For multi-turn rollouts the engine keeps stopped rows (``keep_stopped=True``) and ``append``
extends rows through their cache (a tool's observation after the turn's last token), with no
new prefill; ``release`` lets rows go.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from trainers.core.decode_step import FixedShapeStep, resolve_step_mode
from trainers.core.distributed import gathered
from trainers.core.harness import raise_if_stopping
from trainers.core.kv_cache import buffer_cache_for
from trainers.core.logprobs import position_ids_of


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. ``do_sample=False`` is greedy (the filters are ignored);
    ``top_k=0``, ``top_p=1`` and ``min_p=0`` switch the corresponding filter off."""

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")


GREEDY = Sampling(do_sample=False)


@dataclass(frozen=True)
class TextStop:
    """Stop a row once the text it drew in this call contains ``text`` (a multi-token string,
    such as a tool call's close tag). ``decode`` turns a row's ids into text; ``trigger_ids``
    are the tokens whose text holds the last character of ``text``: only a row that has just
    drawn one of them is decoded and checked, so the check costs nothing on other steps."""

    text: str
    decode: Callable[[list[int]], str]
    trigger_ids: frozenset[int]

    @classmethod
    def for_tokenizer(cls, text: str, tokenizer) -> TextStop:
        """The stop for ``text`` under ``tokenizer`` (every token whose text holds its last
        character is a trigger)."""
        last = text[-1]
        vocab = tokenizer.get_vocab()
        triggers = frozenset(
            i for i in vocab.values() if last in tokenizer.decode([i], skip_special_tokens=False)
        )
        return cls(text, lambda ids: tokenizer.decode(ids, skip_special_tokens=False), triggers)


# Stopped rows leave the batch once they are this share of the rows still in it.
DROP_STOPPED_SHARE = 0.25
# With fixed-shape steps the cache's capacity is rounded up to a multiple of this (the attention
# reads every position; the fused kernels want aligned key lengths).
CAPACITY_MULTIPLE = 64


def filter_logits(logits: Tensor, sampling: Sampling) -> Tensor:
    """Next-token logits (rows, vocab) scaled by the temperature, with the tokens that top-k,
    top-p and min-p exclude set to −inf. Each filter always keeps the most likely token."""
    logits = logits / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth_largest = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))  # ties with k-th kept
    if sampling.top_p < 1.0:
        # stable: of tied tokens the nucleus's edge drops the lower ids first, wherever the
        # row is sorted (the whole vocabulary, or the top-k candidates in vocabulary order)
        ascending, order = torch.sort(logits, dim=-1, stable=True)
        mass_below = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = mass_below <= 1.0 - sampling.top_p
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if sampling.min_p > 0:
        probs = logits.softmax(dim=-1)
        floor = sampling.min_p * probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def choose_next(logits: Tensor, sampling: Sampling, generator=None) -> Tensor:
    """One token id per row: argmax when greedy, else a draw from softmax(filtered logits)."""
    if not sampling.do_sample:
        return logits.argmax(dim=-1)
    uniforms = torch.rand(logits.shape[0], generator=generator, device=logits.device)
    return draw(logits, sampling, uniforms)


def draw(logits: Tensor, sampling: Sampling, uniforms: Tensor) -> Tensor:
    """Row i's draw from softmax(filtered logits) by ``uniforms[i]`` (:func:`pick_by_inverse_cdf`).
    With top-k on, only the k candidates are filtered and drawn from (:func:`draw_within_top_k`):
    the same tokens as the whole-vocabulary computation (:func:`draw_dense`), whose sort and
    cumulative sum over every token cost more than the model's forward at 32 rows on a CPU."""
    if 0 < sampling.top_k < logits.shape[-1]:
        picked = draw_within_top_k(logits, sampling, uniforms)
        if picked is not None:
            return picked
    return draw_dense(logits, sampling, uniforms)


def draw_dense(logits: Tensor, sampling: Sampling, uniforms: Tensor) -> Tensor:
    """The draw over the whole vocabulary: every filter, the softmax and the cumulative sum on
    all ``vocab`` logits of each row."""
    return pick_by_inverse_cdf(filter_logits(logits, sampling).softmax(dim=-1), uniforms)


# Candidates beyond which tokens tied with the k-th are left to the whole-vocabulary draw.
TIED_CANDIDATES_MAX = 1024


def draw_within_top_k(logits: Tensor, sampling: Sampling, uniforms: Tensor) -> Tensor | None:
    """The top-k draw computed on the candidates alone: the temperature-scaled logits' top k
    (and every token tied with the k-th, as top-k keeps them), put back in vocabulary order so
    that the cumulative sum runs as it does over the whole row, then top-p and min-p among them
    and the inverse-CDF pick. Tokens outside the candidates have probability zero in the dense
    computation, so the picks are the same (up to the order of additions in the softmax's sum:
    a last-bit difference that moves a pick only when a uniform falls on it). None when more
    than :data:`TIED_CANDIDATES_MAX` tokens tie with the k-th (a row with too few finite
    logits): the dense draw takes those."""
    k = sampling.top_k
    scaled = logits / sampling.temperature  # ties are decided after scaling, as the filter does
    values, ids = torch.topk(scaled, k, dim=-1)
    kth = values[..., -1:]
    width = int((scaled >= kth).sum(dim=-1).max())  # k unless tokens tie with the k-th
    if width > TIED_CANDIDATES_MAX:
        return None
    if width > k:
        values, ids = torch.topk(scaled, width, dim=-1)
        values = values.masked_fill(values < kth, float("-inf"))  # rows with fewer ties
    ids, order = ids.sort(dim=-1)
    among = values.gather(-1, order)
    rest = Sampling(temperature=1.0, top_p=sampling.top_p, min_p=sampling.min_p)
    picked = pick_by_inverse_cdf(filter_logits(among, rest).softmax(dim=-1), uniforms)
    return ids.gather(-1, picked[:, None]).squeeze(-1)


def pick_by_inverse_cdf(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Row i's token: the first whose cumulative probability exceeds ``uniforms[i]`` times the
    row's total, i.e. a draw from ``probs[i]`` when ``uniforms[i]`` is uniform on [0, 1). One
    random number per row (``torch.multinomial`` costs ~20x more on the CPU for the same draw).
    A token of probability zero is never picked: the threshold stays below the row's total."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    threshold = torch.minimum(uniforms[:, None] * total, total.nextafter(torch.zeros_like(total)))
    picked = torch.searchsorted(cdf, threshold, right=True).squeeze(-1)
    # A row of NaN probabilities makes searchsorted answer one past the vocabulary; kept in
    # range so that no embedding lookup fails on the device (the sampling loop reports the
    # non-finite logits themselves, once, at its end: no synchronisation per token).
    return picked.clamp_(max=probs.shape[-1] - 1)


class NonFiniteLogitsError(FloatingPointError):
    """The model gave NaN or infinite next-token logits while sampling."""


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(ids, attention_mask), both (len(rows), longest row), padding on the left."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask


def cut_after_first_stop(tokens: list[int], stop_ids: set[int]) -> list[int]:
    """The tokens up to and including the first stop token (all of them when there is none)."""
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return tokens[: i + 1]
    return tokens


def _last_logits_only(model) -> dict:
    """Ask the model for the last position's logits only, where its forward supports it (the
    prefill then never projects the whole prompt onto the vocabulary)."""
    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}


def _non_finite_error() -> NonFiniteLogitsError:
    return NonFiniteLogitsError(
        "The model gave NaN or infinite next-token logits while sampling: its weights are "
        "probably no longer finite (a diverged update). Lower the learning rate or resume "
        "from an earlier checkpoint."
    )


class RolloutEngine:
    """Rows of token ids decoded together over one preallocated KV cache (:mod:`kv_cache`).

    ``prefill(prompts, repeats)`` runs each prompt once and gives its ``repeats`` rows the same
    cache; ``decode(...)`` draws tokens for the rows that have next-token logits until each
    stops or the budget ends; ``append(rows, tokens)`` extends rows (a tool's observation in a
    multi-turn rollout) through their cache, without a new prefill; ``release(rows)`` lets rows
    go. Rows are named by their index at prefill (prompt ``p``'s rows are ``p*repeats ...``).

    The rows being decoded sit in the cache's first slots, so every forward is over those rows
    only. A row that stops is moved out of them once stopped rows are a quarter of the batch
    (:data:`DROP_STOPPED_SHARE`; moving rows costs a copy of their cache, so not at each stop);
    with ``keep_stopped`` it is kept behind them (its cache intact) for a later ``append``,
    otherwise it is released. Positions are shared by all rows (the cache's length); each row's
    valid keys are marked in ``key_ok`` (prompt padding and the steps it sat out are not), and
    its position ids count only its own tokens.

    ``step`` chooses how a decode step runs (``trainers/core/decode_step.py``): ``dynamic`` over
    the filled positions, ``fixed`` at a bucket's fixed shapes, ``graphs`` (the fixed step as
    CUDA graphs), ``auto`` (graphs on CUDA, else dynamic). All give the same tokens.

    The methods need no gradients and run the model as it is (``model.eval()`` first); under
    torchrun call them inside :func:`gathered`.
    """

    def __init__(self, model, *, pad_id: int, keep_stopped: bool = False, step: str = "auto"):
        self.model, self.pad_id, self.keep_stopped = model, pad_id, keep_stopped
        self.device = next(model.parameters()).device
        self._sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"
        self.step_mode = resolve_step_mode(step, self.device)
        self._fixed: FixedShapeStep | None = None  # built per cache (it holds its addresses)
        self._keep_last = _last_logits_only(model)
        self.cache = None
        self.rows: list[int] = []  # the row held in each slot
        self.active = 0  # slots [0, active) have next-token logits (decode draws for them)
        self.logits: Tensor | None = None
        self.pending: dict[int, int] = {}  # a row's last drawn token, not yet in the cache
        self._text_stop: TextStop | None = None
        self._text_stopped: dict[int, int] = {}  # row -> tokens drawn up to its text stop

    # -- state kept per slot ---------------------------------------------------------------

    def _arrange(self, order: list[int]) -> None:
        """Slot ``i`` takes the row of slot ``order[i]``; slots not named are freed."""
        index = torch.tensor(order, dtype=torch.long, device=self.device)
        self.cache.arrange(index)
        k = len(order)
        self.key_ok[:k] = self.key_ok[index]
        self.next_pos[:k] = self.next_pos[index]
        self.rows = [self.rows[i] for i in order]

    def _reserve(self, positions: int) -> None:
        """Room in the cache for ``positions`` in all (grown, the filled part kept)."""
        if positions <= self.cache.capacity:
            return
        self._fixed = None  # its buffers and graphs point at the old cache
        self.cache.grow(positions)
        grown = self.key_ok.new_zeros((self.key_ok.shape[0], positions))
        grown[:, : self.key_ok.shape[1]] = self.key_ok
        self.key_ok = grown

    def _forward(self, ids: Tensor, positions: Tensor, mask: Tensor | None = None) -> Tensor:
        """Run rows ``[0, len(ids))`` over new positions; their next-token logits (fp32)."""
        rows, new = ids.shape
        end = self.cache.length + new
        if mask is None:
            mask = self._mask(rows, new, end)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            **self._keep_last,
        )
        return out.logits[:, -1].float()

    def _mask(self, rows: int, new: int, end: int) -> Tensor:
        """The attention mask of ``new`` positions ending at ``end``: under sdpa the 4-D
        boolean mask itself (a view of ``key_ok`` for one position: nothing built per token),
        else the 2-D one the model turns into its own."""
        keys = self.key_ok[:rows, :end]
        if not self._sdpa:
            return keys.long()
        if new == 1:
            return keys[:, None, None, :]
        start = end - new
        causal = torch.ones(new, end, dtype=torch.bool, device=self.device).tril(start)
        return keys[:, None, None, :] & causal

    # -- the interface -----------------------------------------------------------------------

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], *, repeats: int = 1, room: int = 0) -> None:
        """Start over with ``len(prompts) * repeats`` rows: each prompt through the model once,
        its cache and next-token logits given to its ``repeats`` consecutive rows. ``room``:
        positions to reserve beyond the longest prompt (the decode budget)."""
        ids, mask = left_pad(prompts, self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = position_ids_of(mask)
        slots, width = len(prompts) * repeats, ids.shape[1]
        capacity = width + room
        if self.step_mode != "dynamic":  # fixed steps read the whole capacity: kernel-friendly
            capacity = -(-capacity // CAPACITY_MULTIPLE) * CAPACITY_MULTIPLE
        self.cache = buffer_cache_for(self.model, slots, capacity)
        self._fixed = None
        self.key_ok = torch.zeros((slots, capacity), dtype=torch.bool, device=self.device)
        self.key_ok[: len(prompts), :width] = mask.bool()
        self.next_pos = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.next_pos[: len(prompts)] = positions[:, -1] + 1
        self.rows, self.pending = list(range(len(prompts))), {}
        # the 2-D mask here, as transformers builds it for a prefill (greedy equals `generate`)
        self.logits = self._forward(ids, positions, mask)
        if repeats > 1:
            self._arrange([p for p in range(len(prompts)) for _ in range(repeats)])
            self.rows = list(range(slots))
            self.logits = self.logits.repeat_interleave(repeats, dim=0)
        self.active = slots

    @torch.no_grad()
    def decode(
        self,
        *,
        max_new_tokens: int,
        stop_ids: list[int] | set[int],
        sampling: Sampling = GREEDY,
        generator=None,
        text_stop: TextStop | None = None,
    ) -> dict[int, list[int]]:
        """New tokens for each row that has next-token logits (after ``prefill`` or
        ``append``), cut after its first stop token, after the token that completes
        ``text_stop``'s text, or at ``max_new_tokens``: ``{row: ids}``. Afterwards no row has
        logits; a row's last token is fed by the next ``append``."""
        if self.active == 0:
            return {}
        stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=self.device)
        self._reserve(self.cache.length + max_new_tokens)
        if self.step_mode != "dynamic" and self._fixed is None:
            self._fixed = FixedShapeStep(
                self.model,
                self.cache,
                self.key_ok,
                pad_id=self.pad_id,
                graphs=self.step_mode == "graphs",
                extra=self._keep_last,
            )
        self._text_stop, self._text_stopped = text_stop, {}
        if text_stop is not None:
            ids = sorted(text_stop.trigger_ids)
            self._triggers = torch.tensor(ids, dtype=torch.long, device=self.device)
        drawn = self._decode_loop(max_new_tokens, stops, sampling, generator)
        stop_set = {int(s) for s in stop_ids}
        cut = {row: cut_after_first_stop(t, stop_set) for row, t in drawn.items()}
        cut.update({row: drawn[row][:n] for row, n in self._text_stopped.items()})
        self.pending.update({row: t[-1] for row, t in cut.items()})
        self.active, self.logits = 0, None
        return cut

    def _decode_loop(self, max_new_tokens, stops, sampling, generator) -> dict[int, list[int]]:
        rows = self.active
        started = self.rows[:rows]  # the row of each result line
        tokens = torch.full((rows, max_new_tokens), self.pad_id, dtype=torch.long)
        tokens = tokens.to(self.device)
        live = torch.arange(rows, device=self.device)  # result line of each slot decoding
        finished = torch.zeros(rows, dtype=torch.bool, device=self.device)
        non_finite = torch.zeros((), dtype=torch.bool, device=self.device)
        logits = self.logits
        for step in range(max_new_tokens):
            raise_if_stopping("token")  # a run stops within one token of SIGTERM (harness)
            non_finite |= ~torch.isfinite(logits.sum())  # one reduction: NaN and ±inf survive it
            token = choose_next(logits, sampling, generator).masked_fill(finished, self.pad_id)
            tokens[live, step] = token
            finished |= torch.isin(token, stops)
            if self._text_stop is not None:
                finished |= self._text_stops(token, finished, tokens, live, step, started)
            done = int(finished.sum())
            if step == max_new_tokens - 1 or done == len(live):
                break
            if done and done >= DROP_STOPPED_SHARE * len(live):  # out of the batch and cache
                keep = (~finished).nonzero().squeeze(-1)
                self._set_aside(keep.tolist(), finished.nonzero().squeeze(-1).tolist())
                live, token, finished = live[keep], token[keep], finished[keep]
            logits = self._step(token, finished, steps_left=max_new_tokens - step - 1)
        if bool(non_finite):
            raise _non_finite_error()
        return dict(zip(started, tokens.tolist(), strict=True))

    def _text_stops(self, token, finished, tokens, live, step, started) -> Tensor:
        """Which decoding slots completed the text stop with this step's token (a bool per
        slot); their token counts are kept in ``_text_stopped`` for the cut."""
        stop = self._text_stop
        hit = torch.zeros_like(finished)
        candidates = (torch.isin(token, self._triggers) & ~finished).nonzero().squeeze(-1).tolist()
        for slot in candidates:
            line = int(live[slot])
            if stop.text in stop.decode(tokens[line, : step + 1].tolist()):
                hit[slot] = True
                self._text_stopped[started[line]] = step + 1
        return hit

    def _set_aside(self, keep: list[int], stopped: list[int]) -> None:
        """Slots ``keep`` (in order) become the first ones; ``stopped`` follow them when rows
        are kept for a later ``append``, else they are released."""
        held = list(range(self.active, len(self.rows)))
        order = keep + (stopped if self.keep_stopped else []) + held
        self._arrange(order)
        self.active = len(keep)

    def _step(self, token: Tensor, finished: Tensor, steps_left: int = 1) -> Tensor:
        """Feed one token per decoding row; a row that has stopped (still in the batch until
        it is set aside) feeds padding that no later position of its own will see."""
        rows, at = len(token), self.cache.length
        self.key_ok[:rows, at] = ~finished
        if self._fixed is not None:
            logits = self._fixed(token, self.next_pos[:rows], at, steps_left)
        else:
            logits = self._forward(token[:, None], self.next_pos[:rows, None])
        self.next_pos[:rows] += (~finished).long()
        return logits

    @torch.no_grad()
    def append(self, rows: list[int], tokens: list[list[int]]) -> None:
        """Extend each of ``rows`` by its ``tokens`` (after the row's last drawn token, if it has
        one not yet in the cache) through the cache, as a prefill of the concatenation would,
        and give those rows next-token logits; the other rows wait."""
        slot_of = {row: slot for slot, row in enumerate(self.rows)}
        missing = [r for r in rows if r not in slot_of]
        if missing:
            raise ValueError(f"rows {missing} are not held by the engine (released?)")
        chunks = [[self.pending.pop(r)] if r in self.pending else [] for r in rows]
        chunks = [c + list(t) for c, t in zip(chunks, tokens, strict=True)]
        self._arrange(
            [slot_of[r] for r in rows]
            + [s for s in range(len(self.rows)) if self.rows[s] not in set(rows)]
        )
        ids, mask = left_pad(chunks, self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        at, k = self.cache.length, len(rows)
        self._reserve(at + ids.shape[1])
        self.key_ok[:k, at : at + ids.shape[1]] = mask.bool()
        positions = self.next_pos[:k, None] + position_ids_of(mask)
        self.logits = self._forward(ids, positions)
        self.next_pos[:k] += mask.sum(-1)
        self.active = k

    def release(self, rows: list[int]) -> None:
        """Let ``rows`` go (their cache slots are reused)."""
        gone = set(rows)
        keep = [s for s, r in enumerate(self.rows) if r not in gone]
        active = sum(1 for s in keep if s < self.active)
        self._arrange(keep)
        self.active = active
        if self.logits is not None:
            self.logits = self.logits[[s for s in keep if s < len(self.logits)]]
        for r in gone:
            self.pending.pop(r, None)


@torch.no_grad()
def sample_tokens(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    stop_ids: list[int] | set[int],
    pad_id: int,
    sampling: Sampling = GREEDY,
    repeats: int = 1,
    generator=None,
    step: str = "auto",
) -> list[list[int]]:
    """New token ids for ``len(prompts) * repeats`` rows (the ``repeats`` rows of a prompt are
    consecutive), each cut after its first stop token or at ``max_new_tokens``. Rows that have
    stopped leave the batch (and the KV cache) once they are a quarter of it, so the remaining
    steps cost only the rows still decoding.

    The model is used as it is (call ``model.eval()`` first to switch dropout off). ``step``:
    how each decode step runs (:class:`RolloutEngine`; ``auto`` = CUDA graphs on a GPU).

    This function is the rollout seam: every family samples through it, so another engine
    (vLLM, on machines where it can be installed and tested) would plug in here."""
    if not prompts:
        return []
    if max_new_tokens < 1 or repeats < 1:
        raise ValueError(
            f"max_new_tokens and repeats must be >= 1, got {max_new_tokens}, {repeats}"
        )
    with gathered(model):  # under torchrun: whole weights, no collective per token
        engine = RolloutEngine(model, pad_id=pad_id, step=step)
        engine.prefill(prompts, repeats=repeats, room=max_new_tokens)
        rows = engine.decode(
            max_new_tokens=max_new_tokens, stop_ids=stop_ids, sampling=sampling, generator=generator
        )
    return [rows[r] for r in range(len(prompts) * repeats)]
