"""The calculator: exact rational arithmetic pinned against hand values, its bounds, and every
refusal as a short ToolError (never eval)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tests._helpers.tool_errors import assert_short_error
from trainers.core.environments.calculator import (
    MAX_MAGNITUDE,
    ToolError,
    calculate,
    calculator_tool,
    format_number,
)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1/3 + 1/6", Fraction(1, 2)),
        ("2**64", Fraction(18446744073709551616)),
        ("0.1 + 0.2", Fraction(3, 10)),
        ("1234*5678", Fraction(7006652)),
        ("7 // 2", Fraction(3)),
        ("-7 // 2", Fraction(-4)),
        ("7 % 3", Fraction(1)),
        ("7/2 % 1", Fraction(1, 2)),
        ("2 ** -3", Fraction(1, 8)),
        ("(2/3) ** 2", Fraction(4, 9)),
        ("-2 ** 2", Fraction(-4)),
        ("+(3 - 5) * -(1.5)", Fraction(3)),
        ("2.5e3 - 1_000", Fraction(1500)),
        ("1e-3", Fraction(1, 1000)),
        (".5 + 1.", Fraction(3, 2)),
        ("4 ** 0.0", Fraction(1)),
        ("10**50 * 10**50", Fraction(MAX_MAGNITUDE)),
        ("(1/10**50) / 10**50", 1 / Fraction(MAX_MAGNITUDE)),
    ],
)
def test_values_are_exact(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (Fraction(1234), "1234"),
        (Fraction(-5), "-5"),
        (Fraction(7, 3), "7/3"),
        (Fraction(-2, 4), "-1/2"),
    ],
)
def test_format_number_writes_integers_plainly_and_other_rationals_as_fractions(x, text):
    assert format_number(x) == text


def test_the_tool_formats_the_exact_value_and_trims_its_input():
    assert calculator_tool("\n 1/3 + 1/6 \n") == "1/2"
    assert calculator_tool("1234 * 5678") == "7006652"
    assert calculator_tool("22/7") == "22/7"


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("", "empty"),
        ("x + 1", "not 'x'"),
        ("abs(-1)", "not 'abs(-1)'"),
        ("__import__('os')", "not"),
        ("(1).real", "not"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1j * 2", "only numbers"),
        ("1 < 2", "not '1 < 2'"),
        ("[1, 2]", "not"),
        ("1 ^ 2", "operator ^"),
        ("~1", "not"),
        ("1 / 0", "division by zero"),
        ("1 // (2 - 2)", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("2 ** 0.5", "integer exponent"),
        ("2 ** 65", "exponent 65 is too large"),
        ("10**50 * 10**51", "result is too large"),
        ("99999999999 ** 64", "too large"),
        ("(10 ** 60) * (10 ** 60)", "too large"),
        ("1 / 10**101", "too large"),
        ("1e1000000000", "too large or too small"),
        ("1 +", "not an arithmetic expression"),
        ("1" + " + 1" * 100, "longer than 200"),
    ],
)
def test_anything_but_bounded_arithmetic_is_a_short_tool_error(expression, fragment):
    assert_short_error(ToolError, lambda: calculate(expression), fragment)


def test_a_tool_error_is_a_value_error():
    assert issubclass(ToolError, ValueError)
