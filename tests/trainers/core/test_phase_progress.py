"""Long phases report a count (issue #25, item 7): progress.json carries the trainer's start
time and, within a long phase, ``phase_done`` / ``phase_total`` written at a bounded rate."""

from __future__ import annotations

import json

from trainers.core.rundir import RunDir, phase_progress, set_active_run
from trainers.core.runfolder import ProgressFile


def progress(run: RunDir) -> dict:
    return json.loads((run.path / "progress.json").read_text())


def test_a_long_phase_writes_its_count_at_a_bounded_rate(tmp_path):
    ticks = iter([1000.0 + i for i in range(100)])  # one second per reading of the clock
    run = RunDir(tmp_path / "r", clock=lambda: next(ticks), count_every_s=10.0)
    run.update_phase("reference_logprobs", 40)
    first = progress(run)
    assert first["started_at"] == 1000.0 and first["phase"] == "reference_logprobs"
    assert "phase_done" not in first
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


def test_phase_progress_outside_a_run_does_nothing(tmp_path):
    run = RunDir(tmp_path / "r")
    set_active_run(None)
    phase_progress(1, 2)  # no run folder: nothing to write, no error
    assert not (run.path / "progress.json").exists()


class CountingRunDir(RunDir):
    """A run folder that keeps every count offered to it (before the rate bound)."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.offered: list[tuple[int, int]] = []

    def phase_count(self, done: int, total: int) -> None:
        self.offered.append((done, total))
        super().phase_count(done, total)


def test_reference_logprobs_of_a_real_dpo_run_report_their_count(tmp_path):
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
    run = CountingRunDir(tmp_path / "run")  # the process's run folder from now on
    da_pairs.compute_reference_logps(
        model, examples, tokenizer.pad_token_id, torch.device("cpu"), 4, with_kl=False
    )
    assert run.offered == [(4, 12), (8, 12), (12, 12)]
