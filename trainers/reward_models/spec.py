"""The reward-model family's specs, one per kind (torch-free).

Each record's ``loss`` is a key of ``trainers.reward_models.losses.REWARD_LOSSES``. The kinds
report different held-out metrics, so a kind's own key metrics replace the family's list
(``replace_key_metrics``). ``run_name`` is the name a run is filed under (the shipped config's
file name).
"""

from __future__ import annotations

from trainers.core.spec import AlgorithmSpec, FamilySpec, metrics

BUILTIN_PREFERENCES = "builtin:reasoning-preferences"
BUILTIN_OUTCOMES = "builtin:reasoning-outcomes"
BUILTIN_STEPS = "builtin:reasoning-steps"

ALGORITHMS: tuple[AlgorithmSpec, ...] = (
    AlgorithmSpec(
        name="preference",
        summary="Scalar head trained with the Bradley-Terry loss on chosen/rejected pairs.",
        paper="Bradley & Terry 1952; Ouyang et al. 2022, InstructGPT",
        aliases=(
            "bradley-terry",
            "bradley terry",
            "bt",
            "reward model",
            "reward modelling",
            "reward modeling",
            "preference rm",
            "preference_rm",
            "preference reward model",
        ),
        loss="bradley_terry",
        key_metrics=metrics("eval/accuracy+ eval/reward_margin+"),
        acceptance=("eval/accuracy above 0.5 and eval/reward_margin growing",),
        builtin_dataset=BUILTIN_PREFERENCES,
        run_name="preference_rm",
    ),
    AlgorithmSpec(
        name="orm",
        summary="Outcome reward model: scalar head, binary cross-entropy on correctness labels.",
        paper="Cobbe et al. 2021, Training Verifiers to Solve Math Word Problems",
        aliases=("outcome reward model",),
        loss="orm",
        key_metrics=metrics("eval/accuracy+ eval/auroc+ eval/ranking_accuracy+"),
        acceptance=("eval/auroc above 0.5 and eval/ranking_accuracy above 0.5",),
        builtin_dataset=BUILTIN_OUTCOMES,
    ),
    AlgorithmSpec(
        name="prm",
        summary="Process reward model: a class per reasoning step, read at each step separator.",
        paper="Lightman et al. 2023, Let's Verify Step by Step",
        aliases=("process reward model",),
        loss="prm",
        key_metrics=metrics("eval/step_accuracy+ eval/majority_baseline~"),
        headline_metric="eval/step_accuracy",
        acceptance=("eval/step_accuracy above eval/majority_baseline",),
        builtin_dataset=BUILTIN_STEPS,
    ),
)

FAMILY = FamilySpec(
    name="reward_models",
    lora_multi_process=True,
    config_class="RewardModelConfig",
    algorithm_field="kind",
    default_algorithm="preference",
    algorithms=ALGORITHMS,
    key_metrics=metrics(
        "accuracy+ reward_margin+",
        "eval/accuracy+ eval/reward_margin+ eval/auroc+ eval/ranking_accuracy+",
        "eval/step_accuracy+ eval/majority_baseline~",
    ),
    headline_metric="eval/accuracy",
    acceptance=(
        "held-out metrics beat chance and improve over training "
        "(compare held-out numbers, never the training loss)",
    ),
    watch=(
        "eval/ metrics in the later part of training (overfitting shows there first)",
        "the training loss floor: identical pairs after truncation inflate it",
    ),
    comparison="compare held-out margins / correctness scores, not training loss",
    comparison_columns=(
        "eval/accuracy",
        "eval/reward_margin",
        "eval/auroc",
        "eval/ranking_accuracy",
        "eval/step_accuracy",
        "eval/majority_baseline",
        "step_accuracy_over_baseline",
    ),
    builtin_datasets={spec.name: spec.builtin_dataset or "" for spec in ALGORITHMS},
    replace_key_metrics=True,
    headline_label="held-out accuracy",
    heldout_keys=("data.dataset", "data.eval_size", "data.max_samples"),
    algorithm_knobs=("kind", "orm_loss_tokens"),
)
