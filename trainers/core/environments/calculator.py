"""The calculator tool: an arithmetic expression evaluated exactly, with rationals, never ``eval``.

Accepted: integers, decimals and scientific literals (``0.1`` is exactly 1/10, ``2.5e3`` is
2500), ``+ - * / // % **``, unary ``+``/``-`` and parentheses. ``**`` takes an integer exponent
with ``|exponent| <= 64``. Every number met on the way (literal, intermediate, result) must have a
numerator and a denominator of absolute value at most ``10**100`` (:data:`MAX_MAGNITUDE`), and
the expression is at most 200 characters; anything else (names, calls, attributes, strings,
comparisons, division by zero) is a :class:`ToolError` with a short message.

Output (:func:`format_number`): an integer as ``1234`` or ``-5``; any other rational as an exact
fraction in lowest terms, ``7/3`` or ``-1/2`` (never a rounded decimal).
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from fractions import Fraction

from trainers.core.environments.errors import ToolError

__all__ = ["MAX_MAGNITUDE", "ToolError", "calculate", "calculator_tool", "format_number"]

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**100
_MAX_BITS = MAX_MAGNITUDE.bit_length()
_MAX_LITERAL_EXPONENT = 200
_DECIMAL = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE]([+-]?\d+))?")

_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_SYMBOLS = {ast.Pow: "**", ast.BitXor: "^", ast.BitAnd: "&", ast.BitOr: "|", ast.MatMult: "@"}


def calculate(expression: str) -> Fraction:
    """The exact value of an arithmetic ``expression``; :class:`ToolError` when it is not one."""
    text = expression.strip()
    if not text:
        raise ToolError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {text[:60]}") from None
    return _evaluate(tree.body, text)


def format_number(x: Fraction) -> str:
    """``1234`` for an integer, ``7/3`` (lowest terms, sign in front) for any other rational."""
    if x.denominator == 1:
        return str(x.numerator)
    return f"{x.numerator}/{x.denominator}"


def calculator_tool(body: str) -> str:
    """The calculator as a tool: the formatted exact value of the expression in ``body``."""
    return format_number(calculate(body))


def _evaluate(node: ast.expr, text: str) -> Fraction:
    if isinstance(node, ast.Constant):
        return _bounded(_literal(node, text))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _evaluate(node.operand, text)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, text), _evaluate(node.right, text)
        if isinstance(node.op, ast.Pow):
            return _bounded(_power(left, right))
        apply = _BINARY.get(type(node.op))
        if apply is None:
            symbol = _SYMBOLS.get(type(node.op), type(node.op).__name__)
            raise ToolError(f"operator {symbol} is not supported; use + - * / // % **")
        try:
            return _bounded(apply(left, right))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
    raise ToolError(f"only numbers and + - * / // % ** are allowed, not {_describe(node, text)}")


def _literal(node: ast.Constant, text: str) -> Fraction:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolError(f"only numbers are allowed, not {_describe(node, text)}")
    if isinstance(value, int):
        return Fraction(value)
    source = (ast.get_source_segment(text, node) or "").replace("_", "")
    decimal = _DECIMAL.fullmatch(source)
    if decimal is None:
        raise ToolError(f"cannot read the number {source!r}")
    if decimal.group(1) and abs(int(decimal.group(1))) > _MAX_LITERAL_EXPONENT:
        raise ToolError(f"number {source} is too large or too small")
    return Fraction(source)


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise ToolError("** takes an integer exponent only")
    power = exponent.numerator
    if abs(power) > MAX_EXPONENT:
        raise ToolError(f"exponent {power} is too large (at most {MAX_EXPONENT} in size)")
    if base == 0 and power < 0:
        raise ToolError("division by zero")
    bits = max(base.numerator.bit_length(), base.denominator.bit_length())
    if (bits - 1) * abs(power) > _MAX_BITS:
        raise ToolError("result is too large (numbers are limited to 10**100)")
    return base**power


def _bounded(x: Fraction) -> Fraction:
    if abs(x.numerator) > MAX_MAGNITUDE or x.denominator > MAX_MAGNITUDE:
        raise ToolError("result is too large (numbers are limited to 10**100)")
    return x


def _describe(node: ast.expr, text: str) -> str:
    source = ast.get_source_segment(text, node) or type(node).__name__
    return repr(source[:40])
