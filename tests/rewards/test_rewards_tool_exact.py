"""Tool-call accuracy (parsing, 0.5 + 0.5, shaped credit, JSON schema, call cap) and exact match."""

from __future__ import annotations

import pytest

from grouprl.errors import ConfigError
from grouprl.rewards import accuracy_reward, exact_match_reward, parse_tool_call, tool_call_reward

GOLD = "search(query='GRPO', k=5)"


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "calculator(expression='3.14159 * 5**2')",
            {"name": "calculator", "arguments": {"expression": "3.14159 * 5**2"}},
        ),
        (
            '{"name": "search", "arguments": {"query": "GRPO", "k": 5}}',
            {"name": "search", "arguments": {"query": "GRPO", "k": 5}},
        ),
        ('{"name": "search", "arguments": "{\\"k\\": 5}"}', {"name": "search", "arguments": {"k": 5}}),
        ('{"type": "function", "function": {"name": "f", "arguments": {}}}', {"name": "f", "arguments": {}}),
        ("f(1, [2, 3], x=None)", {"name": "f", "arguments": {"0": 1, "1": [2, 3], "x": None}}),
        ("f(x=a + 1)", {"name": "f", "arguments": {"x": "a + 1"}}),  # kept as source text, never evaluated
        ("os.remove(path='/tmp/x')", {"name": "os.remove", "arguments": {"path": "/tmp/x"}}),
        ("f(**kw)", None),
        ("not a call", None),
        ("(lambda: 1)()", None),
        ("{broken json", None),
        ("", None),
    ],
)
def test_parse_tool_call(text, expected):
    assert parse_tool_call(text) == expected


@pytest.mark.parametrize(
    "completion, kwargs, expected",
    [
        ("<tool_call>search(query='GRPO', k=5)</tool_call>", {}, 1.0),
        ("<tool_call>search(k=5, query='GRPO')</tool_call>", {}, 1.0),  # keyword order is irrelevant
        ('<tool_call>{"name": "search", "arguments": {"query": "GRPO", "k": 5.0}}</tool_call>', {}, 1.0),
        ("<tool_call>search(query='GRPO', k=3)</tool_call>", {}, 0.5),  # right name, wrong args
        ("<tool_call>lookup(query='GRPO', k=5)</tool_call>", {}, 0.5),  # args credit is independent of the name
        ("<tool_call>lookup(q='x')</tool_call>", {}, 0.0),
        # shaped: keys {query,k} all present (0.5 * 1) + 1 of 2 values right (0.5 * 1/2) = 0.75 -> 0.5 + 0.5 * 0.75
        ("<tool_call>search(query='GRPO', k=3)</tool_call>", {"shaped": True}, 0.875),
        # shaped: keys union {query,k,lang}, common {query}: 0.5 * 1/3 + 0.5 * 1/3 = 1/3 -> 0.5 + 1/6
        ("<tool_call>search(query='GRPO', lang='en')</tool_call>", {"shaped": True}, 0.5 + 1 / 6),
        ("<think>I will search</think>search(query='GRPO', k=5)", {}, 1.0),  # bare call after the think block
        ("I would search for GRPO.", {}, 0.0),
        ("<tool_call>search(query=</tool_call>", {}, 0.0),
        # an extra call halves the score: (1 + 0) / max(1 gold, 2 predicted)
        ("<tool_call>search(query='GRPO', k=5)</tool_call><tool_call>f()</tool_call>", {}, 0.5),
        # more calls than the cap scores 0 whatever they contain
        ("<tool_call>search(query='GRPO', k=5)</tool_call>" * 3, {"max_calls": 2}, 0.0),
    ],
)
def test_tool_call_reward(completion, kwargs, expected):
    assert tool_call_reward(completion, answer=GOLD, **kwargs) == pytest.approx(expected)


