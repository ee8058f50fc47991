"""A campaign's summary read without pydantic (rlhf_lab/index/campaign_summary.py) is the ledger's
own summary, byte for byte, or it declines; and `campaign list` answers on the fast path when
the run index holds no summary yet (a fresh clone, ledgers written by hand or by another
checkout), printing what the typer command prints. One campaign missing from the index used
to send the whole listing down the typer path: typer, pydantic and the ledger package loaded
and the campaign's ledger.json validated, about a second of a cold process (issue 27, item 8).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlhf_lab import api, index
from rlhf_lab.cli import fast
from rlhf_lab.index import campaign_summary as plain
from rlhf_lab.index.campaign_summary import plain_summary
from tests._helpers.imports import cli_import_trace, within
from tests.lab.test_cli_fast import HEAVY

OLD = time.time() - 120  # a file changed within two seconds is never cached


@pytest.fixture
def exp(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_path / "experiments"
    path.mkdir()
    return path


def _meta(name: str, **extra) -> dict:
    date, slug = name[:10], name[11:]
    return {"id": name, "slug": slug, "date": date, "question": f"does {slug} work?", **extra}


def _write(exp: Path, name: str, data, md: str | None = None) -> None:
    folder = exp / name
    folder.mkdir()
    text = data if isinstance(data, str) else json.dumps(data)
    (folder / "ledger.json").write_text(text)
    paths = [folder / "ledger.json"]
    if md is not None:
        (exp / f"{name}.md").write_text(md)
        paths.append(exp / f"{name}.md")
    for path in paths:
        os.utime(path, (OLD, OLD))


def _row(i: int, **fields) -> dict:
    return {"run_id": f"dpo-20260101-{i:06d}-abcd", "algorithm": "dpo", **fields}


def _rows(n: int) -> list:
    """Rows mixing every kind of value the summary folds: states, families, models, datasets,
    seeds as ints, whole floats, bools, strings and nothing; and a row that is not a record."""
    states = ["succeeded", "failed", "died", "succeeded", "stopped"]
    seeds = [1, 2.0, True, "3", None, 2, 0]
    rows: list = []
    for i in range(n):
        rows.append(
            _row(
                i,
                state=states[i % len(states)],
                family=["direct_alignment", "policy_gradients", None][i % 3],
                model=["tiny", "", None, "small"][i % 4],
                dataset=None if i % 5 else "builtin:reasoning-preferences",
                seed=seeds[i % len(seeds)],
            )
        )
    rows.insert(3, "not a record")
    return rows


FRONT = "---\nid: x\nstatus: {status}\nquestion: q\n---\n\n# body\n"
AGREEING = {
    "many rows": (_meta("2026-01-01-big", model="tiny"), _rows(500), None),
    "settings win": (
        _meta("2026-01-01-set", family="direct_alignment", seeds=[5, 6], dataset="d"),
        _rows(7),
        FRONT.format(status="completed"),
    ),
    "planned, the settings' seeds": (_meta("2026-01-01-new", seeds=[3]), [], None),
    "a run still active": (_meta("2026-01-01-act"), [_row(0, state="running")], None),
    "only failures": (_meta("2026-01-01-bad"), [_row(0, state="failed"), _row(1)], None),
    "paused by hand": (_meta("2026-01-01-pau"), _rows(3), FRONT.format(status="paused")),
    "an escaped status": (
        _meta("2026-01-01-esc"),
        _rows(3),
        FRONT.format(status='"conclu\\x64ed"'),
    ),
    "a word in a comment only": (
        _meta("2026-01-01-com"),
        _rows(3),
        "---\nstatus: completed  # archived later\n---\n",
    ),
    "front matter that is not YAML": (
        _meta("2026-01-01-yml"),
        _rows(3),
        "---\nstatus: [paused\n---\n",
    ),
    "no front matter": (_meta("2026-01-01-nof"), _rows(3), "# paused, says the body\n"),
    "odd text": (
        _meta("2026-01-01-txt", question='é 中文 🙂 "quoted" \\ back\ttab \u2028 \x7f'),
        _rows(2),
        None,
    ),
    "extra keys and another id": (
        {**_meta("2026-01-09-other"), "created_at": "2026-01-01", "note": 1},
        [_row(0, state="succeeded", extra={"a": 1})],
        None,
    ),
}


@pytest.mark.parametrize("case", AGREEING)
def test_the_plain_summary_is_the_ledgers_own_byte_for_byte(exp, case):
    from rlhf_lab.ledger.campaigns import _summary

    meta, rows, md = AGREEING[case]
    name = "2026-01-01-case"
    _write(exp, name, {"version": 1, "campaign": meta, "runs": rows}, md)
    text, cacheable = _summary(name)
    assert cacheable
    assert plain_summary(name) == text


def test_a_campaign_the_lab_created_and_recorded_reads_the_same(exp):
    from rlhf_lab.ledger.campaigns import _summary

    made = api.create_campaign("made", "made by the lab?", family="direct_alignment")
    assert plain_summary(made.id) == _summary(made.id)[0]


DECLINED = {
    "not JSON": "{ nope",
    "not a mapping": "[]",
    "no settings": {"runs": []},
    "a question that is a number": {"campaign": _meta("2026-01-01-x", question=3)},
    "seeds as text": {"campaign": _meta("2026-01-01-x", seeds=["1"])},
    "seeds as bools": {"campaign": _meta("2026-01-01-x", seeds=[True])},
    "a family that is a list": {"campaign": _meta("2026-01-01-x", family=["a"])},
    "a creation time that is a number": {"campaign": _meta("2026-01-01-x", created_at=1)},
    "runs that are not a list": {"campaign": _meta("2026-01-01-x"), "runs": {"a": 1}},
    "a run's model that is a number": {
        "campaign": _meta("2026-01-01-x"),
        "runs": [_row(0, state="succeeded", model=7)],
    },
}


@pytest.mark.parametrize("case", DECLINED)
def test_the_plain_summary_declines_what_only_pydantic_can_judge(exp, case):
    _write(exp, "2026-01-01-x", DECLINED[case])
    assert plain_summary("2026-01-01-x") is None


def test_a_campaign_known_only_by_its_markdown_is_declined(exp):
    (exp / "2026-01-01-md.md").write_text("---\nquestion: only markdown\n---\n")
    assert plain_summary("2026-01-01-md") is None


def test_the_spelled_out_constants_are_the_ledgers():
    from rlhf_lab.ledger.render import _FRONT_RE
    from rlhf_lab.ledger.schema import MANUAL_STATUSES
    from trainers.core.runfolder import ACTIVE_STATES

    assert plain.MANUAL_STATUSES == MANUAL_STATUSES
    assert plain.ACTIVE_STATES == ACTIVE_STATES
    assert (plain.FRONT_RE.pattern, plain.FRONT_RE.flags) == (_FRONT_RE.pattern, _FRONT_RE.flags)


# ------------------------------------------------------------------------- the listing


@pytest.fixture
def big_lab(exp):
    """22 campaigns: 21 made by the lab, one of 500 rows whose ledger.json came from elsewhere
    (a clone, another checkout): the run index holds no summary of it."""
    for i in range(21):
        api.create_campaign(f"small-{i:02d}", f"question {i}?", family="direct_alignment")
    _write(
        exp,
        "2026-01-01-big",
        {"version": 1, "campaign": _meta("2026-01-01-big"), "runs": _rows(500)},
        FRONT.format(status="completed"),
    )
    for path in exp.glob("*/ledger.json"):
        os.utime(path, (OLD, OLD))
    for path in exp.glob("*.md"):
        os.utime(path, (OLD, OLD))
    return exp


def _forget_summaries() -> None:
    with sqlite3.connect(index.index_path()) as conn:
        conn.execute("DELETE FROM campaigns")


def _typer(argv: list[str]) -> str:
    from rlhf_lab.cli import app

    done = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    return done.stdout


@pytest.mark.parametrize("argv", [["campaign", "list"], ["campaign", "list", "--json"]])
def test_the_listing_of_a_lab_with_a_big_campaign_is_the_same_without_its_summary(
    big_lab, argv, capsys
):
    before = _typer(argv)  # the ledger's own reader (pydantic), as before the fast path read
    assert "2026-01-01-big" in before and "500" in before
    for cached in (False, True):  # the summaries dropped from the index, then stored again
        if not cached:
            _forget_summaries()
        capsys.readouterr()
        assert fast.answer(argv) == 0, "the fast path declined"
        out = capsys.readouterr()
        assert out.out == before and out.err == ""
    with sqlite3.connect(index.index_path()) as conn:
        assert conn.execute("SELECT COUNT(*) FROM campaigns WHERE sig IS NOT NULL").fetchone() == (
            22,
        )


def test_a_cold_listing_without_summaries_imports_no_heavy_module(big_lab):
    _typer(["campaign", "list"])
    _forget_summaries()
    env = {**os.environ, "RLHF_LAB_ROOT": str(big_lab.parent), "COLUMNS": "200"}
    done, imported = cli_import_trace(["campaign", "list", "--json"], env)
    heavy = within(imported, HEAVY)
    assert "rlhf_lab.index.campaign_summary" in imported and heavy == []
    listed = json.loads(done.stdout)
    assert len(listed) == 22 and {c["runs"] for c in listed} == {0, 500}
