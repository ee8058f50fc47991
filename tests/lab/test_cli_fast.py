"""The CLI's fast path for the reading commands (rlhf_lab/cli/fast.py): it prints exactly what
the typer commands print on the same lab, declines whatever it is not sure of (so the typer
path answers, errors included), writes JSON as pydantic does, and a cold `rlhf-lab runs`,
`status` or `campaign list` imports neither typer nor pydantic nor the run, ledger or compare
modules (a regression there is what made them slow)."""

from __future__ import annotations

import math
import os
import random
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from rlhf_lab import api
from rlhf_lab.api.listing import RUN_STATES
from rlhf_lab.cli import fast
from tests._helpers.imports import cli_import_trace, within
from tests.lab.test_run_index import OLD, write_run

READING = [
    ["runs"],
    ["runs", "--json"],
    ["runs", "--limit", "3", "--offset", "2", "--json"],
    ["runs", "--campaign=camp1", "--state", "died"],
    ["runs", "--family", "direct_alignment", "--algorithm", "ipo", "--limit=2"],
    ["runs", "--state", "running"],
    ["status"],
    ["status", "--json"],
    ["campaign", "list"],
    ["campaign", "list", "--json"],
    ["version"],
]
# what the cold reading commands must not import (each cost tens of milliseconds at start)
HEAVY = (
    "typer",
    "click",
    "pydantic",
    "rich",  # piped tables are drawn by rlhf_lab.cli.render.plain_table
    "rlhf_lab.runs",
    "rlhf_lab.ledger",
    "rlhf_lab.results.compare",
)


