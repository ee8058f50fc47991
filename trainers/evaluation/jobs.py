"""One evaluation job and what a suite returns: :class:`Job` (the config, the resolved models,
the run folder's progress, the interval estimates, sampling a model) and :class:`SuiteResult`;
:func:`reasoning_check` is the verifier's verdict on a reasoning-gym answer (the reasoning and
best_of_n suites)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainers.core.rundir import RunDir
from trainers.evaluation import statistics as st
from trainers.evaluation.config import EvalConfig
from trainers.evaluation.prompts import EvalPrompt
from trainers.evaluation.sampling import load_policy, release_memory, sample
from trainers.evaluation.targets import ModelRef


@dataclass
class SuiteResult:
    metrics: dict[str, st.Estimate]
    baseline_metrics: dict[str, st.Estimate] = field(default_factory=dict)
    difference: dict[str, st.Estimate] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)
    items: list[dict] = field(default_factory=list)
    prompt_set: str | None = None


class Job:
    """One evaluation: the config, the resolved models and the run folder's progress."""

    def __init__(
        self,
        cfg: EvalConfig,
        run: RunDir,
        target: ModelRef,
        baseline: ModelRef | None,
        judge: str | None,
    ) -> None:
        self.cfg, self.run = cfg, run
        self.target, self.baseline, self.judge = target, baseline, judge
        self.step, self.total = 0, 0
        self.phase = "loading_model"
        self.fingerprints: dict[str, str] = {}  # role -> model_fingerprint (set by the job)

    # progress ---------------------------------------------------------------------------------
    def plan(self, units: int) -> None:
        """Add ``units`` (generation or scoring batches) to the planned total."""
        self.total += units
        self.show()

    def enter(self, phase: str, stage: str) -> None:
        print(f"{phase}: {stage}", flush=True)
        self.phase = phase
        self.stage = stage
        self.show()

    def advance(self) -> None:
        self.step = min(self.step + 1, self.total)
        self.show()

    def show(self) -> None:
        self.run.write_progress(
            self.step, self.total or None, phase=self.phase, stage=getattr(self, "stage", None)
        )

    # statistics -------------------------------------------------------------------------------
    def mean(self, values: Sequence[float]) -> st.Estimate:
        b = self.cfg.bootstrap
        return st.mean_estimate(values, resamples=b.resamples, level=b.level, seed=self.cfg.seed)

    def share(self, values: Sequence[float]) -> st.Estimate:
        """A proportion (per-prompt shares of 0/1 outcomes): Wilson when every value is 0 or 1,
        else the prompt bootstrap (:func:`statistics.proportion_estimate`)."""
        b = self.cfg.bootstrap
        return st.proportion_estimate(
            values, resamples=b.resamples, level=b.level, seed=self.cfg.seed
        )

    def of(self, items: Sequence[Any], statistic: Callable[[Sequence[Any]], Any]) -> st.Estimate:
        b = self.cfg.bootstrap
        return st.bootstrap(
            items, statistic, resamples=b.resamples, level=b.level, seed=self.cfg.seed
        )

    # models -----------------------------------------------------------------------------------
    def models(self) -> list[tuple[str, ModelRef]]:
        out = [("target", self.target)]
        if self.baseline is not None:
            out.append(("baseline", self.baseline))
        return out

    def batches(self, n_prompts: int) -> int:
        return -(-n_prompts // self.cfg.sampling.batch_size)

    def sample_with(self, role: str, ref: ModelRef, prompts: list[EvalPrompt], extra=None):
        """Load ``ref``, sample the prompts, run ``extra(model, tokenizer, samples)`` while the
        model is loaded, release it. Returns (samples, extra's result)."""
        self.enter("loading_model", f"{role} {ref.model}")
        model, tokenizer = load_policy(ref.model, self.cfg)
        self.enter("generating", f"{role}: {len(prompts)} prompts x {self.cfg.sampling.n}")
        samples = sample(
            model,
            tokenizer,
            [p.messages for p in prompts],
            self.cfg.sampling,
            self.cfg.seed,
            self.advance,
        )
        more = extra(model, tokenizer, samples) if extra is not None else None
        del model
        release_memory()
        return samples, more


def reasoning_check(text: str, prompt: EvalPrompt) -> tuple[float, bool, bool]:
    """(score, correct, format) of a reasoning-gym response."""
    from trainers.core.tasks import score_response
    from trainers.core.verifier import has_tag_format

    score = score_response(text, prompt.meta)
    return score, score >= 1.0 - 1e-9, has_tag_format(text)
