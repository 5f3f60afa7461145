"""JSON-schema grammars for constrained decoding: is this text a prefix of some JSON the schema accepts?

``grouprl serve`` honours OpenAI's ``response_format`` (``{"type": "json_object"}`` and ``{"type":
"json_schema", "json_schema": {"schema": ...}}``) by masking, at every step, the tokens after which the
reply could no longer become valid JSON of the schema (the approach of Willard & Louf, "Efficient Guided
Generation for Large Language Models", arXiv:2307.09702, without their precompiled token index).
Hand-written because the schemas a judge needs are narrow -- an object of bounded numbers, or a bounded
list of them -- and the libraries that do this in general (outlines-core, xgrammar, lm-format-enforcer)
bring compiled extensions or a dozen dependencies for it.

A schema compiles to a tree of nodes; ``node.scan(text, pos)`` returns the positions where a complete
match of the node starting at ``pos`` can end, and whether ``text`` ends inside a viable partial match.
The JSON is written in one canonical layout (``{"score": 7}``: ``": "`` and ``", "`` separators, keys
in the schema's order, every property present), which every JSON parser reads. Everything is bounded --
digits by the schema's ``maximum`` (else 6), fractions to 2 digits, strings to ``maxLength`` (else 64),
arrays to ``maxItems`` (else 16), generic objects to 8 keys and depth 3 -- so a reply cannot run forever.

Supported keywords: ``type`` (object, array, integer, number, string, boolean, null), ``properties``,
``items``, ``minItems``/``maxItems``, ``minimum``/``maximum``, ``maxLength``, ``enum``; anything else is
refused with a message naming it (``ValueError``), so a schema is never silently half-enforced.

>>> g = compile_schema({"type": "object", "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 10}}})
>>> g.viable('{"score": 1'), g.viable('{"score": 11'), g.complete('{"score": 10}')
(True, False, True)
"""

from __future__ import annotations

import json
import math
import re
from abc import ABC, abstractmethod
from typing import Any

MAX_DIGITS, MAX_FRACTION, MAX_STRING, MAX_ITEMS, MAX_KEYS, MAX_DEPTH = 6, 2, 64, 16, 8, 3
_KNOWN = {"type", "properties", "items", "minItems", "maxItems", "minimum", "maximum", "maxLength", "enum",
          "required", "additionalProperties", "title", "description", "$schema"}
_NUMBER = re.compile(r"-?\d*(?:\.\d*)?")
_CHARS = [chr(c) for c in range(32, 127)]


class Node(ABC):
    min_len = 1
    """Length of the shortest text the node matches."""

    @abstractmethod
    def scan(self, text: str, pos: int) -> tuple[set[int], int | None]:
        """``(ends, rest)``: where complete matches from ``pos`` end, and -- when ``text`` ends inside a viable
        partial match -- the fewest characters that complete it (else None)."""


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


class Grammar:
    """A compiled schema: ``viable(text)`` (a prefix of some accepted JSON), ``complete(text)``, and
    ``remaining(text)`` (the fewest characters that complete it: what a token budget must leave room for)."""

    def __init__(self, root: Node) -> None:
        self.root = root

    def remaining(self, text: str) -> int | None:
        ends, rest = self.root.scan(text, 0)
        return 0 if len(text) in ends else rest

    def viable(self, text: str) -> bool:
        return self.remaining(text) is not None

    def complete(self, text: str) -> bool:
        return len(text) in self.root.scan(text, 0)[0]

    def next_chars(self, text: str) -> set[str]:
        """The printable ASCII characters that may follow ``text``."""
        return {c for c in _CHARS if self.viable(text + c)}


class Lit(Node):
    def __init__(self, s: str) -> None:
        self.s, self.min_len = s, len(s)

    def scan(self, text, pos):
        rest = text[pos:]
        if rest.startswith(self.s):
            return {pos + len(self.s)}, None
        return set(), (len(self.s) - len(rest) if self.s.startswith(rest) else None)


class Alt(Node):
    def __init__(self, *options: Node) -> None:
        self.options = options
        self.min_len = min(o.min_len for o in options)

    def scan(self, text, pos):
        ends, rest = set(), None
        for option in self.options:
            e, r = option.scan(text, pos)
            ends |= e
            rest = _least(rest, r)
        return ends, rest


