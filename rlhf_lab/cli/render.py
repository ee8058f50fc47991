"""How the CLI draws a table and a number, shared by the typer commands and the fast path
(:mod:`rlhf_lab.cli.fast`), so both print the same. Imports rich only when a table is drawn."""

from __future__ import annotations

import os
import sys
from typing import Any


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """Print a titled table. Piped output that fits the width is drawn here, character for
    character as rich draws it (:func:`plain_table`: an agent polling `runs` does not pay rich's
    ~0.1 s import); a terminal, or anything rich would wrap or style, goes through rich."""
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    text = (
        None
        if sys.stdout.isatty() or _styled_anyway() or not _utf8(sys.stdout)
        else plain_table(title, columns, cells, _console_width())
    )
    if text is not None:
        sys.stdout.write(text)
        return
    from rich.console import Console
    from rich.table import Table

    drawn = Table(title=title, show_lines=False)
    for col in columns:
        drawn.add_column(col, overflow="fold")
    for row in cells:
        drawn.add_row(*row)
    Console().print(drawn)


def _styled_anyway() -> bool:
    """Whether rich would style or size piped output itself (these variables change that)."""
    return any(
        os.environ.get(name) for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")
    )


def _utf8(stream: Any) -> bool:
    """Whether ``stream`` takes the box characters (rich falls back to ASCII boxes otherwise)."""
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    return encoding == "utf8"


def _console_width() -> int:
    """The width rich gives a console that is not a terminal: the first standard stream that is
    one, ``COLUMNS`` when set to a number, else 80."""
    width = 0
    for fd in (0, 1, 2):
        try:
            width = os.get_terminal_size(fd).columns
            break
        except (AttributeError, ValueError, OSError):
            continue
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit():
        width = int(columns)
    return width or 80


def _plain(text: str) -> bool:
    """Text rich prints as it is: printable ASCII, no markup brackets."""
    return text.isascii() and text.isprintable() and "[" not in text and "]" not in text


def plain_table(title: str, columns: list[str], rows: list[list[str]], width: int) -> str | None:
    """The text rich prints for ``Table(title=title)`` with these columns and rows on a console of
    ``width`` columns that is not a terminal, or None where rich would do more than line the cells
    up (the table or its title does not fit, a cell needs wrapping or is not plain ASCII)."""
    if not all(_plain(v) for v in (title, *columns, *(c for row in rows for c in row))):
        return None
    if any(len(row) != len(columns) for row in rows):
        return None
    widths = [max([len(col), *(len(row[i]) for row in rows)]) for i, col in enumerate(columns)]
    inner = sum(widths) + 3 * len(columns) - 1
    if inner + 2 > width or len(title) > inner + 2:
        return None

    def line(left: str, fill: str, middle: str, right: str) -> str:
        return left + middle.join(fill * (w + 2) for w in widths) + right

    def cells(values: list[str], bar: str) -> str:
        return bar + bar.join(f" {v.ljust(w)} " for v, w in zip(values, widths, strict=True)) + bar

    total = inner + 2
    left = (total - len(title)) // 2
    out = [" " * left + title + " " * (total - len(title) - left)]
    out += [line("┏", "━", "┳", "┓"), cells(columns, "┃"), line("┡", "━", "╇", "┩")]
    out += [cells(row, "│") for row in rows]
    out.append(line("└", "─", "┴", "┘"))
    return "\n".join(out) + "\n"


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
