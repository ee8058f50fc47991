"""Campaign ledgers: creation, recording synthetic run folders, hand-written text kept byte for
byte, tolerant reading, concurrent writers (threads and processes), the index, bad names."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import yaml

from rlhf_lab import ledger
from rlhf_lab.paths import LabError
from rlhf_lab.results.compare import compare_runs
from tests._helpers.imports import modules_left_imported
from tests._helpers.run_folders import write_jsonl, write_run_json
from trainers.core.config import read_yaml
from trainers.direct_alignment.config import DirectAlignmentConfig

REPO = Path(__file__).resolve().parents[2]
DPO_YAML = "trainers/direct_alignment/configs/dpo.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MARKER_RE = re.compile(r"<!-- rlhf-lab:(begin|end) ([a-z-]+) -->")


pytestmark = pytest.mark.usefixtures("lab_root")


# ---------------------------------------------------------------------------------------------
# Synthetic run folders
# ---------------------------------------------------------------------------------------------


def dpo_config(**changes) -> dict:
    cfg = DirectAlignmentConfig.model_validate(read_yaml(REPO / DPO_YAML)).model_dump(mode="json")
    for dotted, value in changes.items():
        node = cfg
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return cfg


def da_rows(steps: int = 12, scale: float = 1.0) -> list[dict]:
    rows = []
    for s in range(1, steps + 1):
        rows.append(
            {
                "step": s,
                "time_s": 0.1 * s,
                "phase": "train",
                "loss": 0.69 - 0.01 * s * scale,
                "accuracy": 0.5 + 0.02 * s * scale,
                "margins": 0.05 * s * scale,
                "chosen_rewards": 0.02 * s,
                "rejected_rewards": -0.03 * s,
                "grad_norm": 1.0,
            }
        )
        if s % 4 == 0:
            rows.append(
                {
                    "step": s,
                    "time_s": 0.1 * s,
                    "phase": "eval",
                    "eval/loss": 0.7 - 0.005 * s,
                    "eval/accuracy": 0.5 + 0.01 * s * scale,
                    "eval/margins": 0.03 * s * scale,
                    "eval/chosen_rewards": 0.01 * s,
                    "eval/rejected_rewards": -0.02 * s,
                }
            )
    return rows


def make_run(
    campaign: str,
    run_id: str,
    *,
    family: str = "direct_alignment",
    algorithm: str = "dpo",
    state: str = "succeeded",
    config: dict | None = None,
    config_source: str | None = DPO_YAML,
    rows: list[dict] | None = None,
    summary: dict | None = None,
    samples: list[dict] | None = None,
    run_json: dict | None = None,
) -> Path:
    """Write a run folder by hand the way the launcher and a trainer would."""
    root = ledger.experiments_dir() / campaign / "runs" / run_id
    meta = {
        "config_source": config_source,
        "overrides": ["train.learning_rate=3e-4"],
        "cwd": str(REPO),
        "state": state,
        "wandb_url": f"https://wandb.ai/lab/rlhf/runs/{run_id[-4:]}",
    }
    write_run_json(root, family, algorithm, **{**meta, **(run_json or {})})
    cfg = config if config is not None else dpo_config(train__learning_rate=3e-4)
    (root / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    rows = da_rows() if rows is None else rows
    write_jsonl(root / "metrics.jsonl", rows)
    if samples is None:
        samples = [
            {"step": 12, "prompt": "Spell 'star' backwards", "completion": "<answer>rats</answer>"},
            {"step": 12, "prompt": "Sum 2 and 3", "completion": "<answer>5</answer>"},
        ]
    write_jsonl(root / "samples.jsonl", samples)
    if summary is None and state == "succeeded":
        summary = {
            "outcome": "succeeded",
            "steps": 12,
            "total_steps": 12,
            "final_metrics": rows[-1] if rows else {},
            "final_eval": {},
            "best_metrics": {},
            "wall_time_s": 3.5,
        }
    if summary is not None:
        (root / "summary.json").write_text(json.dumps(summary))
    return root


# ---------------------------------------------------------------------------------------------
# Markdown helpers
# ---------------------------------------------------------------------------------------------


def split_front_matter(text: str) -> tuple[dict, str]:
    assert text.startswith("---\n"), text[:200]
    end = text.index("\n---\n", 3)
    front = yaml.safe_load(text[4 : end + 1])
    assert isinstance(front, dict)
    return front, text[end + 5 :]


def assert_markers_balanced(text: str) -> None:
    found = MARKER_RE.findall(text)
    names = [n for _, n in found]
    for name in ledger.BLOCKS:
        assert names.count(name) == 2, (name, found)
    open_block = None
    for kind, name in found:
        if kind == "begin":
            assert open_block is None, f"{name} opened inside {open_block}"
            open_block = name
        else:
            assert open_block == name, f"end {name} while {open_block} is open"
            open_block = None
    assert open_block is None


def outside_markers(text: str) -> str:
    """Everything a person owns: the text minus front matter and the lab's block contents."""
    _, body = split_front_matter(text)
    return re.sub(
        r"(<!-- rlhf-lab:begin ([a-z-]+) -->).*?(<!-- rlhf-lab:end \2 -->)",
        r"\1\3",
        body,
        flags=re.S,
    )


