"""Recording one run touches only its row: ledger.json is spliced and the markdown assembled from
kept per-run pieces, and both stay byte for byte what a full re-render writes; the index of
campaigns is updated from the writer, not rebuilt. Run folders are written by hand (nothing is
trained); the campaign's other rows are copies of a recorded one under other run ids."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlhf_lab import api, ledger
from rlhf_lab.ledger import store
from rlhf_lab.ledger.incremental import split_ledger

from .test_run_index import write_run

CAMPAIGN = "2026-01-01-many"


@pytest.fixture
def campaign(tmp_path, monkeypatch):
    """A campaign of 40 recorded rows (one real, 39 copies) with a hand-written note outside
    the blocks, a comparison, and two run folders not recorded yet."""
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    exp = tmp_path / "experiments"
    ledger.create_campaign(CAMPAIGN, "Does recording stay cheap?")
    first = write_run(exp, CAMPAIGN, "dpo-20260101-000000-0000")
    for run_id in ("ipo-20260101-000001-0001", "dpo-20260101-000002-0002"):
        write_run(exp, CAMPAIGN, run_id, algorithm=run_id[:3], evals=(0.4, 0.9, 0.8))
    ledger.record_run(first.name, plot=False)
    data_path = exp / CAMPAIGN / "ledger.json"
    data = json.loads(data_path.read_text())
    row = data["runs"][0]
    data["runs"] = [
        {**row, "run_id": f"dpo-20251231-{i:06d}-{i:04x}", "seed": i % 3} for i in range(39)
    ] + [row]
    data_path.write_text(json.dumps(data))
    ledger.render_campaign(CAMPAIGN)  # a full render: every run's pieces are kept
    md = exp / f"{CAMPAIGN}.md"
    md.write_text(md.read_text().replace("## Runs\n", "## Runs\n\nMy own note, kept.\n"))
    return exp


@pytest.fixture
def whole_renders(monkeypatch):
    """Calls of the full (non-incremental) path of record_run (it still runs unchanged)."""
    calls: list[str] = []
    original = store._record_whole

    def spy(name, record, note, plot):
        calls.append(record.run_id)
        return original(name, record, note, plot)

    monkeypatch.setattr(store, "_record_whole", spy)
    return calls


def _files(exp: Path) -> tuple[bytes, bytes]:
    return (exp / f"{CAMPAIGN}.md").read_bytes(), (exp / CAMPAIGN / "ledger.json").read_bytes()


def test_recording_one_run_is_byte_identical_to_a_full_render(campaign, whole_renders):
    exp = campaign
    for run_id, note in (
        ("ipo-20260101-000001-0001", "new row"),  # appended
        ("dpo-20260101-000000-0000", "a note | with a pipe"),  # replaced in place
        ("dpo-20260101-000002-0002", None),
        ("ipo-20260101-000001-0001", None),  # again: the note recorded before is kept
    ):
        record = api.record_results(run_id, note=note)
        incremental = _files(exp)
        ledger.render_campaign(CAMPAIGN)
        assert _files(exp) == incremental, f"recording {run_id} differs from a full render"
    assert whole_renders == []  # every record above went the incremental way
    md, data = _files(exp)
    assert b"My own note, kept." in md and b"new row" in md
    rows = json.loads(data)["runs"]
    assert len(rows) == 42 and rows[-2]["run_id"] == "ipo-20260101-000001-0001"
    assert rows[-2]["note"] == "new row" and record.note == "new row"
    # the campaign summary the index keeps is what a fresh read of the campaign says
    cached = api.list_campaigns().campaigns[0]
    from rlhf_lab.ledger.campaigns import _read_campaign

    assert cached == _read_campaign(CAMPAIGN, light=True)[0] and cached.runs == 42


def test_a_row_changed_behind_the_lab_is_rendered_from_its_new_bytes(campaign, whole_renders):
    exp = campaign
    path = exp / CAMPAIGN / "ledger.json"
    text = path.read_text()
    split = split_ledger(text)
    assert split is not None
    split.records[3] = split.records[3].replace('"state": "succeeded"', '"state": "failed"')
    path.write_text(split.text())
    api.record_results("dpo-20260101-000002-0002")
    incremental = _files(exp)
    ledger.render_campaign(CAMPAIGN)
    assert _files(exp) == incremental and whole_renders == []
    assert "### dpo-20251231-000003-0003 (failed)" in incremental[0].decode()


def test_without_kept_pieces_or_with_a_broken_file_the_full_path_answers(campaign, whole_renders):
    from rlhf_lab.errors import Corrupt
    from rlhf_lab.index.store import drop_index

    exp = campaign
    drop_index()  # the kept pieces are gone: rendered again from each record's bytes
    api.record_results("dpo-20260101-000002-0002")
    incremental = _files(exp)
    ledger.render_campaign(CAMPAIGN)
    assert _files(exp) == incremental and whole_renders == []

    path = exp / CAMPAIGN / "ledger.json"
    path.write_text(path.read_text()[:-300])  # torn: the full path refuses, nothing replaced
    before = _files(exp)
    with pytest.raises(Corrupt):
        api.record_results("dpo-20260101-000002-0002")
    assert whole_renders == ["dpo-20260101-000002-0002"] and _files(exp) == before


def test_recording_a_finished_run_again_keeps_its_plots(campaign):
    exp = campaign
    first = api.record_results("dpo-20260101-000002-0002")
    png = exp / first.plot
    assert png.is_file()
    drawn = png.stat().st_mtime_ns
    again = api.record_results("dpo-20260101-000002-0002")
    assert again.plot == first.plot and png.stat().st_mtime_ns == drawn
    run = exp / CAMPAIGN / "runs" / "dpo-20260101-000002-0002"
    with open(run / "metrics.jsonl", "a") as fh:  # the run changed: its plot is drawn again
        fh.write(json.dumps({"step": 4, "phase": "eval", "eval/accuracy": 0.3}) + "\n")
    api.record_results("dpo-20260101-000002-0002")
    assert png.stat().st_mtime_ns > drawn
    shutil.rmtree(exp / CAMPAIGN / "plots")
    assert api.record_results("dpo-20260101-000002-0002").plot == first.plot
