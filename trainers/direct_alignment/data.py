"""Preference data for the direct-alignment family.

Pipeline: ``load_preference_records`` (hub id, local file or folder, or the built-in offline set)
-> ``split_train_eval`` -> ``tokenize_records`` (chat template, truncation, identical-pair drop)
-> optionally ``attach_kl_responses`` (KTO) -> ``collate_split`` per micro-batch (``collate``:
the same rows right-padded).
``fingerprint_examples`` keys the on-disk reference log-prob cache.

Differences from the reference book's data handling, on purpose:

* ``max_samples`` shuffles with ``seed`` before taking N rows (the book took the first N rows
  unshuffled, which on sorted or grouped datasets gives a biased subset).
* HH-style conversations are parsed into every turn (multi-turn prompts keep their history)
  instead of being split once on the last ``Assistant:``.
* The UltraFeedback response is the *last* assistant message, and the prompt keeps every message
  before it (system prompt and earlier turns included).
* Truncation keeps the response and shortens the prompt from the left; a response longer than
  the whole budget is cut on the right. ``max_prompt_length`` is honoured.
* Batches are padded to the longest sequence of the micro-batch, not to ``max_length``.
* Pairs whose chosen and rejected tokens are identical after truncation are dropped (they carry
  no preference signal and would only add noise to the accuracy metric).
* Unpaired (KTO-style) data is supported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import re
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from trainers.core.datasets import DatasetNotFoundError, open_split
from trainers.core.generation import chat_template_ids
from trainers.core.logprobs import split_rows
from trainers.core.tasks import (  # noqa: F401  (SYSTEM_PROMPT, extract_answer re-exported)
    SYSTEM_PROMPT,
    TASK_CONFIGS,
    TASK_KITS,
    extract_answer,
    format_response,
    import_reasoning_gym,
    reason_generic,
    score_fn,
    score_response,
    wrong_generic,
)
from trainers.direct_alignment.config import BUILTIN_DATASET

logger = logging.getLogger(__name__)

__all__ = [
    "BUILTIN_DATASET",
    "BUILTIN_DEFAULT_SIZE",
    "DEFAULT_BUILTIN_TASKS",
    "DatasetNotFoundError",
    "FORMATS",
    "MIN_PROMPT_TOKENS",
    "PreferenceRecord",
    "SYSTEM_PROMPT",
    "TokenizedExample",
    "attach_kl_responses",
    "builtin_preference_records",
    "collate",
    "collate_split",
    "detect_format",
    "extract_answer",
    "fingerprint_examples",
    "load_preference_records",
    "parse_hh_conversation",
    "score_builtin_response",  # = trainers.core.tasks.score_response
    "split_train_eval",
    "tokenize_records",
]

# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

BUILTIN_DEFAULT_SIZE = 2000
"""Number of built-in records generated when ``max_samples`` is not given."""

DEFAULT_BUILTIN_TASKS: tuple[str, ...] = ("spell_backward", "chain_sum", "letter_counting")

FORMATS = ("ultrafeedback", "hh", "plain", "unpaired")

MIN_PROMPT_TOKENS = 8
"""Left truncation never shortens a prompt below this many tokens (or its full length if shorter)."""


_EXPECTED_COLUMNS = {
    "ultrafeedback": ("chosen", "rejected"),  # lists of messages; `prompt` optional
    "hh": ("chosen", "rejected"),  # "\n\nHuman: ...\n\nAssistant: ..." strings
    "plain": ("prompt", "chosen", "rejected"),
    "unpaired": ("prompt", "completion", "label"),
}


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass
class PreferenceRecord:
    """One preference example, before tokenisation.

    ``prompt`` holds the chat messages before the response (system message and earlier turns
    included). ``chosen`` is the desirable response text, ``rejected`` the undesirable one; an
    unpaired (KTO) example has exactly one of them set. ``meta`` carries optional provenance
    (the built-in set stores the reasoning-gym task name and entry, so responses can be scored).
    """

    prompt: list[dict]
    chosen: str | None
    rejected: str | None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.chosen is None and self.rejected is None:
            raise ValueError("a PreferenceRecord needs a chosen or a rejected response (both None)")

    @property
    def paired(self) -> bool:
        return self.chosen is not None and self.rejected is not None


def _builtin_hint() -> str:
    return (
        f"For offline runs use the built-in preference set `{BUILTIN_DATASET}` "
        "(generated from reasoning-gym tasks), or a local .jsonl/.json/.parquet/.csv file or folder."
    )


def load_preference_records(
    dataset: str,
    split: str = "train",
    fmt: str = "auto",
    max_samples: int | None = None,
    seed: int = 42,
    *,
    stats: dict | None = None,
) -> list[PreferenceRecord]:
    """Load preference data as :class:`PreferenceRecord` objects.

    ``dataset`` is a hub id, a local ``.json``/``.jsonl``/``.parquet``/``.csv`` file, a local
    folder (read by ``datasets.load_dataset``), or ``builtin:reasoning-preferences`` (optionally
    ``builtin:reasoning-preferences:task_a,task_b``), generated offline from reasoning-gym.
    For a single local file ``split`` is ignored: the file is the split.

    ``fmt`` is ``"auto"`` (detected from the columns and the first row) or one of
    ``ultrafeedback``, ``hh``, ``plain``, ``unpaired``.

    ``max_samples``: the rows are shuffled with ``seed`` and the first N usable records are kept.
    The reference book took the first N rows without shuffling; shuffling avoids a biased subset
    on datasets stored sorted by source or topic. The returned order is the shuffled order.

    ``stats``, if given, is filled with counts: ``format``, ``n_rows`` (rows read), ``n_records``,
    ``skipped`` (rows without a usable response) and ``prompt_mismatch`` (HH rows whose chosen and
    rejected conversations have different prompts; chosen's prompt is used).

    Raises :class:`DatasetNotFoundError` for a missing local path or an unreachable hub dataset,
    and ``ValueError`` for an unrecognised schema.
    """
    if fmt != "auto" and fmt not in FORMATS:
        raise ValueError(f"unknown preference format {fmt!r}; expected 'auto' or one of {FORMATS}")
    if max_samples is not None and max_samples < 0:
        raise ValueError(f"max_samples must be >= 0, got {max_samples}")
    out_stats = stats if stats is not None else {}
    out_stats.update(
        {"format": None, "n_rows": 0, "n_records": 0, "skipped": 0, "prompt_mismatch": 0}
    )

    if dataset.startswith("builtin:"):
        records = _load_builtin(dataset, split, max_samples, seed)
        out_stats.update({"format": "builtin", "n_rows": len(records), "n_records": len(records)})
        return records

    ds = _load_hf_dataset(dataset, split)
    columns = list(ds.column_names)
    if len(ds) == 0:
        raise ValueError(f"dataset {dataset!r} (split {split!r}) has no rows")
    first = ds[0]
    resolved = detect_format(columns, first) if fmt == "auto" else fmt
    _check_columns(resolved, columns, dataset)
    out_stats["format"] = resolved
    parse = _PARSERS[resolved]

    if max_samples is None:
        rows: Iterable[dict] = iter(ds)  # sequential reads are much faster than ds[i]
        limit = len(ds)
    else:
        order = list(range(len(ds)))
        random.Random(seed).shuffle(order)
        rows = (ds[i] for i in order)
        limit = max_samples

    records: list[PreferenceRecord] = []
    counts = {"prompt_mismatch": 0}
    n_rows = 0
    for row in rows:
        if len(records) >= limit:
            break
        n_rows += 1
        rec = parse(row, counts)
        if rec is None:
            out_stats["skipped"] += 1
            continue
        records.append(rec)

    out_stats.update(
        {"n_rows": n_rows, "n_records": len(records), "prompt_mismatch": counts["prompt_mismatch"]}
    )
    if out_stats["skipped"]:
        logger.warning(
            "%s: skipped %d row(s) without a usable response", dataset, out_stats["skipped"]
        )
    if counts["prompt_mismatch"]:
        logger.warning(
            "%s: %d row(s) had different prompts in chosen and rejected; used chosen's prompt",
            dataset,
            counts["prompt_mismatch"],
        )
    return records


def _load_hf_dataset(dataset: str, split: str):
    """Open ``dataset`` (file, folder or hub id) and return one split."""
    return open_split(dataset, split, _builtin_hint())


def detect_format(columns: Sequence[str], first_row: dict) -> str:
    """Guess the preference format from the column names and the first row."""
    cols = set(columns)
    if {"prompt", "completion", "label"} <= cols:
        return "unpaired"
    if {"chosen", "rejected"} <= cols:
        chosen = first_row.get("chosen")
        if isinstance(chosen, list):
            return "ultrafeedback"
        if isinstance(chosen, str):
            if "prompt" in cols:
                return "plain"
            if _HH_TURN.search(chosen):
                return "hh"
    raise ValueError(_schema_message(columns, first_row))


def _schema_message(columns: Sequence[str], first_row: dict | None = None) -> str:
    expected = "; ".join(f"{k}: {', '.join(v)}" for k, v in _EXPECTED_COLUMNS.items())
    detail = ""
    if first_row is not None and "chosen" in first_row:
        detail = f" (`chosen` is a {type(first_row['chosen']).__name__})"
    return (
        f"unrecognised preference schema: found columns {sorted(columns)}{detail}. "
        f"Expected one of: {expected} (ultrafeedback: `chosen`/`rejected` are message lists; "
        "hh: `chosen`/`rejected` are '\\n\\nHuman: ...\\n\\nAssistant: ...' strings)."
    )


def _check_columns(fmt: str, columns: Sequence[str], dataset: str) -> None:
    missing = [c for c in _EXPECTED_COLUMNS[fmt] if c not in columns]
    if missing:
        raise ValueError(
            f"dataset {dataset!r} does not fit format {fmt!r}: missing columns {missing}; "
            f"found columns {sorted(columns)}; {fmt!r} expects {list(_EXPECTED_COLUMNS[fmt])}"
        )


# ---- row parsers ---------------------------------------------------------------------------


def _as_messages(value: Any) -> list[dict]:
    """Normalise a prompt value (string or message list) to ``[{"role", "content"}, ...]``."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        out = []
        for msg in value:
            if not isinstance(msg, dict) or "role" not in msg:
                raise ValueError(f"expected chat messages with 'role' and 'content', got {msg!r}")
            out.append({"role": str(msg["role"]), "content": str(msg.get("content") or "")})
        return out
    raise ValueError(f"expected a string or a list of messages, got {type(value).__name__}")


def _split_last_assistant(messages: list[dict]) -> tuple[list[dict], str] | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant":
            return messages[:i], messages[i]["content"]
    return None


def _parse_ultrafeedback(row: dict, counts: dict) -> PreferenceRecord | None:
    chosen = _split_last_assistant(_as_messages(row["chosen"]))
    rejected = _split_last_assistant(_as_messages(row["rejected"]))
    if chosen is None or rejected is None:
        return None
    prompt = chosen[0] or _as_messages(row.get("prompt"))
    if not prompt:
        return None
    return PreferenceRecord(prompt=prompt, chosen=chosen[1], rejected=rejected[1])


_HH_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):[ ]?")
_HH_ROLES = {"Human": "user", "Assistant": "assistant"}


