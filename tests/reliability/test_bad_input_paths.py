"""Bad input, paths: path-like slugs and run ids are refused by the paths checks, the api and
the CLI, and nothing is written.

The shared helpers and the fixtures are in _bad_input.py.
"""

from __future__ import annotations

import pytest
from _bad_input import (  # noqa: F401  (lab_root, no_trainer: fixtures)
    FINISHED,
    QUICK,
    assert_one_clear_message,
    lab_root,
    lab_tree,
    no_trainer,
    runner,
)

from rlhf_lab import api, paths
from rlhf_lab.cli import app
from rlhf_lab.paths import LabError

pytestmark = pytest.mark.usefixtures("lab_root")


# ---------------------------------------------------------------------------------------------
# Path-like slugs and run ids at every entry point
# ---------------------------------------------------------------------------------------------

BAD_SLUGS = [
    "..",
    "../evil",
    "a/b",
    "/abs",
    "/tmp/evil",
    "a\x00b",
    "\x00",
    "x" * 81,
    "x" * 5000,
    "café",
    "ß",
    "１２３",  # fullwidth digits
    "",
    " ",
    "\t",
    "slug\n",
    "simpo gamma",
    "Upper",
    "a_b",
    "-a",
    "a-",
    "a--b",
    "a.b",
    "~",
    "$HOME",
]
BAD_RUN_IDS = ["..", "../x", "a/b", "/etc/passwd", "a/../b", "x\x00", "\x00", "x" * 121]
BAD_RUN_IDS += ["x" * 5000, "", " ", "dpo-1\n", "Dpo-1", ".hidden", "*", "run/", "dpo_1", "ü"]
BAD_RUN_IDS += ["dpo--1", "-dpo", "１２３"]


@pytest.mark.parametrize("slug", BAD_SLUGS, ids=repr)
def test_bad_slugs_are_refused_by_every_entry_point(lab_root, no_trainer, slug):
    before = lab_tree(lab_root)
    with pytest.raises(LabError, match="bad campaign slug"):
        paths.check_slug(slug)
    calls = {
        "create_campaign": lambda: api.create_campaign(slug, "q?"),
        "launch": lambda: api.launch(
            api.RunRequest(recipe="dpo", overrides=QUICK, model="tiny", campaign=slug)
        ),
        "sweep": lambda: api.sweep(
            api.SweepRequest(recipes=["dpo", "ipo"], overrides=QUICK, model="tiny", campaign=slug)
        ),
        "plan_experiment": lambda: api.plan_experiment(algorithm="dpo", campaign=slug),
        "show_campaign": lambda: api.show_campaign(slug),
        "list_runs": lambda: api.list_runs(campaign=slug),
        "compare_runs": lambda: api.compare_runs([FINISHED], record_in=slug),
    }
    for name, fn in calls.items():
        with pytest.raises(LabError, match="bad campaign slug") as err:
            fn()
        assert_one_clear_message(str(err.value))
        assert len(str(err.value)) < 400, name  # a 5000-character slug is not echoed whole
    commands = [  # the slug last, after "--" where it is an argument: "-a" is no option then
        ["campaign", "new", "--question", "q?", "--", slug],
        ["campaign", "show", "--", slug],
        ["launch", "dpo", "--model", "tiny", "--campaign", slug],
        ["sweep", "dpo,ipo", "--model", "tiny", "--campaign", slug],
        ["plan", "dpo sanity", "--campaign", slug],
        ["runs", "--campaign", slug],
    ]
    for argv in commands:
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        assert result.output.count("error: bad campaign slug") == 1, (argv, result.output)
        assert_one_clear_message(result.output)
    assert lab_tree(lab_root) == before


@pytest.mark.parametrize("run_id", BAD_RUN_IDS, ids=repr)
def test_bad_run_ids_are_refused_by_every_entry_point(lab_root, no_trainer, run_id):
    api.create_campaign("ids", "Are path-like run ids refused?")
    before = lab_tree(lab_root)
    with pytest.raises(LabError, match="bad run id"):
        paths.check_run_id(run_id)
    calls = {
        "run_status": lambda: api.run_status(run_id),
        "record_run": lambda: api.record_run(run_id, "note"),
        "resume_run": lambda: api.resume_run(run_id),
        "stop_run": lambda: api.stop_run(run_id, grace_s=0),
        "tail_log": lambda: api.tail_log(run_id),
        "read_metrics": lambda: api.read_metrics(run_id),
        "compare_runs": lambda: api.compare_runs([run_id]),
    }
    for name, fn in calls.items():
        with pytest.raises(LabError, match="bad run id") as err:
            fn()
        assert_one_clear_message(str(err.value))
        assert len(str(err.value)) < 400, name  # a 5000-character id is not echoed whole
    for argv in (["status"], ["tail"], ["metrics"], ["stop"], ["resume"], ["record"], ["compare"]):
        result = runner.invoke(app, [*argv, "--", run_id])
        assert result.exit_code == 2, (argv, result.output)
        assert result.output.count("error: bad run id") == 1, (argv, result.output)
        assert_one_clear_message(result.output)
    assert lab_tree(lab_root) == before
