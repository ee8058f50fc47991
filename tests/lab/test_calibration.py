"""Difficulty calibration (rlhf_lab/planning/calibration.py): the choice rule on stubbed
pass-rate tables, the generation-limit rule, the cost cap, the cache key and cache, and plan /
shrink carrying the calibration with a stubbed probe (passed in, never patched)."""

from __future__ import annotations

import pytest

from rlhf_lab.planning.calibration import (
    MIN_PROBE_PROMPTS,
    PASS_RANGE,
    PRESET_PROBE_PROMPTS,
    Choice,
    ProbeRow,
    ProbeSettings,
    calibrate,
    choose_task,
    fit_budget,
    generation_limit,
    probe_cache_key,
    probe_settings,
    target_for,
)
from rlhf_lab.planning.calibration_apply import (
    CalibrationPolicy,
    read_calibration,
    render_table,
    shrink_calibrated,
    write_calibration,
)
from rlhf_lab.planning.candidates import CANDIDATE_SETS, as_candidate, candidates_for
from rlhf_lab.planning.overrides import as_overrides
from rlhf_lab.planning.shrink import shrink_config
from rlhf_lab.planning.trainer_config import TrainerConfig
from tests._helpers.stub_probe import RATES, StubProbe


def run_probe_settings() -> ProbeSettings:
    """What a GRPO run with the shipped defaults is probed with."""
    config = TrainerConfig("policy_gradients", {})
    return probe_settings(target_for("policy_gradients", "grpo"), "policy_gradients", config)


def row(cid: str, pass_rate: float, contrast: float, **kw) -> ProbeRow:
    return ProbeRow(id=cid, pass_rate=pass_rate, contrast=contrast, prompts=32, samples=4, **kw)


# ---- the choice rule -------------------------------------------------------------------------


def test_choice_picks_the_candidate_in_range():
    table = [row("easy", 0.9, 0.2), row("mid", 0.3, 0.6), row("hard", 0.0, 0.0)]
    choice = choose_task(table)
    assert choice.chosen == "mid"
    assert choice.in_range == ["mid"]
    assert not choice.warnings
    assert "mid" in choice.reasons[0]


def test_choice_needs_contrast_as_well_as_the_pass_rate():
    # 0.3 pass rate but every prompt's samples agree (all right or all wrong): no signal
    table = [row("flat", 0.3, 0.0), row("ok", 0.15, 0.4)]
    assert choose_task(table).chosen == "ok"


def test_choice_breaks_ties_toward_the_middle_then_more_contrast():
    mid = sum(PASS_RANGE) / 2
    near_edge = row("edge", PASS_RANGE[0] + 0.01, 0.9)
    middle = row("middle", mid, 0.3)
    assert choose_task([near_edge, middle]).chosen == "middle"
    # same distance from the middle (within the 5-point step): more contrast wins
    a, b = row("a", mid + 0.01, 0.3), row("b", mid - 0.01, 0.7)
    assert choose_task([a, b]).chosen == "b"
    assert choose_task([b, a]).chosen == "b"


def test_no_candidate_in_range_keeps_the_config_and_proposes_a_warm_start():
    table = [row("t1", 0.0, 0.0), row("t2", 0.0, 0.0)]
    choice = choose_task(table)
    assert choice.chosen is None
    (warning,) = choice.warnings
    assert "0/128" in warning and "no group contrast" in warning
    assert "every advantage is 0" in warning
    assert "SFT warm start" in warning and "r1-zero" in warning


def test_a_requested_task_out_of_range_is_kept_with_what_to_expect():
    table = [row("asked", 0.0, 0.0), row("other", 0.25, 0.5)]
    choice = choose_task(table, requested="asked")
    assert choice.chosen == "asked" and choice.requested == "asked"
    (warning,) = choice.warnings
    assert "asked (requested, kept)" in warning
    assert "pass rate 0/128 and no group contrast" in warning
    assert "try other" in warning


def test_a_requested_task_that_is_too_easy_says_so():
    choice = choose_task([row("asked", 0.95, 0.1)], requested="asked")
    assert choice.chosen == "asked"
    assert "mostly solved" in choice.warnings[0]


def test_a_model_answering_in_prose_is_named():
    table = [row("spell", 0.0, 0.0), row("sums", 0.0, 0.0, untagged_pass_rate=0.36)]
    (warning,) = choose_task(table).warnings
    assert "closest sums" in warning
    assert "it writes no <answer> tag, yet 36% of its untagged answers are right" in warning


def test_format_only_contrast_is_named():
    r = row("tags", 0.0, 0.5, correctness_contrast=0.0)
    warning = choose_task([r], requested="tags").warnings[0]
    assert "format reward only" in warning


