"""``data.builtin_task_configs`` of the ORM and PRM offline sets: the problems follow the given
reasoning-gym settings (so an ORM, a PRM and a policy can share one problem distribution), the
defaults are unchanged, and the setting is refused where it cannot apply."""

from __future__ import annotations

import pytest

from trainers.core.builtin_data import builtin_outcome_records, builtin_step_records
from trainers.reward_models.config import RewardModelConfig
from trainers.reward_models.outcome import load_outcome_records
from trainers.reward_models.steps import load_step_records

THREE_ONE_DIGIT = {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}


def _terms(expression: str) -> list[str]:
    return expression.split()[0::2]


def test_outcome_set_follows_the_chain_sum_settings_and_keeps_its_default():
    records = load_outcome_records(
        "builtin:reasoning-outcomes:chain_sum",
        max_samples=12,
        rollouts_per_prompt=4,
        seed=5,
        task_configs={"chain_sum": THREE_ONE_DIGIT},
    )
    assert len(records) == 12
    for rec in records:
        terms = _terms(rec.meta["entry"]["metadata"]["expression"])
        assert len(terms) == 3 and all(len(t) == 1 for t in terms), terms
        assert 0 < sum(rec.labels) < len(rec.labels)
    # no settings: the set is the default one, record for record
    default = builtin_outcome_records(12, 5, 4, ["chain_sum"])
    assert [r.completions for r in builtin_outcome_records(12, 5, 4, ["chain_sum"], {})] == [
        r.completions for r in default
    ]
    assert any(len(_terms(r.meta["entry"]["metadata"]["expression"])) == 2 for r in default)


def test_step_set_follows_the_chain_sum_settings():
    records = load_step_records(
        "builtin:reasoning-steps",
        max_samples=20,
        seed=2,
        task_configs={"chain_sum": {"min_terms": 2, "max_terms": 2}},
    )
    for rec in records:
        lead = 1 if rec.ratings[0] == 0 else 0
        assert len(rec.steps) == lead + 1 + 1  # one operation, then "The answer is ..."
        assert len(_terms(rec.meta["entry"]["metadata"]["expression"])) == 2
    plain = load_step_records("builtin:reasoning-steps", max_samples=20, seed=2)
    assert [r.steps for r in plain] == [r.steps for r in builtin_step_records(20, _seed(2))]


def _seed(seed: int) -> int:
    from trainers.core.splits import split_seed

    return split_seed(seed, "train")


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"kind": "preference", "data": {"dataset": "builtin:reasoning-preferences"}}, "offline"),
        ({"kind": "orm", "data": {"dataset": "some/hub-set"}}, "offline"),
        ({"kind": "prm", "data": {"dataset": "builtin:reasoning-steps"}}, "only chain_sum"),
    ],
)
def test_task_configs_refused_where_they_cannot_apply(data, needle):
    data["data"]["builtin_task_configs"] = {"letter_counting": {"min_words": 2}}
    with pytest.raises(ValueError, match=needle):
        RewardModelConfig.model_validate(data)
    ok = {"kind": "prm", "data": {"dataset": "builtin:reasoning-steps"}}
    ok["data"]["builtin_task_configs"] = {"chain_sum": {"max_terms": 4}}
    assert RewardModelConfig.model_validate(ok).data.builtin_task_configs["chain_sum"]
