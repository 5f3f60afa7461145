"""Token-in, token-out chat helpers for multi-turn rollouts: the ids of a tool turn, never a re-render.

A multi-turn trajectory is built by concatenation: ``prompt ids + sampled ids + tool-turn ids +
sampled ids + ...``. The sampled ids are exactly what the policy produced; they are never decoded and
re-tokenized (BPE is not bijective, templates re-serialise tool calls and drop earlier reasoning, and
the trainer would score tokens the sampler never produced). Only the tokens the model did *not*
sample are derived from the chat template, by rendering the conversation with and without the new
messages and tokenizing the difference -- the approach TRL (``_get_tool_suffix_ids``), verl
("Continuous Token") and SkyRL (the "fixed base") converged on.

The boundary: the model samples its end-of-turn token (``<|im_end|>``, ``<|eot_id|>``) and stops, but
some templates render glue after it (ChatML renders ``<|im_end|>\\n``). That glue was never sampled, so
the tool-turn ids start right after the last end-of-turn marker of the rendered history: they begin
with the glue, and the whole tool turn, glue and next generation prompt included, gets loss mask 0.

This needs a *prefix-preserving* template: rendering ``messages + new`` must start with the rendering
of ``messages``. Thinking templates that drop earlier ``<think>`` blocks are not; :func:`tool_turn_ids`
then raises :class:`TemplateError` instead of silently training on shifted tokens, and
:func:`check_prefix_preserving` (``grouprl check-template``) shows the masks of a demo conversation.
Hand-written because the library versions (TRL's, verl's) live inside their trainers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from grouprl.errors import GroupRLError

# End-of-turn tokens of the common template families; those that are single tokens of the tokenizer
# (plus its eos_token) stop generation and mark where the template glue after a turn begins.
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>")

CHECK_TEMPLATE_HINT = (
    "Fix: give a training template that renders earlier turns exactly the same way whatever follows "
    "(chat_template= a Jinja string or a path to a .jinja file; for thinking models, one that always keeps "
    "earlier <think> blocks, like TRL's qwen3_training.jinja), and check it with "
    "`grouprl check-template MODEL --chat-template FILE`."
)

DEMO_TOOLS = [
    {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]
DEMO_CONVERSATION = [
    {"role": "user", "content": "What is 3 + 4, and what is the weather in Paris?"},
    {"role": "assistant", "content": (
        "<think>Two tools.</think>"
        '<tool_call>{"name": "calculator", "arguments": {"expression": "3 + 4"}}</tool_call>'
        '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>')},
    {"role": "tool", "name": "calculator", "content": "7"},
    {"role": "tool", "name": "weather", "content": "sunny, 21 C"},
    {"role": "assistant", "content": "3 + 4 = 7; it is sunny in Paris."},
]


class TemplateError(GroupRLError, ValueError):
    """The chat template cannot be used for token-in/token-out multi-turn rollouts."""


def load_chat_template(value: str | None) -> str | None:
    """``value`` itself (a Jinja template), or the text of the ``.jinja`` file it names; ``None`` passes."""
    if value is not None and ("{" not in value) and os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    return value


def render(tokenizer: Any, messages: list[dict], *, tools: list[dict] | None = None,
           add_generation_prompt: bool = False, chat_template: str | None = None) -> str:
    """The template's text for ``messages`` (``tokenize=False``)."""
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
    if tools:
        kwargs["tools"] = tools
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    return tokenizer.apply_chat_template(messages, **kwargs)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Ids of ``text`` with no BOS/EOS added (the template already wrote every special token)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def end_of_turn_tokens(tokenizer: Any) -> list[str]:
    """The tokenizer's EOS plus the known end-of-turn markers that are single tokens of its vocabulary."""
    vocab = tokenizer.get_vocab()
    found = [m for m in END_OF_TURN_MARKERS if m in vocab]
    eos = tokenizer.eos_token
    return ([eos] if eos and eos not in found else []) + found


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Ids that end a model turn (see :func:`end_of_turn_tokens`)."""
    return sorted({int(tokenizer.convert_tokens_to_ids(t)) for t in end_of_turn_tokens(tokenizer)})


def _end_of_last_turn(text: str, markers: list[str]) -> int:
    """Index just after the last end-of-turn marker in ``text``: where the template glue starts."""
    best = max((text.rfind(m) + len(m) for m in markers if m in text), default=-1)
    if best < 0:
        raise TemplateError(
            f"no end-of-turn token ({', '.join(markers) or 'the tokenizer has no eos_token'}) in the rendered "
            f"assistant turn {text[-80:]!r}: cannot tell where the sampled tokens end. Fix: set the "
            "tokenizer's eos_token to the template's end-of-turn token."
        )
    return best


def _prefix_error(before: str, after: str, what: str) -> TemplateError:
    i = next((k for k, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    lo = max(0, i - 40)
    return TemplateError(
        f"the chat template is not prefix-preserving: rendering the conversation with {what} changes the "
        f"earlier text at character {i}: {before[lo:i + 40]!r} became {after[lo:i + 40]!r}. Token-in/token-out "
        f"multi-turn rollouts append new tokens to the sampled ones, so earlier turns must render the same "
        f"way whatever follows. {CHECK_TEMPLATE_HINT}"
    )


def tool_turn_ids(tokenizer: Any, messages_so_far: list[dict], tool_messages: list[dict],
                  tools: list[dict] | None = None, *, chat_template: str | None = None) -> list[int]:
    """Ids that follow the sampled end-of-turn token: template glue, ``tool_messages``, next generation prompt.

    ``messages_so_far`` ends with the assistant turn just sampled. Renders it without a generation prompt,
    renders it plus ``tool_messages`` with one, checks the first is a prefix of the second and tokenizes
    everything after the last end-of-turn marker of the first. Every returned id gets loss mask 0.
    Raises :class:`TemplateError` when the template is not prefix-preserving.
    """
    before = render(tokenizer, messages_so_far, tools=tools, chat_template=chat_template)
    after = render(tokenizer, messages_so_far + list(tool_messages), tools=tools, add_generation_prompt=True,
                   chat_template=chat_template)
    if not after.startswith(before):
        raise _prefix_error(before, after, f"{len(tool_messages)} new message(s) appended")
    return encode(tokenizer, after[_end_of_last_turn(before, end_of_turn_tokens(tokenizer)):])


def prompt_ids(tokenizer: Any, messages: list[dict], tools: list[dict] | None = None, *,
               chat_template: str | None = None) -> list[int]:
    """Ids of the first prompt, generation prompt included."""
    return encode(tokenizer, render(tokenizer, messages, tools=tools, add_generation_prompt=True,
                                    chat_template=chat_template))


def assistant_turn_ids(tokenizer: Any, history: list[dict], assistant: dict, tools: list[dict] | None = None, *,
                       chat_template: str | None = None) -> list[int]:
    """The ids a model would sample for ``assistant`` after ``history``: its content up to its end-of-turn token.

    Used to simulate a policy (``check-template``, tests); rollouts use the real sampled ids instead.
    """
    prefix = render(tokenizer, history, tools=tools, add_generation_prompt=True, chat_template=chat_template)
    full = render(tokenizer, history + [assistant], tools=tools, chat_template=chat_template)
    if not full.startswith(prefix):
        raise _prefix_error(prefix, full, "the assistant turn in place of the generation prompt")
    body = full[len(prefix):]
    return encode(tokenizer, body[:_end_of_last_turn(body, end_of_turn_tokens(tokenizer))])


@dataclass
class TemplateReport:
    """What ``check_prefix_preserving`` found: the demo trajectory's ids and masks, or why it failed."""

    ok: bool
    reason: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)  # decoded text of each completion token
    retokenize_matches: bool | None = None  # does tokenizing the full render give the same ids?


