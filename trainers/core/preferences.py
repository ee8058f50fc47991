"""Preference data shared by direct alignment and preference reward models: reading
preference datasets into :class:`~trainers.core.records.PreferenceRecord` objects and tokenising
them with the chat template.

Formats (``fmt="auto"`` detects them from the columns and the first row):

* ``ultrafeedback``: ``chosen``/``rejected`` are message lists; the response is the *last*
  assistant message and the prompt every message before it (system prompt and earlier turns);
* ``hh``: Anthropic HH transcripts (``"\\n\\nHuman: ...\\n\\nAssistant: ..."``), parsed into
  every turn so multi-turn prompts keep their history;
* ``plain``: ``prompt``, ``chosen``, ``rejected`` (strings or message lists);
* ``unpaired``: ``prompt``, ``completion``, ``label`` (KTO-style, one response per row);
* ``builtin:reasoning-preferences[:task_a,task_b]``: generated offline
  (:func:`trainers.core.builtin_data.builtin_preference_records`).

``max_samples`` shuffles with ``seed`` before taking N rows (the first N rows of a sorted
dataset are a biased subset). Truncation keeps the response and shortens the prompt from the
left; pairs identical after truncation are dropped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from trainers.core.builtin_data import builtin_preference_records, split_builtin_name
from trainers.core.datasets import DatasetNotFoundError, open_split
from trainers.core.messages import as_messages, split_at_last_assistant
from trainers.core.records import PreferenceRecord
from trainers.core.splits import collect_records, rows_to_read, split_seed
from trainers.core.tokenization import (
    chat_template_ids,
    chunks,
    require_chat_template,
    response_ids,
)

logger = logging.getLogger(__name__)

__all__ = [
    "BUILTIN_DEFAULT_SIZE",
    "BUILTIN_PREFERENCES",
    "FORMATS",
    "MIN_PROMPT_TOKENS",
    "TokenizedExample",
    "detect_format",
    "configured_preference_records",
    "load_preference_records",
    "parse_hh_conversation",
    "tokenize_records",
]

BUILTIN_PREFERENCES = "builtin:reasoning-preferences"
"""The offline preference set (the direct-alignment and reward-model configs name it too)."""

BUILTIN_DEFAULT_SIZE = 2000
"""Number of built-in records generated when ``max_samples`` is not given."""

FORMATS = ("ultrafeedback", "hh", "plain", "unpaired")

MIN_PROMPT_TOKENS = 8
"""Left truncation never shortens a prompt below this many tokens (or its full length if shorter)."""


_EXPECTED_COLUMNS = {
    "ultrafeedback": ("chosen", "rejected"),  # lists of messages; `prompt` optional
    "hh": ("chosen", "rejected"),  # "\n\nHuman: ...\n\nAssistant: ..." strings
    "plain": ("prompt", "chosen", "rejected"),
    "unpaired": ("prompt", "completion", "label"),
}


def _builtin_hint() -> str:
    """What to use instead when a preference dataset cannot be opened."""
    return (
        f"For offline runs use the built-in preference set `{BUILTIN_PREFERENCES}` "
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

    rows, limit = rows_to_read(ds, max_samples, seed)
    counts = {"prompt_mismatch": 0}
    records, n_rows, skipped = collect_records(rows, partial(parse, counts=counts), limit)
    out_stats.update(
        {
            "n_rows": n_rows,
            "n_records": len(records),
            "skipped": skipped,
            "prompt_mismatch": counts["prompt_mismatch"],
        }
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


def _load_hf_dataset(dataset: str, split: str) -> Any:
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
    """The error text for columns that fit no known preference format."""
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
    """Raise ValueError naming the columns ``fmt`` needs that ``dataset`` lacks."""
    missing = [c for c in _EXPECTED_COLUMNS[fmt] if c not in columns]
    if missing:
        raise ValueError(
            f"dataset {dataset!r} does not fit format {fmt!r}: missing columns {missing}; "
            f"found columns {sorted(columns)}; {fmt!r} expects {list(_EXPECTED_COLUMNS[fmt])}"
        )


# ---- row parsers ---------------------------------------------------------------------------


def _parse_ultrafeedback(row: dict, counts: dict) -> PreferenceRecord | None:
    """Message-list pairs: the response is each side's last assistant turn."""
    chosen = split_at_last_assistant(as_messages(row["chosen"]))
    rejected = split_at_last_assistant(as_messages(row["rejected"]))
    if chosen is None or rejected is None:
        return None
    prompt = chosen[0] or as_messages(row.get("prompt"))
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
    """HH transcripts; chosen's prompt is used (a differing rejected prompt is counted)."""
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
    """A response given as text, or as messages (the last assistant turn's text)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    split = split_at_last_assistant(as_messages(value))
    return None if split is None else split[1]


def _parse_plain(row: dict, counts: dict) -> PreferenceRecord | None:
    """``prompt`` + ``chosen`` + ``rejected`` columns."""
    prompt = as_messages(row["prompt"])
    chosen = _response_text(row["chosen"])
    rejected = _response_text(row["rejected"])
    if not prompt or chosen is None or rejected is None:
        return None
    return PreferenceRecord(prompt=prompt, chosen=chosen, rejected=rejected)


def _as_label(value: Any) -> bool:
    """A desirable (True) / undesirable (False) label from a bool, number or word."""
    if isinstance(value, str):
        low = value.strip().lower()
        if low in {"true", "1", "yes", "desirable", "good"}:
            return True
        if low in {"false", "0", "no", "undesirable", "bad"}:
            return False
        raise ValueError(f"cannot read {value!r} as a desirable/undesirable label")
    return bool(value)


def _parse_unpaired(row: dict, counts: dict) -> PreferenceRecord | None:
    """One labelled completion per row (KTO): it becomes the chosen or the rejected side."""
    prompt = as_messages(row["prompt"])
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


def _load_builtin(
    dataset: str, split: str, max_samples: int | None, seed: int
) -> list[PreferenceRecord]:
    """The built-in set named by ``dataset``; other splits than ``train`` use a far-away seed."""
    name, tasks = split_builtin_name(dataset)
    if name != BUILTIN_PREFERENCES:
        raise DatasetNotFoundError(
            f"unknown built-in dataset {dataset!r}; the built-in preference set is "
            f"{BUILTIN_PREFERENCES!r} (optionally {BUILTIN_PREFERENCES}:task_a,task_b)"
        )
    n = BUILTIN_DEFAULT_SIZE if max_samples is None else max_samples
    return builtin_preference_records(n, split_seed(seed, split), tasks)


DIRECT_ALIGNMENT_BUILTIN_SIZE = 1000
"""Pairs a direct-alignment run generates from the built-in set when ``max_samples`` is None."""


def configured_preference_records(data: Any, seed: int) -> list[PreferenceRecord]:
    """The records a direct-alignment config's ``data`` section names, as its run reads them
    (and as an evaluation regenerates them to hold the run's training prompts out): exactly
    ``builtin:reasoning-preferences`` is ``max_samples`` (else 1000) generated pairs of
    ``builtin_tasks`` with ``builtin_task_configs``; anything else is read by
    :func:`load_preference_records` (``split``, ``format``, ``max_samples``)."""
    if data.dataset == BUILTIN_PREFERENCES:
        n = data.max_samples or DIRECT_ALIGNMENT_BUILTIN_SIZE
        return builtin_preference_records(
            n, seed=seed, tasks=data.builtin_tasks, settings=data.builtin_task_configs
        )
    return load_preference_records(
        data.dataset, data.split, data.format, data.max_samples, seed=seed
    )


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
    require_chat_template(
        tokenizer,
        "direct alignment formats prompts with apply_chat_template. Use an instruction-tuned "
        "tokenizer or set tokenizer.chat_template.",
    )
    stats = {
        "n_in": len(records),
        "n_out": 0,
        "dropped_identical": 0,
        "truncated_prompt": 0,
        "truncated_response": 0,
        "prefix_fallback": 0,
    }
    examples: list[TokenizedExample] = []
    for batch in chunks(records):
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
                ids[i], fell_back = response_ids(
                    tokenizer, prompts[i], full, getattr(batch[i], side)
                )
                stats["prefix_fallback"] += int(fell_back)
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
