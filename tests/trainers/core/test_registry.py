"""The decorator-built registries: one per kind of function, one signature per kind."""

from __future__ import annotations

import pytest

from trainers.core.registry import Registry
from trainers.core.spec import family_spec


def test_a_registered_function_is_returned_unchanged_and_found_by_name() -> None:
    reg = Registry("scaler", ("x", "k"))

    @reg.register("double")
    def double(x, k):
        return 2 * x * k

    assert reg["double"] is double and "double" in reg and list(reg) == ["double"]
    assert len(reg) == 1 and reg["double"](3, 1) == 6


def test_a_function_with_another_signature_is_refused() -> None:
    reg = Registry("scaler", ("x", "k"))
    with pytest.raises(TypeError, match=r"takes \('x',\), every scaler takes \('x', 'k'\)"):

        @reg.register("one")
        def one(x):
            return x

    with pytest.raises(TypeError):  # same arity, another name: refused as well

        @reg.register("renamed")
        def renamed(x, scale):
            return x * scale

    assert len(reg) == 0


def test_a_name_is_registered_once_and_an_unknown_one_lists_the_known() -> None:
    reg = Registry("scaler", ("x", "k"))
    reg.register("a")(lambda x, k: x)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a")(lambda x, k: k)
    with pytest.raises(KeyError, match="no scaler named 'b'; known: a"):
        reg["b"]


def test_every_policy_gradient_estimator_and_loss_sits_in_one_registry_of_its_kind() -> None:
    from trainers.policy_gradients import advantages, losses

    kinds = (advantages.ADVANTAGES, advantages.TOKEN_REWARD_ADVANTAGES, advantages.TOKEN_ADVANTAGES)
    assert all(isinstance(k, Registry) for k in (*kinds, losses.POLICY_LOSS_FUNCTIONS))
    assert len({k.parameters for k in kinds}) == len(kinds)  # one signature per kind
    for spec in family_spec("policy_gradients").algorithms:
        assert [spec.advantage in k for k in kinds].count(True) == 1, spec.name
        assert losses.POLICY_LOSSES[spec.name] is losses.POLICY_LOSS_FUNCTIONS[spec.loss]
    assert set(losses.POLICY_LOSSES) == set(family_spec("policy_gradients").algorithm_names)
