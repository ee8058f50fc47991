"""Policy-gradient config (torch-free; the lab validates with it).

One config model serves all ten algorithms; ``algorithm`` picks the advantage estimator, the
per-token loss, where the KL term goes and the default loss aggregation, as the algorithm's spec
in ``spec.py`` declares them (docs/algorithms.md, "Policy gradients"). Fields left at ``None`` mean "the algorithm's default" and are filled in at
validation time, so the run directory's ``config.yaml`` always records the values used.

Units: ``train.max_steps`` counts *rollout steps* (sample prompts -> generate -> score -> update);
one rollout step holds ``prompts_per_step × num_rollouts`` sequences, split into micro-batches of
``train.batch_size`` sequences, with an optimizer step every ``gradient_accumulation_steps``
micro-batches (and on the last one), repeated ``loss.updates_per_rollout`` times.
"""

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
from trainers.core.spec import AlgorithmSpec
from trainers.policy_gradients.spec import FAMILY as PG_FAMILY

ALGORITHMS: tuple[str, ...] = PG_FAMILY.algorithm_names
Algorithm = Literal[ALGORITHMS]  # type: ignore[valid-type]  # the spec's names

LossAgg = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]

# What each algorithm needs (groups, KL placement, ratio, defaults) is declared once in
# trainers/policy_gradients/spec.py: read it through ``algorithm_spec(name)`` or ``cfg.spec``.


def algorithm_spec(algorithm: str) -> AlgorithmSpec:
    """The spec of a policy-gradient algorithm (KeyError for a name the family lacks)."""
    return PG_FAMILY.algorithm(algorithm)


class DatasetSpecSection(StrictModel):
    name: str = Field(min_length=1, description="reasoning-gym task, e.g. spell_backward")
    weight: float = Field(default=1.0, gt=0)
    config: dict = Field(default_factory=dict, description="the task's reasoning-gym settings")


class DataSection(StrictModel):
    specs: list[DatasetSpecSection] = Field(
        default_factory=lambda: [
            DatasetSpecSection(
                name="spell_backward", config={"min_word_len": 3, "max_word_len": 10}
            )
        ],
        min_length=1,
        description="reasoning-gym `composite` of these tasks",
    )
    size: int = Field(default=3000, ge=1, description="training prompts (one epoch)")
    eval_size: int = Field(
        default=64, ge=0, description="held-out prompts for the greedy eval/ metrics"
    )


class RolloutSection(StrictModel):
    prompts_per_step: int = Field(default=4, ge=1)
    num_rollouts: int = Field(default=8, ge=1, description="completions per prompt (G)")
    max_new_tokens: int = Field(default=512, ge=1)
    temperature: float = Field(default=0.6, gt=0)
    top_p: float = Field(default=0.95, gt=0, le=1)
    top_k: int = Field(default=20, ge=0, description="0 = off")
    min_p: float = Field(default=0.0, ge=0, lt=1, description="0 = off")
    generation_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="sequences per generate call, rounded to whole prompt groups "
        "(None: the whole step in one call)",
    )


class PGOptimSection(OptimSection):
    """The shared optimizer section with the book's policy-gradient defaults. ``max_steps`` and
    ``num_epochs`` count rollout steps and passes over ``data.size`` prompts."""

    learning_rate: float = Field(default=5e-6, gt=0)
    batch_size: int = Field(default=2, ge=1, description="micro-batch (sequences)")
    gradient_accumulation_steps: int = Field(default=4, ge=1)
    max_steps: int | None = Field(
        default=None,
        ge=1,
        description="rollout steps (None: num_epochs × data.size // prompts_per_step)",
    )
    schedule: Literal["linear", "constant"] = "constant"
    warmup_ratio: float = Field(default=0.0, ge=0, lt=1)


class LossSection(StrictModel):
    loss_agg: LossAgg | None = Field(default=None, description="None: the algorithm's default")
    beta: float = Field(default=0.0, ge=0, description="KL coefficient (0: no reference model)")
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    clip_eps_lo: float | None = Field(default=None, ge=0, le=1, description="None: default")
    clip_eps_hi: float | None = Field(default=None, ge=0, description="None: default")
    updates_per_rollout: int = Field(
        default=1, ge=1, description="passes over each rollout batch (PPO epochs)"
    )
    sapo_tau_pos: float = Field(default=1.0, gt=0)
    sapo_tau_neg: float = Field(default=1.05, gt=0)
    # PPO
    gamma: float = Field(default=1.0, ge=0, le=1)
    lam: float = Field(default=0.98, ge=0, le=1)
    vf_coef: float = Field(default=0.5, ge=0)
    clip_eps_val: float = Field(default=0.4, gt=0)
    # DAPO
    l_max: int = Field(default=512, ge=1, description="overlong penalty: hard limit (tokens)")
    l_cache: int = Field(default=128, ge=1, description="overlong penalty: soft band (tokens)")
    max_draw_factor: int = Field(
        default=8,
        ge=1,
        description="dynamic sampling gives up after drawing this many × prompts_per_step "
        "prompts in one rollout step",
    )
    accuracy_min_reward: float = 0.0
    accuracy_max_reward: float = 1.0


