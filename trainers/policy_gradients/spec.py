"""The policy-gradient family's algorithm specs (torch-free).

Each record names its advantage estimator (a key of
``trainers.policy_gradients.advantages.ADVANTAGES`` for a sequence advantage,
``TOKEN_REWARD_ADVANTAGES`` for a critic-free token-level one, or ``"gae"`` for PPO's
estimator in ``TOKEN_ADVANTAGES``), its per-token loss (a key of
``trainers.policy_gradients.losses.POLICY_LOSS_FUNCTIONS``), where β·KL goes, and the loss
aggregation and clip range a config gets when it leaves them unset. What a row needs follows
from its estimator and its loss (``_pg``): groups of rollouts for a group-relative estimator, the
old log-probs for a loss on the ratio π/π_old, a value model for GAE. The reference model is
loaded only when ``loss.beta > 0`` for an algorithm whose ``kl`` is not ``"none"``.
"""

from __future__ import annotations

from trainers.core.spec import AlgorithmSpec, FamilySpec, KLPlacement, metrics

PAPER_DEFAULT_CLIP = (0.2, 0.2)


GROUP_ADVANTAGES = frozenset({"rloo", "grpo", "drgrpo", "maxrl", "reinforce_pp_baseline"})
"""Estimators that read a rollout against the other rollouts of its prompt (groups of G >= 2)."""
RATIO_LOSSES = frozenset({"clipped_surrogate", "gspo", "cispo", "sapo", "gmpo"})
"""Losses on the ratio π/π_old: they need the old log-probs (``reinforce`` only reports it)."""
CRITIC_ADVANTAGE = "gae"
"""PPO's estimator: it reads a learned value model."""
BINARY_ADVANTAGES = frozenset({"maxrl"})
"""Sequence estimators on the binary reward (correct or not) rather than the total: the
algorithm's ``reward_signal``, and the rewards column the estimator is called on."""


def _pg(name: str, *, advantage: str, loss: str, kl: KLPlacement, **fields) -> AlgorithmSpec:
    """A policy-gradient spec. The row names its estimator, its loss and where β·KL goes; what
    they need (groups, old log-probs, a value model, the binary reward) follows from them; the
    aggregation, clip range and headline are the family's unless the row gives its own."""
    fields.setdefault("loss_agg", "seq_mean_token_mean")
    fields.setdefault("clip_eps", PAPER_DEFAULT_CLIP)
    return AlgorithmSpec(
        name=name,
        advantage=advantage,
        loss=loss,
        kl=kl,
        needs_groups=advantage in GROUP_ADVANTAGES,
        needs_old_logprobs=loss in RATIO_LOSSES,
        needs_value_model=advantage == CRITIC_ADVANTAGE,
        reward_signal="binary" if advantage in BINARY_ADVANTAGES else "total",
        **fields,
    )