def test_a_requested_task_in_range_has_no_warning():
    choice = choose_task([row("asked", 0.4, 0.5)], requested="asked")
    assert choice == Choice(
        chosen="asked", requested="asked", in_range=["asked"], reasons=choice.reasons
    )
    assert not choice.warnings


# ---- generation limit and cost cap -------------------------------------------------------------


@pytest.mark.parametrize(
    ("p90", "cap", "clipped", "want"),
    [
        (40, 512, 0.0, 64),  # 1.5 × 40 = 60 -> 64 (multiple of 8)
        (41, 512, 0.0, 64),  # 61.5 -> 64
        (100, 128, 0.0, 128),  # 150 capped by the recipe's 128
        (4, 512, 0.0, 16),  # at least 16
        (128, 512, 0.5, 512),  # half clipped: the p90 is the probe's cap, the recipe's kept
    ],
)
def test_generation_limit(p90, cap, clipped, want):
    assert generation_limit(p90, cap, clipped) == want


def test_fit_budget_lowers_prompts_then_drops_candidates_but_keeps_the_first():
    cands = CANDIDATE_SETS["arithmetic"] + CANDIDATE_SETS["spelling"]
    settings = run_probe_settings().model_copy(
        update={"prompts": 32, "samples": 4, "max_new_tokens": 128}
    )
    kept, s, notes = fit_budget(cands, settings, budget=4 * 16 * 4 * 128)
    assert s.prompts == MIN_PROBE_PROMPTS
    assert [c.id for c in kept] == [c.id for c in cands[:4]]
    assert any("not probed" in n for n in notes)
    small, s2, none = fit_budget(cands[:1], settings, budget=10**9)
    assert small == cands[:1] and s2 == settings and none == []


def test_a_multi_turn_run_is_probed_with_its_environment_and_costs_its_turns():
    """env.name reaches the probe (trajectories, not single completions); the cost cap counts
    each sample's turns, and the cache key tells the two probes apart."""
    target = target_for("policy_gradients", "grpo")
    tools = {
        "rollout": {"num_rollouts": 4, "max_new_tokens": 64},
        "env": {"name": "calculator", "max_turns": 3},
    }
    plain = {"rollout": {"num_rollouts": 4, "max_new_tokens": 64}}
    with_env = probe_settings(target, "policy_gradients", TrainerConfig("policy_gradients", tools))
    without = probe_settings(target, "policy_gradients", TrainerConfig("policy_gradients", plain))
    assert (with_env.environment, with_env.max_turns, with_env.turns) == ("calculator", 3, 3)
    assert without.environment is None and without.turns == 1
    cands = CANDIDATE_SETS["arithmetic"]
    budget = len(cands) * without.prompts * without.samples * without.max_new_tokens
    assert fit_budget(cands, without, budget)[2] == []
    assert fit_budget(cands, with_env, budget)[2]  # three turns a sample: over the cap
    assert probe_cache_key("fp", cands, with_env) != probe_cache_key("fp", cands, without)


# ---- cache key -------------------------------------------------------------------------------


def test_cache_key_changes_with_model_candidates_settings_and_seed():
    cands = CANDIDATE_SETS["counting"]
    s = run_probe_settings()
    base = probe_cache_key("fp1", cands, s)
    assert base == probe_cache_key("fp1", list(cands), run_probe_settings())
    assert base != probe_cache_key("fp2", cands, s)
    assert base != probe_cache_key("fp1", cands[:1], s)
    assert base != probe_cache_key(
        "fp1", cands, s.model_copy(update={"temperature": s.temperature / 2})
    )
    assert base != probe_cache_key("fp1", cands, s.model_copy(update={"seed": 7}))


# ---- candidates --------------------------------------------------------------------------------


def test_candidates_for_a_request_lead_with_it_then_its_ladder():
    asked = [{"name": "spell_backward", "config": {"min_word_len": 3, "max_word_len": 7}}]
    ids = [c.id for c in candidates_for(asked, asked)]
    assert ids[0] == "spell_backward/3-7-letters"  # matched onto the ladder's own candidate
    assert "spell_backward/3-5-letters" in ids and len(ids) == len(set(ids))
    configured = [{"name": "spell_backward", "config": {"min_word_len": 3, "max_word_len": 10}}]
    unasked = [c.id for c in candidates_for(None, configured)]
    assert unasked[0] == "spell_backward/3-10-letters"  # first: the cost cap never drops it
    assert "chain_sum/2x1-digit" in unasked and "letter_counting/1-3-words" in unasked
    odd = as_candidate([{"name": "chain_sum", "config": {"min_terms": 5}}])
    assert odd.id == "chain_sum[min_terms=5]"


