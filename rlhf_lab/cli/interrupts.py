"""Ctrl-C in `launch --foreground`, whatever its timing: the SIGINT handler is installed before
the run starts, and a Ctrl-C stops the run (at a terminal: asks, stop or detach) whether it
comes while the run is being launched, before its first log line or mid-run.

Two ways a Ctrl-C used to be lost: Python installs its own SIGINT handler only when the
process starts with SIGINT at its default, so a CLI started with SIGINT ignored (a script's
``cmd &`` without job control, a harness that ignores it) never saw the signal: the run went
on to its end and the CLI exited 0; and a Ctrl-C between the run's start and the follow loop
aborted the CLI and left the run going.

While the run is being launched the first SIGINT is noted (a line on stderr says so) and
acted on as soon as the run exists; a second one aborts the launch, as before. While the run
is followed a SIGINT raises KeyboardInterrupt, as Python's own handler does. The previous
handler comes back when the command returns (:func:`sigint_restored`), so an in-process
caller (a test) keeps its own.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["NOTED", "Interrupts", "sigint_restored"]

F = TypeVar("F", bound=Callable[..., Any])
NOTED = "Ctrl-C: the run is stopped as soon as it has started (Ctrl-C again aborts the launch)"


class Interrupts:
    """The SIGINT handler of a foreground launch."""

    def __init__(self) -> None:
        self.noted = 0
        self.following = False

    def install(self) -> Interrupts:
        """Handle SIGINT from now on (also when the process started with it ignored); only the
        main thread can, elsewhere this does nothing."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.following or self.noted:
            raise KeyboardInterrupt
        self.noted += 1
        os.write(2, f"\n{NOTED}\n".encode())  # not print: the main thread may be mid-write

    def follow(self) -> None:
        """The run is being followed: a SIGINT raises KeyboardInterrupt from now on, and one
        noted while launching raises it here."""
        self.following = True
        if self.noted:
            raise KeyboardInterrupt


def sigint_restored(fn: F) -> F:
    """``fn`` with the SIGINT handler it found put back when it returns or raises."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)
        previous = signal.getsignal(signal.SIGINT)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)

    return wrapper  # type: ignore[return-value]
