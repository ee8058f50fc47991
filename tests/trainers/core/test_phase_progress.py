"""Long phases report a count (issue #25, item 7): progress.json carries the trainer's start
time and, within a long phase, ``phase_done`` / ``phase_total`` written at a bounded rate."""

from __future__ import annotations

import json

from trainers.core import rundir
from trainers.core.rundir import RunDir, phase_progress
from trainers.core.runfolder import ProgressFile


def progress(run: RunDir) -> dict:
    return json.loads((run.path / "progress.json").read_text())


def test_a_long_phase_writes_its_count_at_a_bounded_rate(tmp_path, monkeypatch):
    clock = iter([1000.0 + i for i in range(100)])  # one second per time.time() call
    monkeypatch.setattr(rundir.time, "time", lambda: next(clock))
    run = RunDir(tmp_path / "r")
    run.update_phase("reference_logprobs", 40)
    first = progress(run)
    assert first["started_at"] == 1000.0 and first["phase"] == "reference_logprobs"
    assert "phase_done" not in first
    monkeypatch.setattr(rundir, "PHASE_COUNT_EVERY_S", 10.0)
    phase_progress(8, 640)  # through the process's run folder
    shown = progress(run)
    assert (shown["phase_done"], shown["phase_total"]) == (8, 640)
    assert shown["total_steps"] == 40 and shown["phase"] == "reference_logprobs"
    phase_progress(16, 640)  # within the interval: not written
    assert progress(run)["phase_done"] == 8
    phase_progress(640, 640)  # the last item always is
    assert progress(run)["phase_done"] == 640
    ProgressFile.model_validate(progress(run))
    # the next phase starts without the previous phase's count, with its own start time
    run.update_phase("training", 40)
    nxt = progress(run)
    assert "phase_done" not in nxt and nxt["phase_started_at"] > first["phase_started_at"]
    assert nxt["started_at"] == 1000.0


def test_phase_progress_outside_a_run_does_nothing(monkeypatch):
    monkeypatch.setattr(rundir, "_ACTIVE", None)
    phase_progress(1, 2)  # no run folder: nothing to write, no error


def test_reference_logprobs_of_a_real_dpo_run_report_their_count(tmp_path, monkeypatch):
    """The direct-alignment reference loop on tiny reports 4/12, 8/12, 12/12 through
    phase_progress (every batch offered; the rate bound is RunDir's)."""
    import torch

    from tests.trainers.core.test_lora import DPO_QUICK, config_path
    from trainers.core.config import load_config
    from trainers.core.models import load_causal_lm, load_tokenizer
    from trainers.direct_alignment import pairs as da_pairs
    from trainers.direct_alignment.config import DirectAlignmentConfig

    cfg = load_config(config_path("direct_alignment", "dpo"), DirectAlignmentConfig, DPO_QUICK)
    tokenizer = load_tokenizer("tiny")
    examples = da_pairs.prepare_examples(cfg, tokenizer)[0][:12]
    model = load_causal_lm("tiny", device="cpu", dtype="fp32", trainable=False)
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(da_pairs, "phase_progress", lambda d, t: seen.append((d, t)))
    da_pairs.compute_reference_logps(
        model, examples, tokenizer.pad_token_id, torch.device("cpu"), 4, with_kl=False
    )
    assert seen == [(4, 12), (8, 12), (12, 12)]