@pytest.fixture
def lab(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    exp = tmp_path / "experiments"
    for i in range(7):
        campaign = f"2026-01-0{i % 3 + 1}-camp{i % 3}"
        algorithm = "dpo" if i % 2 else "ipo"
        write_run(
            exp,
            campaign,
            f"{algorithm}-20260101-0000{i:02d}-ab{i:02d}",
            algorithm=algorithm,
            state="died" if i % 3 == 0 else "succeeded",
            created=f"2026-01-01T00:{i:02d}:00.000+00:00",
            evals=(0.5, 1e-5 * (i + 1), 2.5e-7 * i),  # numbers pydantic writes its own way
        )
    api.create_campaign("camp-a", question="Does the fast path print the same? (yes, é)")
    api.create_campaign("camp-b", question="A second one", family="direct_alignment")
    return tmp_path


def _typer(argv: list[str]) -> Any:
    from rlhf_lab.cli import app

    return CliRunner().invoke(app, argv, env={"COLUMNS": "200"})


def test_the_fast_path_prints_what_the_typer_commands_print(lab, capsys):
    for argv in READING:
        _typer(argv)  # builds the index and the campaign summaries (their warnings once)
    for argv in READING:
        slow = _typer(argv)
        assert slow.exit_code == 0, (argv, slow.output)
        capsys.readouterr()
        code = fast.answer(argv)
        out = capsys.readouterr()
        assert code == 0, f"{argv}: the fast path declined"
        assert out.out == slow.stdout, argv
        assert out.err == "", argv


def test_the_fast_path_declines_what_it_is_not_sure_of(lab, capsys):
    _typer(["campaign", "list"])  # summaries cached
    for argv in (
        ["runs", "--help"],
        ["runs", "--detail"],
        ["runs", "--limit", "abc"],
        ["runs", "--limit", "0"],  # the lab refuses it: the typer path prints the error
        ["runs", "--offset", "-1"],
        ["runs", "--state", "bogus"],
        ["runs", "--campaign", "Not A Slug"],
        ["runs", "--limit", "2", "--limit", "3"],
        ["runs", "--json", "--json"],
        ["runs", "--limit"],
        ["runs", "--no-such-flag"],
        ["runs", "extra"],
        ["status", "dpo-20260101-000001-ab01"],
        ["status", "--help"],
        ["campaign", "list", "--limit", "3"],
        ["campaign", "show", "camp-a"],
        ["launch", "dpo"],
        ["version", "--help"],
        [],
    ):
        assert fast.answer(argv) is None, argv
        out = capsys.readouterr()
        assert out.out == "" and out.err == "", argv
    assert _typer(["runs", "--limit", "0"]).exit_code == 2


def test_status_with_an_active_run_and_an_unread_campaign_go_the_typer_way(lab, capsys):
    # a ledger written by hand: its summary is not in the index until a listing reads it
    by_hand = lab / "experiments" / "2026-01-20-by-hand.md"
    by_hand.write_text("---\nquestion: by hand\n---\n")
    os.utime(by_hand, (OLD, OLD))  # an edit within two seconds is read again every time
    assert fast.answer(["campaign", "list"]) is None
    _typer(["campaign", "list"])
    assert fast.answer(["campaign", "list"]) == 0

    write_run(
        lab / "experiments",
        "2026-01-09-live",
        "dpo-20260109-000000-beef",
        state="queued",
        created="2026-01-09T00:00:00.000+00:00",
    )
    capsys.readouterr()
    assert fast.answer(["status"]) is None  # each active run's full status: the typer path
    assert capsys.readouterr().out == ""


class _Shapes(BaseModel):
    numbers: list[float | None]
    texts: list[str]
    nested: dict[str, Any]
    count: int
    empty: list[int]


def test_json_text_is_pydantics_json_byte_for_byte():
    rng = random.Random(0)
    numbers: list[float | None] = [
        0.0,
        -0.0,
        1.0,
        0.1,
        1e-4,
        1e-5,
        -2.5e-5,
        1.2345678901234e-5,
        1e-6,
        2.5e-7,
        1e15,
        1e16,
        -1.5e17,
        1e300,
        5e-324,
        math.inf,
        -math.inf,
        math.nan,
        None,
    ]
    numbers += [rng.uniform(-1, 1) * 10 ** rng.randint(-12, 20) for _ in range(400)]
    texts = [
        "plain",
        'quote " and \\ back',
        "é ü 中文 🙂",
        "tab\tnew\nline\r\x01\x1f\x7f",
        "\u2028",
    ]
    texts += ["".join(chr(rng.randint(32, 0x2FFF)) for _ in range(12)) for _ in range(50)]
    model = _Shapes(
        numbers=numbers,
        texts=texts,
        nested={"a": {"b": [1, 2.5, None, "x"], "c": {}}, "é": []},
        count=-3,
        empty=[],
    )
    assert fast.json_text(model.model_dump()) == model.model_dump_json(indent=2)


def test_the_state_list_matches_the_run_folder_states():
    from trainers.core.runfolder import RUN_STATES as TRAINER_STATES

    assert RUN_STATES == TRAINER_STATES


@pytest.mark.parametrize(
    "argv", [["runs", "--json"], ["runs"], ["status"], ["campaign", "list", "--json"]]
)
def test_cold_reading_commands_import_no_heavy_module(lab, argv):
    _typer(["runs"])  # the index built and the summaries cached, as after any listing
    _typer(["campaign", "list"])
    env = {**os.environ, "RLHF_LAB_ROOT": str(lab), "COLUMNS": "200"}
    _done, imported = cli_import_trace(argv, env)
    assert "rlhf_lab.cli.fast" in imported
    heavy = within(imported, HEAVY)
    assert heavy == [], f"`rlhf-lab {' '.join(argv)}` imports {heavy}"


def test_plain_table_draws_what_rich_draws_or_declines():
    """Random tables (seeded): wherever ``plain_table`` answers, its text equals rich's for the
    same table on a non-terminal console of that width; it declines what rich would wrap,
    fold or read as markup."""
    import io
    import string

    from rich.console import Console
    from rich.table import Table

    from rlhf_lab.cli.render import plain_table

    rng = random.Random(0)
    compared = declined = 0
    for _ in range(400):
        ncol = rng.randint(1, 5)
        columns = [rng.choice(["run", "state", "step", "headline", "a b"]) for _ in range(ncol)]
        alphabet = string.ascii_letters + string.digits + " ./-()_"
        rows = [
            ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 22))) for _ in columns]
            for _ in range(rng.randint(0, 4))
        ]
        title = rng.choice(["runs", "campaigns", "x" * rng.randint(1, 40)])
        width = rng.choice([30, 80, 200])
        drawn = Table(title=title, show_lines=False)
        for col in columns:
            drawn.add_column(col, overflow="fold")
        for row in rows:
            drawn.add_row(*row)
        buffer = io.StringIO()
        Console(file=buffer, width=width).print(drawn)
        text = plain_table(title, columns, rows, width)
        if text is None:
            declined += 1
        else:
            compared += 1
            assert text == buffer.getvalue(), (title, columns, rows, width)
    assert compared > 100 and declined > 50
    assert plain_table("runs", ["run"], [["[bold]x"]], 80) is None  # rich reads markup
    assert plain_table("runs", ["run"], [["é"]], 80) is None
    assert plain_table("runs", ["run"], [["x" * 100]], 80) is None  # rich would fold it


def test_a_table_on_a_non_utf8_stream_is_left_to_rich(monkeypatch):
    """Piped output that cannot take box characters (PYTHONIOENCODING=ascii, a Latin-1 locale):
    rich draws its ASCII boxes; the plain path would fail to encode its own."""
    import io

    from rlhf_lab.cli import render

    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    monkeypatch.setattr("sys.stdout", stream)
    monkeypatch.setenv("COLUMNS", "80")
    render.table("runs", ["run", "state"], [["a", "succeeded"]])
    stream.flush()
    text = raw.getvalue().decode("ascii")
    assert "runs" in text and "succeeded" in text and "┏" not in text
