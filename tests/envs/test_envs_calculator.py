"""The calculator environment: exact, bounded arithmetic through an AST walk (never eval)."""

from __future__ import annotations

import time

import pytest

from grouprl.envs import CalculatorEnv, calculator, call_with_timeout, evaluate, make_env_factory
from grouprl.envs.calculator import CalculatorError


@pytest.mark.parametrize("expression,expected", [
    ("3.14159 * 5**2", "78.53975"),  # 3.14159 * 25 = 78.53975
    ("1 + 2 * 3", "7"),
    ("(1 + 2) * 3", "9"),
    ("7 / 2", "3.5"),
    ("8 / 2", "4.0"),  # true division gives a float, as in Python
    ("7 // 2", "3"),
    ("-7 // 2", "-4"),  # floor division rounds down
    ("7 % 3", "1"),
    ("-(2 + 3)", "-5"),
    ("+4", "4"),
    ("2 ** -2", "0.25"),
    ("0.1 + 0.2", "0.30000000000000004"),  # floats shown in full (repr), not rounded
    ("2**100 + 1", "1267650600228229401496703205377"),  # exact: 2**100 = 1267650600228229401496703205376
    ("10**30 // 7", "142857142857142857142857142857"),
    ("  12  ", "12"),
])
def test_valid_expressions(expression, expected):
    assert calculator(expression) == expected


def test_integers_stay_exact_where_floats_would_round():
    big = evaluate("3**200 - 1")
    assert isinstance(big, int) and big == 3**200 - 1 and big % 2 == 0
    assert evaluate("2**53 + 1") == 9007199254740993  # float(2**53 + 1) would be ...992
    assert len(calculator("2**3321")) == 1000  # 3321 * log10(2) = 999.7: exactly 1000 digits
    # the largest result allowed: 10**1000 - 1, built without the 1001-digit intermediate 10**1000
    assert calculator("9 * 10**999 + (10**999 - 1)") == "9" * 1000


@pytest.mark.parametrize("expression,error,message", [
    ("1 / 0", ZeroDivisionError, "division by zero"),
    ("5 // 0", ZeroDivisionError, "division by zero"),
    ("5 % 0.0", ZeroDivisionError, "division by zero"),
    ("2 +", CalculatorError, "invalid syntax"),
    ("", CalculatorError, "empty"),
    ("x + 1", CalculatorError, "the name 'x' is not allowed"),
    ("__import__('os').system('true')", CalculatorError, "function call is not allowed"),
    ("abs(-3)", CalculatorError, "function call is not allowed"),
    ("(1).real", CalculatorError, "Attribute is not allowed"),
    ("'a' * 3", CalculatorError, "the constant 'a' is not allowed"),
    ("True + 1", CalculatorError, "the constant True is not allowed"),
    ("1 << 3", CalculatorError, "the operator LShift is not allowed"),
    ("[1, 2]", CalculatorError, "List is not allowed"),
    ("2**3322", CalculatorError, "more than 1000 digits"),
    ("10**999 * 10", CalculatorError, "more than 1000 digits"),
    ("10.0 ** 400", CalculatorError, "too large for a floating-point number"),
    ("(-8) ** 0.5", CalculatorError, r"\(-8\)\*\*0.5 is not a real number"),
    ("1" * 1001, CalculatorError, "longer than 1000 characters"),
])
def test_refused_expressions(expression, error, message):
    with pytest.raises(error, match=message):
        evaluate(expression)


@pytest.mark.parametrize("expression", ["2**10**10", "9**9**9", "(10**500)**(10**500)", "2**10000 * 2**10000"])
def test_huge_powers_are_refused_before_they_are_computed(expression):
    t0 = time.monotonic()
    with pytest.raises(CalculatorError, match="too large|more than 1000 digits"):
        evaluate(expression)
    assert time.monotonic() - t0 < 0.5


def test_calculator_environment_through_the_contract():
    env = make_env_factory(environment_factory=CalculatorEnv)()
    assert env.reset({"prompt": "What is 6 * 7?", "answer": "42"}) is None
    assert env.call("calculator", {"expression": "6 * 7"}) == "42"
    assert call_with_timeout(env, "calculator", {"expression": "1/0"}, 5.0) == (
        "error: tool 'calculator' raised ZeroDivisionError: division by zero", "exception")
    assert call_with_timeout(env, "calculator", {"expression": "x"}, 5.0) == (
        "error: tool 'calculator' raised CalculatorError: the name 'x' is not allowed; use numbers, "
        "+ - * / // % **, and parentheses", "exception")
    assert env.instance.num_calls == 3 and env.reward() is None
    # the plain function works as tools=[calculator] too, with the same schema
    assert make_env_factory(tools=[calculator])().tools == env.tools
