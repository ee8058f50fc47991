"""The run index (rlhf_lab/index/): built from the run folders, checked against them with a few
stats on every use, rebuilt with a warning when it is damaged, missing or stale, never a wrong
answer; pages, filters and counts come from SQL; list_runs shows each run's own headline
(final and best); the query tool on both surfaces. Run folders are written by hand the way the
launcher and a trainer leave them (nothing is trained); their files are dated a minute back,
as a finished run's are, so that a signature is trusted (a file changed within two seconds is
always read again)."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
from mcp import Client
from typer.testing import CliRunner

from rlhf_lab import api, index
from rlhf_lab.errors import InvalidArgument
from rlhf_lab.index import extract as extract_module
from rlhf_lab.index import sync as sync_module
from tests._helpers.run_folders import write_ending, write_jsonl, write_run_json

OLD = time.time() - 120


def _age(path: Path, when: float = OLD) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            os.utime(os.path.join(root, name), (when, when))
        os.utime(root, (when, when))


def write_run(
    exp: Path,
    campaign: str,
    run_id: str,
    *,
    algorithm: str = "dpo",
    family: str = "direct_alignment",
    state: str = "succeeded",
    created: str = "2026-01-01T00:00:00.000+00:00",
    ended: str | None = "2026-01-01T01:00:00.000+00:00",
    model: str = "tiny",
    evals: tuple[float, ...] = (0.5, 0.7, 0.6),
    eval_key: str = "eval/accuracy",
    config_extra: str = "",
    extra_eval: dict | None = None,
) -> Path:
    run_dir = exp / campaign / "runs" / run_id
    write_run_json(run_dir, family, algorithm, state=state, created_at=created, ended_at=ended)
    (run_dir / "config.yaml").write_text(
        f"algorithm: {algorithm}\nmodel:\n  name: {model}\nseed: 7\n{config_extra}"
    )
    rows = []
    for step, value in enumerate(evals, start=1):
        rows.append({"step": step, "time_s": step, "phase": "train", "loss": 1.0 / step})
        rows.append(
            {"step": step, "time_s": step, "phase": "eval", eval_key: value, **(extra_eval or {})}
        )
    write_jsonl(run_dir / "metrics.jsonl", rows)
    (run_dir / "progress.json").write_text(json.dumps({"step": len(evals), "total_steps": 3}))
    if state != "died":
        write_ending(run_dir, "succeeded" if state == "succeeded" else "failed")
    _age(run_dir)
    return run_dir


@pytest.fixture
def lab(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    exp = tmp_path / "experiments"
    runs = {}
    for i in range(12):
        campaign = f"2026-01-0{i % 3 + 1}-camp{i % 3}"
        run_id = f"{'dpo' if i % 2 else 'ipo'}-20260101-0000{i:02d}-ab{i:02d}"
        runs[run_id] = write_run(
            exp,
            campaign,
            run_id,
            algorithm="dpo" if i % 2 else "ipo",
            state="died" if i % 4 == 0 else "succeeded",
            created=f"2026-01-01T00:{i:02d}:00.000+00:00",
            model="tiny" if i < 8 else "small",
            evals=(0.5, 0.5 + i / 100, 0.5 + i / 200),
        )
    _age(exp)
    return exp, runs


@pytest.fixture
def extracts(monkeypatch):
    """The run folders the index reads, in order (the real reader runs unchanged)."""
    seen: list[str] = []
    original = sync_module.extract_run

    def spy(run_dir, scan, now_ns):
        seen.append(Path(run_dir).name)
        return original(run_dir, scan, now_ns)

    monkeypatch.setattr(sync_module, "extract_run", spy)
    return seen


def _ids(page) -> list[str]:
    return [r["id"] for r in page.rows]


# ----------------------------------------------------------------------------- build, pages


def test_pages_and_filters_come_from_sql_and_finished_runs_are_read_once(lab, extracts):
    _, runs = lab
    newest_first = sorted(runs, key=lambda r: r[-9:-5], reverse=True)  # by creation minute
    first = index.page_runs(limit=5)
    assert first.total == 12 and _ids(first) == newest_first[:5][::-1]
    assert any("built from 12 run folders" in w for w in first.warnings)
    assert sorted(extracts) == sorted(runs)  # each folder read once to build the index

    extracts.clear()
    second = index.page_runs(limit=5, offset=5)
    assert _ids(second) == newest_first[5:10][::-1] and second.total == 12
    died = index.page_runs(state="died", algorithm="ipo")
    assert died.total == 3 and all(r["state"] == "died" for r in died.rows)
    by_campaign = index.page_runs(campaign="camp1", limit=2)  # the slug names the campaign
    assert by_campaign.total == 4 and len(by_campaign.rows) == 2
    assert index.page_runs(family="reward_models").total == 0
    assert extracts == [] and not second.warnings  # nothing changed: nothing read again


def test_list_runs_shows_each_runs_own_headline_final_and_best(lab, tmp_path):
    exp, _ = lab
    # a policy-gradient run rewarded by a learned model is judged on the gold reward, not the
    # spec's headline (eval/avg_correctness) that it also logs
    write_run(
        exp,
        "2026-01-04-rlhf",
        "grpo-20260102-000000-cafe",
        family="policy_gradients",
        algorithm="grpo",
        created="2026-01-02T00:00:00.000+00:00",
        evals=(0.2, 0.6, 0.4),
        eval_key="eval/gold_reward",
        config_extra="reward:\n  model: some/rm\n",
        extra_eval={"eval/avg_correctness": 0.9, "eval/proxy_reward": 3.0},
    )
    listed = api.run_list(limit=2)
    row = listed.runs[-1]
    assert row.id == "grpo-20260102-000000-cafe"
    assert (row.metric, row.value, row.best) == ("eval/gold_reward", 0.4, 0.6)
    dpo = listed.runs[0]  # run 11: evals 0.5, 0.61, 0.555
    assert (dpo.metric, dpo.value, dpo.best) == ("eval/accuracy", 0.555, 0.61)
    table = CliRunner().invoke(api_cli(), ["runs", "--limit", "2"], env={"COLUMNS": "200"})
    assert "eval/gold_reward 0.4 (best 0.6)" in table.output


def api_cli():
    from rlhf_lab.cli import app

    return app


# ------------------------------------------------------------------ never a wrong answer


def test_a_damaged_or_deleted_index_is_rebuilt_with_a_warning(lab):
    assert index.page_runs().total == 12
    path = index.index_path()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(b"this is not a database" * 100)
    page = index.page_runs(state="died")
    assert page.total == 3 and any("damaged" in w for w in page.warnings)

    path.unlink()
    page = index.page_runs(state="died")
    assert page.total == 3 and any("built from 12" in w for w in page.warnings)

    with sqlite3.connect(path) as conn:  # another version's index
        conn.execute("UPDATE meta SET value = '0' WHERE key = 'version'")
    page = index.page_runs()
    assert page.total == 12 and any("another version" in w for w in page.warnings)


def test_edits_behind_the_index_back_are_seen(lab, extracts):
    exp, runs = lab
    assert index.page_runs().total == 12
    extracts.clear()
    # a finished run's state edited by hand in place (same inode), dated in the past
    run_id = "dpo-20260101-000003-ab03"
    record_path = runs[run_id] / "run.json"
    record = json.loads(record_path.read_text())
    record["state"] = "failed"
    with open(record_path, "r+") as fh:
        fh.seek(0)
        fh.write(json.dumps(record))
        fh.truncate()
    _age(runs[run_id], OLD + 30)
    failed = index.page_runs(state="failed")
    assert _ids(failed) == [run_id] and any("changed on disk" in w for w in failed.warnings)
    assert extracts == [run_id]

    # a metric row appended to a finished run: the row shown is checked in full
    other = "ipo-20260101-000010-ab10"
    with open(runs[other] / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 4, "time_s": 4, "phase": "eval", "eval/accuracy": 0.95}))
        fh.write("\n")
    _age(runs[other], OLD + 40)
    row = next(r for r in index.page_runs().rows if r["id"] == other)
    assert (row["final"], row["best"]) == (0.95, 0.95)

    # a run folder removed, another added
    import shutil

    shutil.rmtree(runs["ipo-20260101-000000-ab00"])
    write_run(
        exp, "2026-01-05-late", "dpo-20260105-000000-beef", created="2026-01-05T00:00:00+00:00"
    )
    page = index.page_runs()
    assert page.total == 12 and page.rows[-1]["id"] == "dpo-20260105-000000-beef"
    assert "ipo-20260101-000000-ab00" not in _ids(index.page_runs(limit=50))


def test_a_state_change_by_the_lab_reaches_the_index_without_a_warning(lab, extracts):
    from rlhf_lab.runs.records import _atomic_write_json

    _, runs = lab
    index.page_runs()
    extracts.clear()
    run_dir = runs["dpo-20260101-000001-ab01"]
    record = json.loads((run_dir / "run.json").read_text())
    _atomic_write_json(run_dir / "run.json", {**record, "state": "queued"})
    with sqlite3.connect(index.index_path()) as conn:  # the writer told the index at once
        state = conn.execute("SELECT state FROM runs WHERE id = ?", (run_dir.name,)).fetchone()
    assert state == ("queued",)
    ids, warnings = index.unfinished_run_ids()
    assert ids == [run_dir.name] and warnings == []


def test_rebuild_on_demand(lab):
    count, warnings = index.rebuild_index()
    assert count == 12 and warnings == []
    result = CliRunner().invoke(api_cli(), ["index", "rebuild", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["runs"] == 12


# --------------------------------------------------------------------------------- queries


def test_query_best_per_group_and_time_windows(lab):
    exp, _ = lab
    best = api.query_runs(
        ["family=direct_alignment", "model=tiny"], group_by="algorithm", best="eval/accuracy"
    )
    # tiny runs are 0..7; the final eval/accuracy is 0.5 + i/200: best dpo i=7, best ipo i=6
    assert [(r.group, r.id) for r in best.rows] == [
        ("dpo", "dpo-20260101-000007-ab07"),
        ("ipo", "ipo-20260101-000006-ab06"),
    ]
    assert best.rows[0].metrics == {"eval/accuracy": 0.535}
    lowest = api.query_runs(["model=tiny"], group_by="algorithm", best="min:eval/accuracy")
    assert {r.id for r in lowest.rows} == {"dpo-20260101-000001-ab01", "ipo-20260101-000000-ab00"}

    recent = (time.time() - 3600) * 1000
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000+00:00", time.gmtime(recent / 1000))
    write_run(exp, "2026-01-06-fresh", "dpo-20260106-000000-dead", state="died", ended=stamp)
    died = api.query_runs(["state=died", "ended_at>=-7d"])
    assert [r.id for r in died.rows] == ["dpo-20260106-000000-dead"]
    assert api.query_runs(["state=died"]).total == 4

    ordered = api.query_runs(["state=succeeded"], sort="-final", limit=3)
    assert [r.final for r in ordered.rows] == sorted([r.final for r in ordered.rows], reverse=True)
    assert ordered.total == 9 and "first 3 of 9" in ordered.note


def test_a_query_on_run_json_fields_reads_again_only_the_rows_it_returns(lab, extracts):
    """With no condition, sort or grouping on a value outside run.json, the rows shown get the
    full check and the others are left alone (a query with no filter costs what a page of the
    run list costs, whatever the lab's size); a query by value checks every candidate."""
    _, runs = lab
    api.query_runs([])  # the index built
    extracts.clear()
    shown, hidden = "dpo-20260101-000011-ab11", "ipo-20260101-000002-ab02"
    for run_id, value in ((shown, 0.97), (hidden, 0.99)):  # run.json untouched
        metrics = runs[run_id] / "metrics.jsonl"
        with open(metrics, "a") as fh:
            fh.write(json.dumps({"step": 4, "time_s": 4, "phase": "eval", "eval/accuracy": value}))
            fh.write("\n")
        os.utime(metrics, (OLD + 40, OLD + 40))

    newest = api.query_runs([], limit=2)
    assert [r.id for r in newest.rows] == [shown, "ipo-20260101-000010-ab10"]
    assert (newest.rows[0].final, newest.rows[0].best) == (0.97, 0.97)  # read again
    assert newest.total == 12 and extracts == [shown]
    page = index.page_runs(limit=2)  # the same rows and values as the run list's page
    assert [(r["id"], r["final"]) for r in page.rows[::-1]] == [
        (r.id, r.final) for r in newest.rows
    ]
    by_record = api.query_runs(["algorithm=ipo", "campaign~camp"], sort="-created_at", limit=1)
    assert [r.id for r in by_record.rows] == ["ipo-20260101-000010-ab10"]
    assert by_record.total == 6 and extracts == [shown]  # that row was unchanged

    extracts.clear()
    best = api.query_runs(["algorithm=ipo"], sort="-final", limit=1)  # by value: every ipo run
    assert [r.id for r in best.rows] == [hidden] and best.rows[0].final == 0.99
    assert extracts == [hidden]


def test_bad_queries_get_one_error_naming_the_fields(lab):
    for call in (
        lambda: api.query_runs(["colour=red"]),
        lambda: api.query_runs(["seed>lots"]),
        lambda: api.query_runs(["ended_at>=last week"]),
        lambda: api.query_runs(["state"]),
        lambda: api.query_runs([], sort="-nonsense"),
    ):
        with pytest.raises(InvalidArgument) as err:
            call()
        assert "Fields: id, campaign" in err.value.message and "\n" not in err.value.message
    with pytest.raises(InvalidArgument, match="group_by"):
        api.query_runs([], best="eval/accuracy")

    result = CliRunner().invoke(api_cli(), ["query", "--where", "colour=red"])
    assert result.exit_code == 2 and "unknown field 'colour'" in result.output
    assert "rlhf-lab query --where" in result.output  # the next step in CLI terms


@pytest.mark.anyio
async def test_query_runs_over_mcp(lab):
    from rlhf_lab.mcp_server import server

    async with Client(server) as client:
        good = await client.call_tool(
            "query_runs", {"where": ["state=died"], "sort": "id", "limit": 2}
        )
        bad = await client.call_tool("query_runs", {"where": ["colour=red"]})
    out = good.structured_content
    assert not good.is_error and out["total"] == 3 and len(out["rows"]) == 2
    text = "".join(c.text for c in bad.content)
    assert bad.is_error and "unknown field 'colour'" in text and "query_runs(where=" in text
    assert "--where" not in text


def test_scan_carries_on_from_where_it_stopped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "phase": "eval", "eval/accuracy": 0.4}) + "\n")
    scan = extract_module.scan_metrics(path, extract_module.MetricScan())
    offset = scan.offset
    with open(path, "a") as fh:
        fh.write(json.dumps({"step": 2, "phase": "eval", "eval/accuracy": 0.8}) + "\n")
        fh.write('{"step": 3, "phase": "eval", "eval/accu')  # a torn last line waits
    scan = extract_module.scan_metrics(path, scan)
    assert scan.offset > offset and scan.stats["eval/accuracy"][5:9] == [0.8, 2, 0.8, 2]
    with open(path, "a") as fh:
        fh.write('racy": 0.1}\n')
    scan = extract_module.scan_metrics(path, scan)
    assert scan.stats["eval/accuracy"][3:9] == [0.1, 3, 0.8, 2, 0.1, 3]


