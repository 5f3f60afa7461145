r"""``format_reward``: does the completion follow the agent format?

Base scoring:

==========================================================  ======
one well-formed ``<think>...</think>`` pair                  +0.2
  ... whose content has >= 20 characters (and is coherent)   +0.2
well-formed ``<tool_call>`` pair(s)                          +0.2
  ... whose first body has ``name(args)`` (or JSON) syntax   +0.2
``<think>`` tags that do not pair up                         -0.2
``<tool_call>`` tags that do not pair up                     -0.2
==========================================================  ======

clamped to [0, 1]. The worked example (a think block and one ``calculator(...)`` call) scores
0.2 + 0.2 + 0.2 + 0.2 = 0.8. A direct answer with no tool call tops out at 0.4; pass
``direct_answer_credit=True`` to give a non-empty final answer after ``</think>`` the tool-call half.

Hardening over the base scoring, each closing a hack or a false negative:

- tags "pair up" only when they alternate open/close in order (``</think>x<think>`` has equal counts
  but is malformed) and do not nest;
- a ``<think>`` opened by the chat template (the completion has ``</think>`` but no ``<think>``) is
  accepted as a pair when ``think_opened`` is ``None`` (auto) or ``True``;
- the "substantive" +0.2 also needs the think content to be coherent text (``text_coherence`` >=
  ``min_coherence``), so 20 characters of gibberish or ``aaaa...`` do not earn it;
- more than ``max_tool_calls`` tool calls is tag stuffing and counts as unpaired (-0.2).
"""

from __future__ import annotations

import re

from grouprl.registry import REWARDS
from grouprl.rewards import _text
from grouprl.rewards._limit import time_limited
from grouprl.rewards.coherence import text_coherence

_CALL_SYNTAX = re.compile(r"^[A-Za-z_][\w.]*\(.*\)$", re.S)


def _pairs(text: str, open_tag: str, close_tag: str) -> tuple[int, bool]:
    """(number of pairs, well-formed?) scanning tags in order: open, close, open, close, ..."""
    events = sorted(
        [(m.start(), 1) for m in re.finditer(re.escape(open_tag), text)]
        + [(m.start(), -1) for m in re.finditer(re.escape(close_tag), text)]
    )
    depth, pairs = 0, 0
    for _, kind in events:
        depth += kind
        if depth not in (0, 1):
            return pairs, False
        pairs += depth == 0
    return pairs, depth == 0


def _think_part(completion: str, think_opened: bool | None, min_coherence: float) -> float:
    text = completion
    if think_opened or (think_opened is None and _text.THINK_OPEN not in text and _text.THINK_CLOSE in text):
        text = _text.THINK_OPEN + text
    pairs, ok = _pairs(text, _text.THINK_OPEN, _text.THINK_CLOSE)
    if not ok:
        return -0.2
    if pairs != 1:
        return 0.0
    content = text.split(_text.THINK_OPEN, 1)[1].split(_text.THINK_CLOSE, 1)[0].strip()
    substantive = len(content) >= 20 and text_coherence(content) >= min_coherence
    return 0.4 if substantive else 0.2


def _tool_part(completion: str, max_tool_calls: int, direct_answer_credit: bool) -> float:
    pairs, ok = _pairs(completion, _text.TOOL_OPEN, _text.TOOL_CLOSE)
    if not ok or pairs > max_tool_calls:
        return -0.2
    if pairs == 0:
        final = _text.split_think(completion).final
        return 0.4 if direct_answer_credit and final is not None and final.strip() else 0.0
    body = _text.tool_call_bodies(completion)[0]
    return 0.4 if _CALL_SYNTAX.match(body) or _is_json_call(body) else 0.2


def _is_json_call(body: str) -> bool:
    if not body.startswith("{"):
        return False
    from grouprl.rewards.tool_call import parse_tool_call

    return parse_tool_call(body) is not None


@REWARDS.register("format")
@time_limited
def format_reward(
    completion: str,
    *,
    answer=None,
    think_opened: bool | None = None,
    direct_answer_credit: bool = False,
    max_tool_calls: int = 8,
    min_coherence: float = 0.5,
    **meta,
) -> float:
    """Agent-format score in [0, 1]: +0.2 per think/tool-call pair and their content, -0.2 if unpaired.

    The base scoring with its loopholes closed; see the module docstring for each step.

    >>> format_reward("<think>The area is pi r^2 = 25 pi, about 78.54</think><tool_call>calc(x='25*pi')</tool_call>")
    0.8
    """
    score = _think_part(completion, think_opened, min_coherence)
    score += _tool_part(completion, max_tool_calls, direct_answer_credit)
    return round(max(0.0, min(1.0, score)), 10)


# fixed options (make_reward_func, reward_kwargs) must be named parameters: **meta only takes dataset columns
format_reward.passes_options_to = ()
