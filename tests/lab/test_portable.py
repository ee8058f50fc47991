"""No machine paths in committed campaigns (issue #25, item 7): the rules of
rlhf_lab/ledger/portable.py, the ledger storing a portable argv, the migration of an old
campaign through the lab's renderer, and a check of every committed file under experiments/."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_lab import ledger
from rlhf_lab.ledger.portable import (
    MACHINE_PATH,
    portable_argv,
    portable_path,
    portable_text,
)
from rlhf_lab.results.portable_campaign import make_campaign_portable
from tests.lab.test_overoptimisation import CAMP, make_run, rlhf_rows

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("lab_root")


def test_portable_path_rules():
    assert portable_path("/work/wt-14/.venv/bin/python3") == "python3"
    assert portable_path("/home/ann/lab/.venv/bin/torchrun") == "torchrun"
    assert (
        portable_path("/work/main/experiments/2026-11-21-demo/runs/dpo-1/config.yaml")
        == "experiments/2026-11-21-demo/runs/dpo-1/config.yaml"
    )
    assert (
        portable_path("/root/.cache/rlhf-lab/ref_logps/a.pt") == "~/.cache/rlhf-lab/ref_logps/a.pt"
    )
    assert portable_path("/Users/ann/data.jsonl") == "~/data.jsonl"
    assert portable_path("/usr/bin/python") == "/usr/bin/python"  # not a machine's own folder
    argv = ["/work/x/.venv/bin/python", "-m", "t", "--config=/work/x/experiments/c/runs/r/c.yaml"]
    assert portable_argv(argv) == ["python", "-m", "t", "--config=experiments/c/runs/r/c.yaml"]
    text = "saved to /tmp/x/experiments/c/runs/r/final_model (from /root/.cache/m)"
    assert portable_text(text) == "saved to experiments/c/runs/r/final_model (from ~/.cache/m)"
    assert MACHINE_PATH.search("see ~/.cache/rlhf-lab and experiments/c") is None


def test_a_checkout_outside_the_usual_roots_is_made_portable_too():
    """CI clones the repository under /check: its interpreter and run folders are machine paths
    as much as /work's are (the ledger kept ``/check/.../.venv/bin/python`` before)."""
    argv = ["/check/work/main/.venv/bin/python", "-m", "t", "--run-dir", "/srv/ci/experiments/c/r"]
    assert portable_argv(argv) == ["python", "-m", "t", "--run-dir", "experiments/c/r"]
    assert MACHINE_PATH.search("/check/work/main/.venv/bin/python") is not None
    url = "see https://example.org/a/experiments/x and /usr/bin/python"
    assert portable_text(url) == url


def test_the_ledger_stores_a_portable_argv(lab_root):
    ledger.create_campaign(CAMP, "q")
    run = make_run("grpo-1", rlhf_rows(lambda d: d))
    meta = json.loads((run / "run.json").read_text())
    meta["argv"] = [sys.executable, "-m", "trainers.policy_gradients.train", "--run-dir", str(run)]
    (run / "run.json").write_text(json.dumps(meta))
    record = ledger.record_run("grpo-1", plot=False)
    assert record.argv[0] == portable_path(sys.executable)
    assert record.argv[-1] == f"experiments/{CAMP}/runs/grpo-1"
    stored = json.loads((lab_root / "experiments" / CAMP / "ledger.json").read_text())
    assert MACHINE_PATH.search(json.dumps(stored["runs"][0]["argv"])) is None


def test_an_old_campaign_is_migrated_by_the_lab(lab_root):
    """The round-1 demo campaign, copied with its machine paths, comes out without any: its
    ledger.json, run folders and markdown (rendered again by the lab)."""
    source = REPO / "experiments"
    name = "2026-11-21-demo"
    target = lab_root / "experiments"
    target.mkdir()
    shutil.copytree(source / name, target / name, ignore=shutil.ignore_patterns("*.png"))
    shutil.copy(source / f"{name}.md", target / f"{name}.md")
    old = "/work/main"
    for path in [target / f"{name}.md", *(target / name).rglob("*.json")]:
        text = path.read_text()  # put back the machine paths the committed copy no longer has
        text = text.replace('"python"', f'"{old}/.venv/bin/python"')
        text = text.replace("experiments/2026-11-21-demo/runs", f"{old}/experiments/{name}/runs")
        text = text.replace('"cwd": "."', f'"cwd": "{old}"')
        path.write_text(text)
    assert any(MACHINE_PATH.search(p.read_text()) for p in (target / name).rglob("*.json"))
    changed = make_campaign_portable(name)
    assert target / f"{name}.md" in changed and target / name / "ledger.json" in changed
    for path in [target / f"{name}.md", *(target / name).rglob("*")]:
        if path.is_file() and path.suffix in (".json", ".md", ".yaml", ".log"):
            assert MACHINE_PATH.search(path.read_text()) is None, path
    run = json.loads(next((target / name / "runs").glob("dpo-*/run.json")).read_text())
    assert run["cwd"] == "." and run["argv"][0] == "python"
    md = (target / f"{name}.md").read_text()
    assert "uv run python -m trainers.direct_alignment.train --config experiments/" in md
    data = json.loads((target / name / "ledger.json").read_text())
    assert all(r["command"] is None for r in data["runs"])  # a trainer argv, not a lab command
    assert make_campaign_portable(name) == []  # a second pass changes nothing


def _committed_experiment_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "experiments"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [REPO / line for line in out.splitlines() if line]


def test_no_committed_file_under_experiments_holds_a_machine_path():
    files = _committed_experiment_files()
    if not files:
        pytest.skip("not a git checkout: no committed files to check")
    found = []
    for path in files:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue  # a figure
        if (m := MACHINE_PATH.search(text)) is not None:
            found.append(f"{path.relative_to(REPO)}: {m.group(0)}")
    assert not found, (
        'machine paths in committed campaigns (run `uv run python -c "from '
        "rlhf_lab.results.portable_campaign import make_campaign_portable as m; "
        "print(m('<campaign>'))\"` before committing):\n" + "\n".join(found[:20])
    )
