"""What a planning step that takes a while says when it starts: a throughput calibration or a
difficulty probe runs the model in a subprocess for seconds to minutes, the first time a model
is planned on a machine. The CLI prints these to stderr, so that ``plan`` does not sit silent;
the API and the MCP server set no listener and stay quiet (a tool's answer carries the cost as a
note afterwards). Torch-free."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["listening", "starting"]

_listeners: list[Callable[[str], None]] = []


def starting(message: str) -> None:
    """Tell the listener, if there is one, that a slow step begins."""
    for listener in _listeners[-1:]:
        listener(message)


@contextmanager
def listening(listener: Callable[[str], None]) -> Iterator[None]:
    """Send :func:`starting` messages to ``listener`` within the block."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)
