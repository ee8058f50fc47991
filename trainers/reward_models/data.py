"""Data for the three reward-model kinds, one module each; this module re-exports their names
so ``from trainers.reward_models.data import ...`` keeps working.

* :mod:`trainers.reward_models.preference`: preference pairs (records and tokenisation shared
  with direct alignment through :mod:`trainers.core.preferences`) and the pair batches;
* :mod:`trainers.reward_models.outcome`: ORM rows (GSM8K-style prompts with labelled
  completions), their tokenisation and batches;
* :mod:`trainers.reward_models.steps`: PRM rows (PRM800K-style rated steps), windows and batches;
* :mod:`trainers.reward_models.sources`: reading rows and the ``builtin:*`` names.

The offline ``builtin:*`` sets come from :mod:`trainers.core.builtin_data`.
"""

from __future__ import annotations

from trainers.core.builtin_data import (
    ERROR_KINDS,
    PRM_TASK_CONFIG,
    builtin_outcome_records,
    builtin_preference_records,
    builtin_step_records,
)
from trainers.core.datasets import DatasetNotFoundError
from trainers.core.records import OutcomeRecord, StepRecord
from trainers.core.tokenization import right_pad
from trainers.reward_models.config import BUILTIN_OUTCOMES, BUILTIN_STEPS
from trainers.reward_models.outcome import (
    GSM8K_SYSTEM_PROMPT,
    OutcomeExample,
    collate_outcomes,
    corrupt_final_answer,
    gsm8k_final_answer,
    load_outcome_records,
    parse_outcome_row,
    tokenize_outcomes,
)
from trainers.reward_models.preference import (
    DEFAULT_BUILTIN_TASKS,
    collate_pairs,
    collate_pairs_split,
    load_preference_records,
    split_train_eval,
    tokenize_records,
)
from trainers.reward_models.sources import chat_ids, read_rows
from trainers.reward_models.steps import (
    PRM_PROMPT,
    StepExample,
    collate_steps,
    encode_solution,
    load_step_records,
    parse_prm800k_row,
    rating_to_class,
    tokenize_steps,
    window_solution,
)

__all__ = [
    "BUILTIN_OUTCOMES",
    "BUILTIN_STEPS",
    "DEFAULT_BUILTIN_TASKS",
    "DatasetNotFoundError",
    "ERROR_KINDS",
    "GSM8K_SYSTEM_PROMPT",
    "OutcomeExample",
    "OutcomeRecord",
    "PRM_PROMPT",
    "PRM_TASK_CONFIG",
    "StepExample",
    "StepRecord",
    "builtin_outcome_records",
    "builtin_preference_records",
    "builtin_step_records",
    "chat_ids",
    "collate_outcomes",
    "collate_pairs",
    "collate_pairs_split",
    "collate_steps",
    "corrupt_final_answer",
    "encode_solution",
    "gsm8k_final_answer",
    "load_outcome_records",
    "load_preference_records",
    "load_step_records",
    "parse_outcome_row",
    "parse_prm800k_row",
    "rating_to_class",
    "read_rows",
    "right_pad",
    "split_train_eval",
    "tokenize_outcomes",
    "tokenize_records",
    "tokenize_steps",
    "window_solution",
]