# ---- calibrate() with a stubbed probe ------------------------------------------------------------


def test_a_probe_says_when_it_starts_and_a_cached_one_says_nothing(tmp_path):
    """The probe takes minutes on a real model the first time: a listener (the CLI's stderr)
    hears that it starts, with its size; an answer from the cache is silent."""
    from rlhf_lab.planning.notices import listening

    heard: list[str] = []
    policy = CalibrationPolicy(probe=StubProbe(RATES), cache_dir=tmp_path)
    with listening(heard.append):
        _, cal = shrink_calibrated(shrink_config, "grpo", [], "tiny", policy)
        shrink_calibrated(shrink_config, "grpo", [], "tiny", policy)
    assert len(heard) == 1, heard
    assert heard[0].startswith("probing tiny on ") and "to pick the run's task" in heard[0]
    assert f"{cal.settings.prompts} prompts × {cal.settings.samples} samples" in heard[0]


def test_shrink_calibrated_applies_the_choice_before_user_overrides(tmp_path):
    probe = StubProbe(RATES)
    policy = CalibrationPolicy(probe=probe, cache_dir=tmp_path)
    shrunk, cal = shrink_calibrated(shrink_config, "grpo", [], "tiny", policy)
    assert cal is not None and cal.choice.chosen == "letter_counting/1-3-words"
    specs = shrunk.config["data"]["specs"]
    assert [s["name"] for s in specs] == ["letter_counting"]
    assert shrunk.config["rollout"]["max_new_tokens"] == 64  # 1.5 × 40 = 60 -> 64 (cap 64)
    assert cal.settings.samples == 4 and cal.settings.temperature == 0.6
    assert cal.settings.prompts == PRESET_PROBE_PROMPTS  # random-init preset: a quick probe
    # an override outside the probe's settings: answered by the cache
    shrink_calibrated(
        shrink_config, "grpo", as_overrides(["train.learning_rate=0.0005"]), "tiny", policy
    )
    assert len(probe.calls) == 1
    # the user's generation limit wins (and the probe samples within it: a new probe)
    shrunk, cal = shrink_calibrated(
        shrink_config, "grpo", as_overrides(["rollout.max_new_tokens=48"]), "tiny", policy
    )
    assert shrunk.config["rollout"]["max_new_tokens"] == 48
    assert not any(o.startswith("rollout.max_new_tokens") for o in cal.overrides)
    assert cal.settings.max_new_tokens == 48 and len(probe.calls) == 2


def test_a_requested_task_is_kept_and_probed_first(tmp_path):
    probe = StubProbe({**RATES, "basic_arithmetic/2x1-digit": (0.4, 0.6, 30)})
    policy = CalibrationPolicy(probe=probe, cache_dir=None)
    asked = (
        'data.specs=[{"name": "spell_backward", "config": {"min_word_len": 3, "max_word_len": 10}}]'
    )
    shrunk, cal = shrink_calibrated(shrink_config, "grpo", as_overrides([asked]), "tiny", policy)
    assert probe.calls[0][0] == "spell_backward/3-10-letters"
    assert shrunk.config["data"]["specs"][0]["name"] == "spell_backward"
    assert cal.choice.requested == "spell_backward/3-10-letters"
    assert (
        "requested, kept" in cal.warnings[0] and "try basic_arithmetic/2x1-digit" in cal.warnings[0]
    )


def test_calibration_skips_runs_it_does_not_concern(tmp_path):
    probe = StubProbe(RATES)
    policy = CalibrationPolicy(probe=probe, cache_dir=None)
    _, cal = shrink_calibrated(shrink_config, "dpo", [], "tiny", policy)
    assert cal is None
    _, off = shrink_calibrated(
        shrink_config, "grpo", [], "tiny", CalibrationPolicy(enabled=False, probe=probe)
    )
    assert off is None and probe.calls == []
    cal = calibrate(
        "policy_gradients",
        "grpo",
        TrainerConfig(
            "policy_gradients",
            {"model": {"name": "run:<sft-run-id>"}, "data": {"specs": [{"name": "chain_sum"}]}},
        ),
        [],
        probe=probe,
        cache_dir=None,
    )
    assert cal is not None and cal.rows == [] and "not a model that exists yet" in cal.notes[0]


def test_a_failing_probe_leaves_the_run_as_configured():
    def broken(model, candidates, settings):
        raise RuntimeError("out of memory")

    shrunk, cal = shrink_calibrated(
        shrink_config, "grpo", [], "tiny", CalibrationPolicy(probe=broken, cache_dir=None)
    )
    assert cal.overrides == [] and "out of memory" in cal.warnings[0]
    assert shrunk.config["data"]["specs"][0]["name"] == "spell_backward"


