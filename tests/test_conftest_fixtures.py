"""The shared trainer-run helpers of tests/conftest.py, on a fake trainer and hand-made run
folders (no model is built)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_complete_run_dir, assert_same_gradients, trainer_argv


def _fake_main(seen: list[list[str]], status: int = 0):
    def main(argv: list[str]) -> int:
        seen.append(argv)
        return status

    return main


def test_trainer_argv_builds_the_command_line(tmp_path):
    seen: list[list[str]] = []
    config, run_dir = tmp_path / "dpo.yaml", tmp_path / "run"
    assert _fake_main(seen)(trainer_argv(config, run_dir, ["a=1", "b.c=x"])) == 0
    assert seen[-1] == [
        "--config",
        str(config),
        "--run-dir",
        str(run_dir),
        "--set",
        "a=1",
        "--set",
        "b.c=x",
    ]
    assert _fake_main(seen, 2)(trainer_argv(config, run_dir, [], resume=True)) == 2
    assert seen[-1] == ["--config", str(config), "--run-dir", str(run_dir), "--resume"]


def _run_folder(path: Path, *, outcome: str = "succeeded", step: int = 3, rows=None) -> Path:
    path.mkdir()
    for name in ("config.yaml", "samples.jsonl"):
        (path / name).write_text("")
    rows = rows if rows is not None else [{"step": 1, "time_s": 0.1, "phase": "train"}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "progress.json").write_text(json.dumps({"step": step, "total_steps": 3}))
    (path / "summary.json").write_text(json.dumps({"outcome": outcome, "steps": 3}))
    return path


def test_complete_run_dir_accepts_a_finished_run(tmp_path):
    summary = assert_complete_run_dir(_run_folder(tmp_path / "run"))
    assert summary == {"outcome": "succeeded", "steps": 3}


@pytest.mark.parametrize(
    "damage",
    ["failed", "early", "missing_file", "extra_file", "bad_row"],
)
def test_complete_run_dir_rejects_an_unfinished_run(tmp_path, damage):
    changes = {
        "failed": {"outcome": "failed"},
        "early": {"step": 2},
        "bad_row": {"rows": [{"step": 1, "phase": "train"}]},
    }.get(damage, {})
    path = _run_folder(tmp_path / "run", **changes)
    extra = ("selection.jsonl",) if damage == "extra_file" else ()
    if damage == "missing_file":
        (path / "samples.jsonl").unlink()
    with pytest.raises(AssertionError):
        assert_complete_run_dir(path, extra_files=extra)


def test_complete_run_dir_can_skip_the_row_check(tmp_path):
    path = _run_folder(tmp_path / "run", rows=[{"step": 1}])
    assert assert_complete_run_dir(path, check_rows=False)["outcome"] == "succeeded"


def test_assert_same_gradients_tolerates_reordering_but_not_a_real_difference():
    import torch

    torch.manual_seed(0)
    want = torch.randn(1000)
    reordered = want + 1e-7 * torch.randn(1000)  # float32 sums taken in another order
    assert_same_gradients(reordered, want)
    assert_same_gradients([reordered, want], [want, want])
    one_wrong = want.clone()
    one_wrong[3] += 0.01 * want.norm()  # a single masked/shifted term
    with pytest.raises(AssertionError, match="gradients differ"):
        assert_same_gradients(one_wrong, want)
    with pytest.raises(AssertionError, match="nothing was compared"):
        assert_same_gradients(torch.zeros(3), torch.zeros(3))


def conftests_shadowing_the_root(tests_dir: Path) -> list[str]:
    """The conftest.py files below ``tests_dir`` that pytest would import as the top-level module
    ``conftest`` (their folder is not a package), so that the suite's ``from conftest import ...``
    could get them instead of tests/conftest.py, depending on which file a worker collects first."""
    return sorted(
        str(path.relative_to(tests_dir))
        for path in tests_dir.rglob("conftest.py")
        if path.parent != tests_dir and not (path.parent / "__init__.py").is_file()
    )


def test_no_conftest_shadows_the_root_one(tmp_path):
    tests_dir = Path(__file__).resolve().parent
    assert conftests_shadowing_the_root(tests_dir) == []
    # the check sees one: a conftest.py in a folder that is not a package
    (tmp_path / "conftest.py").write_text("")
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "__init__.py").write_text("")
    (tmp_path / "lab" / "conftest.py").write_text("")
    (tmp_path / "reliability").mkdir()
    (tmp_path / "reliability" / "conftest.py").write_text("")
    assert conftests_shadowing_the_root(tmp_path) == ["reliability/conftest.py"]