ALGORITHMS: tuple[AlgorithmSpec, ...] = (
    _pg(
        "reinforce",
        summary="Vanilla policy gradient: the sequence reward is the advantage, no baseline.",
        paper="Williams 1992, Simple statistical gradient-following algorithms",
        aliases=("vanilla policy gradient",),
        advantage="reinforce",
        loss="reinforce",
        kl="reward",
        watch=("high variance: no baseline",),
    ),
    _pg(
        "rloo",
        summary="REINFORCE with the mean reward of the other rollouts of the prompt as baseline.",
        paper="Ahmadian et al. 2024, Back to Basics: Revisiting REINFORCE-style optimization",
        advantage="rloo",
        loss="reinforce",
        kl="reward",
    ),
    _pg(
        "ppo",
        summary="Clipped ratio surrogate with GAE advantages from a learned value model.",
        paper="Schulman et al. 2017, Proximal Policy Optimization Algorithms",
        aliases=("proximal policy optimization",),
        advantage="gae",
        loss="clipped_surrogate",
        kl="reward",
        key_metrics=metrics("value_loss- explained_variance~"),
        acceptance=("value_loss falls and explained_variance rises above 0",),
    ),
    _pg(
        "grpo",
        summary="Group-normalised advantages (z-score within a prompt's rollouts), clipped "
        "ratio, KL in the loss.",
        paper="Shao et al. 2024, DeepSeekMath",
        aliases=("group relative policy optimization",),
        advantage="grpo",
        loss="clipped_surrogate",
        kl="loss",
    ),
    _pg(
        "drgrpo",
        summary="GRPO without the division by the group std and with a constant token normaliser.",
        paper="Liu et al. 2025, Understanding R1-Zero-Like Training (Dr. GRPO)",
        aliases=(
            "dr grpo",
            "dr. grpo",
            "dr.grpo",
            "dr-grpo",
            "dr_grpo",
            "grpo done right",
        ),
        advantage="drgrpo",
        loss="clipped_surrogate",
        kl="loss",
        loss_agg="seq_mean_token_sum_norm",
    ),
    _pg(
        "gspo",
        summary="GRPO advantages with one sequence-level (geometric-mean) ratio per rollout.",
        paper="Zheng et al. 2025, Group Sequence Policy Optimization",
        advantage="grpo",
        loss="gspo",
        kl="loss",
        # The ratio is a per-token geometric mean, so it stays much closer to 1: the paper's
        # tiny clip range.
        clip_eps=(3e-4, 4e-4),
        watch=("clip_frac (GSPO's clip range is tiny by design)",),
    ),
    _pg(
        "cispo",
        summary="GRPO advantages on a REINFORCE loss weighted by the clipped, detached ratio.",
        paper="MiniMax 2025, MiniMax-M1",
        advantage="grpo",
        loss="cispo",
        kl="loss",
        loss_agg="token_mean",
        # Weight capped at ratio <= 5 with no real lower bound (TRL's / ScaleRL's epsilon_high
        # = 5) in our clip(ratio, 1 - lo, 1 + hi) form.
        clip_eps=(1.0, 4.0),
        watch=("clip_frac at the upper bound",),
    ),
    _pg(
        "sapo",
        summary="GRPO advantages with a smooth sigmoid gate on the ratio instead of a hard clip.",
        paper="Gao et al. 2025, Soft Adaptive Policy Optimization",
        advantage="grpo",
        loss="sapo",
        kl="loss",
    ),
    _pg(
        "dapo",
        summary="GRPO with clip-higher, token-mean aggregation, an overlong penalty and dynamic "
        "sampling of groups with reward contrast; no KL term.",
        paper="Yu et al. 2025, DAPO",
        advantage="grpo",
        loss="clipped_surrogate",
        kl="none",
        loss_agg="token_mean",
        clip_eps=(0.2, 0.28),
        overlong_penalty=True,
        dynamic_sampling=True,
        key_metrics=metrics("dynamic_sampling/kept_frac~"),
        acceptance=(
            "dynamic_sampling/kept_frac stays above 0 (groups with reward contrast exist)",
        ),
    ),
    _pg(
        "maxrl",
        summary="Group-centred binary reward divided by the group success rate "
        "(maximum-likelihood weighting of hard prompts); no KL term.",
        paper="Maximum-likelihood RL (MaxRL)",
        aliases=("max rl", "max-rl"),
        advantage="maxrl",
        loss="reinforce",
        kl="none",
        acceptance=("avg_binary must be above 0 in some groups: MaxRL's advantage is 0 otherwise",),
    ),
    _pg(
        "reinforce_pp",
        summary="REINFORCE++: no critic, no groups; the KL per token in the reward, returns-to-go "
        "normalised over the whole batch, PPO's clipped ratio.",
        paper="Hu et al. 2025, REINFORCE++",
        aliases=("reinforce++", "reinforce plus plus", "reinforce-pp"),
        advantage="reinforce_pp",
        loss="clipped_surrogate",
        kl="reward",
        watch=("kl_reward: the token-level KL is part of every advantage",),
    ),
    _pg(
        "reinforce_pp_baseline",
        summary="REINFORCE++ with the group mean reward subtracted first, then the batch-wide "
        "normalisation (for reasoning tasks with several rollouts per prompt).",
        paper="Hu et al. 2025, REINFORCE++ (REINFORCE++-baseline)",
        aliases=("reinforce++-baseline", "reinforce++ baseline", "reinforce_baseline"),
        advantage="reinforce_pp_baseline",
        loss="clipped_surrogate",
        kl="reward",
    ),
    _pg(
        "remax",
        summary="REINFORCE whose baseline is the reward of the prompt's greedy completion (one "
        "extra greedy rollout per prompt each step).",
        paper="Li et al. 2023, ReMax",
        aliases=("re-max",),
        advantage="remax",
        loss="reinforce",
        kl="reward",
        greedy_baseline=True,
        key_metrics=metrics("avg_greedy+", key=False),
        watch=("avg_greedy (the baseline) against avg_total: the sampled rollouts' advantage",),
    ),
    _pg(
        "gmpo",
        summary="GRPO advantages on the geometric mean of the token ratios, each clipped in log "
        "space, as the sequence objective.",
        paper="Zhao et al. 2025, Geometric-Mean Policy Optimization",
        aliases=("geometric-mean policy optimization", "geometric mean policy optimization"),
        advantage="grpo",
        loss="gmpo",
        kl="loss",
        # log-space bounds: ratios clipped to (e^-0.4, e^0.4), the paper's range
        clip_eps=(0.4, 0.4),
        watch=("clip_frac (tokens whose log-ratio hit ±0.4)",),
    ),
)


FAMILY = FamilySpec(
    name="policy_gradients",
    config_class="PolicyGradientConfig",
    algorithm_field="algorithm",
    default_algorithm="grpo",
    algorithms=ALGORITHMS,
    key_metrics=metrics(
        "avg_correctness+ avg_format+ avg_binary+",
        # The policy-gradient loss hovers near 0 whatever the policy does: no direction.
        "loss~ frac_reward_zero_std-",
    )
    + metrics(
        "avg_total+",
        # reward from a reward model (README "Rewards"): the optimised score, the gold signal,
        # and the distance from the reference policy they are read against
        "proxy_reward+ gold_reward+ kl_ref~",
        key=False,
    ),
    headline_metric="eval/avg_correctness",
    acceptance=(
        "avg_correctness, avg_format and avg_binary rise over the rollout steps",
        "reward contrast is present: frac_reward_zero_std stays well below 1",
        "no NaN loss and no collapse of response_length/mean",
    ),
    watch=(
        "avg_correctness / avg_format / avg_binary (the signal; the loss alone says little "
        "and hovers near 0 with beta 0)",
        "frac_reward_zero_std: groups without reward contrast teach nothing",
        "response_length/mean and response_length/clipped_frac",
        "kl and clip_frac when beta > 0 or several updates per rollout",
    ),
    comparison="decide on greedy held-out eval/avg_correctness at matched prompts per step; "
    "the sampled avg_correctness / avg_binary curves over rollout steps are the training signal "
    "(they can rise while held-out correctness falls); check that groups carry reward contrast",
    comparison_columns=(
        "avg_correctness",
        "avg_format",
        "avg_binary",
        "loss",
        "reward_contrast",
        "avg_correctness_change",
    ),
    headline_label="greedy held-out correctness",
    heldout_keys=("data.specs", "data.eval_size"),
    algorithm_knobs=("algorithm", "loss."),
    kl_key="loss.beta",
)