def test_rejection_sampling_reads_and_writes_its_own_task_keys():
    probe = StubProbe({"chain_sum/2-3x1-2-digit": (0.0, 0.0, 30), **RATES})
    policy = CalibrationPolicy(probe=probe, cache_dir=None)
    # on tiny the shrink sets its built-in task (builtin:chain_sum): kept, as a request is
    _, cal = shrink_calibrated(shrink_config, "top_per_prompt", [], "tiny", policy)
    assert cal.settings.temperature == 0.8  # the family's generation section
    assert cal.choice.requested == "chain_sum/2-3x1-2-digit"  # the lab's easy chain_sum settings
    assert not any(o.startswith("data.dataset") for o in cal.overrides)
    # a task left to the calibration: written as builtin:<task> + its settings
    config = {
        "model": {"name": "tiny"},
        "data": {"dataset": "builtin:chain_sum", "builtin_task_configs": {}},
        "generation": {"num_completions_per_prompt": 8, "max_new_tokens": 512},
        "eval": {"eval_max_new_tokens": 512},
    }
    cal = calibrate(
        "rejection_sampling",
        "top_per_prompt",
        TrainerConfig("rejection_sampling", config),
        [],
        probe=probe,
        cache_dir=None,
    )
    assert cal.choice.chosen == "letter_counting/1-3-words"
    assert "data.dataset=builtin:letter_counting" in cal.overrides
    assert 'data.builtin_task_configs={"letter_counting": {"min_words": 1, "max_words": 3}}' in (
        cal.overrides
    )
    assert "generation.max_new_tokens=64" in cal.overrides  # 1.5 × 40 -> 64
    assert "eval.eval_max_new_tokens=64" in cal.overrides


def test_a_warm_starts_trained_task_counts_as_requested():
    from rlhf_lab.planning.calibration import TARGETS
    from rlhf_lab.planning.trainer_config import TrainerConfig

    spec = [{"name": "chain_sum", "weight": 1.0, "config": {"min_terms": 2}}]
    config = {"model": {"name": "tiny"}, "data": {"source": "reasoning_gym", "specs": spec}}
    view = TrainerConfig("policy_gradients", config)
    assert TARGETS["policy_gradients"].specs_of(view) == spec
    cal = calibrate("policy_gradients", "grpo", TrainerConfig("policy_gradients", config), as_overrides(['data.specs=[{"name": "chain_sum"}]']),
                    probe=StubProbe(RATES), cache_dir=None)  # fmt: skip
    assert cal.choice.requested == "chain_sum[min_terms=2]"
    assert not any(o.startswith("data.specs") for o in cal.overrides)


def test_calibration_round_trips_through_the_run_folder(tmp_path):
    _, cal = shrink_calibrated(
        shrink_config, "grpo", [], "tiny", CalibrationPolicy(probe=StubProbe(RATES), cache_dir=None)
    )
    write_calibration(tmp_path, cal)
    back = read_calibration(tmp_path)
    assert back == cal
    table = "\n".join(render_table(back, markdown=True))
    n = cal.settings.prompts * cal.settings.samples
    assert f"| letter_counting/1-3-words | 0.30 ({round(0.3 * n)}/{n}) | 0.50 |" in table
    assert read_calibration(tmp_path / "missing") is None


# ---- plan carries it -------------------------------------------------------------------------


def test_plan_carries_the_calibration_with_a_stubbed_probe(tmp_path):
    from rlhf_lab.planning.plan import plan_experiment

    probe = StubProbe(RATES)
    policy = CalibrationPolicy(probe=probe, cache_dir=tmp_path)
    plan = plan_experiment("grpo sanity check on tiny", calibration=policy)
    (run,) = plan.runs
    assert run.calibration is not None
    assert run.calibration.choice.chosen == "letter_counting/1-3-words"
    assert any(c.key == "data.specs" for c in run.changes)
    assert "--set data.specs" not in run.launch_command  # launch --shrink calibrates (cached)
    assert "data.specs=" in run.trainer_command
    assert any(
        "letter_counting/1-3-words" in line and "yes" in line for line in run.calibration_table
    )
    off = plan_experiment("grpo sanity check on tiny", calibrate=False, calibration=None)
    assert off.runs[0].calibration is None


# ---- launch --shrink and the ledger ------------------------------------------------------------