def test_a_kept_snapshot_of_signatures_never_hides_an_edit(lab, extracts):
    """A long-lived process keeps the finished runs' run.json signatures while the index file
    is unchanged (no read of every row per listing); an edit of a run folder is still seen, and
    any write to the index drops the snapshot."""
    _, runs = lab
    assert index.page_runs().total == 12
    path = index.index_path()
    for suffix in ("", "-wal"):  # the index last written a while ago
        if Path(f"{path}{suffix}").exists():
            os.utime(f"{path}{suffix}", (OLD, OLD))
    index.page_runs()
    assert sync_module._SNAPSHOT["key"] is not None
    entries = sync_module._SNAPSHOT["entries"]
    assert len(entries) == 12
    extracts.clear()
    assert index.page_runs().total == 12 and extracts == []
    assert sync_module._SNAPSHOT["entries"] is entries  # reused, not read again

    run_id = "ipo-20260101-000002-ab02"  # edited in place behind the index's back
    record_path = runs[run_id] / "run.json"
    record = json.loads(record_path.read_text())
    with open(record_path, "r+") as fh:
        fh.write(json.dumps({**record, "state": "failed"}))
        fh.truncate()
    _age(runs[run_id], OLD + 30)
    failed = index.page_runs(state="failed")
    assert [r["id"] for r in failed.rows] == [run_id]
    assert extracts == [run_id] and any("changed on disk" in w for w in failed.warnings)
    index.page_runs()
    assert sync_module._SNAPSHOT["entries"] is not entries  # the index was written: read again