def parse_hh_conversation(text: str) -> list[dict]:
    """Parse an Anthropic HH transcript (``\\n\\nHuman: ...\\n\\nAssistant: ...``) into messages."""
    parts = _HH_TURN.split(text)
    messages: list[dict] = []
    lead = parts[0].strip()
    if lead:
        messages.append({"role": "user", "content": lead})
    for role, content in zip(parts[1::2], parts[2::2], strict=True):
        messages.append({"role": _HH_ROLES[role], "content": content.strip()})
    return messages


def _parse_hh(row: dict, counts: dict) -> PreferenceRecord | None:
    chosen = parse_hh_conversation(row["chosen"])
    rejected = parse_hh_conversation(row["rejected"])
    if not chosen or not rejected:
        return None
    if chosen[-1]["role"] != "assistant" or rejected[-1]["role"] != "assistant":
        return None
    prompt = chosen[:-1]
    if not prompt:
        return None
    if rejected[:-1] != prompt:
        counts["prompt_mismatch"] += 1
    return PreferenceRecord(
        prompt=prompt, chosen=chosen[-1]["content"], rejected=rejected[-1]["content"]
    )


def _response_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    split = _split_last_assistant(_as_messages(value))
    return None if split is None else split[1]


def _parse_plain(row: dict, counts: dict) -> PreferenceRecord | None:
    prompt = _as_messages(row["prompt"])
    chosen = _response_text(row["chosen"])
    rejected = _response_text(row["rejected"])
    if not prompt or chosen is None or rejected is None:
        return None
    return PreferenceRecord(prompt=prompt, chosen=chosen, rejected=rejected)


