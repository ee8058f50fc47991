"""Bad input, config overrides: fuzzed with hypothesis through api.resolve_config and
shrink_config, they give a valid, finite, YAML-writable config or a LabError / ConfigError with
a message, never another error (docs/architecture.md, "Engineering rules").

tests/lab/test_ledger.py holds the basic cases; this file adds the fuzzing. The shared helpers
and the fixtures are in _bad_input.py.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml
from _bad_input import (  # noqa: F401  (lab_root, no_trainer: fixtures)
    FUZZ,
    YAML_SPECIAL,
    assert_one_clear_message,
    lab_root,
    override_strategy,
)
from hypothesis import given
from hypothesis import strategies as st

from rlhf_lab import api
from rlhf_lab.paths import LabError
from rlhf_lab.planning.configs import validate_data
from rlhf_lab.planning.overrides import as_overrides
from trainers.core.config import ConfigError

pytestmark = pytest.mark.usefixtures("lab_root")


# ---------------------------------------------------------------------------------------------
# Config overrides fuzzed
# ---------------------------------------------------------------------------------------------


RECIPES = ["dpo", "kto", "simpo", "grpo", "ppo", "rloo", "preference_rm", "prm", "sft"]
RECIPES += ["top_per_prompt", "random_k_overall"]


def assert_usable_config(family: str, data: dict) -> None:
    """A config the lab accepted is what a trainer can run: it validates again, every float is
    finite, and it survives the YAML and JSON round trips the run folder uses."""

    def floats(node):
        if isinstance(node, dict):
            for v in node.values():
                yield from floats(v)
        elif isinstance(node, list):
            for v in node:
                yield from floats(v)
        elif isinstance(node, float):
            yield node

    assert all(math.isfinite(x) for x in floats(data))
    validate_data(family, data)
    assert yaml.safe_load(yaml.safe_dump(data, sort_keys=False)) == data
    json.dumps(data, allow_nan=False)


def resolve(recipe: str, overrides: list[str]):
    """``api.resolve_config`` with the strings parsed as a surface parses them."""
    return api.resolve_config(recipe, as_overrides(overrides))


def resolve_or_refuse(call, *args, **kwargs):
    """The result, or None for a LabError / ConfigError with a message; anything else raises."""
    try:
        return call(*args, **kwargs)
    except (LabError, ConfigError) as err:
        assert_one_clear_message(str(err))
        return None


@FUZZ
@given(
    recipe=st.sampled_from(RECIPES),
    overrides=st.lists(override_strategy, min_size=1, max_size=4),
    model=st.sampled_from([None, "tiny"]),
)
def test_fuzzed_overrides_give_a_valid_config_or_one_lab_error(recipe, overrides, model):
    resolved = resolve_or_refuse(resolve, recipe, overrides)
    if resolved is not None:
        assert_usable_config(resolved.family, resolved.data)
    shrunk = resolve_or_refuse(api.shrink_config, recipe, overrides, model=model)
    if shrunk is not None:
        assert_usable_config(shrunk.family, shrunk.config)


# One key per kind of field (int, float, str, bool, optional list, section, top-level int).
TYPED_KEYS = [
    "train.batch_size",
    "train.learning_rate",
    "model.name",
    "checkpoint.save_final_model",
    "data.builtin_tasks",
    "train",
    "seed",
]


@pytest.mark.parametrize("value", YAML_SPECIAL, ids=lambda v: repr(v)[:30])
def test_every_hostile_value_on_every_kind_of_field(value):
    """The deterministic half of the fuzzing: each hostile value on each kind of field."""
    for key in TYPED_KEYS:
        resolved = resolve_or_refuse(resolve, "dpo", [f"{key}={value}"])
        if resolved is not None:
            assert_usable_config(resolved.family, resolved.data)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("train.learning_rate=" + "9" * 4400, "finite number"),  # int() refuses 4300+ digits
        ("train.batch_size=" + "[" * 700, "valid integer"),  # deeper than the recursion limit
        ("train.learning_rate=.inf", "finite number"),
        ("beta=.nan", "finite number"),
        ("gamma=1e999", "finite number"),
        ("train.batch_size=&a [*a]", "train.batch_size"),  # a list that contains itself
        ("seed=!!python/object/apply:os.system ['echo pwned']", "seed"),
    ],
)
def test_override_values_yaml_or_python_cannot_hold_are_config_errors(override, needle):
    """Found by the fuzzer: these used to escape as ValueError / RecursionError or were accepted
    as inf / nan learning rates."""
    with pytest.raises(LabError) as err:
        api.resolve_config("dpo", as_overrides([override]))
    text = str(err.value)
    assert needle in text and len(text) < 6000 + len(override), text[:500]
    assert_one_clear_message(text)
