"""Evaluation config (torch-free; the lab validates with it).

One config model for every suite; ``suite`` picks what is measured, the other sections say how.
The shipped recipes are ``trainers/evaluation/configs/<suite>.yaml``; the job runs as

    python -m trainers.evaluation.run --config trainers/evaluation/configs/reasoning.yaml \
        --run-dir DIR --set target=RUN_OR_MODEL [--set baseline=MODEL] [--set k=v ...]

``target`` / ``baseline`` take a run folder (its ``final_model/`` is evaluated and its config
tells the starting model, the tasks and the held-out data), a ``final_model`` folder, or any
model name the trainers resolve (preset, local folder, ``.gguf``, hub id). ``baseline: auto``
is the target run's starting model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainers.core.config import StrictModel

SUITES: tuple[str, ...] = (
    "reasoning",
    "math",
    "winrate",
    "generation",
    "pair_accuracy",
    "best_of_n",
)
Suite = Literal["reasoning", "math", "winrate", "generation", "pair_accuracy", "best_of_n"]

AUTO = "auto"
"""``baseline: auto``: the starting model of the target run (its ``model.name``)."""

BUILTIN_ARITHMETIC = "builtin:arithmetic"
"""The offline GSM8K-schema arithmetic set of the ``math`` suite."""

HEADLINES: dict[str, str] = {
    "reasoning": "accuracy",
    "math": "accuracy",
    "winrate": "win_rate",
    "generation": "kl_to_baseline",
    "pair_accuracy": "pair_accuracy",
    "best_of_n": "prm_minus_orm",
}
"""Each suite's headline metric (a key of ``eval.json``'s ``metrics``)."""


class SamplingSection(StrictModel):
    n: int = Field(default=1, ge=1, description="samples per prompt")
    temperature: float = Field(default=0.7, ge=0, description="0 = greedy (then n must be 1)")
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0, description="0 = off")
    min_p: float = Field(default=0.0, ge=0, lt=1, description="0 = off")
    max_new_tokens: int = Field(default=128, ge=1)
    batch_size: int = Field(default=16, ge=1, description="prompts per generate call")
    max_prompt_tokens: int | None = Field(
        default=None, ge=1, description="a longer prompt keeps its last tokens (None: all)"
    )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class PromptsSection(StrictModel):
    source: Literal["auto", "reasoning_gym", "preference"] = Field(
        default="auto",
        description="auto: a direct-alignment or reward-model target run's held-out preference "
        "prompts, else reasoning-gym questions",
    )
    size: int = Field(default=64, ge=1, description="held-out prompts")
    tasks: list[str] = Field(
        default_factory=list,
        description="reasoning-gym tasks (empty: the target run's own tasks; for winrate and "
        "generation without a run, the built-in default tasks)",
    )
    task_configs: dict[str, dict] = Field(
        default_factory=dict,
        description="per-task reasoning-gym settings (over the run's own, else "
        "trainers.core.tasks.TASK_CONFIGS)",
    )
    dataset: str | None = Field(
        default=None,
        description="preference prompts: hub id, local file or builtin:reasoning-preferences "
        "(None: the target run's held-out split)",
    )
    split: str = Field(default="test", description="split of `dataset`")
    exclude_training: bool = Field(
        default=True,
        description="drop questions that occur in the target run's training data (when it can "
        "be regenerated here: the built-in sets)",
    )


class ReasoningSection(StrictModel):
    pass_k: list[int] = Field(
        default_factory=lambda: [1], description="k of pass@k (each <= sampling.n)"
    )


class MathSection(StrictModel):
    dataset: str = Field(
        default=BUILTIN_ARITHMETIC,
        description="openai/gsm8k (hub), a local GSM8K-schema file (question, answer ending "
        f"'#### <number>'), or {BUILTIN_ARITHMETIC} (offline)",
    )
    subset: str | None = Field(default="main", description="hub dataset configuration")
    split: str = "test"
    system_prompt: str | None = Field(
        default=None, description="None: the <think>/<answer> tag-format prompt of the trainers"
    )


class WinrateSection(StrictModel):
    length_buckets: int = Field(default=4, ge=1, description="buckets of |length difference|")
    tie_margin: float = Field(
        default=0.0, ge=0, description="judge scores this close are a tie (identical texts always)"
    )
    judge_batch_size: int = Field(default=8, ge=1)


class GenerationSection(StrictModel):
    distinct: list[int] = Field(default_factory=lambda: [1, 2], description="n of distinct-n")
    repetition_n: int = Field(default=4, ge=1, description="n-gram size of the repetition rate")
    kl: bool = Field(default=True, description="KL to the baseline (needs the same tokenizer)")
    logprob_batch_size: int = Field(default=8, ge=1)


class BestOfNSection(StrictModel):
    orm: str | None = Field(default=None, description="an orm reward-model run or final_model")
    prm: str | None = Field(default=None, description="a prm reward-model run or final_model")
    prm_aggregate: Literal["product", "min"] = Field(
        default="product",
        description="a solution's PRM score from its steps' P(not bad): product (Lightman et "
        "al. 2023) or min",
    )
    samples_from: str | None = Field(
        default=None,
        description="an earlier best_of_n job's folder: score its completions instead of "
        "sampling again (same policy, n_max and prompts)",
    )
    score_batch_size: int = Field(default=16, ge=1, description="sequences per scoring pass")
    majority_draws: int = Field(
        default=2000, ge=100, description="random subsets per n where enumerating is too long"
    )


class BootstrapSection(StrictModel):
    resamples: int = Field(default=1000, ge=100)
    level: float = Field(default=0.95, gt=0, lt=1)


class EvalConfig(StrictModel):
    suite: Suite = "reasoning"
    target: str | None = Field(default=None, description="run folder, final_model or model name")
    baseline: str | None = Field(
        default=None, description="model to compare with; auto: the target run's starting model"
    )
    judge: str | None = Field(
        default=None, description="winrate: a reward-model folder (preference or orm)"
    )
    cache_dir: str | None = Field(
        default=None,
        description="reuse per-model results (reasoning, math) from this folder; None: off",
    )
    seed: int = 0
    device: Literal["auto", "cuda", "cpu"] = "auto"
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = "auto"
    sampling: SamplingSection = SamplingSection()
    prompts: PromptsSection = PromptsSection()
    reasoning: ReasoningSection = ReasoningSection()
    math: MathSection = MathSection()
    winrate: WinrateSection = WinrateSection()
    generation: GenerationSection = GenerationSection()
    best_of_n: BestOfNSection = BestOfNSection()
    bootstrap: BootstrapSection = BootstrapSection()

    @model_validator(mode="after")
    def _check(self):
        s = self.sampling
        if s.greedy and s.n != 1:
            raise ValueError(
                f"sampling.temperature=0 is greedy decoding: every sample would be the same; "
                f"use sampling.n=1 (got {s.n}) or a temperature > 0"
            )
        if self.suite == "reasoning":
            bad = [k for k in self.reasoning.pass_k if not 1 <= k <= s.n]
            if bad:
                raise ValueError(
                    f"reasoning.pass_k {bad}: each k must be between 1 and sampling.n ({s.n}); "
                    "raise sampling.n to estimate pass@k for larger k"
                )
        if self.suite == "winrate" and (self.baseline is None or self.judge is None):
            raise ValueError(
                "the winrate suite needs a baseline (a model, or auto for the target run's "
                "starting model) and a judge (a reward-model folder)"
            )
        if self.suite == "generation" and self.generation.kl and self.baseline is None:
            raise ValueError(
                "generation.kl needs a baseline (a model, or auto); set generation.kl=false to "
                "measure the target alone"
            )
        if self.suite == "best_of_n":
            self._check_best_of_n()
        if any(n < 1 for n in self.generation.distinct):
            raise ValueError("generation.distinct: each n must be >= 1")
        return self

    def _check_best_of_n(self) -> None:
        missing = [k for k in ("orm", "prm") if not getattr(self.best_of_n, k)]
        if missing:
            raise ValueError(
                f"the best_of_n suite compares an ORM and a PRM: name best_of_n.{missing[0]} "
                "(a reward-model run folder or its final_model/)"
            )
        if self.baseline is not None:
            raise ValueError(
                "the best_of_n suite compares selectors on the target's own samples: it takes "
                "no baseline"
            )
        if self.sampling.n < 2:
            raise ValueError(
                f"best_of_n draws sampling.n samples per prompt (n_max) and selects among "
                f"subsets of them: sampling.n must be at least 2 (got {self.sampling.n})"
            )

    @property
    def headline(self) -> str:
        return HEADLINES[self.suite]
