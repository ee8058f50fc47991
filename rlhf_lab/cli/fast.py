"""The fast path of the reading commands an agent or a shell polls: `runs` (with its paging and
filter options and `--json`), a bare `status`, `campaign list` and `version`. It answers them from the
plain-data readers of :mod:`rlhf_lab.api.listing` without importing typer, pydantic, the run
modules or the ledger, so a cold process costs the interpreter, the standard library, one
SQLite query and (for a table) rich.

It declines (returns None, and the typer app of :mod:`rlhf_lab.cli.commands` handles the command
line as always) whenever it is not sure to print exactly what the typer command prints: an
option it does not know or one given twice, `--help`, a value that is not a plain number, an
argument the lab refuses (the typer path then prints the error), `runs --detail`, a `status`
with active runs, a campaign whose summary the run index does not hold yet. A decline happens
before anything is read, except for those last two, whose index warnings are printed first.
tests/lab/test_cli_fast.py runs both paths on the same lab and compares their output.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from rlhf_lab.cli.render import fmt, table
from rlhf_lab.errors import LabError

__all__ = ["answer", "json_text"]

# `runs` options taking a value -> (argument name, whether it is a whole number)
_RUNS_OPTIONS = {
    "--campaign": ("campaign", False),
    "--state": ("state", False),
    "--limit": ("limit", True),
    "--offset": ("offset", True),
    "--family": ("family", False),
    "--algorithm": ("algorithm", False),
}


def answer(argv: list[str]) -> int | None:
    """Run ``argv`` (the words after `rlhf-lab`) on the fast path and return its exit code, or
    None when the typer app must handle it."""
    try:
        if argv[:1] == ["runs"]:
            return _runs(argv[1:])
        if argv[:1] == ["status"]:
            return _status(argv[1:])
        if argv[:2] == ["campaign", "list"]:
            return _campaign_list(argv[2:])
        if argv == ["version"]:
            from rlhf_lab import __version__

            print(__version__)
            return 0
    except LabError:
        return None  # refused before reading: the typer path renders the error
    return None


def _flag_json(args: list[str]) -> bool | None:
    """True/False for ``[--json]``, None for anything else."""
    if not args:
        return False
    return True if args == ["--json"] else None


def _parse_runs(args: list[str]) -> dict[str, Any] | None:
    found: dict[str, Any] = {"as_json": False}
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--json":
            if found["as_json"]:
                return None
            found["as_json"] = True
            i += 1
            continue
        name, equals, value = word.partition("=")
        if name not in _RUNS_OPTIONS:
            return None
        if not equals:
            if i + 1 >= len(args):
                return None
            value = args[i + 1]
            i += 1
        i += 1
        key, number = _RUNS_OPTIONS[name]
        if key in found or value.startswith("-"):
            return None
        if number:
            if not (value.isascii() and value.isdigit()):
                return None
            found[key] = int(value)
        else:
            found[key] = value
    return found


def _runs(args: list[str]) -> int | None:
    parsed = _parse_runs(args)
    if parsed is None:
        return None
    from rlhf_lab.api.listing import RunQuery, run_page

    as_json = parsed.pop("as_json")
    listed = run_page(RunQuery(**parsed))
    for warning in listed["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    if as_json:
        print(json_text(listed))
        return 0
    rows = [
        [
            r["id"],
            r["state"],
            f"{r['step'] or 0}/{r['total_steps'] or '?'}",
            f"{r['metric']} {fmt(r['value'])} (best {fmt(r['best'])})"
            if r["value"] is not None
            else "",
            r["campaign"],
        ]
        for r in listed["runs"]
    ]
    table("runs", ["run", "state", "step", "headline", "campaign"], rows)
    if listed["note"]:
        print(listed["note"])
    return 0


def _status(args: list[str]) -> int | None:
    as_json = _flag_json(args)
    if as_json is None:
        return None
    from rlhf_lab.api.listing import unfinished_runs

    if unfinished_runs():
        return None  # each active run's full status: the typed path
    print("[]" if as_json else "no active runs (see `rlhf-lab runs` for finished ones)")
    return 0


def _campaign_list(args: list[str]) -> int | None:
    as_json = _flag_json(args)
    if as_json is None:
        return None
    from rlhf_lab.api.listing import cached_campaigns

    warnings: list[str] = []
    found = cached_campaigns(warnings)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if found is None:
        return None
    if as_json:
        print(json.dumps(found, indent=2))
        return 0
    table(
        "campaigns",
        ["campaign", "status", "runs", "question"],
        [[c["id"], c["status"], c["runs"], c["question"]] for c in found],
    )
    return 0


# ------------------------------------------------------------------------- pydantic's JSON


def _float_text(value: float) -> str:
    """A float as pydantic writes it: the shortest round-trip digits (Python's repr), plain
    decimals down to 1e-5 (repr switches to an exponent below 1e-4), exponents without leading
    zeros (``2.5e-7``), and null for inf and nan."""
    if not math.isfinite(value):
        return "null"
    text = repr(value)
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    power = int(exponent)
    if power == -5:
        sign, digits = ("-", mantissa[1:]) if mantissa.startswith("-") else ("", mantissa)
        return f"{sign}0.0000{digits.replace('.', '')}"
    return f"{mantissa}e{'+' if power > 0 else '-'}{abs(power)}"


def _json_lines(value: Any, indent: str) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    inner = indent + "  "
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [
            f"{inner}{json.dumps(str(k), ensure_ascii=False)}: {_json_lines(v, inner)}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        return "[\n" + ",\n".join(inner + _json_lines(v, inner) for v in value) + f"\n{indent}]"
    raise TypeError(f"no JSON for {type(value).__name__}")


def json_text(value: Any) -> str:
    """``value`` (dicts, lists, strings, numbers, None) as pydantic's ``model_dump_json(indent=2)``
    writes the same data, byte for byte (tests/lab/test_cli_fast.py)."""
    return _json_lines(value, "")