def _as_label(value: Any) -> bool:
    if isinstance(value, str):
        low = value.strip().lower()
        if low in {"true", "1", "yes", "desirable", "good"}:
            return True
        if low in {"false", "0", "no", "undesirable", "bad"}:
            return False
        raise ValueError(f"cannot read {value!r} as a desirable/undesirable label")
    return bool(value)


def _parse_unpaired(row: dict, counts: dict) -> PreferenceRecord | None:
    prompt = _as_messages(row["prompt"])
    completion = _response_text(row["completion"])
    if not prompt or completion is None or row["label"] is None:
        return None
    if _as_label(row["label"]):
        return PreferenceRecord(prompt=prompt, chosen=completion, rejected=None)
    return PreferenceRecord(prompt=prompt, chosen=None, rejected=completion)


_PARSERS: dict[str, Callable[[dict, dict], PreferenceRecord | None]] = {
    "ultrafeedback": _parse_ultrafeedback,
    "hh": _parse_hh,
    "plain": _parse_plain,
    "unpaired": _parse_unpaired,
}


T = TypeVar("T")


def split_train_eval(
    records: Sequence[T],
    eval_fraction: float = 0.1,
    eval_size: int | None = None,
    seed: int = 42,
) -> tuple[list[T], list[T]]:
    """Deterministic train/eval split; both parts keep the input order.

    ``eval_size`` (an int) wins over ``eval_fraction``. With a fraction, the eval part has
    ``round(n * eval_fraction)`` items, at least 1 when the fraction is positive and n >= 2.
    The train part is never emptied by a fraction.
    """
    n = len(records)
    if eval_size is not None:
        if not 0 <= eval_size <= n:
            raise ValueError(f"eval_size must be in [0, {n}], got {eval_size}")
        k = eval_size
    else:
        if not 0.0 <= eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        k = round(n * eval_fraction)
        if eval_fraction > 0 and n >= 2:
            k = min(max(k, 1), n - 1)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    eval_idx = set(order[:k])
    train = [r for i, r in enumerate(records) if i not in eval_idx]
    evals = [r for i, r in enumerate(records) if i in eval_idx]
    return train, evals