class Seq(Node):
    def __init__(self, *parts: Node) -> None:
        self.parts = parts
        self.min_len = sum(p.min_len for p in parts)

    def scan(self, text, pos):
        states, rest = {pos}, None
        for i, part in enumerate(self.parts):
            after = sum(p.min_len for p in self.parts[i + 1:])
            nxt = set()
            for p in states:
                e, r = part.scan(text, p)
                nxt |= e
                rest = _least(rest, None if r is None else r + after)
            states = nxt
            if not states:
                break
        return states, rest


class Rep(Node):
    """``open item (sep item)* close`` with between ``lo`` and ``hi`` items."""

    def __init__(self, open_: str, item: Node, sep: str, close: str, lo: int, hi: int) -> None:
        self.open, self.item, self.sep, self.close, self.lo, self.hi = Lit(open_), item, Lit(sep), Lit(close), lo, hi
        self.min_len = len(open_) + self._after(0)

    def _after(self, count: int) -> int:
        """Fewest characters that finish the list once ``count`` items are complete."""
        need = max(0, self.lo - count)
        seps = need if count else max(0, need - 1)
        return need * self.item.min_len + seps * self.sep.min_len + self.close.min_len

    def scan(self, text, pos):
        ends = set()
        states, r = self.open.scan(text, pos)
        rest = None if r is None else r + self._after(0)
        for count in range(self.hi + 1):
            if count >= self.lo:
                for p in states:
                    e, r = self.close.scan(text, p)
                    ends |= e
                    rest = _least(rest, r)
            if count == self.hi or not states:
                break
            nxt = set()
            for p in states:
                starts = {p}
                if count:
                    starts, r = self.sep.scan(text, p)
                    rest = _least(rest, None if r is None else r + self.item.min_len + self._after(count + 1))
                for s in starts:
                    e, r = self.item.scan(text, s)
                    nxt |= e
                    rest = _least(rest, None if r is None else r + self._after(count + 1))
            states = nxt
        return ends, rest


class Num(Node):
    """A JSON number in ``[lo, hi]``: an integer, or with ``fraction`` digits after a point."""

    def __init__(self, integer: bool, lo: float | None, hi: float | None) -> None:
        self.fraction = 0 if integer else MAX_FRACTION
        self.lo = -math.inf if lo is None else float(lo)
        self.hi = math.inf if hi is None else float(hi)
        bound = max(abs(b) for b in (self.lo, self.hi) if math.isfinite(b)) if (
            math.isfinite(self.lo) or math.isfinite(self.hi)) else 0
        self.digits = len(str(int(bound))) if bound else MAX_DIGITS

    def scan(self, text, pos):
        run = _NUMBER.match(text, pos).group()
        end = pos + len(run)
        ends = {end} if run and self._complete(run) else set()
        return ends, (self._rest(run) if end == len(text) else None)

    def _rest(self, run: str) -> int | None:
        """Fewest characters that make ``run`` a complete number in range (breadth-first over viable prefixes)."""
        level, depth = [run], 0
        while level and depth <= self.digits + self.fraction + 2:
            if any(self._complete(r) for r in level):
                return depth
            level = [r + c for r in level for c in "0123456789." if self._viable(r + c)]
            depth += 1
        return None

    def _parts(self, run: str) -> tuple[int, str, str | None] | None:
        m = re.fullmatch(r"(-?)(0|[1-9]\d*)?(?:(\.)(\d*))?", run)
        if not m or (m.group(1) and self.lo >= 0) or (m.group(3) and (not m.group(2) or not self.fraction)):
            return None
        whole, frac = m.group(2) or "", m.group(4) if m.group(3) else None
        if len(whole) > self.digits or (frac is not None and len(frac) > self.fraction):
            return None
        return (-1 if m.group(1) else 1), whole, frac

    def _complete(self, run: str) -> bool:
        parts = self._parts(run)
        if parts is None or not parts[1] or parts[2] == "":
            return False
        return self.lo <= float(run) <= self.hi

    def _viable(self, run: str) -> bool:
        """Some completion of ``run`` is a number in ``[lo, hi]``."""
        parts = self._parts(run)
        if parts is None:
            return False
        sign, whole, frac = parts
        eps = 10.0 ** -self.fraction if self.fraction else 1.0
        spans = []  # closed magnitude intervals the completions can reach
        if not whole:
            spans.append((0.0, 10.0 ** self.digits - eps))
        elif frac is not None:
            base = float(f"{whole}.{frac or '0'}")
            spans.append((base, base + 10.0 ** -len(frac) - eps))
        else:
            extra = 0 if whole == "0" else self.digits - len(whole)
            spans += [(int(whole) * 10.0 ** k, (int(whole) + 1) * 10.0 ** k - eps) for k in range(extra + 1)]
        for a, b in spans:
            lo, hi = (a, b) if sign > 0 else (-b, -a)
            if lo <= self.hi + 1e-9 and hi >= self.lo - 1e-9:
                return True
        return False


