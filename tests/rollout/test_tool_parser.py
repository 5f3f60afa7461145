"""The one tool-call parser (grouprl.rewards.tool_call) as the rollout uses it: blocks with reasons."""

from __future__ import annotations

import pytest

from grouprl.rewards.tool_call import parse_tool_blocks, parse_tool_call, parse_tool_call_reason


@pytest.mark.parametrize("text, expected", [
    ("The answer is 7.", []),
    ('{"name": "f", "arguments": {}}', []),  # a bare call outside <tool_call> is an answer, not a call
    ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', [({"name": "f", "arguments": {"x": 1}}, None)]),
    ("<tool_call>f(x=1)</tool_call> and <tool_call>g()</tool_call>",
     [({"name": "f", "arguments": {"x": 1}}, None), ({"name": "g", "arguments": {}}, None)]),
    ("<tool_call>f(</tool_call>", [(None, "not valid call syntax (SyntaxError)")]),
    ("<tool_call>42</tool_call>", [(None, "not a call: expected name(arg=...) or a JSON object")]),
    ("<tool_call>f(**kw)</tool_call>", [(None, "**kwargs cannot be resolved without evaluating code")]),
    ('<tool_call>{"arguments": {}}</tool_call>', [(None, "missing the string field 'name'")]),
    ('<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>',
     [(None, "'arguments' is a string that is not valid JSON")]),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', [(None, "'arguments' must be an object, got list")]),
    ("<tool_call>{broken</tool_call>", [(None, "invalid JSON (Expecting property name enclosed in double quotes)")]),
    ("<tool_call></tool_call>", [(None, "empty tool call")]),
    ("<tool_call>f()</tool_call><tool_call>g(", [({"name": "f", "arguments": {}}, None),
                                                 (None, "unclosed <tool_call> block: close it with </tool_call>")]),
])
def test_parse_tool_blocks(text, expected):
    assert parse_tool_blocks(text) == expected


def test_parse_tool_call_is_the_reason_parser_without_the_reason():
    for text in ["f(x=1)", '{"name": "f"}', "f(", "", '{"name": 3}']:
        assert parse_tool_call(text) == parse_tool_call_reason(text)[0]