# --------------------------------------------------------------------------------------------
# Built-in offline preference set (reasoning-gym)
# --------------------------------------------------------------------------------------------

score_builtin_response = score_response

# Mix of rejected kinds: right format + wrong answer, no tags at all, answer outside the tags.
_REJECT_KINDS = ("wrong_answer", "no_tags", "answer_outside_tags")
_REJECT_WEIGHTS = (0.5, 0.25, 0.25)


def _make_rejected(dataset, entry: dict, reason, wrong, rng: random.Random) -> tuple[str, str]:
    """A plausible bad response for ``entry`` and its kind; it always scores < 1."""
    answer = str(entry["answer"])
    kind = rng.choices(_REJECT_KINDS, weights=_REJECT_WEIGHTS)[0]
    if kind == "wrong_answer":
        cands = list(dict.fromkeys(c for c in wrong(entry, rng) if c and c != answer))
        rng.shuffle(cands)
        for cand in cands:
            text = format_response(reason(entry, cand), cand)
            if dataset.score_answer(extract_answer(text), entry) < 1.0:
                return text, kind
        kind = "no_tags"  # no perturbation scored below 1: fall back to a format error
    # Format errors: the stated answer is right or wrong at random; without <answer> tags the
    # extracted answer is None, so the response scores 0 either way.
    stated = answer
    if rng.random() < 0.5:
        cands = [c for c in wrong(entry, rng) if c and c != answer]
        if cands:
            stated = rng.choice(cands)
    if kind == "no_tags":
        text = stated if rng.random() < 0.5 else f"The answer is {stated}."
    else:
        text = f"<think>{reason(entry, stated)}</think>\n{stated}"
    assert dataset.score_answer(extract_answer(text), entry) < 1.0
    return text, kind


