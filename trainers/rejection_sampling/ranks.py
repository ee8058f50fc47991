"""Rejection sampling under torchrun: who does what (no-ops on one process).

Generation, scoring and the greedy evaluations need no collective: each rank loads the whole
policy (generation needs whole weights anyway), works through its contiguous part of the
prompts (:func:`split_work`, parts gathered back in prompt order), and samples with
``seed + rank``. Rank 0 alone reads and writes the cache and the run folder
(:func:`read_on_main`, :func:`write_on_main`); the SFT stage is trainers.sft's loop, which
shards the model with FSDP2 and splits every batch itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from trainers.core.distributed import barrier, broadcast_object, gather_objects, rank_span, world

T = TypeVar("T")


def split_work(items: Sequence[Any], work: Callable[[list[Any]], list[T]]) -> list[T]:
    """``work`` on this rank's contiguous part of ``items`` (one result per item); every
    rank's results, in the order of ``items``. Collective."""
    part = work([items[i] for i in rank_span(len(items))])
    return [x for results in gather_objects(part) for x in results]


def read_on_main(read: Callable[[], T]) -> T:
    """``read()`` on rank 0 (a cache lookup), its result on every rank: all ranks decide
    alike whether to generate. Collective."""
    return broadcast_object(read() if world().is_main else None)


def write_on_main(write: Callable[[], Any]) -> None:
    """``write()`` on rank 0 only (a file of the run folder, the cache); the others wait for
    it, so a file one stage writes is there for the next on every rank. Collective."""
    if world().is_main:
        write()
    barrier()
