"""The distillation family's algorithm spec (torch-free).

``loss`` is a key of ``trainers.distillation.losses.DIVERGENCES``: the per-token divergence a
config gets when it leaves ``loss.divergence`` at its default.
"""

from __future__ import annotations

from trainers.core.spec import AlgorithmSpec, FamilySpec, metrics

ALGORITHMS: tuple[AlgorithmSpec, ...] = (
    AlgorithmSpec(
        name="distill",
        summary="On-policy distillation: the student samples completions, a frozen teacher "
        "gives its next-token distribution at every sampled position, and the student "
        "minimises the per-token reverse KL to it (or the generalised JSD with beta).",
        paper="Agarwal et al. 2024, On-Policy Distillation of Language Models: Learning from "
        "Self-Generated Mistakes (GKD)",
        aliases=("gkd", "on-policy distillation", "on policy distillation", "distillation"),
        loss="reverse_kl",
        needs_teacher=True,
    ),
)

FAMILY = FamilySpec(
    name="distillation",
    multi_process=False,  # the student's sampling and the teacher are not split across ranks yet
    config_class="DistillationConfig",
    algorithm_field="algorithm",
    default_algorithm="distill",
    algorithms=ALGORITHMS,
    key_metrics=(
        metrics("loss- reverse_kl- teacher_logp+", "eval/avg_correctness+ eval/avg_format+")
        + metrics("eval/teacher_avg_correctness~", key=False)
    ),
    headline_metric="eval/avg_correctness",
    acceptance=(
        "loss and reverse_kl fall over the steps while teacher_logp (the teacher's log-prob of "
        "the student's own tokens) rises",
        "greedy held-out eval/avg_correctness moves towards eval/teacher_avg_correctness",
    ),
    watch=(
        "loss / reverse_kl falling (the student's samples become likely under the teacher)",
        "eval/avg_correctness against eval/teacher_avg_correctness (the ceiling)",
        "completion_length: a student that stops at once has little to learn from",
    ),
    comparison="decide on greedy held-out eval/avg_correctness at matched prompts, read next to "
    "the teacher's own held-out correctness (eval/teacher_avg_correctness); the per-token "
    "divergence is the training signal and its scale differs between divergences",
    comparison_columns=(
        "eval/avg_correctness",
        "eval/teacher_avg_correctness",
        "reverse_kl",
        "teacher_logp",
    ),
    headline_label="greedy held-out correctness",
    training_signal="reverse_kl",
    heldout_keys=("data.specs", "data.dataset", "data.eval_size"),
    algorithm_knobs=("algorithm", "loss."),
)
