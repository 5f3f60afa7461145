"""Text helpers shared by the rewards: think/answer regions, tool-call blocks, sentences, tokens.

Everything here is a pure function of a string. Tags follow the agent format of DeepSeek-R1 (arXiv:2501.12948) and Hermes/Qwen tool calls::

    <think> reasoning </think> <tool_call>name(arg=...)</tool_call>   (or a direct final answer)

A chat template may open ``<think>`` inside the prompt, in which case the completion starts in the
middle of the reasoning and only the closing ``</think>`` appears; ``split_think`` handles that.
"""

from __future__ import annotations

import re
from typing import NamedTuple

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

# A tool-call block, or an unclosed one running to the end of the text; also tool responses.
_TOOL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>.*?(?:</tool_response>|\Z)", re.S)
_JSON_CALL_LINE = re.compile(r'^[ \t]*\{[^\n]*"name"[^\n]*"arguments"[^\n]*\}[ \t]*$', re.M)

# English sentence ends only count when followed by space/end, so "78.54" is not split.
_SENTENCE_SPLIT = re.compile(r"[。！？；\n]+|[.!?;]+(?=\s|$)")
# Word tokens: a CJK character is one token, a run of letters/digits another.
_TOKEN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|[^\W_]+(?:[.,'][^\W_]+)*", re.UNICODE)
# A number: optional sign, thousands separators, decimals (a plain "[\d,]+" would also match lone commas).
NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])|(?<![\w.])-?\.\d+(?!\w)")


class ThinkSplit(NamedTuple):
    """``reasoning``: think content (or the whole text when there are no think tags).

    ``final``: the text after the last ``</think>``; ``None`` when there is no ``</think>``.
    ``opened_by_template``: ``</think>`` appeared without any ``<think>`` in the completion.
    """

    reasoning: str
    final: str | None
    opened_by_template: bool


def split_think(text: str) -> ThinkSplit:
    """Split a completion into reasoning and final text (see ``ThinkSplit``)."""
    close = text.rfind(THINK_CLOSE)
    if close < 0:
        start = text.find(THINK_OPEN)
        if start < 0:
            return ThinkSplit(text, None, False)
        return ThinkSplit(text[start + len(THINK_OPEN) :].replace(THINK_OPEN, ""), None, False)
    head = text[:close]
    opened = THINK_OPEN not in head
    start = head.find(THINK_OPEN)
    reasoning = head if start < 0 else head[start + len(THINK_OPEN) :]
    reasoning = reasoning.replace(THINK_OPEN, "").replace(THINK_CLOSE, "")
    return ThinkSplit(reasoning, text[close + len(THINK_CLOSE) :], opened)


def strip_tool_blocks(text: str) -> str:
    """The text without ``<tool_call>`` / ``<tool_response>`` blocks and without untagged JSON tool-call
    lines (``{"name": ..., "arguments": ...}``): numbers in tool calls are never answers."""
    text = _TOOL_RESPONSE.sub(" ", _TOOL_BLOCK.sub(" ", text))
    return _JSON_CALL_LINE.sub(" ", text) if '"arguments"' in text else text


def tag_blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[str], str]:
    """Contents of every closed ``open_tag ... close_tag`` block (not nested: the first close after an
    open ends it), in order, and the text outside them (each block replaced by a space).

    The same result as ``re.findall(open + "(.*?)" + close)``, in linear time: the regex rescans to the
    end of the text for every unclosed open tag (quadratic on 20,000 unclosed ``<answer>``).
    """
    blocks: list[str] = []
    outside: list[str] = []
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            break
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            break  # no close after this open, so none after any later open either
        blocks.append(text[start + len(open_tag) : end])
        outside.append(text[pos:start])
        pos = end + len(close_tag)
    outside.append(text[pos:])
    return blocks, " ".join(outside)


def tool_call_bodies(text: str) -> list[str]:
    """Stripped contents of every closed ``<tool_call>...</tool_call>`` block, in order."""
    return [b.strip() for b in tag_blocks(text, TOOL_OPEN, TOOL_CLOSE)[0]]


