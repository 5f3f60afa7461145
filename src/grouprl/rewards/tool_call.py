"""Tool-call accuracy: right tool, right arguments.

Calls are parsed, never evaluated: the Python-call syntax ``name(arg=..., ...)`` (as in ``calculator(expression='3.14159 * 5**2')``) with Python's ``ast``
(literal values via ``ast.literal_eval``; any other expression is kept as its source text), and JSON
``{"name": ..., "arguments": {...}}`` (``arguments`` may itself be a JSON string, as in OpenAI's format).
In a completion the calls are the ``<tool_call>`` blocks; a bare call / JSON object is also accepted.
``parse_tool_blocks`` is the same parser for multi-turn rollouts: only ``<tool_call>`` blocks count, and
each malformed one comes with the reason, which the rollout returns to the model as the tool result.

Score of one call: 0.5 for the right name + 0.5 for exactly the right arguments.
``shaped=True`` replaces the exact-argument half with per-key credit: half for the key set (Jaccard)
and half for the fraction of keys whose values match. Several gold calls are matched in order and the
sum is divided by ``max(#gold, #predicted)``, so extra calls never help. More than ``max_calls`` calls
scores 0. With ``schema`` (a JSON schema of the arguments, or ``{tool name: schema}``), arguments that
fail validation, or a tool the schemas do not know, earn no argument credit.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from grouprl.registry import REWARDS
from grouprl.rewards import _text

Call = dict  # {"name": str, "arguments": dict}


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ast.unparse(node)


def _parse_python_call(text: str) -> tuple[Call | None, str | None]:
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        return None, f"not valid call syntax ({type(e).__name__})"
    node = tree.body
    if not isinstance(node, ast.Call):
        return None, "not a call: expected name(arg=...) or a JSON object"
    if not isinstance(node.func, (ast.Name, ast.Attribute)):
        return None, "the called object is not a plain name"
    try:
        name = ast.unparse(node.func)
    except (ValueError, RecursionError):
        return None, "the called name cannot be read"
    args: dict[str, Any] = {str(i): _literal(a) for i, a in enumerate(node.args)}
    for kw in node.keywords:
        if kw.arg is None:  # **kwargs cannot be resolved without evaluating
            return None, "**kwargs cannot be resolved without evaluating code"
        args[kw.arg] = _literal(kw.value)
    return {"name": name, "arguments": args}, None


def _parse_json_call(obj: Any) -> tuple[Call | None, str | None]:
    if isinstance(obj, dict) and "function" in obj and isinstance(obj["function"], dict):
        obj = obj["function"]  # OpenAI {"type": "function", "function": {...}}
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    if not isinstance(obj.get("name"), str):
        return None, "missing the string field 'name'"
    args = next((obj[k] for k in ("arguments", "args", "parameters") if k in obj), {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return None, "'arguments' is a string that is not valid JSON"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, f"'arguments' must be an object, got {type(args).__name__}"
    return {"name": obj["name"], "arguments": args}, None


def parse_tool_call_reason(text: Any) -> tuple[Call | None, str | None]:
    """``(call, None)`` for a parseable call, else ``(None, reason)`` saying what is malformed.

    The one parser behind :func:`parse_tool_call`, the ``tool_call`` reward and the multi-turn rollout
    (``grouprl.rollout.multiturn``), which returns the reason to the model as the tool result.

    >>> parse_tool_call_reason('{"name": "search", "arguments": [1]}')
    (None, "'arguments' must be an object, got list")
    """
    if isinstance(text, dict):
        return _parse_json_call(text)
    if not isinstance(text, str) or not text.strip():
        return None, "empty tool call"
    s = text.strip()
    if s.startswith("{"):
        try:
            return _parse_json_call(json.loads(s))
        except (json.JSONDecodeError, RecursionError) as e:
            return None, f"invalid JSON ({getattr(e, 'msg', type(e).__name__)})"
    return _parse_python_call(s)


def parse_tool_call(text: Any) -> Call | None:
    """One call from ``name(a=1)`` syntax, a JSON string, or an already-parsed dict; else ``None``.

    >>> parse_tool_call("calculator(expression='3.14159 * 5**2')")
    {'name': 'calculator', 'arguments': {'expression': '3.14159 * 5**2'}}
    >>> parse_tool_call('{"name": "search", "arguments": {"q": "GRPO"}}')
    {'name': 'search', 'arguments': {'q': 'GRPO'}}
    """
    return parse_tool_call_reason(text)[0]


def parse_tool_calls(text: Any) -> list[Call | None]:
    """Every call in ``text``: each ``<tool_call>`` block (``None`` where unparseable), else the bare text."""
    if isinstance(text, (list, tuple)):
        return [parse_tool_call(t) for t in text]
    if isinstance(text, dict):
        return [parse_tool_call(text)]
    if not isinstance(text, str):
        return []
    bodies = _text.tool_call_bodies(text)
    if bodies:
        return [parse_tool_call(b) for b in bodies]
    final = _text.split_think(text).final
    one = parse_tool_call(final if final is not None else text)
    return [one] if one is not None else []


def parse_tool_blocks(text: str) -> list[tuple[Call | None, str | None]]:
    """Each ``<tool_call>`` block of a model turn as ``(call, None)`` or ``(None, reason)``, in order.

    Unlike :func:`parse_tool_calls` this never falls back to the bare text (an answer that merely looks
    like a call is an answer), and an unclosed final block is reported as malformed, so a multi-turn
    rollout can tell the model exactly what to fix. ``[]`` means the turn called no tool.

    >>> parse_tool_blocks('<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>f(</tool_call>')
    [({'name': 'f', 'arguments': {}}, None), (None, 'not valid call syntax (SyntaxError)')]
    """
    out = [parse_tool_call_reason(body) for body in _text.tool_call_bodies(text)]
    tail = text.rsplit(_text.TOOL_CLOSE, 1)[-1]
    if _text.TOOL_OPEN in tail:
        out.append((None, f"unclosed {_text.TOOL_OPEN} block: close it with {_text.TOOL_CLOSE}"))
    return out


def _norm(v: Any) -> Any:
    """Canonical value for comparison: 1 == 1.0, but True is not 1; dict/list compared deeply."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return (type(v).__name__, v)
    if isinstance(v, (int, float)):
        return ("num", float(v))
    if isinstance(v, dict):
        return ("dict", tuple(sorted((str(k), _norm(x)) for k, x in v.items())))
    if isinstance(v, (list, tuple)):
        return ("list", tuple(_norm(x) for x in v))
    return ("other", repr(v))


