"""The direct-alignment family's algorithm specs (torch-free).

Each record's ``loss`` is a key of ``trainers.direct_alignment.losses.LOSSES``; ``default_beta``
is the β a config gets when it leaves ``beta`` unset (for ORPO β plays the paper's λ);
``needs_reference`` says whether a frozen reference model is loaded and its log-probs cached.
"""

from __future__ import annotations

from trainers.core.spec import AlgorithmSpec, FamilySpec, metrics

BUILTIN_DATASET = "builtin:reasoning-preferences"


def _da(name: str, **fields) -> AlgorithmSpec:
    """A direct-alignment spec: the loss of the same name, β 0.1 and a reference by default."""
    fields.setdefault("loss", name)
    fields.setdefault("default_beta", 0.1)
    fields.setdefault("needs_reference", True)
    return AlgorithmSpec(name=name, **fields)


ALGORITHMS: tuple[AlgorithmSpec, ...] = (
    _da(
        "dpo",
        summary="Logistic loss on the difference of policy-vs-reference log-ratios of the "
        "chosen and rejected responses.",
        paper="Rafailov et al. 2023, Direct Preference Optimization",
        aliases=("direct preference optimization",),
    ),
    _da(
        "cdpo",
        summary="DPO with label smoothing: each preference is assumed flipped with "
        "probability epsilon.",
        paper="Mitchell 2023, A note on DPO with noisy preferences",
        aliases=("c-dpo", "conservative dpo"),
    ),
    _da(
        "dpo_norm",
        summary="DPO on per-token average log-probs instead of sums.",
        paper="length-normalised DPO",
        aliases=("dpo-norm", "dpo norm", "length-normalized dpo", "length-normalised dpo"),
        default_beta=2.0,
    ),
    _da(
        "ipo",
        summary="Squared loss pulling the log-ratio difference towards 1/(2 beta).",
        paper="Azar et al. 2023, A General Theoretical Paradigm to Understand Learning from "
        "Human Preferences",
        aliases=("identity preference optimization",),
        acceptance=("IPO's loss starts high (10-25 on real data) and is not comparable to DPO's",),
    ),
    _da(
        "simpo",
        summary="Reference-free: logistic loss on average log-probs with a target margin.",
        paper="Meng et al. 2024, SimPO",
        aliases=("simple preference optimization",),
        default_beta=2.0,
        needs_reference=False,
        acceptance=("samples stay coherent: SimPO is learning-rate sensitive",),
        watch=("repetitive or incoherent samples (lower the learning rate)",),
    ),
    _da(
        "orpo",
        summary="Reference-free: SFT loss on the chosen response plus a log-odds-ratio term.",
        paper="Hong et al. 2024, ORPO",
        aliases=("odds ratio preference optimization", "odds-ratio preference optimization"),
        needs_reference=False,
        key_metrics=metrics("sft_loss- or_loss- log_odds_ratio~"),
        acceptance=(
            "margins leave 0 and or_loss is not negligible next to sft_loss (the known failure "
            "is 'stable but flat')",
        ),
        watch=("or_loss next to sft_loss",),
    ),
    _da(
        "kto",
        summary="Per-example prospect-theory loss against a detached KL reference point; "
        "works on paired or unpaired data.",
        paper="Ethayarajh et al. 2024, KTO",
        aliases=("kahneman-tversky optimization",),
        key_metrics=metrics("kl~"),
        watch=("kl (the detached reference point z)",),
    ),
    _da(
        "apo_zero",
        summary="Anchored loss raising the chosen and lowering the rejected log-ratio.",
        paper="D'Oosterlinck et al. 2024, Anchored Preference Optimization",
        aliases=("apo-zero", "apo zero"),
    ),
    _da(
        "online_dpo",
        summary="Each step samples two (online.num_samples) completions per prompt from the "
        "current policy, ranks them with a reward model or the verifier (best against worst), "
        "and applies a loss of the family (online.loss, DPO by default) against the frozen "
        "starting model; ties are skipped.",
        paper="Guo et al. 2024, Direct Language Model Alignment from Online AI Feedback",
        aliases=("online dpo", "online-dpo", "oaif"),
        loss="dpo",
        needs_reward_model=True,
        key_metrics=metrics(
            "score_chosen+ score_margin~ tie_frac-", "eval/score+ eval/correctness+"
        ),
        acceptance=(
            "tie_frac stays below 1: pairs whose two samples score the same teach nothing",
            "the ranker's held-out score of greedy completions (eval/score) rises",
        ),
        watch=(
            "tie_frac (a random-init policy ties everything under the verifier: warm-start it; "
            "near 1, raise online.num_samples or rank with a reward model)",
            "score_chosen vs score_rejected over steps, and eval/score",
        ),
        memory_hook="online_dpo",
        shrink_hook="online_dpo",
        one_process_as="online DPO",  # its sampling and ranking step is not split across ranks
    ),
    _da(
        "apo_down",
        summary="Anchored loss lowering both log-ratios, the rejected one more.",
        paper="D'Oosterlinck et al. 2024, Anchored Preference Optimization",
        aliases=("apo-down", "apo down"),
    ),
)

FAMILY = FamilySpec(
    name="direct_alignment",
    lora_multi_process=True,
    config_class="DirectAlignmentConfig",
    algorithm_field="loss",
    default_algorithm="dpo",
    algorithms=ALGORITHMS,
    # Both rewards often fall while the gap widens: no direction for the rejected one.
    key_metrics=metrics(
        "accuracy+ margins+ chosen_rewards+ rejected_rewards~",
        "eval/accuracy+ eval/margins+ eval/chosen_rewards+ eval/rejected_rewards~",
    ),
    headline_metric="eval/accuracy",
    acceptance=(
        "accuracy and margins trend up within the first 10-20 optimizer steps "
        "(eval/accuracy ends above 0.5)",
        "sample generations stay coherent: no repetition collapse",
    ),
    watch=(
        "accuracy and margins (train and eval/) rising together",
        "chosen_rewards vs rejected_rewards: the gap should widen; both falling is common",
        "grad_norm spikes and a loss that turns NaN (lower the learning rate)",
        "samples.jsonl for repetition or gibberish",
    ),
    comparison="compare eval/accuracy and eval/margins at matched steps; loss scales differ "
    "across losses (IPO's is not comparable to DPO's)",
    comparison_columns=(
        "eval/accuracy",
        "eval/margins",
        "eval/chosen_rewards",
        "eval/rejected_rewards",
    ),
    builtin_datasets={"*": BUILTIN_DATASET},
    headline_label="held-out preference accuracy",
    heldout_keys=("data.dataset", "data.eval_size", "data.max_samples", "data.builtin_tasks"),
    algorithm_knobs=(
        "loss",
        "beta",
        "gamma",
        "label_smoothing",
        "lambda_d",
        "lambda_u",
        "ipo_sum",
        "online.",
        "reward.",
    ),
    kl_key="beta",
)