def answer_blocks(text: str) -> tuple[list[str], str]:
    """Stripped contents of every closed ``<answer>...</answer>`` block (the DeepSeek-R1 format), in
    order, and the text outside them."""
    blocks, outside = tag_blocks(text, ANSWER_OPEN, ANSWER_CLOSE)
    return [b.strip() for b in blocks], outside


def sentences(text: str, min_chars: int = 6) -> list[str]:
    """Sentences split on English and Chinese punctuation and newlines, at least ``min_chars`` long."""
    out = []
    for s in _SENTENCE_SPLIT.split(text):
        s = " ".join(s.split())
        if len(s) >= min_chars:
            out.append(s)
    return out


def tokens(text: str) -> list[str]:
    """Word tokens (CJK characters count one each); used for n-grams, word counts and coherence."""
    return _TOKEN.findall(text)


def numbers(text: str) -> list[str]:
    """Every number in ``text`` in order, as written (thousands separators kept)."""
    return NUMBER.findall(text)


def is_number_spam(text: str, *, min_numbers: int = 10, max_fraction: float = 0.5) -> bool:
    """True when ``text`` is mostly a list of numbers ("1 2 3 ... 78.54"), a last-number-extraction hack.

    Spam = at least ``min_numbers`` numbers that make up more than ``max_fraction`` of the tokens.
    """
    nums = numbers(text)
    if len(nums) < min_numbers:
        return False
    toks = tokens(text)
    return len(nums) / max(len(toks), 1) > max_fraction


_BRACE_TOKEN = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")


def find_boxed(text: str, *, max_chars: int | None = None) -> list[str]:
    r"""Contents of every ``\boxed{...}`` / ``\fbox{...}`` (balanced braces), in order of opening.

    One pass over the braces with a stack, so the time is linear in ``len(text)`` (a scan per
    ``\boxed{`` was quadratic: 20,000 unclosed ``\boxed{`` took minutes). Unclosed boxes give nothing.
    ``max_chars`` cuts a longer content to its first ``max_chars`` characters, unstripped (20,000
    nested boxes would otherwise copy gigabytes).

    >>> find_boxed(r"\boxed{\frac{1}{2}} and \boxed{ \boxed{3} } \boxed{4")
    ['\\frac{1}{2}', '\\boxed{3}', '3']
    """
    found: list[tuple[int, str]] = []
    stack: list[tuple[int, int]] = []  # (start of "\boxed", start of its content) or (-1, -1) for "{"
    for m in _BRACE_TOKEN.finditer(text):
        tok = m.group(0)
        if tok == "}":
            if stack:
                start, content = stack.pop()
                if start >= 0:
                    if max_chars is not None and m.start() - content > max_chars:
                        found.append((start, text[content : content + max_chars]))  # cut, not stripped
                    else:
                        found.append((start, text[content : m.start()].strip()))
        elif tok == "{":
            stack.append((-1, -1))
        else:
            stack.append((m.start(), m.end()))
    found.sort()
    return [content for _, content in found]


_ANSWER_LINE = re.compile(
    r"(?:\b(?:final\s+answer|answer)\s*(?:is\s*[:：]?|[:：])|答案\s*(?:是|为|[:：])\s*[:：]?)[ \t]*(?P<a>[^\n]*)",
    re.IGNORECASE,
)


def find_answer_lines(text: str) -> list[str]:
    """Contents of every "Answer: ..." / "The answer is ..." / "答案：..." line, in order."""
    out = []
    for m in _ANSWER_LINE.finditer(text):
        a = m.group("a").strip()
        a = re.split(r"(?<=[^\d])\.\s|。", a + " ")[0].strip().rstrip("。.").strip()
        if a.startswith("$") and a.endswith("$") and len(a) > 1:
            a = a.strip("$").strip()
        if a:
            out.append(a)
    return out