class RewardSection(StrictModel):
    format_weight: float = Field(default=0.5, ge=0)


class EvalSection(StrictModel):
    eval_every: int = Field(
        default=25, ge=0, description="rollout steps between greedy held-out evals; 0 = end only"
    )
    eval_batch_size: int = Field(default=32, ge=1, description="prompts per generate call")
    max_new_tokens: int | None = Field(
        default=None, ge=1, description="None: rollout.max_new_tokens"
    )
    sample_every: int = Field(
        default=1, ge=0, description="rollout steps between samples.jsonl rows; 0 = none"
    )
    num_samples: int = Field(default=2, ge=0, description="rollouts written per sample event")


class PolicyGradientConfig(StrictModel):
    algorithm: Algorithm = "grpo"
    model: ModelSection = ModelSection(name="Qwen/Qwen3-1.7B", gradient_checkpointing=True)
    data: DataSection = DataSection()
    rollout: RolloutSection = RolloutSection()
    train: PGOptimSection = PGOptimSection()
    loss: LossSection = LossSection()
    reward: RewardSection = RewardSection()
    eval: EvalSection = EvalSection()
    logging: LoggingSection = LoggingSection()
    checkpoint: CheckpointSection = CheckpointSection(save_final_model=True)
    seed: int = 42

    @model_validator(mode="before")
    @classmethod
    def _algorithm_defaults(cls, data):
        """Fill loss_agg and the clip range from the algorithm so config.yaml records them."""
        if not isinstance(data, dict):
            return data
        algorithm = data.get("algorithm", PG_FAMILY.default_algorithm)
        loss = data.get("loss")
        if loss is None:
            loss = {}
        if not isinstance(loss, dict) or algorithm not in PG_FAMILY.algorithm_names:
            return data  # field validation reports the problem
        spec = algorithm_spec(algorithm)
        loss = dict(loss)
        if loss.get("loss_agg") is None:
            loss["loss_agg"] = spec.loss_agg
        lo, hi = spec.clip_eps
        if loss.get("clip_eps_lo") is None:
            loss["clip_eps_lo"] = lo
        if loss.get("clip_eps_hi") is None:
            loss["clip_eps_hi"] = hi
        return {**data, "loss": loss}

    @model_validator(mode="after")
    def _check(self):
        r, t, loss = self.rollout, self.train, self.loss
        if self.spec.needs_groups and r.num_rollouts < 2:
            raise ValueError(
                f"algorithm {self.algorithm} computes advantages within each prompt's group of "
                f"rollouts and needs rollout.num_rollouts >= 2 (got {r.num_rollouts}); use "
                "reinforce or ppo for one rollout per prompt"
            )
        n_seq = r.prompts_per_step * r.num_rollouts
        if n_seq % t.batch_size:
            raise ValueError(
                f"rollout.prompts_per_step × rollout.num_rollouts = {n_seq} sequences per rollout "
                f"step is not divisible by train.batch_size = {t.batch_size}; pick a micro-batch "
                "size that divides it"
            )
        if self.data.size < r.prompts_per_step:
            raise ValueError(
                f"data.size ({self.data.size}) must be at least rollout.prompts_per_step "
                f"({r.prompts_per_step})"
            )
        if loss.l_cache >= loss.l_max:
            raise ValueError(
                f"loss.l_cache ({loss.l_cache}) must be smaller than loss.l_max ({loss.l_max})"
            )
        if loss.accuracy_min_reward >= loss.accuracy_max_reward:
            raise ValueError("loss.accuracy_min_reward must be smaller than accuracy_max_reward")
        names = [s.name for s in self.data.specs]
        if len(names) != len(set(names)):
            raise ValueError(f"data.specs names must be unique (got {names})")
        return self

    # ---- derived facts the loop and the lab share ---------------------------------------------
    @property
    def spec(self) -> AlgorithmSpec:
        """The algorithm's spec (advantage and loss names, KL placement, needs)."""
        return algorithm_spec(self.algorithm)

    @property
    def sequences_per_step(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.num_rollouts

    @property
    def micro_batches_per_rollout(self) -> int:
        return self.sequences_per_step // self.train.batch_size

    @property
    def optimizer_steps_per_update(self) -> int:
        """Optimizer steps in one pass over the rollout batch (a short last one included)."""
        return -(-self.micro_batches_per_rollout // self.train.gradient_accumulation_steps)

    @property
    def total_rollout_steps(self) -> int:
        if self.train.max_steps is not None:
            return self.train.max_steps
        return max(1, self.train.num_epochs * (self.data.size // self.rollout.prompts_per_step))

    @property
    def uses_kl(self) -> bool:
        """β > 0 for an algorithm that has a KL term (the reference model is loaded)."""
        return self.loss.beta > 0 and self.spec.kl != "none"

    @property
    def needs_old_logps(self) -> bool:
        """Whether π_old must be computed by an extra forward at rollout time. When the whole
        rollout batch is used in a single optimizer step, π = π_old exactly during the update,
        so the update uses logπ.detach() instead (and losses without a ratio never need it)."""
        if not self.spec.needs_old_logprobs:
            return False
        return self.loss.updates_per_rollout > 1 or self.optimizer_steps_per_update > 1