def add_hand_text(md: Path) -> dict[str, str]:
    text = md.read_text()
    goal = (
        "Hypothesis: β=0.1 lifts held-out accuracy above 0.6 within 12 steps.\n"
        "   (indented, Ünïcode, trailing spaces)   \n"
    )
    between = "Hand note under Runs, after the lab's block. | not a table |\n"
    obs = "My own observation: margins grow steadily.\n\n```\ncode <!-- not a marker -->\n```\n"
    nxt = "- sweep β ∈ {0.05, 0.2}\n- try 3 seeds\n"
    text = text.replace("## Goal\n\n", "## Goal\n\n" + goal + "\n", 1)
    text = text.replace(
        "<!-- rlhf-lab:end runs -->\n", "<!-- rlhf-lab:end runs -->\n\n" + between, 1
    )
    text = text.replace(
        "<!-- rlhf-lab:end observations-auto -->\n",
        "<!-- rlhf-lab:end observations-auto -->\n\n" + obs,
        1,
    )
    # the Next section: hand lines above the lab's block and after it
    text = text.replace("## Next\n\n", "## Next\n\n" + nxt + "\n", 1)
    assert text.endswith("<!-- rlhf-lab:end next -->\n")
    after = "\nMy own follow-up, after the lab's list.\n"
    text = text + after + "\nNo trailing newline at the very end"
    md.write_text(text)
    return {"goal": goal, "between": between, "obs": obs, "next": nxt, "after": after}


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


def test_create_campaign_writes_front_matter_sections_and_folders(lab_root):
    camp = ledger.create_campaign(
        "dpo-beta",
        "Does DPO learn at β 0.1?",
        family="direct_alignment",
        model="tiny",
        seeds=[1, 2],
    )
    assert camp.created and re.fullmatch(r"\d{4}-\d{2}-\d{2}-dpo-beta", camp.id)
    md = lab_root / "experiments" / f"{camp.id}.md"
    assert Path(camp.path) == md and md.is_file()
    for sub in ("runs", "plots"):
        assert (lab_root / "experiments" / camp.id / sub).is_dir()
    assert (lab_root / "experiments" / camp.id / "ledger.json").is_file()
    text = md.read_text()
    front, body = split_front_matter(text)
    assert list(front)[:8] == [
        "id",
        "date",
        "status",
        "question",
        "family",
        "model",
        "dataset",
        "seeds",
    ]
    assert front["id"] == camp.id and front["date"] == camp.date
    assert front["status"] == "planned" and front["question"] == "Does DPO learn at β 0.1?"
    assert front["family"] == "direct_alignment" and front["model"] == "tiny"
    assert front["dataset"] is None and front["seeds"] == [1, 2]
    headings = re.findall(r"^## (.+)$", body, re.M)
    assert headings == [
        "Answer",
        "Goal",
        "Setup",
        "Runs",
        "Plots",
        "Evaluation",
        "Comparison",
        "Observations",
        "Next",
    ]
    assert_markers_balanced(text)

    # idempotent: the same slug returns the campaign and never rewrites it
    again = ledger.create_campaign("dpo-beta", "a different question")
    assert not again.created and again.id == camp.id
    assert again.question == "Does DPO learn at β 0.1?"
    assert md.read_text() == text

    index = (lab_root / "experiments" / "README.md").read_text()
    assert f"[dpo-beta]({camp.id}.md)" in index and "Does DPO learn at β 0.1?" in index


