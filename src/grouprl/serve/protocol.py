"""The OpenAI chat-completions request, checked: every field is honoured or refused, never ignored.

:func:`parse_request` turns a request body into a :class:`ChatRequest` or raises :class:`APIError`,
which the server sends as OpenAI's error object ``{"error": {"message", "type", "param", "code"}}``
with the matching status (400 for a bad request, 404 ``model_not_found`` for an unknown model), so the
official client raises ``BadRequestError`` / ``NotFoundError`` naming the field.

Honoured: ``model`` (must be the served name), ``messages`` (roles system / developer / user /
assistant / tool; ``content`` as text, as a list of text parts, or null on an assistant turn with
``tool_calls``), ``stream`` and ``stream_options.include_usage``, ``n``, ``stop``, ``max_tokens`` /
``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``logprobs`` / ``top_logprobs``,
``tools``, ``tool_choice``, ``parallel_tool_calls``, ``response_format``, ``user`` (an identifier; it
changes nothing by definition). Refused with a message: any other field, image / audio / file content
parts, the legacy ``functions`` / ``function_call``, non-zero ``frequency_penalty`` /
``presence_penalty``, a non-empty ``logit_bias``, and ``response_format`` together with tool calling.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from grouprl.serve.grammar import Grammar, grammar_for

ROLES = {"system", "developer", "user", "assistant", "tool"}
_NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": None, "store": False, "metadata": None}
KNOWN = {"model", "messages", "stream", "stream_options", "n", "stop", "max_tokens", "max_completion_tokens",
         "temperature", "top_p", "seed", "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
         "response_format", "user", *_NEUTRAL}
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class APIError(Exception):
    """An OpenAI-style error: HTTP ``status``, ``message``, the offending ``param`` and a ``code``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class ChatRequest:
    """A checked request; ``messages`` are ready for the chat template (see :mod:`grouprl.serve.tools`)."""

    model: str
    messages: list[dict]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    tools: list[dict] = field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    grammar: Grammar | None = None


