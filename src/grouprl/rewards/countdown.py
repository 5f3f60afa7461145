"""``countdown_reward``: reach a target with + - * from given numbers, each used exactly once.

The Countdown game as an RL task (TinyZero, Pan et al. 2025, https://github.com/Jiayi-Pan/TinyZero;
also the countdown task of reasoning-gym): the prompt gives the numbers and the target, so a reward
that compares the final *value* with the target (``accuracy``) pays 1.0 for repeating the target from
the prompt. This reward checks the expression itself: only integers, + - * and brackets (parsed with
``ast``, never ``eval`` of arbitrary text), every given number used exactly once, and the value equal
to the target.
"""

from __future__ import annotations

import ast
import re
from collections import Counter

from grouprl.registry import REWARDS
from grouprl.rewards import _text
from grouprl.rewards._limit import time_limited

_ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.USub)
_ANSWER_LINE_RE = re.compile(r"Answer:[ \t]*([^\n]*)")
_MAX_EXPR_CHARS = 200


def safe_eval(expr: str) -> int | None:
    """Value of an integer expression with + - * and brackets; ``None`` for anything else.

    >>> safe_eval("(2+3)*4"), safe_eval("2**3"), safe_eval("__import__('os')")
    (20, None, None)
    """
    if len(expr) > _MAX_EXPR_CHARS:
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            return None
        if isinstance(node, ast.Constant) and (type(node.value) is not int or node.value > 10**6):
            return None
    try:
        value = eval(compile(tree, "<countdown>", "eval"), {"__builtins__": {}}, {})  # noqa: S307 (checked AST)
    except (ArithmeticError, ValueError, RecursionError):
        return None
    return value if isinstance(value, int) else None


@REWARDS.register("countdown")
@time_limited
def countdown_reward(completion: str, *, numbers=None, target=None, answer=None, **meta) -> float | None:
    """1.0 if the final expression uses each given number exactly once and equals the target, else 0.0.

    The expression is the last ``<answer>...</answer>`` block, or else the rest of the last
    ``Answer:`` line (the built-in demonstrations' format; also what remains of a tokenizer whose
    ``<answer>`` tags are special tokens when a trainer decodes with ``skip_special_tokens=True``).

    >>> countdown_reward("<think>2+3=5, 5*4=20</think>Answer: (2+3)*4", numbers=[2, 3, 4], target=20)
    1.0
    >>> countdown_reward("<answer>(2+3)*4</answer>", numbers=[2, 3, 4], target=20)
    1.0
    >>> countdown_reward("Answer: 20", numbers=[2, 3, 4], target=20)   # just the target: a hack
    0.0
    >>> countdown_reward("Answer: 4*4+4", numbers=[2, 3, 4], target=20)  # a number used twice
    0.0
    >>> countdown_reward("Answer: 5*4", numbers=[2, 3, 4, 5], target=20)  # 2 and 3 not used
    0.0

    Returns ``None`` (no opinion) when the row has no ``numbers`` or ``target``.
    """
    if isinstance(completion, list):  # chat format: score the last message
        completion = completion[-1]["content"] if completion else ""
    if numbers is None or (target is None and answer is None):
        return None
    goal = int(target if target is not None else answer)
    found = _text.tag_blocks(completion, _text.ANSWER_OPEN, _text.ANSWER_CLOSE)[0]
    found = found or _ANSWER_LINE_RE.findall(completion)
    if not found:
        return 0.0
    expr = found[-1].strip()
    used = [int(tok) for tok in re.findall(r"\d+", expr)]
    if not used or Counter(used) != Counter(int(n) for n in numbers):
        return 0.0
    return 1.0 if safe_eval(expr) == goal else 0.0


countdown_reward.passes_options_to = ()  # **meta takes only dataset columns
