"""The ``calculator`` environment: exact, bounded arithmetic for a model that calls a calculator tool.

The expression is parsed with :mod:`ast` and walked node by node; only numbers, ``+ - * / // % **``,
unary ``+``/``-`` and parentheses are accepted (never ``eval``: a name, call, attribute or subscript is
refused). Integer arithmetic stays exact (``2**100`` is all 31 digits); ``/`` gives a float as in Python.
Results are bounded before they are computed, so ``2**10**10`` is refused at once instead of
exhausting memory. Hand-written because no small library does bounded exact arithmetic; the walk is
~60 lines.
"""

from __future__ import annotations

import ast
import math
import operator

from grouprl.registry import ENVIRONMENTS

MAX_DIGITS = 1000  # largest |integer result|, in decimal digits
MAX_EXPONENT = 10_000  # largest |exponent| of a power
MAX_LENGTH = 1000  # longest expression accepted, in characters


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or its result would be too large."""


_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**"}


def _log10_floor_bound(x: int) -> float:
    """A lower bound of log10|x| from the bit length (cheap even for huge x); 0 for |x| <= 1."""
    return max(abs(x).bit_length() - 1, 0) * math.log10(2)


def _power(base: int | float, exp: int | float) -> int | float:
    shown = f"({base})**{exp}" if base < 0 else f"{base}**{exp}"
    if abs(exp) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exp} is too large (|exponent| <= {MAX_EXPONENT})")
    # log10|b**e| >= e * bound(b): refuse before computing when the result surely has > MAX_DIGITS digits
    if isinstance(base, int) and isinstance(exp, int) and exp > 0 and exp * _log10_floor_bound(base) >= MAX_DIGITS:
        raise CalculatorError(f"{shown} has more than {MAX_DIGITS} digits")
    try:
        result = base**exp
    except OverflowError:
        raise CalculatorError(f"{shown} is too large for a floating-point number") from None
    if isinstance(result, complex):
        raise CalculatorError(f"{shown} is not a real number")
    return result


def _too_long(x: int) -> bool:
    """|x| has more than MAX_DIGITS decimal digits (the bit length decides, except near the limit)."""
    if _log10_floor_bound(x) >= MAX_DIGITS:
        return True
    if abs(x).bit_length() * math.log10(2) < MAX_DIGITS:
        return False
    return len(str(abs(x))) > MAX_DIGITS  # within a bit of the limit: count exactly (~1000 digits)


def _check(value: int | float) -> int | float:
    if isinstance(value, int) and _too_long(value):
        raise CalculatorError(f"the result has more than {MAX_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is too large for a floating-point number")
    return value


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _check(_power(left, right))
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ZeroDivisionError("division by zero")
        try:
            return _check(_BINARY[type(node.op)](left, right))
        except OverflowError as e:
            raise CalculatorError(f"the result is too large ({e})") from None
    what = type(node).__name__
    if isinstance(node, ast.Name):
        what = f"the name {node.id!r}"
    elif isinstance(node, ast.Call):
        what = "a function call"
    elif isinstance(node, ast.Constant):
        what = f"the constant {node.value!r}"
    elif isinstance(node, (ast.BinOp, ast.UnaryOp)):
        what = f"the operator {type(node.op).__name__}"
    raise CalculatorError(f"{what} is not allowed; use numbers, + - * / // % **, and parentheses")


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic ``expression``; CalculatorError / ZeroDivisionError when it has none.

    >>> evaluate("3.14159 * 5**2")
    78.53975
    >>> evaluate("2**100 + 1")
    1267650600228229401496703205377
    """
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("the expression is empty")
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"the expression is longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"invalid syntax in {expression!r} ({e.msg})") from None
    except ValueError as e:  # e.g. a null byte
        raise CalculatorError(f"invalid expression: {e}") from None
    return _eval(tree)


def format_number(value: int | float) -> str:
    """Integers in full; floats by ``repr`` (shortest round-trip: ``78.53975``), whole floats as ``4.0``."""
    return str(value) if isinstance(value, int) else repr(float(value))


def calculator(expression: str) -> str:
    """
    Evaluate an arithmetic expression exactly.

    Args:
        expression: Numbers combined with + - * / // % ** and parentheses, e.g. '3.14159 * 5**2'.

    Returns:
        The value of the expression.
    """
    return format_number(evaluate(expression))


@ENVIRONMENTS.register("calculator")
class CalculatorEnv:
    """A calculator tool for arithmetic word problems (exact integers, no eval)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self, **row) -> str | None:
        self.num_calls = 0
        return None

    def calculator(self, expression: str) -> str:
        """
        Evaluate an arithmetic expression exactly.

        Args:
            expression: Numbers combined with + - * / // % ** and parentheses, e.g. '3.14159 * 5**2'.

        Returns:
            The value of the expression.
        """
        self.num_calls += 1
        return calculator(expression)