def test_hand_written_text_survives_regeneration_byte_for_byte():
    camp = ledger.create_campaign("keep-notes", "Does the ledger keep my notes?")
    md = Path(camp.path)
    hand = add_hand_text(md)
    before = outside_markers(md.read_text())
    for i in range(3):
        make_run(camp.id, f"dpo-20260101-00000{i}-aaa{i}")
        ledger.record_run(f"dpo-20260101-00000{i}-aaa{i}", note=f"note {i}")
    ledger.record_run("dpo-20260101-000001-aaa1")  # again, no note: keeps "note 1"
    compare_runs(["dpo-20260101-000000-aaa0", "dpo-20260101-000002-aaa2"], record_in="keep-notes")
    ledger.render_campaign("keep-notes")
    text = md.read_text()
    assert outside_markers(text) == before
    for chunk in hand.values():
        assert chunk in text
    assert text.endswith("No trailing newline at the very end")
    assert_markers_balanced(text)
    front, _ = split_front_matter(text)
    assert front["status"] == "completed"
    view = ledger.show_campaign("keep-notes")
    assert [r.note for r in view.runs] == ["note 0", "note 1", "note 2"]
    assert len(view.comparisons) == 1


def test_record_run_fills_the_row_from_a_synthetic_run(lab_root):
    camp = ledger.create_campaign("dpo-lr", "Does a larger lr help DPO on tiny?")
    run_id = "dpo-20260101-120000-ab12"
    path = make_run(
        camp.id,
        run_id,
        config=dpo_config(train__learning_rate=3e-4, model__name="tiny", beta=0.2),
    )
    rec = ledger.record_run(run_id, note="lr 3e-4 | first try")

    # the lab-level command a reader elsewhere can run, and the trainer's with relative paths
    assert rec.command == (
        f"uv run rlhf-lab launch dpo --set train.learning_rate=3e-4 --campaign {camp.id}"
    )
    run_rel = f"experiments/{camp.id}/runs/{run_id}"
    assert rec.trainer_command == (
        f"uv run python -m trainers.direct_alignment.train --config {run_rel}/config.yaml "
        f"--run-dir {run_rel}"
    )
    assert json.loads((path / "run.json").read_text())["argv"][0] == sys.executable
    changed = {c.key: (c.shipped, c.used) for c in rec.changes}
    assert changed == {
        "train.learning_rate": (5e-6, 3e-4),
        "model.name": ("allenai/OLMo-2-0425-1B-SFT", "tiny"),
        "beta": (0.1, 0.2),
    }
    assert rec.model == "tiny" and rec.seed == 42
    assert rec.dataset == "argilla/ultrafeedback-binarized-preferences-cleaned"
    assert rec.config_source == DPO_YAML and rec.config_file.endswith(f"{run_id}/config.yaml")
    assert rec.state == "succeeded" and rec.failure is None and rec.algorithm == "dpo"
    acc = rec.metric("eval/accuracy")
    assert acc.final == pytest.approx(0.62) and acc.final_step == 12
    assert acc.best == pytest.approx(0.62) and acc.best_step == 12
    train_acc = rec.metric("accuracy")
    assert train_acc.final == pytest.approx(0.74)
    assert rec.metric("rejected_rewards").best is None  # no "better" direction
    assert rec.steps == 12 and rec.total_steps == 12
    assert rec.wandb_url == "https://wandb.ai/lab/rlhf/runs/ab12"
    assert rec.warnings == [] and len(rec.samples) == 2

    png = lab_root / "experiments" / camp.id / "plots" / f"{run_id}.png"
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000
    assert rec.plot == f"{camp.id}/plots/{run_id}.png"

    text = Path(camp.path).read_text()
    assert_markers_balanced(text)
    assert rec.command in text
    assert f"![{run_id}]({camp.id}/plots/{run_id}.png)" in text
    assert "| `train.learning_rate` | 5e-06 | 0.0003 |" in text
    assert "lr 3e-4 \\| first try" in text  # the pipe in the note cannot break the table
    assert "[W&B](https://wandb.ai/lab/rlhf/runs/ab12)" in text
    assert "```\n<answer>rats</answer>\n```" in text  # a sample generation, verbatim
    assert "> **prompt:** Spell 'star' backwards" in text
    row = next(ln for ln in text.splitlines() if ln.startswith(f"| `{run_id}` | dpo |"))
    assert "| succeeded | 12/12 |" in row and "| 0.62 |" in row
    saved = json.loads((lab_root / "experiments" / camp.id / "ledger.json").read_text())
    assert [r["run_id"] for r in saved["runs"]] == [run_id]