def builtin_preference_records(
    n: int, seed: int, tasks: list[str] | None = None
) -> list[PreferenceRecord]:
    """Generate ``n`` preference records offline from reasoning-gym tasks.

    Prompt = ``SYSTEM_PROMPT`` + the task question. ``chosen`` = short correct reasoning in
    ``<think>`` and the correct answer in ``<answer>`` (reasoning-gym scores it 1.0). ``rejected``
    = one of: the right format with a perturbed wrong answer (half of the records), no tags at
    all, or the answer written outside the tags; reasoning-gym scores its extracted answer < 1.
    The contrast is systematic (format and answer correctness on easy tasks), so a tiny model can
    learn it. Tasks are used in equal shares; the result is shuffled and depends only on
    ``(n, seed, tasks)``. ``meta`` holds ``task``, the reasoning-gym ``entry`` and
    ``rejected_kind``; use :func:`score_builtin_response` to score generations.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    tasks = list(tasks) if tasks else list(DEFAULT_BUILTIN_TASKS)
    rg = import_reasoning_gym()
    rng = random.Random(seed)
    per_task = -(-n // len(tasks)) if n else 0
    datasets_by_task = {}
    for t_idx, name in enumerate(tasks):
        cfg = dict(TASK_CONFIGS.get(name, {}))
        try:
            datasets_by_task[name] = rg.create_dataset(
                name, seed=seed + 100_003 * t_idx, size=max(2 * per_task + 16, 16), **cfg
            )
        except Exception as err:  # unknown task name or config
            raise ValueError(f"cannot build reasoning-gym task {name!r}: {err}") from err

    cursors = dict.fromkeys(tasks, 0)
    records: list[PreferenceRecord] = []
    misses = 0
    for i in range(n):
        name = tasks[i % len(tasks)]
        ds = datasets_by_task[name]
        reason, wrong = TASK_KITS.get(name, (reason_generic, wrong_generic))
        while True:
            entry = ds[cursors[name]]
            cursors[name] += 1
            answer = str(entry["answer"])
            chosen = format_response(reason(entry, answer), answer)
            if ds.score_answer(extract_answer(chosen), entry) == 1.0:
                break
            misses += 1
            if misses > n + 100:
                raise ValueError(f"reasoning-gym task {name!r}: its own answers do not score 1.0")
        rejected, kind = _make_rejected(ds, entry, reason, wrong, rng)
        records.append(
            PreferenceRecord(
                prompt=[
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": entry["question"]},
                ],
                chosen=chosen,
                rejected=rejected,
                meta={
                    "task": name,
                    "entry": {
                        "question": entry["question"],
                        "answer": answer,
                        "metadata": entry["metadata"],
                    },
                    "rejected_kind": kind,
                },
            )
        )
    rng.shuffle(records)
    return records


def _load_builtin(dataset: str, split: str, max_samples: int | None, seed: int):
    name, _, task_spec = dataset.partition(":")[2].partition(":")
    if f"builtin:{name}" != BUILTIN_DATASET:
        raise DatasetNotFoundError(
            f"unknown built-in dataset {dataset!r}; the built-in preference set is "
            f"{BUILTIN_DATASET!r} (optionally {BUILTIN_DATASET}:task_a,task_b)"
        )
    tasks = [t.strip() for t in task_spec.split(",") if t.strip()] or None
    n = BUILTIN_DEFAULT_SIZE if max_samples is None else max_samples
    # Other splits draw from a far-away seed so their items do not repeat the train indices.
    split_seed = (
        seed if split == "train" else seed + 1_000_003 * (1 + zlib.crc32(split.encode()) % 89)
    )
    return builtin_preference_records(n, split_seed, tasks)


# --------------------------------------------------------------------------------------------
# Tokenisation
# --------------------------------------------------------------------------------------------


@dataclass
class TokenizedExample:
    """Token ids of one example. Responses include the template's end-of-turn token(s)."""

    prompt_ids: list[int]
    chosen_ids: list[int] | None
    rejected_ids: list[int] | None
    kl_response_ids: list[int] | None = None