def check_prefix_preserving(tokenizer: Any, tools: list[dict] | None = None, *, chat_template: str | None = None,
                            conversation: list[dict] | None = None) -> TemplateReport:
    """Build the two-tool demo conversation token by token, as a rollout would, and report the masks.

    ``conversation`` (default :data:`DEMO_CONVERSATION`): one user message, then assistant turns and tool
    messages. Assistant tokens get mask 1, tool turns (glue, tool messages, next generation prompt) mask 0.
    ``ok=False`` with the reason when the template is not prefix-preserving.
    """
    tools = DEMO_TOOLS if tools is None else tools
    conv = DEMO_CONVERSATION if conversation is None else conversation
    kw = {"chat_template": load_chat_template(chat_template)}
    try:
        ids = prompt_ids(tokenizer, conv[:1], tools, **kw)
        completion, mask, i = [], [], 1
        while i < len(conv):
            sampled = assistant_turn_ids(tokenizer, conv[:i], conv[i], tools, **kw)
            completion += sampled
            mask += [1] * len(sampled)
            j = i + 1
            while j < len(conv) and conv[j]["role"] != "assistant":
                j += 1
            if j > i + 1:
                turn = tool_turn_ids(tokenizer, conv[:i + 1], conv[i + 1:j], tools, **kw)
                completion += turn
                mask += [0] * len(turn)
            i = j
    except TemplateError as e:
        return TemplateReport(ok=False, reason=str(e))
    full = encode(tokenizer, render(tokenizer, conv, tools=tools, **kw))
    return TemplateReport(ok=True, prompt_ids=ids, completion_ids=completion, loss_mask=mask,
                          pieces=[tokenizer.decode([t]) for t in completion],
                          retokenize_matches=full[:len(ids) + len(completion)] == ids + completion)