def test_recording_twice_updates_the_same_row():
    camp = ledger.create_campaign("twice", "Does re-recording duplicate rows?")
    run_id = "dpo-20260101-120000-0001"
    alive = {"pid": os.getpid(), "create_time": psutil.Process().create_time()}
    make_run(camp.id, run_id, state="running", rows=da_rows(4), summary=None, run_json=alive)
    first = ledger.record_run(run_id, note="still going")
    assert first.state == "running" and first.steps == 4
    assert ledger.show_campaign("twice").campaign.status == "running"
    make_run(camp.id, run_id, rows=da_rows(12))  # it finished
    second = ledger.record_run(run_id)
    assert second.state == "succeeded" and second.steps == 12 and second.note == "still going"
    view = ledger.show_campaign("twice")
    assert len(view.runs) == 1 and view.campaign.runs == 1
    assert view.campaign.status == "completed"
    runs_block = view.markdown.split("<!-- rlhf-lab:begin runs -->")[1].split("<!-- rlhf")[0]
    assert runs_block.count(f"| `{run_id}` |") == 1


def test_failed_run_row_shows_its_error():
    camp = ledger.create_campaign("oom", "What happens at batch 64?")
    run_id = "dpo-20260101-130000-dead"
    make_run(
        camp.id,
        run_id,
        state="failed",
        rows=da_rows(3),
        summary={
            "outcome": "failed",
            "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "traceback": "Traceback ...",
            "wall_time_s": 1.0,
        },
        run_json={"exit_code": 1},
    )
    rec = ledger.record_run(run_id)
    assert rec.state == "failed" and rec.outcome == "failed"
    assert "OutOfMemoryError: CUDA out of memory" in rec.failure and "exit code 1" in rec.failure
    text = Path(camp.path).read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith(f"| `{run_id}` | dpo |"))
    assert "failed: OutOfMemoryError: CUDA out of memory" in row
    assert "- failure: OutOfMemoryError: CUDA out of memory" in text
    assert split_front_matter(text)[0]["status"] == "failed"


def test_died_run_without_summary_reports_the_log_tail():
    camp = ledger.create_campaign("killed", "Does a SIGKILL show up?")
    run_id = "dpo-20260101-140000-0k1d"
    path = make_run(camp.id, run_id, state="died", rows=da_rows(2), summary=None)
    (path / "train.log").write_text("step 1/12 loss 0.69\nstep 2/12 loss 0.68\nKilled\n")
    rec = ledger.record_run(run_id)
    assert rec.state == "died"
    assert "without an exit status" in rec.failure and "last log line: Killed" in rec.failure
    assert any("no summary.json" in w for w in rec.warnings)


