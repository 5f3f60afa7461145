"""Tool calls over the chat endpoint, in the same shape as a multi-turn training trajectory.

- **Out**: the model writes ``<tool_call>...</tool_call>`` blocks, as in its rollouts. They are parsed by
  :func:`grouprl.rewards.tool_call.parse_tool_blocks` -- the parser of the multi-turn rollout and of the
  ``tool_call`` reward -- so JSON ``{"name": ..., "arguments": {...}}`` and Python-call
  ``calculator(expression="3 * 4")`` blocks both become OpenAI ``tool_calls`` with fresh ids; a block
  that does not parse stays in the reply's text, where the client sees it.
- **Back in**: a later request carries the assistant turn as ``tool_calls`` (``content`` often null) and
  the results as ``tool`` messages. The server remembers the exact text of every turn it returned with
  tool calls (:class:`TurnMemory`, keyed by the call ids), so the history renders to the very tokens the
  model sampled -- the trajectory a rollout builds. Calls it did not produce are written as JSON blocks
  (or passed as ``tool_calls`` to a template that renders them); a ``tool`` message becomes
  ``{"role": "tool", "name": <the call's function>, "content": ...}``, what the rollout appends.
- **Constrained**: ``tool_choice="required"`` or a named function decodes under a grammar of exactly
  one block (:func:`call_grammar`): the tool's name, then its arguments as JSON of the tool's
  ``parameters`` schema or as Python keyword arguments (the model's probabilities choose the form).
  A schema the grammar cannot enforce falls back to any JSON object of arguments.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from typing import Any

from grouprl.rewards._text import TOOL_CLOSE, TOOL_OPEN
from grouprl.rewards.tool_call import parse_tool_blocks
from grouprl.serve.grammar import (
    MAX_DEPTH,
    MAX_KEYS,
    Alt,
    Grammar,
    Lit,
    Node,
    Num,
    Rep,
    Seq,
    Str,
    _any_value,
    _node,
)


def _json_arguments(schema: Any) -> Node:
    try:
        return _node(schema, "$") if isinstance(schema, dict) and schema.get("properties") else _any_object()
    except ValueError:
        return _any_object()


def _any_object() -> Node:
    return Rep("{", Seq(Str(), Lit(": "), _any_value(MAX_DEPTH - 1)), ", ", "}", 0, MAX_KEYS)


def _python_value(schema: Any) -> Node | None:
    if not isinstance(schema, dict):
        return None
    if "enum" in schema and all(isinstance(v, (str, int, float)) for v in schema["enum"]):
        return Alt(*(Lit(json.dumps(v)) for v in schema["enum"]))
    kind = schema.get("type")
    if kind == "string":
        return Str(int(schema.get("maxLength", 64)))
    if kind in ("integer", "number"):
        return Num(kind == "integer", schema.get("minimum"), schema.get("maximum"))
    if kind == "boolean":
        return Alt(Lit("True"), Lit("False"))
    return None


def _python_call(name: str, schema: Any) -> Node | None:
    """``name(key="...", n=3)`` with every property in the schema's order; None when a value is not a
    string, number, boolean or enum (JSON and Python spell the others differently)."""
    props = (schema or {}).get("properties") or {} if isinstance(schema, dict) else {}
    parts: list[Node] = [Lit(f"{name}(")]
    for i, (key, sub) in enumerate(props.items()):
        value = _python_value(sub)
        if value is None or not key.isidentifier():
            return None
        parts += [Lit((", " if i else "") + f"{key}="), value]
    return Seq(*parts, Lit(")"))


def call_grammar(tools: list[dict]) -> Grammar:
    """Exactly one ``<tool_call>`` block calling one of ``tools`` (OpenAI tool objects)."""
    options: list[Node] = []
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters")
        options.append(Seq(Lit('{"name": ' + json.dumps(fn["name"]) + ', "arguments": '), _json_arguments(params),
                           Lit("}")))
        python = _python_call(fn["name"], params)
        if python is not None:
            options.append(python)
    newline = Alt(Lit(""), Lit("\n"))
    return Grammar(Seq(Lit(TOOL_OPEN), newline, Alt(*options), newline, Lit(TOOL_CLOSE)))


def _without_blocks(text: str) -> tuple[str, list[str]]:
    """``text`` with its closed tool-call blocks cut out, and the blocks' bodies in order."""
    pieces, bodies, pos = [], [], 0
    while True:
        start = text.find(TOOL_OPEN, pos)
        end = text.find(TOOL_CLOSE, start + len(TOOL_OPEN)) if start >= 0 else -1
        if end < 0:
            break
        pieces.append(text[pos:start])
        bodies.append(text[start + len(TOOL_OPEN):end])
        pos = end + len(TOOL_CLOSE)
    pieces.append(text[pos:])
    return "".join(pieces), bodies


def extract_calls(text: str) -> tuple[str | None, list[dict]]:
    """``(content, tool_calls)`` of one reply: every block that parses becomes an OpenAI tool call with
    a fresh id and its arguments as a JSON string; the content is the text outside them (None when
    empty). A reply with any malformed block is returned whole as content, with no calls."""
    parsed = parse_tool_blocks(text)
    if not parsed or any(call is None for call, _ in parsed):
        return (text or None), []
    content, _ = _without_blocks(text)
    calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
              "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}} for call, _ in parsed]
    return (content if content.strip() else None), calls


class TurnMemory:
    """The exact text of the last ``size`` assistant turns returned with tool calls, by their call ids."""

    def __init__(self, size: int = 4096) -> None:
        self.size, self._turns, self._lock = size, OrderedDict(), threading.Lock()

    def remember(self, calls: list[dict], text: str) -> None:
        with self._lock:
            self._turns[tuple(c["id"] for c in calls)] = text
            while len(self._turns) > self.size:
                self._turns.popitem(last=False)

    def recall(self, ids: tuple[str, ...]) -> str | None:
        with self._lock:
            return self._turns.get(ids)


def assistant_turn(content: str, calls: list[dict], memory: TurnMemory, template_renders_calls: bool) -> dict:
    """The template message for an assistant turn with ``calls`` (arguments already decoded to dicts)."""
    raw = memory.recall(tuple(c["id"] for c in calls))
    if raw is not None:
        return {"role": "assistant", "content": raw}
    if template_renders_calls:
        return {"role": "assistant", "content": content, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls]}
    blocks = "".join(f"{TOOL_OPEN}{json.dumps({'name': c['name'], 'arguments': c['arguments']})}{TOOL_CLOSE}"
                     for c in calls)
    return {"role": "assistant", "content": content + blocks}