def test_the_ledger_shows_a_runs_calibration_under_its_setup(tmp_path):
    from rlhf_lab.ledger.blocks import RUN_PIECES
    from rlhf_lab.ledger.inspect import _calibration
    from rlhf_lab.ledger.schema import RunRecord

    assert _calibration(tmp_path) == []  # no calibration.json: nothing
    _, cal = shrink_calibrated(
        shrink_config, "grpo", [], "tiny", CalibrationPolicy(probe=StubProbe(RATES), cache_dir=None)
    )
    write_calibration(tmp_path, cal)
    lines = _calibration(tmp_path)
    record = RunRecord(run_id="grpo-1", campaign="c", calibration=lines)
    piece = RUN_PIECES["setup_changes"](record, "c")
    assert "`grpo-1` — difficulty calibration of tiny" in piece
    assert "| task/difficulty | pass rate | contrast | format | p90 length | chosen |" in piece
    assert "| letter_counting/1-3-words |" in piece and "| yes |" in piece
    plain = RUN_PIECES["setup_changes"](RunRecord(run_id="grpo-2", campaign="c"), "c")
    assert "difficulty" not in plain


def test_launch_shrink_calibrates_and_keeps_it_in_the_run_folder(tmp_path, monkeypatch):
    import yaml

    from rlhf_lab import api
    from rlhf_lab.planning.calibration_apply import using

    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    small = ["train.max_steps=1", "data.size=4", "data.eval_size=2", "rollout.num_rollouts=2"]
    with using(CalibrationPolicy(probe=StubProbe(RATES), cache_dir=None)):
        result = api.launch(
            api.RunRequest(recipe="grpo", overrides=small, model="tiny", campaign="cal", force=True)
        )
    try:
        run_dir = result.run.run_dir
        cal = read_calibration(run_dir)
        assert cal is not None and cal.choice.chosen == "letter_counting/1-3-words"
        assert cal.settings.samples == 2  # the run's group size (capped at 4)
        cfg = yaml.safe_load(open(f"{run_dir}/config.yaml"))
        assert cfg["data"]["specs"][0]["name"] == "letter_counting"
        assert cfg["train"]["max_steps"] == 1  # the user's overrides are kept
        markdown = api.show_campaign("cal").markdown
        assert "difficulty calibration of tiny" in markdown
    finally:
        api.stop_run(result.run.id)


def test_a_finished_warm_start_is_probed_through_its_final_model(tmp_path, monkeypatch):
    """``model.name=run:<id>`` of a run that kept its final model is probed there (it was called
    'not a model that exists yet' before, so GRPO from an SFT warm start was never calibrated);
    a run not finished yet still is not."""
    import json

    from tests._helpers.prepared_runs import prepared_run

    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    info = prepared_run("sft", ["model.name=tiny"], campaign="c")
    run_dir = tmp_path / "experiments" / info.campaign / "runs" / info.id
    specs = {"data": {"specs": [{"name": "chain_sum"}]}}
    probe = StubProbe(RATES)
    pending = calibrate(
        "policy_gradients", "grpo", TrainerConfig("policy_gradients", {"model": {"name": f"run:{info.id}"}, **specs}), [],
        probe=probe, cache_dir=None,
    )  # fmt: skip
    assert "not a model that exists yet" in pending.notes[0] and probe.calls == []
    final = run_dir / "final_model"
    final.mkdir(parents=True)
    (final / "config.json").write_text(json.dumps({"model_type": "llama"}))
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "state": "succeeded"}))
    seen: list[str] = []

    def probe_at(model, candidates, settings):
        seen.append(model)
        return probe(model, candidates, settings)

    cal = calibrate(
        "policy_gradients", "grpo", TrainerConfig("policy_gradients", {"model": {"name": f"run:{info.id}"}, **specs}), [],
        probe=probe_at, cache_dir=None,
    )  # fmt: skip
    assert seen == [str(final)] and cal.rows and cal.model == f"run:{info.id}"


def test_the_seeds_of_a_sweep_share_one_probe():
    """A 3-seed sweep probed three times (the run's seed was in the probe's key) and could
    choose a different task per seed; the probe now has one seed."""
    probe = StubProbe(RATES)
    cache = {}

    def cached_probe(model, candidates, settings):
        key = (model, tuple(c.id for c in candidates), settings.model_dump_json())
        if key not in cache:
            cache[key] = probe(model, candidates, settings)
        return cache[key]

    for seed in (42, 43, 44):
        shrink_calibrated(
            shrink_config, "grpo", as_overrides([f"seed={seed}"]), "tiny",
            CalibrationPolicy(probe=cached_probe, cache_dir=None),
        )  # fmt: skip
    assert len(probe.calls) == 1
