"""The rejection-sampling family's specs, one per selection strategy (torch-free).

Every strategy fine-tunes on its selection with the SFT token loss (``loss="token_nll"``); what
differs is ``selection``, a key of ``trainers.rejection_sampling.selection.SELECTIONS``. Each
reward-selected strategy is judged against the random strategy with the same selection size
(``matched_control``), and each random one is the control of its partner.
"""

from __future__ import annotations

from trainers.core.spec import AlgorithmSpec, FamilySpec, metrics

BUILTIN_DATASET = "builtin:chain_sum"


def _rs(name: str, control: str, **fields) -> AlgorithmSpec:
    """A rejection-sampling spec: select by ``name``, SFT on the selection, judged by exact
    match against ``control``."""
    return AlgorithmSpec(
        name=name,
        loss="token_nll",
        selection=name,
        matched_control=control,
        **fields,
    )


ALGORITHMS: tuple[AlgorithmSpec, ...] = (
    _rs(
        "top_per_prompt",
        "random_per_prompt",
        summary="Best-of-n: the highest-scoring completion of every prompt.",
        paper="Nakano et al. 2021, WebGPT (best-of-n); Touvron et al. 2023, Llama 2",
        aliases=("best-of-n", "best of n", "bon", "rejection sampling", "top per prompt"),
    ),
    _rs(
        "top_k_overall",
        "random_k_overall",
        summary="The k highest-scoring completions over all prompts.",
        aliases=("top-k overall", "top k overall"),
    ),
    _rs(
        "random_per_prompt",
        "top_per_prompt",
        summary="Control: one random completion per prompt.",
        is_control=True,
        aliases=("random per prompt",),
    ),
    _rs(
        "random_k_overall",
        "top_k_overall",
        summary="Control: k random completions over all prompts.",
        is_control=True,
        aliases=("random k overall", "random-k overall"),
    ),
)

FAMILY = FamilySpec(
    name="rejection_sampling",
    config_class="RejectionSamplingConfig",
    algorithm_field="strategy",
    default_algorithm="top_per_prompt",
    algorithms=ALGORITHMS,
    key_metrics=metrics(
        "eval/exact_match+ diagnostics/decidable_frac~ loss- sft/loss-",
        "eval/accuracy+ test_accuracy+",
    ),
    headline_metric="eval/exact_match",
    acceptance=(
        "each reward-selected strategy's held-out exact match is reported beside its "
        "matched random control (top_per_prompt vs random_per_prompt, top_k_overall vs "
        "random_k_overall); a gain counts only against that control",
        "diagnostics/decidable_frac is well above 0 (prompts with both correct and incorrect "
        "completions), otherwise selection cannot help",
    ),
    watch=(
        "diagnostics/decidable_frac after scoring",
        "the SFT loss falling on the selection",
        "exact match of the strategy vs its matched random control",
    ),
    comparison="always beside the matched random control with the same selection size",
    comparison_columns=(
        "eval/exact_match",
        "eval/accuracy",
        "eval/test_accuracy",
        "test_accuracy",
    ),
    builtin_datasets={"*": BUILTIN_DATASET},
    headline_label="greedy held-out exact match of the fine-tuned model",
    # the SFT loss on the selection is the only training-time number
    training_signal="loss",
    eval_size_keys=("data.max_test_samples",),
    heldout_keys=("data.dataset", "data.test_dataset", "data.test_split", "data.max_test_samples"),
    algorithm_knobs=("strategy", "top_k"),
    learning_rate_key="sft.learning_rate",
    steps_key="sft.max_steps",
)