def _schema_ok(call: Call, schema: dict | None) -> bool:
    if schema is None:
        return True
    import jsonschema

    if "type" not in schema and "properties" not in schema:  # {tool name: schema}
        if call["name"] not in schema:
            return False
        schema = schema[call["name"]]
    try:
        jsonschema.validate(call["arguments"], schema)
    except jsonschema.ValidationError:
        return False
    except jsonschema.SchemaError as e:
        from grouprl.errors import ConfigError

        raise ConfigError(f"tool_call reward: the given JSON schema is invalid: {e.message}") from e
    return True


def _args_score(pred: dict, gold: dict, shaped: bool) -> float:
    if not shaped:
        return 1.0 if _norm(pred) == _norm(gold) else 0.0
    keys = set(pred) | set(gold)
    if not keys:
        return 1.0
    common = set(pred) & set(gold)
    same = sum(1 for k in common if _norm(pred[k]) == _norm(gold[k]))
    return 0.5 * len(common) / len(keys) + 0.5 * same / len(keys)


def call_score(pred: Call | None, gold: Call, *, shaped: bool = False, schema: dict | None = None) -> float:
    """0.5 * (name matches) + 0.5 * (arguments match, exactly or shaped); 0 for an unparseable call."""
    if pred is None:
        return 0.0
    score = 0.5 if pred["name"] == gold["name"] else 0.0
    if _schema_ok(pred, schema):
        score += 0.5 * _args_score(pred["arguments"], gold["arguments"], shaped)
    return score


@REWARDS.register("tool_call")
def tool_call_reward(
    completion: str,
    *,
    answer=None,
    shaped: bool = False,
    schema: dict | None = None,
    max_calls: int = 8,
    **meta,
) -> float | None:
    """Tool-call accuracy in [0, 1]: 0.5 for the right name + 0.5 for exact arguments, per gold call.

    ``answer`` holds the gold call(s) (``name(k=v)`` or JSON); ``None`` when it cannot be parsed.
    ``shaped=True`` credits each argument key and value, ``schema`` validates the arguments, and more
    than ``max_calls`` calls score 0.

    >>> tool_call_reward("<tool_call>search(q='GRPO', k=3)</tool_call>", answer="search(q='GRPO', k=5)")
    0.5
    >>> tool_call_reward("<tool_call>search(q='GRPO', k=3)</tool_call>", answer="search(q='GRPO', k=5)", shaped=True)
    0.875
    """
    golds = parse_tool_calls(answer) if answer is not None else []
    if not golds or any(g is None for g in golds):
        return None
    preds = parse_tool_calls(completion) if isinstance(completion, str) else []
    if not preds or len(preds) > max_calls:
        return 0.0
    total = sum(call_score(p, g, shaped=shaped, schema=schema) for p, g in zip(preds, golds))
    return total / max(len(golds), len(preds))


# fixed options (make_reward_func, reward_kwargs) must be named parameters: **meta only takes dataset columns
tool_call_reward.passes_options_to = ()
