"""Direct-alignment config (torch-free; the lab validates with it)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainers.core.config import (
    CheckpointSection,
    LoggingSection,
    ModelSection,
    OptimSection,
    StrictModel,
)
from trainers.direct_alignment.spec import BUILTIN_DATASET as DA_BUILTIN
from trainers.direct_alignment.spec import FAMILY as DA_FAMILY

LossName = DA_FAMILY.algorithm_literal

# Derived from the specs (trainers/direct_alignment/spec.py); kept for callers that import it.
DEFAULT_BETA: dict[str, float] = {
    a.name: a.default_beta for a in DA_FAMILY.algorithms if a.default_beta is not None
}

BUILTIN_DATASET = DA_BUILTIN  # data.py re-exports it

ONLINE = "online_dpo"
# The losses online DPO may apply to its sampled pairs: every pairwise loss of the family (KTO
# works on unpaired examples; online_dpo itself is the sampling loop, not a loss).
PAIRWISE_LOSSES: tuple[str, ...] = tuple(
    n for n in DA_FAMILY.algorithm_names if n not in ("kto", ONLINE)
)
PairwiseLoss = Literal[PAIRWISE_LOSSES]  # type: ignore[valid-type]


class DataSection(StrictModel):
    dataset: str = Field(
        default="argilla/ultrafeedback-binarized-preferences-cleaned",
        description=f"hub id, local file/folder, or {BUILTIN_DATASET} (offline)",
    )
    split: str = "train"
    format: Literal["auto", "ultrafeedback", "hh", "plain", "unpaired"] = "auto"
    max_samples: int | None = Field(default=1000, ge=2, description="shuffled, then the first N")
    eval_size: int = Field(default=100, ge=0, description="examples held out for eval/ metrics")
    max_length: int = Field(default=512, ge=8, description="prompt + response tokens")
    max_prompt_length: int | None = Field(default=None, ge=1)
    builtin_tasks: list[str] | None = Field(
        default=None, description=f"reasoning-gym tasks for {BUILTIN_DATASET} (None: defaults)"
    )
    builtin_task_configs: dict[str, dict] = Field(
        default_factory=dict,
        description="per-task reasoning-gym settings merged over trainers.core.tasks.TASK_CONFIGS",
    )


class EvalSection(StrictModel):
    eval_every: int = Field(default=25, ge=0, description="optimizer steps; 0 = only at the end")
    eval_batch_size: int = Field(default=8, ge=1)
    sample_every: int = Field(default=25, ge=0, description="optimizer steps; 0 = only at the end")
    num_samples: int = Field(default=3, ge=0, description="held-out prompts sampled per event")
    sample_max_new_tokens: int = Field(default=128, ge=1)
    sample_do_sample: bool = True
    sample_temperature: float = Field(default=0.7, gt=0)
    sample_top_p: float = Field(default=0.9, gt=0, le=1)
    gold_prompts: int = Field(
        default=0,
        ge=0,
        description=f"held-out {BUILTIN_DATASET} prompts whose greedy answers the verifier scores "
        "at each eval, with the KL to the reference (0 = off); see direct_alignment/gold.py",
    )
    gold_max_new_tokens: int = Field(default=128, ge=1, description="gold eval: tokens per answer")


class OnlineSection(StrictModel):
    """online_dpo only: how each step's completions per prompt are drawn from the current
    policy and which loss of the family is applied to the ranked pairs."""

    loss: PairwiseLoss = Field(default="dpo", description="direct-alignment loss on the pairs")
    num_samples: int = Field(
        default=2,
        ge=2,
        description="completions per prompt; the best and the worst by the ranker make the pair",
    )
    max_new_tokens: int = Field(default=64, ge=1, description="tokens sampled per completion")
    temperature: float = Field(default=0.9, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0, description="0 = off")


class RankSection(StrictModel):
    """online_dpo only: the ranker of the two completions (the reward model's score plus, when
    on, the verifier's correctness + format_weight·format). Equal scores are a tie: the pair is
    skipped and counted in ``tie_frac``."""

    model: str | None = Field(
        default=None,
        description="reward model: a reward-model run's final_model/ (preference or orm), any "
        "sequence-classification checkpoint with one label, or run:<id> (the lab resolves it)",
    )
    verifier: bool | None = Field(
        default=None,
        description=f"reasoning-gym correctness of {BUILTIN_DATASET} prompts (None: on when "
        "there is no reward model and the prompts carry an entry)",
    )
    format_weight: float = Field(default=0.5, ge=0, description="verifier: weight of the tags")
    score_batch_size: int = Field(default=16, ge=1, description="reward-model batch")


class DirectAlignmentConfig(StrictModel):
    loss: LossName = "dpo"
    beta: float | None = Field(default=None, gt=0, description="None: the loss's default")
    gamma: float = Field(default=0.5, description="SimPO target margin as the γ/β ratio")
    label_smoothing: float = Field(default=0.1, ge=0, lt=0.5, description="cDPO ε")
    lambda_d: float = Field(default=1.0, gt=0, description="KTO desirable weight")
    lambda_u: float = Field(default=1.0, gt=0, description="KTO undesirable weight")
    ipo_sum: bool = Field(default=False, description="IPO on summed log-probs (the book's form)")
    model: ModelSection = ModelSection(name="allenai/OLMo-2-0425-1B-SFT")
    data: DataSection = DataSection()
    train: OptimSection = OptimSection()
    eval: EvalSection = EvalSection()
    logging: LoggingSection = LoggingSection()
    checkpoint: CheckpointSection = CheckpointSection()
    online: OnlineSection = OnlineSection()
    reward: RankSection = RankSection()
    seed: int = 42

    @model_validator(mode="before")
    @classmethod
    def _default_beta(cls, data):
        """Fill β from the loss so config.yaml always records the value used."""
        if isinstance(data, dict) and data.get("beta") is None:
            loss = data.get("loss", DA_FAMILY.default_algorithm)
            online = data.get("online")
            if loss == ONLINE:  # β belongs to the loss applied to the sampled pairs
                loss = (online.get("loss") if isinstance(online, dict) else None) or "dpo"
            if loss in DEFAULT_BETA:
                data = {**data, "beta": DEFAULT_BETA[loss]}
        return data

    @model_validator(mode="after")
    def _check_ranker(self):
        """online_dpo needs a way to rank its two samples: a reward model or the verifier."""
        if self.loss != ONLINE:
            return self
        if self.online.max_new_tokens >= self.data.max_length:
            raise ValueError(
                f"online.max_new_tokens ({self.online.max_new_tokens}) must be smaller than "
                f"data.max_length ({self.data.max_length}), which holds prompt and completion"
            )
        builtin = self.data.dataset.startswith(BUILTIN_DATASET)
        if self.reward.verifier and not builtin:
            raise ValueError(
                f"reward.verifier=true needs prompts the reasoning-gym verifier can score "
                f"(data.dataset={BUILTIN_DATASET}); {self.data.dataset!r} has no reference "
                "answers: pass a reward model in reward.model instead"
            )
        if self.reward.model is None and not self.ranks_with_verifier:
            raise ValueError(
                "online_dpo has no way to rank its two samples per prompt: set reward.model (a "
                "reward-model run, run:<id>, or a sequence-classification checkpoint) or use "
                f"prompts the verifier scores (data.dataset={BUILTIN_DATASET}, "
                "reward.verifier=true)"
            )
        return self

    @property
    def ranks_with_verifier(self) -> bool:
        """online_dpo: whether the verifier scores the samples (see ``RankSection``)."""
        if self.reward.verifier is not None:
            return self.reward.verifier
        return self.reward.model is None and self.data.dataset.startswith(BUILTIN_DATASET)

    @property
    def pair_loss(self) -> str:
        """The loss applied to preference pairs: ``online.loss`` for online_dpo, else ``loss``."""
        return self.online.loss if self.loss == ONLINE else self.loss

    @model_validator(mode="after")
    def _check_lengths(self):
        """A prompt budget that leaves no room for the response is refused here, so the lab
        rejects it before a run starts (the trainer used to find it only after loading)."""
        d = self.data
        if d.max_prompt_length is not None and d.max_prompt_length >= d.max_length:
            raise ValueError(
                f"data.max_prompt_length ({d.max_prompt_length}) must be smaller than "
                f"data.max_length ({d.max_length}), which holds prompt and response; raise "
                "data.max_length or lower data.max_prompt_length"
            )
        return self

    @model_validator(mode="after")
    def _check_gold(self):
        """The gold evaluation scores reasoning-gym answers: built-in prompts only, and room for
        the answer within ``data.max_length``."""
        e = self.eval
        if e.gold_prompts <= 0:
            return self
        if not self.data.dataset.startswith(BUILTIN_DATASET):
            raise ValueError(
                f"eval.gold_prompts={e.gold_prompts} needs prompts the reasoning-gym verifier can "
                f"score (data.dataset={BUILTIN_DATASET}); {self.data.dataset!r} has no reference "
                "answers: set eval.gold_prompts=0"
            )
        if self.loss == ONLINE:
            raise ValueError(
                "eval.gold_prompts is for the offline losses; online_dpo already scores greedy "
                "held-out answers (eval/correctness): set eval.gold_prompts=0"
            )
        if e.gold_max_new_tokens >= self.data.max_length:
            raise ValueError(
                f"eval.gold_max_new_tokens ({e.gold_max_new_tokens}) must be smaller than "
                f"data.max_length ({self.data.max_length}), which holds prompt and answer"
            )
        return self

    @property
    def needs_reference(self) -> bool:
        """Whether the loss's spec needs a frozen reference model (online_dpo: its pair loss's)."""
        return DA_FAMILY.algorithm(self.pair_loss).needs_reference
