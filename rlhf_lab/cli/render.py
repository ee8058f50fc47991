"""How the CLI draws a table and a number, shared by the typer commands and the fast path
(:mod:`rlhf_lab.cli.fast`), so both print the same. Imports rich only when a table is drawn."""

from __future__ import annotations

from typing import Any


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    drawn = Table(title=title, show_lines=False)
    for col in columns:
        drawn.add_column(col, overflow="fold")
    for row in rows:
        drawn.add_row(*["" if v is None else str(v) for v in row])
    Console().print(drawn)


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
