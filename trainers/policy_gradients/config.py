"""Policy-gradient config (torch-free; the lab validates with it).

One config model serves every algorithm of the family; ``algorithm`` picks the advantage estimator, the
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
    BUILTIN_PROMPTS,
    CheckpointSection,
    LoggingSection,
    ModelSection,
    OptimSection,
    PromptDataSection,
    StrictModel,
)
from trainers.core.spec import AlgorithmSpec
from trainers.policy_gradients.spec import FAMILY as PG_FAMILY

Algorithm = PG_FAMILY.algorithm_literal

LossAgg = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]

# What each algorithm needs (groups, KL placement, ratio, defaults) is declared once in
# trainers/policy_gradients/spec.py: read it through ``algorithm_spec(name)`` or ``cfg.spec``.


def algorithm_spec(algorithm: str) -> AlgorithmSpec:
    """The spec of a policy-gradient algorithm (KeyError for a name the family lacks)."""
    return PG_FAMILY.algorithm(algorithm)


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


class EnvSection(StrictModel):
    """Multi-turn rollouts with a tool (trainers/core/multiturn.py): the model may call the
    environment's tool, read its reply and go on, up to ``max_turns`` model turns."""

    name: str | None = Field(
        default=None,
        description="None: one completion per prompt; else a registered environment "
        "(calculator, python, scripted_tool: trainers/core/environments)",
    )
    max_turns: int = Field(default=4, description="model turns per trajectory (>= 1)")
    max_observation_tokens: int = Field(
        default=64, ge=1, description="tokens of one tool reply's content (cut beyond)"
    )
    max_total_tokens: int | None = Field(
        default=None,
        ge=1,
        description="model + tool-reply tokens after the prompt (None: max_turns × "
        "(rollout.max_new_tokens + max_observation_tokens + 16))",
    )

    @model_validator(mode="after")
    def _check_env(self):
        if self.max_turns < 1:
            raise ValueError(
                f"env.max_turns={self.max_turns}: a trajectory needs at least one model turn "
                "(1 = the model may not see a tool reply; 2 or more to use a tool)"
            )
        if self.name is not None:
            from trainers.core.environments import environment_names

            known = environment_names()
            if self.name not in known:
                raise ValueError(
                    f"env.name={self.name!r} is not an environment; known: {', '.join(known)} "
                    "(null: one completion per prompt)"
                )
        return self


# the chat template's text around a tool reply (SmolLM2: 9 tokens); a generous bound
REPLY_WRAPPER_TOKENS = 16


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


RewardNormalize = Literal["none", "batch", "running"]


class RewardSection(StrictModel):
    """The scalar reward of a completion (README "Rewards"; docs/algorithms.md):

    total = clip(model_weight·norm(rm) + verifier_weight·correctness + format_weight·format
                 + penalty − missing_eos_penalty·[no end-of-turn], ±clip)

    ``None`` weights take their default at validation time (written to config.yaml)."""

    model: str | None = Field(
        default=None,
        description="reward model: a reward-model run's final_model/ (preference or orm), any "
        "local or hub sequence-classification checkpoint with one label, or run:<id> (the lab "
        "resolves it)",
    )
    model_weight: float | None = Field(
        default=None, ge=0, description="weight of the reward model's score (None: 1 with a model)"
    )
    verifier_weight: float | None = Field(
        default=None,
        ge=0,
        description="weight of reasoning-gym correctness (None: 1 for reasoning_gym prompts, "
        "else 0)",
    )
    format_weight: float | None = Field(
        default=None,
        ge=0,
        description="weight of the <think>/<answer> tag format (None: 0.5 for reasoning_gym "
        "prompts, else 0)",
    )
    gold_model: str | None = Field(
        default=None,
        description="a held-out 'gold' reward model, scored and logged (gold_reward), never "
        "optimised; None: the verifier is the gold signal where the prompts have one",
    )
    normalize: RewardNormalize = Field(
        default="none",
        description="whitening of the reward model's score: none, batch (this rollout batch's "
        "mean/std) or running (mean/std of every score so far, exact Welford/Chan merge)",
    )
    clip: float | None = Field(
        default=None, gt=0, description="clip the shaped reward to [-clip, clip] (None: off)"
    )
    missing_eos_penalty: float = Field(
        default=0.0,
        ge=0,
        description="subtracted from the reward of a completion cut at max_new_tokens without "
        "an end-of-turn token",
    )
    score_batch_size: int = Field(
        default=16, ge=1, description="sequences per reward-model forward pass"
    )


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