def _fit(
    prompt: list[int],
    responses: list[list[int] | None],
    max_length: int,
    max_prompt_length: int | None,
) -> tuple[list[int], list[list[int] | None], bool, bool]:
    """Apply the truncation rules to one example; returns (prompt, responses, cut_p, cut_r)."""
    cut_prompt = cut_response = False
    if max_prompt_length is not None and len(prompt) > max_prompt_length:
        prompt = prompt[-max_prompt_length:]
        cut_prompt = True
    longest = max(len(r) for r in responses if r is not None)
    if len(prompt) + longest > max_length:
        keep = max(max_length - longest, min(len(prompt), MIN_PROMPT_TOKENS))
        if keep < len(prompt):
            prompt = prompt[-keep:]
            cut_prompt = True
    budget = max_length - len(prompt)
    fitted = []
    for r in responses:
        if r is not None and len(r) > budget:
            r = r[:budget]
            cut_response = True
        fitted.append(r)
    return prompt, fitted, cut_prompt, cut_response


def tokenize_records(
    records: Sequence[PreferenceRecord],
    tokenizer,
    max_length: int,
    max_prompt_length: int | None = None,
) -> tuple[list[TokenizedExample], dict]:
    """Tokenise records with the tokenizer's chat template and truncate to ``max_length``.

    Prompt ids = ``apply_chat_template(prompt, add_generation_prompt=True)``. Response ids =
    ``apply_chat_template(prompt + [assistant response])`` minus the prompt prefix, so they end
    with the template's end-of-turn token(s). A template that breaks this prefix property (one
    that rewrites earlier turns, say) falls back to the response text's tokens + eos.

    Truncation: the prompt is first cut to ``max_prompt_length`` (from the left); if prompt +
    longest response still exceeds ``max_length``, the prompt loses tokens from the left (never
    below ``MIN_PROMPT_TOKENS``); a response still too long is cut on the right. Pairs whose
    chosen and rejected ids are equal afterwards are dropped.

    Stats: ``n_in``, ``n_out``, ``dropped_identical``, ``truncated_prompt``,
    ``truncated_response`` (examples affected), ``prefix_fallback`` (responses tokenised without
    the template).
    """
    if max_length <= MIN_PROMPT_TOKENS:
        raise ValueError(f"max_length must exceed {MIN_PROMPT_TOKENS}, got {max_length}")
    if max_prompt_length is not None and max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "the tokenizer has no chat template; direct alignment formats prompts with "
            "apply_chat_template. Use an instruction-tuned tokenizer or set tokenizer.chat_template."
        )
    stats = {
        "n_in": len(records),
        "n_out": 0,
        "dropped_identical": 0,
        "truncated_prompt": 0,
        "truncated_response": 0,
        "prefix_fallback": 0,
    }
    eos = getattr(tokenizer, "eos_token_id", None)
    examples: list[TokenizedExample] = []
    chunk = 256
    for start in range(0, len(records), chunk):
        batch = records[start : start + chunk]
        prompts = chat_template_ids(
            tokenizer, [r.prompt for r in batch], add_generation_prompt=True
        )
        responses: dict[str, list] = {}
        for side in ("chosen", "rejected"):
            which = [i for i, r in enumerate(batch) if getattr(r, side) is not None]
            convs = [
                batch[i].prompt + [{"role": "assistant", "content": getattr(batch[i], side)}]
                for i in which
            ]
            fulls = chat_template_ids(tokenizer, convs, add_generation_prompt=False)
            ids: list = [None] * len(batch)
            for i, full in zip(which, fulls, strict=True):
                p = prompts[i]
                if len(full) > len(p) and full[: len(p)] == p:
                    ids[i] = full[len(p) :]
                else:
                    text = getattr(batch[i], side)
                    ids[i] = list(tokenizer(text, add_special_tokens=False)["input_ids"])
                    if eos is not None:
                        ids[i].append(eos)
                    stats["prefix_fallback"] += 1
            responses[side] = ids
        for i in range(len(batch)):
            prompt, (c, r), cut_p, cut_r = _fit(
                prompts[i],
                [responses["chosen"][i], responses["rejected"][i]],
                max_length,
                max_prompt_length,
            )
            stats["truncated_prompt"] += int(cut_p)
            stats["truncated_response"] += int(cut_r)
            if c is not None and r is not None and c == r:
                stats["dropped_identical"] += 1
                continue
            examples.append(TokenizedExample(prompt_ids=prompt, chosen_ids=c, rejected_ids=r))
    stats["n_out"] = len(examples)
    if stats["prefix_fallback"]:
        logger.warning(
            "chat template broke the prompt-prefix property for %d response(s); "
            "tokenised those responses as text + eos",
            stats["prefix_fallback"],
        )
    return examples, stats