class Str(Node):
    """A JSON string of at most ``max_len`` plain characters (no escapes, no control characters)."""

    def __init__(self, max_len: int = MAX_STRING) -> None:
        self.max_len = max_len

    min_len = 2

    def scan(self, text, pos):
        if pos >= len(text):
            return set(), 2
        if text[pos] != '"':
            return set(), None
        j = pos + 1
        while j < len(text) and text[j] not in '"\\' and ord(text[j]) >= 32 and j - pos - 1 < self.max_len:
            j += 1
        if j == len(text):
            return set(), 1
        return ({j + 1}, None) if text[j] == '"' else (set(), None)


def _any_value(depth: int) -> Node:
    leaves = [Str(), Num(False, None, None), Lit("true"), Lit("false"), Lit("null")]
    if depth <= 0:
        return Alt(*leaves)
    inner = _any_value(depth - 1)
    return Alt(Rep("{", Seq(Str(), Lit(": "), inner), ", ", "}", 0, MAX_KEYS),
               Rep("[", inner, ", ", "]", 0, MAX_ITEMS), *leaves)


def _node(schema: Any, where: str) -> Node:
    if not isinstance(schema, dict):
        raise ValueError(f"response_format schema at {where}: expected an object, got {schema!r}")
    unknown = set(schema) - _KNOWN
    if unknown:
        raise ValueError(f"response_format schema at {where}: unsupported keyword(s) {sorted(unknown)}; "
                         f"grouprl serve enforces {sorted(_KNOWN - {'title', 'description', '$schema'})}.")
    if "enum" in schema:
        return Alt(*(Lit(json.dumps(v)) for v in schema["enum"]))
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties") or {}
        if not props:
            return Rep("{", Seq(Str(), Lit(": "), _any_value(MAX_DEPTH - 1)), ", ", "}", 0, MAX_KEYS)
        parts: list[Node] = []
        for i, (key, sub) in enumerate(props.items()):
            parts += [Lit(("{" if i == 0 else ", ") + json.dumps(key) + ": "), _node(sub, f"{where}.{key}")]
        return Seq(*parts, Lit("}"))
    if kind == "array":
        lo, hi = int(schema.get("minItems", 0)), int(schema.get("maxItems", MAX_ITEMS))
        if hi < lo:
            raise ValueError(f"response_format schema at {where}: maxItems={hi} < minItems={lo}")
        return Rep("[", _node(schema.get("items", {"type": "number"}), f"{where}[]"), ", ", "]", lo, hi)
    if kind in ("integer", "number"):
        return Num(kind == "integer", schema.get("minimum"), schema.get("maximum"))
    if kind == "string":
        return Str(int(schema.get("maxLength", MAX_STRING)))
    if kind == "boolean":
        return Alt(Lit("true"), Lit("false"))
    if kind == "null":
        return Lit("null")
    raise ValueError(f"response_format schema at {where}: type {kind!r} is not supported; use object, array, "
                     f"integer, number, string, boolean or null.")


def compile_schema(schema: dict) -> Grammar:
    """The grammar of a JSON schema (the supported subset: see the module docstring)."""
    return Grammar(_node(schema, "$"))


def json_object_grammar() -> Grammar:
    """``{"type": "json_object"}``: any JSON object (bounded as in the module docstring)."""
    return Grammar(Rep("{", Seq(Str(), Lit(": "), _any_value(MAX_DEPTH - 1)), ", ", "}", 0, MAX_KEYS))


def grammar_for(response_format: Any) -> Grammar | None:
    """The grammar an OpenAI ``response_format`` asks for; None for plain text. ValueError when malformed."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ValueError('response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}')
        return compile_schema(spec["schema"])
    raise ValueError(f"response_format type {kind!r} is not supported; use text, json_object or json_schema.")