def test_a_running_run_whose_process_is_gone_is_recorded_as_died():
    camp = ledger.create_campaign("gone", "Is a vanished run noticed?")
    run_id = "dpo-20260101-140000-0900"
    path = make_run(camp.id, run_id, state="running", rows=da_rows(2), summary=None)
    rec = ledger.record_run(run_id)
    assert rec.state == "died" and "without an exit status" in rec.failure
    assert json.loads((path / "run.json").read_text())["state"] == "died"


def test_corrupt_and_truncated_files_become_warnings(lab_root):
    camp = ledger.create_campaign("corrupt", "Does a broken run folder crash the ledger?")
    run_id = "dpo-20260101-150000-bad0"
    path = make_run(camp.id, run_id, summary=None, state="running")
    (path / "run.json").write_text('{"id": "dpo-2026010')  # cut mid-write
    with open(path / "metrics.jsonl", "ab") as fh:
        fh.write(b'\xff\xfe not json\n{"step": 13, "phase": "tra')  # junk + a truncated line
    (path / "samples.jsonl").unlink()
    (path / "config.yaml").write_text("model: [unclosed\n")
    rec = ledger.record_run(run_id)
    text = " ".join(rec.warnings)
    assert "run.json is unreadable" in text
    assert "metrics.jsonl: 2 unreadable line(s)" in text
    assert "config.yaml unreadable" in text
    assert rec.command is None and rec.family is None and rec.state == "unknown"
    assert rec.metric("eval/accuracy").final == pytest.approx(0.62)  # the good lines still count
    assert (lab_root / "experiments" / camp.id / "plots" / f"{run_id}.png").is_file()
    md = Path(camp.path).read_text()
    assert_markers_balanced(md)
    assert "warning: run.json is unreadable" in md

    # an empty folder (nothing written yet) is fine too
    empty = lab_root / "experiments" / camp.id / "runs" / "dpo-20260101-150001-e000"
    empty.mkdir()
    rec = ledger.record_run(empty.name)
    assert rec.plot is None and any("run.json is missing" in w for w in rec.warnings)


def test_a_note_cannot_forge_marker_comments():
    camp = ledger.create_campaign("forge", "Can text break the markers?")
    make_run(camp.id, "dpo-20260101-160000-f000")
    ledger.record_run("dpo-20260101-160000-f000", note="<!-- rlhf-lab:end runs --> oops")
    text = Path(camp.path).read_text()
    assert_markers_balanced(text)
    ledger.record_run("dpo-20260101-160000-f000")
    assert_markers_balanced(Path(camp.path).read_text())


def test_broken_markers_are_an_error_that_loses_nothing():
    camp = ledger.create_campaign("broken", "What if someone deletes a marker?")
    make_run(camp.id, "dpo-20260101-170000-b000")
    md = Path(camp.path)
    md.write_text(md.read_text().replace("<!-- rlhf-lab:end plots -->", "", 1))
    broken = md.read_text()
    with pytest.raises(LabError, match="'plots' block markers are broken"):
        ledger.record_run("dpo-20260101-170000-b000")
    assert md.read_text() == broken  # the markdown was not touched
    assert [r.run_id for r in ledger.show_campaign("broken").runs] == ["dpo-20260101-170000-b000"]
    # deleting the other marker too: the block is re-added under its heading
    md.write_text(broken.replace("<!-- rlhf-lab:begin plots -->", "", 1))
    ledger.render_campaign("broken")
    text = md.read_text()
    assert_markers_balanced(text)
    assert "![dpo-20260101-170000-b000]" in text


def test_a_corrupt_ledger_file_is_an_error_not_a_silent_reset():
    camp = ledger.create_campaign("bad-data", "What if ledger.json is damaged?")
    make_run(camp.id, "dpo-20260101-175000-c000")
    ledger.record_run("dpo-20260101-175000-c000")
    data = Path(camp.asset_dir) / "ledger.json"
    data.write_text(data.read_text()[:100])
    md_before = Path(camp.path).read_text()
    with pytest.raises(LabError, match="ledger.json is unreadable"):
        ledger.record_run("dpo-20260101-175000-c000")
    assert Path(camp.path).read_text() == md_before
    listed = ledger.list_campaigns()
    assert listed[0].status == "unknown" and "unreadable" in listed[0].warnings[0]


