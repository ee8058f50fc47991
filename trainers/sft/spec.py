"""The SFT family's spec (torch-free): one algorithm, next-token cross-entropy on the
assistant turns (``loss="token_nll"``)."""

from __future__ import annotations

from trainers.core.spec import AlgorithmSpec, FamilySpec, metrics

BUILTIN_DATASET = "builtin:reasoning-sft"

ALGORITHMS: tuple[AlgorithmSpec, ...] = (
    AlgorithmSpec(
        name="sft",
        summary="Supervised fine-tuning: token-level negative log-likelihood of the "
        "demonstrations' assistant turns.",
        paper="Ouyang et al. 2022, InstructGPT (SFT stage); Wei et al. 2021, FLAN",
        aliases=(
            "instruction tuning",
            "supervised fine-tuning",
            "supervised finetuning",
            "supervised fine tuning",
        ),
        loss="token_nll",
    ),
)

FAMILY = FamilySpec(
    name="sft",
    lora_multi_process=True,
    config_class="SFTConfig",
    algorithm_field=None,
    default_algorithm="sft",
    algorithms=ALGORITHMS,
    key_metrics=metrics("loss- mean_token_accuracy+ eval/loss-"),
    headline_metric="eval/loss",
    acceptance=(
        "loss and eval/loss fall (eval/loss without rising again)",
        "mean_token_accuracy rises; samples take the chat format and end their turn",
    ),
    watch=(
        "eval/loss against loss (overfitting when they part)",
        "samples.jsonl: the answers should follow the format and terminate",
    ),
    comparison="compare eval/loss and held-out samples at matched steps",
    comparison_columns=(
        "eval/loss",
        "eval/mean_token_accuracy",
        "loss",
        "mean_token_accuracy",
    ),
    builtin_datasets={"*": BUILTIN_DATASET},
    headline_label="held-out loss (lower is better)",
    headline_is_share=False,
    heldout_keys=("data.dataset", "data.eval_size", "data.max_samples", "data.builtin_tasks"),
)
