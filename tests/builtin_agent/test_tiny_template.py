"""The tiny chat template: lists tools in one short system turn, renders tool messages, stays
prefix-preserving, and renders tool-free conversations exactly as the plain ChatML template did."""

from __future__ import annotations

import pytest

from grouprl.builtin.agent_demos import CALCULATOR_TOOLS
from grouprl.builtin.tiny import CHAT_TEMPLATE, build_tokenizer
from grouprl.envs.calculator import CalculatorEnv
from grouprl.rollout.chat import DEMO_TOOLS, check_prefix_preserving, render
from grouprl.rollout.multiturn import as_tool_env

# The template before tools were supported: tool-free renderings must not change (the default recipe's
# numbers depend on it).
PLAIN_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "Ana has 7 bags with 3 pens in each bag. How many pens?\n"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"},
     {"role": "assistant", "content": "<think>2+3=5</think>Answer: 5"}],
    [{"role": "user", "content": "What is 4817 * 36 + 529?"},
     {"role": "assistant", "content": '<tool_call>calculator(expression="4817 * 36 + 529")</tool_call>'},
     {"role": "tool", "name": "calculator", "content": "173941"}],
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_without_tools_the_rendering_is_plain_chatml(tok, conversation, generation_prompt):
    ours = render(tok, conversation, add_generation_prompt=generation_prompt)
    assert tok.chat_template == CHAT_TEMPLATE
    assert ours == render(tok, conversation, add_generation_prompt=generation_prompt, chat_template=PLAIN_CHATML)
    assert ours == render(tok, conversation, tools=[], add_generation_prompt=generation_prompt)


def test_tools_are_named_in_one_short_system_turn_and_tool_messages_render(tok):
    env_tools = as_tool_env(CalculatorEnv()).tools  # the schema the rollout passes (get_json_schema)
    text = render(tok, CONVERSATIONS[2], tools=env_tools, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nTools: calculator(expression)<|im_end|>\n"
        "<|im_start|>user\nWhat is 4817 * 36 + 529?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>calculator(expression="4817 * 36 + 529")</tool_call><|im_end|>\n'
        "<|im_start|>tool\n173941<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # the warm start's hand-written schema renders the same as the environment's
    assert render(tok, CONVERSATIONS[2], tools=CALCULATOR_TOOLS) == render(tok, CONVERSATIONS[2], tools=env_tools)
    two = render(tok, CONVERSATIONS[0], tools=DEMO_TOOLS)
    assert two.startswith("<|im_start|>system\nTools: calculator(expression), weather(city)<|im_end|>\n")
    bare = [{"name": "ping"}, {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]
    assert render(tok, CONVERSATIONS[0], tools=bare).startswith("<|im_start|>system\nTools: ping(), now()<|im_end|>")


@pytest.mark.parametrize("tools", [None, CALCULATOR_TOOLS, DEMO_TOOLS])
def test_prefix_preserving_with_and_without_tools(tok, tools):
    report = check_prefix_preserving(tok, tools=tools if tools is not None else [])
    assert report.ok, report.reason
    assert report.retokenize_matches
    # mask: the two assistant turns are 1, the two tool results and the glue between them 0
    tool_text = "".join(p for p, m in zip(report.pieces, report.loss_mask) if m == 0)
    assert "7" in tool_text and "sunny, 21 C" in tool_text
    assert "".join(p for p, m in zip(report.pieces, report.loss_mask) if m == 1).endswith(
        "3 + 4 = 7; it is sunny in Paris.<|im_end|>")