def test_tool_call_multi_call_gold_in_order():
    gold = "<tool_call>a(x=1)</tool_call><tool_call>b(y=2)</tool_call>"
    assert tool_call_reward("<tool_call>a(x=1)</tool_call><tool_call>b(y=2)</tool_call>", answer=gold) == 1.0
    # second call: right name, wrong argument -> (1 + 0.5) / 2
    assert tool_call_reward("<tool_call>a(x=1)</tool_call><tool_call>b(y=3)</tool_call>", answer=gold) == 0.75
    assert tool_call_reward("<tool_call>a(x=1)</tool_call>", answer=gold) == 0.5


SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "k": {"type": "integer", "minimum": 1}},
    "required": ["query"],
    "additionalProperties": False,
}


def test_tool_call_schema_validation():
    assert (
        tool_call_reward("<tool_call>search(query='GRPO', k=5)</tool_call>", answer=GOLD, schema=SCHEMA)
        == 1.0
    )
    # k=0 violates minimum: no argument credit even in shaped mode, name still counts
    bad = "<tool_call>search(query='GRPO', k=0)</tool_call>"
    assert tool_call_reward(bad, answer=GOLD, schema=SCHEMA, shaped=True) == 0.5
    # schemas keyed by tool name: an unknown tool gets no argument credit
    by_name = {"search": SCHEMA}
    assert (
        tool_call_reward("<tool_call>search(query='GRPO', k=5)</tool_call>", answer=GOLD, schema=by_name)
        == 1.0
    )
    assert (
        tool_call_reward("<tool_call>other(query='GRPO', k=5)</tool_call>", answer=GOLD, schema=by_name)
        == 0.0
    )
    with pytest.raises(ConfigError, match="schema is invalid"):
        tool_call_reward("<tool_call>search(query='x')</tool_call>", answer=GOLD, schema={"type": "nonsense"})


def test_tool_call_unparseable_gold_is_none():
    assert tool_call_reward("<tool_call>f()</tool_call>", answer="not a call") is None
    assert tool_call_reward("<tool_call>f()</tool_call>", answer=None) is None


def test_accuracy_dispatches_tool_call():
    assert (
        accuracy_reward("<tool_call>search(query='GRPO', k=5)</tool_call>", GOLD, task_type="tool_call")
        == 1.0
    )


@pytest.mark.parametrize(
    "completion, answer, kwargs, expected",
    [
        ("Paris", "Paris", {}, 1.0),
        ("  Paris.\n", "Paris", {}, 1.0),
        ("<think>the capital</think>\n  Paris ", "Paris", {}, 1.0),
        ("paris", "Paris", {}, 0.0),
        ("paris", "Paris", {"case_sensitive": False}, 1.0),
        ("New   York", "New York", {}, 1.0),
        ("ＰＡＲＩＳ", "PARIS", {}, 1.0),  # NFKC folds full-width letters
        # no substring credit: neither "everything" nor a prefix
        ("Paris, London, Rome, Berlin", "Paris", {}, 0.0),
        ("The answer is Paris", "Paris", {}, 0.0),
        ("", "Paris", {}, 0.0),
        ("Lyon", ["Paris", "Lyon"], {}, 1.0),
        # a single <answer> block as the whole final text (DeepSeek-R1 format): its content is compared
        ("<think>the capital</think><answer>Paris</answer>", "Paris", {}, 1.0),
        ("<answer> Paris. </answer>\n", "Paris", {}, 1.0),
        ("<think>the capital</think><answer>Lyon</answer>", "Paris", {}, 0.0),
        # anything besides that one block still counts: no credit for extra text or a second block
        ("<think>x</think>Paris<answer>Paris</answer>", "Paris", {}, 0.0),
        ("<answer>Paris</answer><answer>Lyon</answer>", "Paris", {}, 0.0),
    ],
)
def test_exact_match(completion, answer, kwargs, expected):
    assert exact_match_reward(completion, answer=answer, **kwargs) == expected


def test_exact_match_no_ground_truth_and_generic_branch():
    assert exact_match_reward("x", answer=None) is None
    assert exact_match_reward("x", answer="  ") is None
    assert accuracy_reward("Paris", "Paris", task_type="exact") == 1.0
    with pytest.raises(ConfigError, match="unknown task_type 'maths'.*Did you mean 'math'"):
        accuracy_reward("x", "1", task_type="maths")