def attach_kl_responses(
    examples: Sequence[TokenizedExample], max_length: int | None = None
) -> list[TokenizedExample]:
    """Give example i the response of example (i + 1) mod n as its KL (mismatched) completion.

    The KTO reference point z is estimated from such mismatched prompt/completion pairs; fixing
    them at data-preparation time lets their reference log-probs be cached with the rest. The
    desirable response of the neighbour is used, or its undesirable one when it has none. With
    ``max_length`` the KL response is cut on the right so prompt + response fits. Returns new
    examples; the inputs are not modified. An empty list gives an empty list; a single example
    can only get its own response (a matched pair), which is allowed with a warning.
    """
    n = len(examples)
    if n == 1:
        logger.warning("attach_kl_responses: one example only; its KL pair is not mismatched")
    out = []
    for i, ex in enumerate(examples):
        nxt = examples[(i + 1) % n]
        resp = nxt.chosen_ids if nxt.chosen_ids is not None else nxt.rejected_ids
        resp = list(resp)
        if max_length is not None:
            resp = resp[: max(max_length - len(ex.prompt_ids), 1)]
        out.append(dataclasses.replace(ex, kl_response_ids=resp))
    return out


def preference_rows(
    examples: Sequence[TokenizedExample], with_kl: bool = False
) -> tuple[list[tuple[list[int], list[int], int]], dict[str, list[int]]]:
    """The sequences of a micro-batch as (prompt ids, response ids, example index), in the row
    order every collate uses: every chosen (desirable) response, then every rejected
    (undesirable) one, then (``with_kl``) every KL response, each in example order; and the row
    positions of each kind."""
    if not examples:
        raise ValueError("collate got an empty batch")
    rows: list[tuple[list[int], list[int], int]] = []
    index: dict[str, list[int]] = {"chosen": [], "rejected": [], "kl": []}
    for ex_i, ex in enumerate(examples):
        if ex.chosen_ids is not None:
            index["chosen"].append(len(rows))
            rows.append((ex.prompt_ids, ex.chosen_ids, ex_i))
    for ex_i, ex in enumerate(examples):
        if ex.rejected_ids is not None:
            index["rejected"].append(len(rows))
            rows.append((ex.prompt_ids, ex.rejected_ids, ex_i))
    if with_kl:
        for ex_i, ex in enumerate(examples):
            if ex.kl_response_ids is None:
                raise ValueError("with_kl=True but an example has no kl_response_ids")
            index["kl"].append(len(rows))
            rows.append((ex.prompt_ids, ex.kl_response_ids, ex_i))
    if not rows:
        raise ValueError("collate: no responses in the batch")
    return rows, index