def test_manual_status_and_extra_front_matter_keys_are_kept():
    camp = ledger.create_campaign("manual", "Is a hand-set status kept?")
    md = Path(camp.path)
    md.write_text(md.read_text().replace("status: planned\n", "status: concluded\ntags: [dpo]\n"))
    make_run(camp.id, "dpo-20260101-180000-m000")
    ledger.record_run("dpo-20260101-180000-m000")
    front, _ = split_front_matter(md.read_text())
    assert front["status"] == "concluded" and front["tags"] == ["dpo"]
    assert ledger.list_campaigns()[0].status == "concluded"


def _record_many(ids: list[str]) -> None:
    for run_id in ids:
        ledger.record_run(run_id, plot=run_id.endswith("0"))


def _check_concurrent_result(camp, run_ids, hand) -> None:
    text = Path(camp.path).read_text()
    assert_markers_balanced(text)
    front, _ = split_front_matter(text)
    assert front["id"] == camp.id and front["status"] == "completed"
    for chunk in hand.values():
        assert chunk in text
    for run_id in run_ids:
        assert text.count(f"| `{run_id}` | dpo |") == 1, run_id
    view = ledger.show_campaign(camp.slug)
    assert sorted(r.run_id for r in view.runs) == sorted(run_ids)
    index = (ledger.experiments_dir() / "README.md").read_text()
    assert re.search(
        rf"\[{camp.slug}\]\({camp.id}\.md\) \| .* \| completed \| {len(run_ids)} \|", index
    )
    leftovers = [p.name for p in ledger.experiments_dir().rglob("*.tmp*")]
    assert leftovers == []


def test_fifty_concurrent_threads_record_into_one_campaign():
    camp = ledger.create_campaign("threads", "Do concurrent writers lose rows?")
    hand = add_hand_text(Path(camp.path))
    run_ids = [f"dpo-20260102-000000-t{i:03d}" for i in range(50)]
    for run_id in run_ids:
        make_run(camp.id, run_id, rows=da_rows(6))
    barrier = threading.Barrier(10)

    def work(run_id: str) -> ledger.RunRecord:
        if int(run_id[-3:]) < 10:
            barrier.wait()
        return ledger.record_run(run_id, plot=int(run_id[-3:]) % 5 == 0)

    with ThreadPoolExecutor(max_workers=10) as pool:
        records = list(pool.map(work, run_ids))
    assert [r.run_id for r in records] == run_ids
    _check_concurrent_result(camp, run_ids, hand)
    plots = sorted(p.name for p in (Path(camp.asset_dir) / "plots").glob("*.png"))
    assert plots == [f"{r}.png" for r in run_ids if int(r[-3:]) % 5 == 0]


def test_fifty_concurrent_record_calls_from_processes():
    camp = ledger.create_campaign("processes", "Do concurrent processes lose rows?")
    hand = add_hand_text(Path(camp.path))
    run_ids = [f"dpo-20260102-000000-p{i:03d}" for i in range(50)]
    for run_id in run_ids:
        make_run(camp.id, run_id, rows=da_rows(6))
    import matplotlib.backends.backend_agg  # noqa: F401  (imported once, shared by the forks)

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_record_many, args=(run_ids[i::10],)) for i in range(10)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * 10
    _check_concurrent_result(camp, run_ids, hand)


