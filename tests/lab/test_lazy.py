"""Lazily loaded package attributes (rlhf_lab/_lazy.py): a name loads from its module on first
read and stays; a name outside the table is an AttributeError; ``wrap`` sees every loaded value."""

from __future__ import annotations

import sys
import types

import pytest

from rlhf_lab._lazy import lazy_attributes


@pytest.fixture
def package():
    module = types.ModuleType("lazy_probe_pkg")
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_a_name_loads_from_its_module_once_and_stays(package):
    seen = []
    getattr_, dir_ = lazy_attributes(
        package.__name__,
        {"sqrt": "math", "dumps": "json"},
        wrap=lambda name, value: seen.append(name) or value,
    )
    package.__getattr__, package.__dir__ = getattr_, dir_
    import math

    assert package.sqrt is math.sqrt
    assert "sqrt" in vars(package) and "dumps" not in vars(package)  # kept; the other not loaded
    assert package.sqrt is math.sqrt and seen == ["sqrt"]  # the second read is no load
    assert {"sqrt", "dumps"} <= set(dir(package))


def test_a_name_outside_the_table_is_an_attribute_error(package):
    package.__getattr__, _ = lazy_attributes(package.__name__, {"sqrt": "math"})
    with pytest.raises(AttributeError, match="lazy_probe_pkg.*'cos'"):
        package.cos  # noqa: B018
    assert not hasattr(package, "cos")