def _row_index(examples, rows, index) -> dict[str, torch.Tensor | bool]:
    return {
        "chosen_index": torch.tensor(index["chosen"], dtype=torch.long),
        "rejected_index": torch.tensor(index["rejected"], dtype=torch.long),
        "kl_index": torch.tensor(index["kl"], dtype=torch.long),
        "row_example": torch.tensor([e for _, _, e in rows], dtype=torch.long),
        "paired": all(ex.chosen_ids is not None and ex.rejected_ids is not None for ex in examples),
    }


def collate(
    examples: Sequence[TokenizedExample], pad_id: int, with_kl: bool = False
) -> dict[str, torch.Tensor | bool]:
    """Right-padded batch of prompt + response rows, padded to the longest row of this batch
    (row order: :func:`preference_rows`).

    Returns ``input_ids``, ``attention_mask`` and ``loss_mask`` (N, T) long tensors
    (``loss_mask`` is 1 on response tokens, aligned with ``input_ids``: the trainer shifts it
    with the labels), ``chosen_index``, ``rejected_index``, ``kl_index`` (row positions),
    ``row_example`` (the example each row came from) and ``paired`` (every example has both
    responses; paired losses need it).
    """
    rows, index = preference_rows(examples, with_kl)
    width = max(len(p) + len(r) for p, r, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (p, r, _) in enumerate(rows):
        seq = p + r
        input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[row, : len(seq)] = 1
        loss_mask[row, len(p) : len(seq)] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        **_row_index(examples, rows, index),
    }


def collate_split(
    examples: Sequence[TokenizedExample], pad_id: int, with_kl: bool = False
) -> dict[str, torch.Tensor | bool | int]:
    """The same rows as :func:`collate` laid out ``[left-padded prompt | right-padded
    response]`` (``trainers.core.logprobs.split_rows``), so the chosen, rejected and KL rows of
    an example can share one forward of its prompt. Returns ``input_ids``, ``attention_mask``,
    ``completion_mask`` (N, T_response), ``prompt_width`` and the row index of :func:`collate`.
    """
    rows, index = preference_rows(examples, with_kl)
    ids, attn, completion_mask, width_p = split_rows(
        [p for p, _, _ in rows], [r for _, r, _ in rows], pad_id
    )
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "completion_mask": completion_mask,
        "prompt_width": width_p,
        **_row_index(examples, rows, index),
    }


def fingerprint_examples(examples: Sequence[TokenizedExample]) -> str:
    """SHA-256 hex digest of every example's token ids (KL ids included), in order.

    Stable across processes and machines (no Python ``hash``); any change of a token, of the
    order, or of which responses are present changes it.
    """
    h = hashlib.sha256(b"direct-alignment-examples/v1\n")
    for ex in examples:
        payload = [ex.prompt_ids, ex.chosen_ids, ex.rejected_ids, ex.kl_response_ids]
        h.update(json.dumps(payload, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()