def test_index_lists_every_campaign_newest_first(lab_root):
    a = ledger.create_campaign("2026-01-05-alpha", "Alpha question?")
    b = ledger.create_campaign("2026-02-01-beta", "Beta | question?")
    make_run(b.id, "dpo-20260201-000000-beta")
    ledger.record_run("dpo-20260201-000000-beta")
    assert [c.id for c in ledger.list_campaigns()] == [b.id, a.id]
    index = (lab_root / "experiments" / "README.md").read_text()
    lines = [ln for ln in index.splitlines() if ln.startswith("| 2026-")]
    assert lines == [
        "| 2026-02-01 | [beta](2026-02-01-beta.md) | Beta \\| question? | completed | 1 |",
        "| 2026-01-05 | [alpha](2026-01-05-alpha.md) | Alpha question? | planned | 0 |",
    ]
    # text a person adds to the index outside its markers is kept
    readme = lab_root / "experiments" / "README.md"
    readme.write_text(readme.read_text() + "\nSee also the wiki.\n")
    ledger.create_campaign("gamma", "Gamma?")
    assert readme.read_text().endswith("\nSee also the wiki.\n")
    assert "[gamma]" in readme.read_text()
    assert ledger.resolve_campaign("alpha") == a.id  # latest campaign with that slug


BAD_SLUGS = ["../evil", "a/b", "/abs", "Bad", "", "x\x00y", "a..b", "-x", "a_b", "..", "a b"]
BAD_RUN_IDS = [
    "../x",
    "a/b",
    "..",
    "/etc/passwd",
    "x\x00",
    "",
    "*",
    "a/../b",
    "run/",
    ".hidden",
    "dpo-1\n",
    "Dpo-1",
    "x" * 200,
]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("slug", BAD_SLUGS)
def test_bad_slugs_are_rejected_before_touching_disk(lab_root, slug):
    with pytest.raises(LabError, match="bad campaign slug"):
        ledger.create_campaign(slug, "question?")
    with pytest.raises(LabError):
        ledger.show_campaign(slug)
    assert _tree(lab_root) == set()


@pytest.mark.parametrize("run_id", BAD_RUN_IDS)
def test_path_like_run_ids_are_rejected(lab_root, run_id):
    camp = ledger.create_campaign("ids", "Are path-like ids rejected?")
    before = _tree(lab_root)
    for call in (ledger.record_run, ledger.inspect_run, lambda r: compare_runs([r])):
        with pytest.raises(LabError, match="bad run id"):
            call(run_id)
    with pytest.raises(LabError, match="bad campaign slug"):
        compare_runs(["dpo-20260101-000000-0000"], record_in="../" + camp.id)
    assert _tree(lab_root) == before
    # the campaign and the run index beside experiments/ (a cache of the folders)
    assert all(p.startswith(("experiments", ".rlhf-lab")) for p in before)


def test_unknown_run_and_campaign_give_clear_errors():
    with pytest.raises(LabError, match="no run 'dpo-20990101-000000-0000'"):
        ledger.record_run("dpo-20990101-000000-0000")
    with pytest.raises(LabError, match="no campaign with slug 'nothing'"):
        ledger.show_campaign("nothing")
    with pytest.raises(LabError, match="unknown family"):
        ledger.create_campaign("fam", "q?", family="rlhf")


def test_run_in_a_campaign_without_ledger_creates_it():
    run_id = "dpo-20260103-000000-auto"
    make_run("2026-01-03-dpo-sanity", run_id)
    rec = ledger.record_run(run_id)
    assert any("created" in w for w in rec.warnings)
    view = ledger.show_campaign("2026-01-03-dpo-sanity")
    assert (
        view.campaign.family == "direct_alignment"
        and view.campaign.model == DirectAlignmentConfig().model.name
    )
    assert [r.run_id for r in view.runs] == [run_id]
    assert_markers_balanced(view.markdown)


def test_lab_modules_import_neither_torch_nor_matplotlib():
    code = "import rlhf_lab.ledger, rlhf_lab.results.compare, rlhf_lab.results.plots"
    assert modules_left_imported(code, ("torch", "transformers", "matplotlib")) == []


