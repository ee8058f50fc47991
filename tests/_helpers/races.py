"""Races: the same call made by several threads released at one moment."""

from __future__ import annotations

import threading

from rlhf_lab.paths import LabError


def at_once(start, n: int, *, join_s: float, catch=LabError) -> tuple[list, list[BaseException]]:
    """Call ``start()`` in ``n`` threads that a barrier releases together; (what the calls
    returned, the errors of type ``catch`` they raised), each in the order the calls ended."""
    barrier = threading.Barrier(n)
    results: list = []
    errors: list[BaseException] = []

    def go() -> None:
        barrier.wait()
        try:
            results.append(start())
        except catch as err:
            errors.append(err)

    threads = [threading.Thread(target=go) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=join_s)
    return results, errors