def _bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def _number(body: dict, key: str, lo: float, hi: float, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise _bad(f"{key}={value!r} is invalid: expected a number in [{lo:g}, {hi:g}].", key)
    return float(value)


def _integer(body: dict, key: str, lo: int, hi: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        span = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise _bad(f"{key}={value!r} is invalid: expected an integer {span}.", key)
    return value


def _flag(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"{key}={value!r} is invalid: expected true or false.", key)
    return value


def _text_content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise _bad(f"{where}.content[{j}] has type {kind!r}: this server serves a text-only model and takes "
                           f"text parts only ({{'type': 'text', 'text': ...}}).", f"{where}.content[{j}].type")
        return "".join(texts)
    raise _bad(f"{where}.content must be a string or a list of text parts, got {type(content).__name__}.",
               f"{where}.content")


def _assistant_calls(message: dict, where: str) -> list[dict]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise _bad(f"{where}.tool_calls must be a non-empty list.", f"{where}.tool_calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(call.get("id"), str) or not isinstance(fn.get("name"), str):
            raise _bad(f"{where}.tool_calls[{j}] must be {{'id': str, 'type': 'function', 'function': {{'name': str, "
                       f"'arguments': str}}}}.", f"{where}.tool_calls[{j}]")
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except (TypeError, json.JSONDecodeError) as e:
            raise _bad(f"{where}.tool_calls[{j}].function.arguments is not a JSON string: {e}",
                       f"{where}.tool_calls[{j}].function.arguments") from None
        out.append({"id": call["id"], "name": fn["name"], "arguments": args})
    return out


def parse_messages(messages: Any, assistant_turn) -> list[dict]:
    """Template messages from the request's ``messages``; ``assistant_turn(content, calls)`` renders an
    assistant turn that carries tool calls (:func:`grouprl.serve.tools.assistant_turn`)."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {role, content} objects.", "messages")
    out, call_names = [], {}
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(f"{where} must be an object with role and content.", where)
        role = message.get("role")
        if role not in ROLES:
            raise _bad(f"{where}.role={role!r} is not one of {sorted(ROLES)}.", f"{where}.role")
        if "function_call" in message:
            raise _bad(f"{where}.function_call is the legacy API; send tool_calls.", f"{where}.function_call")
        content = message.get("content")
        if role == "assistant" and message.get("tool_calls") is not None:
            calls = _assistant_calls(message, where)
            call_names.update({c["id"]: c["name"] for c in calls})
            out.append(assistant_turn("" if content is None else _text_content(content, where), calls))
            continue
        if content is None and role != "assistant":
            raise _bad(f"{where} ({role}) has no content; only an assistant turn with tool_calls may omit it.",
                       f"{where}.content")
        text = "" if content is None else _text_content(content, where)
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in call_names:
                raise _bad(f"{where}.tool_call_id={call_id!r} answers no tool call of an earlier assistant turn.",
                           f"{where}.tool_call_id")
            out.append({"role": "tool", "name": call_names[call_id], "content": text, "tool_call_id": call_id})
            continue
        turn = {"role": "system" if role == "developer" else role, "content": text}
        if isinstance(message.get("name"), str):
            turn["name"] = message["name"]
        out.append(turn)
    return out


def parse_tools(body: dict) -> tuple[list[dict], Any]:
    """``(tools, tool_choice)`` checked: function tools with valid names, a choice among them."""
    if "functions" in body or "function_call" in body:
        raise _bad("functions / function_call are the legacy API; send tools / tool_choice.", "functions")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise _bad("tools must be a list of {type: function, function: {...}} objects.", "tools")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise _bad(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}.",
                       f"tools[{i}]")
        if not isinstance(fn.get("name"), str) or not _TOOL_NAME.match(fn["name"]):
            raise _bad(f"tools[{i}].function.name={fn.get('name')!r} must match {_TOOL_NAME.pattern}.",
                       f"tools[{i}].function.name")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _bad(f"tools[{i}].function.parameters must be a JSON schema object.", f"tools[{i}].function.parameters")
    names = [t["function"]["name"] for t in tools]
    choice = body.get("tool_choice")
    if choice is None:
        return tools, "auto" if tools else "none"
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in names:
            raise _bad(f"tool_choice names function {name!r}, which is not among tools {names}.", "tool_choice")
        return tools, choice
    if choice not in ("none", "auto", "required"):
        raise _bad(f"tool_choice={choice!r}: expected none, auto, required or {{'type': 'function', 'function': "
                   f"{{'name': ...}}}}.", "tool_choice")
    if choice != "none" and not tools:
        raise _bad(f"tool_choice={choice!r} needs tools.", "tool_choice")
    return tools, choice


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    words = [stop] if isinstance(stop, str) else stop
    if not isinstance(words, list) or not 1 <= len(words) <= 4 or not all(isinstance(w, str) and w for w in words):
        raise _bad(f"stop={stop!r}: expected a non-empty string or a list of 1 to 4 of them.", "stop")
    return tuple(words)


def _max_tokens(body: dict) -> int | None:
    a, b = _integer(body, "max_tokens", 1, None), _integer(body, "max_completion_tokens", 1, None)
    if a is not None and b is not None and a != b:
        raise _bad(f"max_tokens={a} and max_completion_tokens={b} disagree; send one.", "max_completion_tokens")
    return b if b is not None else a


def parse_request(body: Any, served: str, assistant_turn, max_n: int) -> ChatRequest:
    """The checked request (module docstring); ``served`` is the model name this server answers to."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object.")
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise _bad(f"unrecognized request argument(s) {unknown}: grouprl serve supports {sorted(KNOWN)}.", unknown[0])
    for key, neutral in _NEUTRAL.items():  # accepted only with the value that changes nothing
        if body.get(key) is not None and body[key] != neutral and body[key] != {}:
            raise _bad(f"{key}={body[key]!r} is not supported by grouprl serve (only {neutral!r}).", key)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model is required: the served model's name (GET /v1/models).", "model")
    if model != served:
        raise APIError(404, f"The model `{model}` does not exist: this server serves `{served}` (GET /v1/models).",
                       "model", "model_not_found")
    tools, choice = parse_tools(body)
    req = ChatRequest(model=model, messages=parse_messages(body.get("messages"), assistant_turn), tools=tools,
                      tool_choice=choice, stop=_stop(body), max_tokens=_max_tokens(body),
                      temperature=_number(body, "temperature", 0.0, 2.0, 1.0), top_p=_number(body, "top_p", 0.0, 1.0, 1.0),
                      seed=_integer(body, "seed", -(2 ** 63), 2 ** 63 - 1), logprobs=_flag(body, "logprobs"),
                      stream=_flag(body, "stream"), parallel_tool_calls=body.get("parallel_tool_calls") is not False)
    req.n = _integer(body, "n", 1, max_n) or 1
    if req.top_p == 0.0:
        raise _bad("top_p=0 keeps no token; use a value in (0, 1].", "top_p")
    req.top_logprobs = _integer(body, "top_logprobs", 0, 20) or 0
    if req.top_logprobs and not req.logprobs:
        raise _bad("top_logprobs needs logprobs=true.", "top_logprobs")
    options = body.get("stream_options")
    if options is not None:
        if not req.stream:
            raise _bad("stream_options is only allowed with stream=true.", "stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise _bad(f"stream_options={options!r}: only include_usage is supported.", "stream_options")
        req.include_usage = bool(options.get("include_usage"))
    try:
        req.grammar = grammar_for(body.get("response_format"))
    except ValueError as e:
        raise _bad(str(e), "response_format") from None
    if req.grammar is not None and choice != "none":
        raise _bad("response_format with tool calling is not supported: set tool_choice='none' or drop one.",
                   "response_format")
    return req