def test_performance_summary_skips_warm_up_and_reaches_the_markdown():
    rows = da_rows(steps=4)
    for row, (tps, peak, fwd) in zip(
        [r for r in rows if r["phase"] == "train"],
        [(10.0, 0.5, 9.0), (100.0, 0.7, 0.2), (300.0, 0.6, 0.4), (200.0, 0.4, 0.3)],
        strict=True,
    ):
        row.update({"throughput/tokens_per_s": tps, "memory/peak_gb": peak, "timing/train": fwd})
    perf = ledger.summarize_performance(rows)
    # the first (warm-up) row is left out of the medians, not out of the peak
    assert perf == {
        "throughput/tokens_per_s": 200.0,
        "memory/peak_gb": 0.7,
        "timing/train": 0.3,
    }
    assert ledger.summarize_performance(da_rows(steps=2)) == {}

    camp = ledger.create_campaign("speed", "how fast?")
    make_run(camp.id, "dpo-20260101-000001-5eed", rows=rows)
    record = ledger.record_run("dpo-20260101-000001-5eed", plot=False)
    assert record.performance["throughput/tokens_per_s"] == 200.0
    text = ledger.show_campaign("speed").markdown
    assert "Speed: 200 tokens/s (median); peak memory 0.70 GB; per step: train 0.3 s." in text


# ---------------------------------------------------------------------------------------------
# Config classes come from the catalog (every family, rejection sampling included)
# ---------------------------------------------------------------------------------------------

RS_YAML = "trainers/rejection_sampling/configs/top_per_prompt.yaml"


def test_every_catalog_family_has_its_config_class_for_the_setup_diff():
    from rlhf_lab.planning.catalog import FAMILIES as CATALOG

    assert set(ledger._CONFIG_CLASSES) == set(CATALOG)
    for family, info in CATALOG.items():
        model = ledger._config_model(family)
        assert model is not None and model.__name__ == info.config_class, family


def test_a_rejection_sampling_runs_config_changes_show_in_the_setup_block(lab_root):
    rs_config = pytest.importorskip("trainers.rejection_sampling.config")
    shipped = read_yaml(REPO / RS_YAML)
    used = rs_config.RejectionSamplingConfig.model_validate(shipped).model_dump(mode="json")
    used["top_k"] = 500
    used["model"]["name"] = "tiny"
    camp = ledger.create_campaign("rs-setup", "Does top-per-prompt beat its random control?")
    run_id = "rs-20260101-120000-a5e1"
    make_run(
        camp.id,
        run_id,
        family="rejection_sampling",
        algorithm="top_per_prompt",
        config=used,
        config_source=RS_YAML,
        rows=[{"step": 1, "time_s": 1.0, "phase": "train", "loss": 0.5}],
    )
    rec = ledger.record_run(run_id, plot=False)

    # the resolved config is compared with the shipped YAML validated by the family's model, so
    # only the two values set by hand differ (not every default the YAML leaves out)
    changed = {c.key: (c.shipped, c.used) for c in rec.changes}
    assert changed == {"top_k": (1000, 500), "model.name": ("Qwen/Qwen3-1.7B", "tiny")}
    assert not any("does not validate" in w for w in rec.warnings), rec.warnings
    md = Path(camp.path).read_text()
    setup = md.split("<!-- rlhf-lab:begin setup -->")[1].split("<!-- rlhf-lab:end setup -->")[0]
    assert f"`{run_id}` — values changed from the shipped defaults" in setup
    assert "| `top_k` | 1000 | 500 |" in setup and "| `model.name` |" in setup


def test_a_relative_shipped_config_resolves_in_the_source_checkout_without_cwd(lab_root):
    # RLHF_LAB_ROOT moves experiments/ only: the shipped YAML is found beside the trainers
    camp = ledger.create_campaign("no-cwd", "Is the shipped config found without a cwd?")
    run_id = "dpo-20260101-120000-c0d0"
    make_run(camp.id, run_id, config=dpo_config(beta=0.2), run_json={"cwd": None})
    rec = ledger.record_run(run_id, plot=False)
    assert {c.key: (c.shipped, c.used) for c in rec.changes} == {"beta": (0.1, 0.2)}
    assert not any("not found" in w for w in rec.warnings), rec.warnings