def _reward_defaults(data: dict) -> dict:
    """Fill the reward weights left at None from the prompt source and the reward model, so
    config.yaml records the weights used: model_weight 1 with a model (else 0), verifier_weight
    1 and format_weight 0.5 for reasoning-gym prompts (else 0)."""
    reward = data.get("reward")
    section = data.get("data")
    if reward is None:
        reward = {}
    if not isinstance(reward, dict) or not isinstance(section, dict | None):
        return {}  # field validation reports the problem
    source = (section or {}).get("source", "reasoning_gym")
    reasoning = source == "reasoning_gym"
    reward = dict(reward)
    if reward.get("model_weight") is None:
        reward["model_weight"] = 1.0 if reward.get("model") else 0.0
    if reward.get("verifier_weight") is None:
        reward["verifier_weight"] = 1.0 if reasoning else 0.0
    if reward.get("format_weight") is None:
        reward["format_weight"] = 0.5 if reasoning else 0.0
    return {"reward": reward}


class PolicyGradientConfig(StrictModel):
    algorithm: Algorithm = "grpo"
    model: ModelSection = ModelSection(name="Qwen/Qwen3-1.7B", gradient_checkpointing=True)
    data: PromptDataSection = PromptDataSection()
    rollout: RolloutSection = RolloutSection()
    env: EnvSection = EnvSection()
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
        return {**data, "loss": loss, **_reward_defaults(data)}

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
        self.data.check_specs_unique()
        self._check_prompts_and_rewards()
        if self.multi_turn and self.spec.greedy_baseline:
            raise ValueError(
                f"algorithm {self.algorithm} takes a greedy single-turn completion as its "
                f"baseline, which a multi-turn rollout (env.name={self.env.name!r}) has no "
                "counterpart for; use grpo, rloo, reinforce_pp or ppo with an environment"
            )
        return self

    def _check_prompts_and_rewards(self) -> None:
        d, rw = self.data, self.reward
        d.check_source()
        if rw.model is None and rw.model_weight:
            raise ValueError("reward.model_weight > 0 needs reward.model (a reward model to score)")
        if rw.model is None and rw.normalize != "none":
            raise ValueError(
                f"reward.normalize={rw.normalize!r} whitens the reward model's score and needs "
                "reward.model; leave it 'none' for verifier rewards"
            )
        if rw.verifier_weight and not d.has_verifier:
            raise ValueError(
                f"reward.verifier_weight={rw.verifier_weight} needs prompts the reasoning-gym "
                f"verifier can score (data.source=reasoning_gym or data.dataset={BUILTIN_PROMPTS}"
                f"); the prompts of {d.dataset!r} have no reference answer: set "
                "reward.verifier_weight=0"
            )
        weights = {
            "reward.model_weight": rw.model_weight if rw.model else 0.0,
            "reward.verifier_weight": rw.verifier_weight,
            "reward.format_weight": rw.format_weight,
        }
        if not any(weights.values()):
            raise ValueError(
                "every reward weight is 0 ("
                + ", ".join(f"{k}={v or 0:g}" for k, v in weights.items())
                + "): every completion would get the same reward and nothing would be learnt; "
                "set reward.model (with reward.model_weight > 0), reward.verifier_weight > 0 "
                "(reasoning-gym prompts) or reward.format_weight > 0"
            )
        spec = self.spec
        if spec.greedy_baseline and rw.normalize != "none":
            raise ValueError(
                f"algorithm {self.algorithm} subtracts the reward of the greedy completion, which "
                "is scored without whitening, from the sampled completions' reward: "
                f"reward.normalize={rw.normalize!r} would put the two on different scales; "
                "leave reward.normalize 'none'"
            )
        if (spec.dynamic_sampling or spec.reward_signal == "binary") and not d.has_verifier:
            raise ValueError(
                f"algorithm {self.algorithm} reads reasoning-gym correctness (DAPO's dynamic "
                "sampling, MaxRL's binary reward), which the prompts of "
                f"{d.dataset!r} do not have: use data.source=reasoning_gym or "
                f"data.dataset={BUILTIN_PROMPTS}, or another algorithm"
            )

    # ---- derived facts the loop and the lab share ---------------------------------------------
    @property
    def multi_turn(self) -> bool:
        """Whether rollouts are trajectories with an environment (env.name set)."""
        return self.env.name is not None

    @property
    def max_completion_tokens(self) -> int:
        """The most tokens after the prompt one sequence can hold: max_new_tokens, or a
        trajectory's model turns and tool replies (what memory and time estimates count)."""
        if not self.multi_turn:
            return self.rollout.max_new_tokens
        if self.env.max_total_tokens is not None:
            return self.env.max_total_tokens
        per_turn = self.rollout.max_new_tokens + self.env.max_observation_tokens
        return self.env.max_turns * (per_turn + REPLY_WRAPPER_TOKENS)

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
    def gold_source(self) -> str | None:
        """What ``gold_reward`` measures: ``"model"`` (reward.gold_model), ``"verifier"``
        (reasoning-gym correctness) or None (no gold signal)."""
        if self.reward.gold_model:
            return "model"
        return "verifier" if self.data.has_verifier else None

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

    def reward_model_names(self) -> list[tuple[str, str]]:
        """(config key, name) of the reward models the run loads."""
        out = []
        if self.reward.model:
            out.append(("reward.model", self.reward.model))
        if self.reward.gold_model:
            out.append(("reward.gold_model", self.reward.gold_model))
        return out

    @property
    def headline_metric(self) -> str:
        """The held-out metric this run is judged on (summary.json's best value; the lab's rule
        in ``rlhf_lab/results/headline.py``): a run rewarded by a reward model is judged on its held-out
        gold reward when it has a gold signal, else on the optimised model's held-out score (a
        proxy); any other run on greedy held-out correctness, the family's headline."""
        if self.reward.model:
            return "eval/gold_reward" if self.gold_source else "eval/proxy_reward"
        return "eval/avg_correctness"

    def notes(self) -> list[str]:
        """Things a reader of the run should know about this config (printed and in summary)."""
        notes = []
        if self.loss.beta > 0 and self.spec.kl == "none":
            notes.append(
                f"loss.beta={self.loss.beta} is ignored: {self.algorithm} has no KL term (as in "
                "the book's code); no reference model is loaded"
            )
        if self.reward.model and self.reward.gold_model == self.reward.model:
            notes.append(
                "reward.gold_model is the optimised reward model itself: gold_reward equals "
                "proxy_reward and cannot reveal overoptimisation"
            )
        if self.reward.model and not self.uses_kl:
            notes.append(
                "no KL leash to the reference (loss.beta=0"
                + ("" if self.spec.kl != "none" else f", {self.algorithm} has no KL term")
                + "): nothing holds the policy near its start while it maximises the reward "
                "model, and kl_ref is not logged"
            )
        safe = self.loss.l_max - self.loss.l_cache
        if self.spec.overlong_penalty and safe >= self.rollout.max_new_tokens:
            notes.append(
                f"the overlong penalty never applies: rollout.max_new_tokens="
                f"{self.rollout.max_new_tokens} <= l_max - l_cache = {safe}"
            )
        return notes
