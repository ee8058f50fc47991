"""Reading a run's train.log: a cursor tail (folded progress bars), its head and tail for a
diagnosis, the last traceback and the last error line. Torch-free.

Both :mod:`rlhf_lab.runs` (following a run) and :mod:`rlhf_lab.results.diagnosis` (the diagnosis) read the log
through this module, so neither imports the other.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from pydantic import BaseModel, Field

from rlhf_lab.errors import InvalidArgument, NextStep
from rlhf_lab.paths import find_run

__all__ = [
    "PARTIAL_LINE_IDLE_S",
    "TRACEBACK_HEAD",
    "LogChunk",
    "fold_carriage_returns",
    "last_error_line",
    "last_error_mention",
    "last_traceback",
    "read_log",
    "tail_log",
]

# A trailing line without its newline is returned by a cursor read once the writer has been
# quiet this long (or when the caller says the run is over).
PARTIAL_LINE_IDLE_S = 2.0
TRACEBACK_HEAD = "Traceback (most recent call last):"


class LogChunk(BaseModel):
    text: str = Field(description="log text, progress-bar carriage returns folded")
    cursor: int = Field(description="byte offset to pass as `cursor` next time")
    eof: bool = Field(description="the read reached the end of the file")
    truncated: bool = Field(description="output was capped by max_bytes (more is available)")
    size: int = Field(default=0, description="size of train.log in bytes at read time")


def fold_carriage_returns(text: str) -> str:
    """Keep what a terminal would show of each line: the text after its last carriage return."""
    out = []
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if "\r" in line:
            line = line.rsplit("\r", 1)[1]
        out.append(line)
    return "\n".join(out)


def _utf8_cut(data: bytes, limit: int) -> int:
    """The largest cut <= limit that does not split a UTF-8 character."""
    cut = min(limit, len(data))
    while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def tail_log(
    run_id: str,
    lines: int = 50,
    cursor: int | None = None,
    max_bytes: int = 16_000,
    *,
    final: bool = False,
) -> LogChunk:
    """Read train.log.

    ``cursor=None``: the last ``lines`` lines (at most ``max_bytes`` of text, newest kept);
    the returned cursor is the end of the file. ``cursor=N``: the bytes after offset N (whole
    lines, at most ``max_bytes``); pass the returned cursor next time. A trailing line still
    being written is held back until the writer has been idle ``PARTIAL_LINE_IDLE_S`` (or
    ``final=True``). Carriage-return progress bars are folded to their last state.
    """
    if lines < 1 or max_bytes < 1:
        raise InvalidArgument("lines and max_bytes must be positive")
    if cursor is not None and (not isinstance(cursor, int) or cursor < 0):
        raise InvalidArgument(
            f"bad cursor {cursor!r}: a cursor is the offset a previous tail returned",
            next=NextStep("tail_logs", {"run_id": run_id}, note="without a cursor: the last lines"),
        )
    path = find_run(run_id) / "train.log"
    try:
        size = path.stat().st_size
        mtime = path.stat().st_mtime
    except OSError:
        return LogChunk(text="", cursor=cursor or 0, eof=True, truncated=False, size=0)

    if cursor is not None:
        start = min(cursor, size)
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read(min(size - start, max_bytes))
        end = start + len(data)
        if end < size:  # capped: stop at a line boundary when there is one
            nl = data.rfind(b"\n")
            cut = nl + 1 if nl >= 0 else _utf8_cut(data, len(data))
        else:
            nl = data.rfind(b"\n")
            idle = time.time() - mtime >= PARTIAL_LINE_IDLE_S
            cut = len(data) if (final or idle or data.endswith(b"\n")) else nl + 1
        data = data[:cut]
        new_cursor = start + len(data)
        return LogChunk(
            text=fold_carriage_returns(_decode(data)),
            cursor=new_cursor,
            eof=new_cursor >= size,
            truncated=new_cursor < size and end < size,
            size=size,
        )

    window = min(size, max(4 * max_bytes, 256 * 1024))
    with path.open("rb") as fh:
        fh.seek(size - window)
        data = fh.read(window)
    text = _decode(data)
    parts = text.split("\n")
    if window < size:
        parts = parts[1:]  # the first line is partial
    if parts and parts[-1] == "":
        parts = parts[:-1]
    folded = [fold_carriage_returns(p) for p in parts]
    want = folded[-lines:]
    truncated = False
    kept: list[str] = []
    used = 0
    for line in reversed(want):
        cost = len(line.encode()) + 1
        if used + cost > max_bytes:
            truncated = True
            if not kept:  # one huge line: keep its end
                raw = line.encode()[-max(max_bytes - 1, 1) :]
                while raw and (raw[0] & 0xC0) == 0x80:  # do not start inside a character
                    raw = raw[1:]
                kept.append(_decode(raw))
            break
        kept.append(line)
        used += cost
    out = "\n".join(reversed(kept))
    if kept:
        out += "\n"
    return LogChunk(text=out, cursor=size, eof=True, truncated=truncated, size=size)


def read_log(path: Path, head: int = 64 * 1024, tail: int = 256 * 1024) -> str:
    """The head and tail of a log: errors, OOM text and tracebacks sit at the end."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            if size <= head + tail:
                return _decode(fh.read())
            first = fh.read(head)
            fh.seek(size - tail)
            return _decode(first) + "\n" + _decode(fh.read())
    except OSError:
        return ""


def last_traceback(text: str) -> str | None:
    """The last ``Traceback (most recent call last):`` block of a log, through its error line."""
    at = text.rfind(TRACEBACK_HEAD)
    if at < 0:
        return None
    lines = fold_carriage_returns(text[at:]).split("\n")
    block = [lines[0]]
    for line in lines[1:]:
        block.append(line)
        if line and not line[0].isspace():
            break
    return "\n".join(block).rstrip()


def last_error_line(text: str) -> str | None:
    """The last non-empty line of a log that the lab did not write itself (what a failed run's
    alert quotes when there is no traceback)."""
    for line in reversed(text.splitlines()):
        s = line.strip()
        if s and not s.startswith("[rlhf-lab]"):
            return s
    return None


def last_error_mention(text: str) -> str | None:
    """The last line of a log that names an error (Error, Exception, ``error:``, Killed,
    Traceback), else its last line; at most 300 characters. What a ledger row quotes."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"(Error|Exception|error:|Killed|Traceback)", ln):
            return ln[:300]
    return lines[-1][:300] if lines else None