def test_the_lab_finds_its_unfinished_runs_in_the_index(lab, run_json_reads):
    """queued_runs / active_runs / unfinished_runs (the queue worker, device checks) take the
    unfinished runs from the index instead of reading every run.json."""
    from rlhf_lab.runs import queued_runs, unfinished_runs

    exp, _ = lab
    queued = write_run(
        exp,
        "2026-01-03-camp2",
        "dpo-20260103-000000-feed",
        state="queued",
        created="2026-01-03T00:00:00.000+00:00",
    )
    index.page_runs()  # the index knows every run
    read = run_json_reads  # the run folders whose run.json this process opened
    read.clear()  # what the listings below open counts
    assert [s.id for s in queued_runs()] == [queued.name]
    assert [s.id for s in unfinished_runs()] == [queued.name]
    assert set(read) <= {queued.name}, "no finished run's run.json was read"

    from rlhf_lab.index.hook import indexing

    read.clear()
    with indexing():  # the index is reading folders in this context: the folders are scanned
        assert [s.id for s in queued_runs()] == [queued.name]
    assert len(set(read)) == 13


def test_every_listings_check_for_unsettled_runs_searches_an_index(lab):
    """The query behind every listing's "anything to read again?" check (active runs, runs
    whose run.json changed too recently to trust) stays on an index: an OR of the two scanned
    all 10,000 rows of a large lab on every MCP list_runs (5 ms of its 57). The answer is the
    same: a queued run and a run without a trusted signature are both found."""
    exp, runs = lab
    queued = write_run(exp, "2026-01-03-camp2", "dpo-20260103-000000-feed", state="queued")
    index.page_runs()
    unsigned = sorted(runs)[0]
    with sqlite3.connect(index.index_path()) as conn:
        conn.execute("UPDATE runs SET record_sig = NULL WHERE id = ?", (unsigned,))
        found = sync_module._unsettled(conn)
        assert set(found) == {queued.name, unsigned}
        for query, args in (
            ("SELECT id FROM runs WHERE state IN (?, ?, ?)", sync_module._ACTIVE),
            ("SELECT id FROM runs WHERE record_sig IS NULL", ()),
        ):
            plan = " ".join(row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", args))
            assert "USING INDEX" in plan or "USING COVERING INDEX" in plan, (query, plan)
