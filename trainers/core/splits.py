"""Seeded, reproducible orderings of data: shuffles, train/eval hold-outs, the seed of a named
split, and taking the first N usable rows of a dataset in a seeded order. Torch-free.

Every function is a pure function of its arguments (``random.Random(seed)``, never the global
generator), so the same seed gives the same records on every machine.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

__all__ = [
    "SPLIT_SEED_STRIDE",
    "collect_records",
    "hold_out",
    "rows_to_read",
    "seeded_order",
    "shuffled",
    "split_seed",
    "split_train_eval",
]

T = TypeVar("T")
R = TypeVar("R")

SPLIT_SEED_STRIDE = 1_000_003
"""Distance between the seeds of named splits of a generated set (see :func:`split_seed`)."""


def seeded_order(n: int, seed: int) -> list[int]:
    """A permutation of ``range(n)`` drawn with ``random.Random(seed)``."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def shuffled(items: Sequence[T], seed: int) -> list[T]:
    """A copy of ``items`` in the order :func:`seeded_order` gives."""
    return [items[i] for i in seeded_order(len(items), seed)]


def hold_out(records: Sequence[T], k: int, seed: int) -> tuple[list[T], list[T]]:
    """(kept, held out): the first ``k`` indices of a seeded permutation are held out; both
    parts keep the input order."""
    held = set(seeded_order(len(records), seed)[:k])
    return (
        [r for i, r in enumerate(records) if i not in held],
        [r for i, r in enumerate(records) if i in held],
    )


def split_train_eval(
    records: Sequence[T],
    eval_fraction: float = 0.1,
    eval_size: int | None = None,
    seed: int = 42,
) -> tuple[list[T], list[T]]:
    """Deterministic train/eval split; both parts keep the input order.

    An ``eval_size`` overrides ``eval_fraction``. A fraction holds out ``round(n * fraction)``
    items, at least one when the fraction is positive and there are two or more records, and
    never all of them.
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
    return hold_out(records, k, seed)


def split_seed(seed: int, split: str) -> int:
    """The generator seed of a named split of a built-in set: ``seed`` for ``train``; any other
    split moves far away (a CRC of its name picks the distance) so its items do not repeat the
    training ones."""
    if split == "train":
        return seed
    return seed + SPLIT_SEED_STRIDE * (1 + zlib.crc32(split.encode()) % 89)


def rows_to_read(rows: Sequence[Any], max_samples: int | None, seed: int) -> tuple[Iterable, int]:
    """(rows in reading order, how many usable records to keep): without ``max_samples`` every
    row in stored order (sequential reads are fast), else a seeded shuffle with a cap of N (the
    first N rows of a sorted dataset would be a biased sample)."""
    if max_samples is None:
        return iter(rows), len(rows)
    return (rows[i] for i in seeded_order(len(rows), seed)), max_samples


def collect_records(
    rows: Iterable[Any], parse: Callable[[Any], R | None], limit: int | None
) -> tuple[list[R], int, int]:
    """Parse ``rows`` until ``limit`` records (None: no limit); rows that parse to None are
    skipped. Returns (records, rows read, rows skipped)."""
    records: list[R] = []
    n_rows = skipped = 0
    for row in rows:
        if limit is not None and len(records) >= limit:
            break
        n_rows += 1
        record = parse(row)
        if record is None:
            skipped += 1
            continue
        records.append(record)
    return records, n_rows, skipped
