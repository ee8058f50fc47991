"""The difficulty probe (trainers/policy_gradients/probe.py): its figures from scored samples,
its input checks, and a real run on the tiny preset through its command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainers.policy_gradients.probe import (
    ProbeSettings,
    group_contrast,
    main,
    parse_candidates,
    percentile,
    probe_prompts,
    summarise,
    untagged_score,
)

CHAIN = {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                          "max_digits": 1}}  # fmt: skip


def test_percentile_is_the_nearest_rank():
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile(list(range(1, 11)), 90) == 9
    assert percentile([7], 90) == 7
    assert percentile([], 90) == 0


def test_group_contrast_counts_groups_whose_rewards_differ():
    assert group_contrast([0, 0, 1, 1, 0, 1], 2) == pytest.approx(1 / 3)
    assert group_contrast([0.5] * 8, 4) == 0.0


def test_summarise_from_scored_samples():
    settings = ProbeSettings(samples=2)
    scored = {
        "correctness": [1.0, 0.0, 0.0, 0.0],
        "format": [1.0, 0.25, 0.0, 0.0],
        "total": [1.5, 0.125, 0.0, 0.0],
        "answer_tag": [True, False, False, False],
        "untagged": [0.0, 1.0, 0.0, 0.0],
        "length": [10, 20, 30, 40],
        "truncated": [False, False, False, True],
        "text": ["<answer>3</answer>", "3", "x", "y"],
    }
    r = summarise("c", [CHAIN], scored, settings)
    assert (r.prompts, r.samples) == (2, 2)
    assert r.pass_rate == 0.25  # correctness > 0
    assert r.reward_positive_rate == 0.5  # one tag is enough for a total reward > 0
    assert r.contrast == 0.5 and r.correctness_contrast == 0.5
    assert r.format_rate == 0.25 and r.answer_tag_rate == 0.25
    assert r.untagged_pass_rate == 0.25
    assert (r.length_p50, r.length_p90, r.length_max, r.clipped) == (20, 40, 40, 0.25)
    assert r.example == "<answer>3</answer>"


def test_untagged_score_reads_the_last_number_of_a_prose_answer():
    prompt = probe_prompts([CHAIN], 1, 0)[0]
    right = prompt.answer
    assert untagged_score(f"The answer is {right}.", prompt.meta) == 1.0
    assert untagged_score(f"<answer>{right}</answer>", prompt.meta) == 0.0  # tagged: not prose
    assert untagged_score("no number here", prompt.meta) == 0.0


def test_probe_prompts_are_the_loaders_prompts_from_their_own_seed():
    a = probe_prompts([CHAIN], 4, 42)
    assert a == probe_prompts([CHAIN], 4, 42)
    assert [p.question for p in a] != [p.question for p in probe_prompts([CHAIN], 4, 43)]
    assert a[0].messages[0]["role"] == "system" and a[0].meta["task"] == "chain_sum"


def test_parse_candidates_accepts_bare_specs_and_names_problems():
    (one,) = parse_candidates(json.dumps(CHAIN))
    assert one["id"] == "chain_sum" and one["specs"][0]["config"]["max_digits"] == 1
    two = parse_candidates(json.dumps([{"id": "x", "specs": [CHAIN]}, {"name": "spell_backward"}]))
    assert [c["id"] for c in two] == ["x", "spell_backward"]
    for bad in ("[]", '[{"specs": []}]', '[{"config": {}}]', "[3]"):
        with pytest.raises(ValueError):
            parse_candidates(bad)


def test_bad_input_exits_2_before_loading_anything(capsys):
    assert main(["--model", "tiny", "--candidates", "[]"]) == 2
    assert main(["--model", "tiny", "--candidates", json.dumps(CHAIN), "--samples", "0"]) == 2
    assert "error:" in capsys.readouterr().err


def test_probe_runs_on_tiny_through_its_command_line():
    cands = [{"id": "chain_sum/easy", "specs": [CHAIN]}, {"name": "letter_counting"}]
    argv = [sys.executable, "-m", "trainers.policy_gradients.probe", "--model", "tiny",
            "--candidates", json.dumps(cands), "--prompts", "4", "--samples", "2",
            "--max-new-tokens", "8", "--threads", "1", "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["fingerprint"] and report["settings"]["samples"] == 2
    rows = report["candidates"]
    assert [r["id"] for r in rows] == ["chain_sum/easy", "letter_counting"]
    for r in rows:
        assert (r["prompts"], r["samples"]) == (4, 2)
        assert 0.0 <= r["pass_rate"] <= 1.0 and 0.0 <= r["contrast"] <= 1.0
        assert 1 <= r["length_p50"] <= r["length_p90"] <= r["length_max"] <= 8
        assert r["seconds"] >= 0


def test_a_multi_turn_probe_samples_trajectories_with_the_environment(capsys):
    """``--environment``: the samples are trajectories (the tiny model never calls the tool, so
    its call rate is 0, a figure the single-turn probe does not have); a bad name exits 2."""
    assert (
        main(["--model", "tiny", "--candidates", json.dumps(CHAIN), "--environment", "abacus"]) == 2
    )
    assert "'abacus' is not one of: calculator" in capsys.readouterr().err
    argv = ["--model", "tiny", "--candidates", json.dumps(CHAIN), "--prompts", "2", "--samples", "2",
            "--max-new-tokens", "6", "--environment", "calculator", "--max-turns", "2", "--json"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (row,) = report["candidates"]
    assert report["settings"]["environment"] == "calculator"
    assert row["tool_call_rate"] == 0.0 and row["length_max"] <= 6
