r"""Math accuracy: find the final answer where the answer is, then compare it with math-verify.

Where the answer is, in order (tool-call blocks are removed first: numbers inside tool-call
arguments are never the answer):

0. ``<answer>...</answer>`` blocks in the final region (the DeepSeek-R1 format
   ``<think>...</think><answer>38</answer>``, or ``<answer>38</answer>`` alone): each block is a final
   region of its own, searched as in 1-3; a boxed answer or answer line outside the blocks must agree;
1. the last ``\boxed{}`` of the final region (the text after ``</think>``, or the whole completion
   when there are no think tags);
2. else the last "Answer: ..." / "The answer is ..." / "答案：..." line of the final region;
3. else the text after ``</think>`` itself (math-verify picks the expression from it);
4. else, unless ``strict=True``, the same search in the reasoning and finally its last number.

Taking the last number of the whole string instead would read 2 from the worked example "78.54
computed in ``<think>``, then ``calculator(expression='3.14159 * 5**2')``"; here the example scores
1.0, and 0.0 under ``strict`` (it has no final-answer region).

Hardening: several *different* boxed answers (or answer lines, or ``<answer>`` blocks) are hedging and
score 0; a region that is mostly numbers ("1 2 3 ... 78.54") is spam and yields no answer.

Comparison: math-verify ``parse``/``verify`` (LaTeX, fractions, percentages, sets, intervals) with
its signal-based timeouts disabled (``parsing_timeout=None``, ``timeout_seconds=None``), plus a
relative numeric tolerance ``|pred - gold| / (|gold| + 1e-8) < tolerance``. An integer gold answer
(a count) needs exactly that integer unless ``integer_exact=False``, at any size: ``1000000006`` is
not ``1000000007``. Plain numbers (``-1,234.5``, ``3e9999``) take a fast path that skips sympy and
compares exact decimal values, so a huge or overflowing exponent never equals a finite answer
(math-verify alone reads ``1e999999`` as 1). Numbers beyond ``1e±400`` equal only the same number. Inputs that could make sympy run away (towers of powers, huge factorials, very long
expressions, brackets nested deeper than 6) are checked in a killable worker process under
``time_limit`` seconds; an "answer" longer than 2000 characters is wrong without being parsed.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from grouprl.registry import REWARDS
from grouprl.rewards import _text
from grouprl.rewards._limit import call_with_limit, time_limited

HEDGE = "\x00hedge"
# plain numbers, with thousands separators or in scientific notation (math-verify reads "1e3" as 1)
_PLAIN_NUMBER = re.compile(r"^[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?$")
_RISKY = re.compile(
    r"\^.*\^|\*\*.*\*\*|\^\s*\{?\s*[-+]?\d{3,}|\*\*\s*\(?\s*[-+]?\d{3,}|\d{3,}\s*!|!\s*!"
    r"|\\(?:int|sum|prod|lim|binom|infty|iint)|\d{60,}"
)
_MAX_INPROCESS_CHARS = 500
_MAX_ANSWER_CHARS = 2000
_SIMPLE_FRACTION = re.compile(
    r"^\\[dt]?frac\{\s*(-?\d{1,15})\s*\}\{\s*(\d{1,15})\s*\}$|^(-?\d{1,15})\s*/\s*(\d{1,15})$"
)
_INNER_FRACTION = re.compile(r"\\[dt]?frac\{\s*(-?\d{1,15})\s*\}\{\s*(\d{1,15})\s*\}")
# "3e9999 apples": one number in scientific notation (the prose-number regex would see none)
_SCIENTIFIC = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?[eE][-+]?\d+(?![\w.])")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+|\\text\{[^}]*\}")
_PROSE_WORD = re.compile(r"(?<![A-Za-z])[A-Za-z]{3,}(?![A-Za-z])")
# Prose with any of these is not "just a number" (25 pi, 3/4, x = 5, 25%, two thirds, ...).
_NOT_PROSE = re.compile(
    r"[\\^/*=+%{}()\[\]<>|!]|\d\s*[-×÷·]|\b(?:pi|sqrt|root|over|half|halves|thirds?|quarters?|percent|"
    r"hundred|thousand|million|billion|times|squared|cubed|or|and|to|plus|minus|i|e|x|y|n)\b",
    re.IGNORECASE,
)

logging.getLogger("math_verify").setLevel(logging.ERROR)


# ── extraction ───────────────────────────────────────────────────────────────────────────────


_MAX_DISTINCT = 8  # more different-looking candidates than this is hedging, without comparing them


def _pick(cands: list[str]) -> str | None:
    """The last candidate, or HEDGE when the candidates disagree (or are too many different spellings:
    the comparisons stay bounded, each under its own time limit)."""
    if not cands:
        return None
    last = cands[-1]
    distinct = list(dict.fromkeys(" ".join(c.split()) for c in cands[:-1]))
    if len(distinct) > _MAX_DISTINCT:
        return HEDGE
    for c in distinct:
        if not _same_answer(c, last):
            return HEDGE
    return last


def _search_region(region: str, *, whole_text: bool) -> str | None:
    answer = _pick(_text.find_boxed(region, max_chars=_MAX_ANSWER_CHARS + 1))
    if answer is None:
        lines = [a for a in _text.find_answer_lines(region) if "\\boxed" not in a]
        answer = _pick(lines)
    if answer is None and whole_text and region.strip():
        answer = HEDGE if _text.is_number_spam(region) else _last_answer_line(region)
    return answer


def _search_answer_blocks(region: str) -> str | None:
    """The answer in the ``<answer>`` blocks of ``region`` (``None``: no non-empty block)."""
    blocks, outside = _text.answer_blocks(region)
    found = [_search_region(b, whole_text=True) for b in blocks if b]
    if not found:
        return None
    outside_answer = _search_region(outside, whole_text=False)  # a boxed answer / answer line next to it
    if outside_answer is not None:
        found.insert(0, outside_answer)
    return HEDGE if HEDGE in found else _pick(found)


def _last_answer_line(region: str) -> str:
    """The last non-blank line that holds a digit or LaTeX (else the last non-blank line)."""
    lines = [ln.strip() for ln in region.splitlines() if ln.strip()]
    mathy = [ln for ln in lines if re.search(r"[\\\d]", ln)]
    return (mathy or lines)[-1]


def extract_answer(completion: str, *, strict: bool = False) -> str | None:
    """The final-answer text of ``completion`` (see the module docstring), ``None``, or ``HEDGE``
    (several different answers, or a final region that is number spam: scored 0, no fallback).

    >>> extract_answer("<think>pi * 5^2 = 78.54</think><tool_call>calc(x='3.14 * 5**2')</tool_call>")
    '78.54'
    >>> extract_answer("<think>pi * 5^2 = 78.54</think>", strict=True) is None
    True
    >>> extract_answer("<think>20 + 18 = 38</think><answer>38</answer>", strict=True)
    '38'
    """
    text = _text.strip_tool_blocks(completion)
    split = _text.split_think(text)
    if split.final is not None or _text.THINK_OPEN not in text:
        found = _search_answer_blocks(split.final if split.final is not None else text)
        if found is not None:
            return found
    if split.final is not None:
        found = _search_region(_text.answer_blocks(split.final)[1], whole_text=True)
    else:
        found = _search_region(split.reasoning, whole_text=False)
    if found is not None or strict:
        return found
    reasoning = split.reasoning
    if split.final is not None:
        found = _search_region(reasoning, whole_text=False)
        if found is not None:
            return found
    if _text.is_number_spam(reasoning):
        return None
    nums = _text.numbers(reasoning)
    return nums[-1] if nums else None


# ── comparison ───────────────────────────────────────────────────────────────────────────────


@functools.lru_cache(maxsize=8192)
def _parse(text: str) -> tuple:
    from math_verify import parse

    text = text.strip()
    body = text.strip("$").strip()
    if "$" in body or "\\boxed" in body or _PROSE_WORD.search(_LATEX_COMMAND.sub(" ", body)):
        # Delimited math or prose around it: math-verify finds the math itself; wrapping the whole
        # text in $...$ would parse the words as a product of symbols.
        forms: tuple[str, ...] = (text, f"${body}$")
    elif re.search(r"[\\{}()\[\]]", text):
        forms = (f"${body}$", text)
    else:
        # Plain expressions: math-verify's expression regexes are ~100x faster than its ANTLR LaTeX
        # parser (0.3 ms vs 30 ms).
        forms = (text, f"${body}$")
    for form in forms:
        try:
            got = parse(form, fallback_mode="no_fallback", parsing_timeout=None)
        except Exception:  # noqa: BLE001 - math-verify/sympy may raise anything on odd input
            got = []
        if got:
            return tuple(got)
    return ()


_ABSURD_EXPONENT = 400  # |adjusted exponent| above this: no finite answer is that big or that small
Number = Fraction | Decimal | float


def _as_number(expr) -> Number | None:
    """A sympy number as an exact ``Fraction`` (integers, rationals) or a float; ``None`` otherwise."""
    try:
        if getattr(expr, "is_Rational", False):
            return Fraction(int(expr.p), int(expr.q))
        if getattr(expr, "is_number", False) and not getattr(expr, "is_Relational", False):
            value = complex(expr.evalf())
            if value.imag == 0 and math.isfinite(value.real):
                return value.real
    except Exception:  # noqa: BLE001
        return None
    return None


def _exact(x: Number) -> Fraction | None:
    """``x`` as a Fraction; ``None`` when it is not finite or its exponent is absurd (``3e9999``)."""
    if isinstance(x, Decimal):
        if not x.is_finite() or (x and abs(x.adjusted()) > _ABSURD_EXPONENT):
            return None
        return Fraction(x)
    if isinstance(x, float):
        return Fraction(x) if math.isfinite(x) else None
    return x


def _numbers_close(gold: Number, pred: Number, tolerance: float, integer_exact: bool) -> bool:
    """``pred`` equals ``gold``: exactly for an integer gold (``integer_exact``; a float ``pred`` from
    sympy's evalf may differ by 1e-9), else within the relative ``tolerance``."""
    g, p = _exact(gold), _exact(pred)
    if g is None or p is None:  # an absurd or overflowing number equals only itself
        return isinstance(gold, Decimal) and isinstance(pred, Decimal) and gold == pred
    if integer_exact and g.denominator == 1:
        return p == g or (isinstance(pred, float) and abs(p - g) <= Fraction(1, 10**9))
    return abs(p - g) / (abs(g) + Fraction(1, 10**8)) < Fraction(tolerance)


def _plain(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None


def _simple_value(text: str, *, prose: bool) -> Number | None:
    """Exact value of a plain number or integer fraction (``3/4``, ``\\frac{3}{4}``); with ``prose``,
    also of text holding exactly one number and no math ("8 apples"). ``None``: needs math-verify."""
    text = text.strip().strip("$").strip()
    if _PLAIN_NUMBER.match(text):
        return _plain(text)
    m = _SIMPLE_FRACTION.match(text)
    if m:
        num, den = (int(x) for x in (m.group(1) or m.group(3), m.group(2) or m.group(4)))
        return Fraction(num, den) if den else None
    if not prose:
        return None
    fracs = _INNER_FRACTION.findall(text)
    if len(fracs) == 1:  # "So it is \\frac{3}{4} of the cake."
        rest = _INNER_FRACTION.sub(" ", text)
        if not _NOT_PROSE.search(rest) and not _text.numbers(rest) and int(fracs[0][1]):
            return Fraction(int(fracs[0][0]), int(fracs[0][1]))
    if _NOT_PROSE.search(text):
        return None
    sci = _SCIENTIFIC.findall(text)
    if sci:
        return _plain(sci[0]) if len(sci) == 1 and not _text.numbers(_SCIENTIFIC.sub(" ", text)) else None
    nums = _text.numbers(text)
    return _plain(nums[0]) if len(nums) == 1 else None


def match(pred: str, gold: str, tolerance: float = 1e-2, integer_exact: bool = True) -> bool | None:
    """True/False whether ``pred`` equals ``gold``; ``None`` when ``gold`` cannot be parsed.

    Runs in-process with no time limit: call ``answers_match`` for untrusted input.
    """
    g, p = _simple_value(gold, prose=False), _simple_value(pred, prose=True)
    if g is not None and p is not None:
        return _numbers_close(g, p, tolerance, integer_exact)
    from math_verify import verify

    g = _parse(gold)
    if not g:
        return None
    p = _parse(pred)
    if not p:
        return False
    gf, pf = _as_number(g[0]), _as_number(p[0])
    if gf is not None and pf is not None and _numbers_close(gf, pf, tolerance, integer_exact):
        return True
    try:
        return bool(verify(list(g), list(p), timeout_seconds=None))
    except Exception:  # noqa: BLE001
        return False


def _depth(s: str) -> int:
    depth = best = 0
    for ch in s:
        if ch in "([{":
            depth += 1
            best = max(best, depth)
        elif ch in ")]}":
            depth -= 1
    return best


def _risky(s: str) -> bool:
    """Inputs that can make the LaTeX parser or sympy run for seconds: long, deeply nested, big powers."""
    return len(s) > _MAX_INPROCESS_CHARS or bool(_RISKY.search(s)) or _depth(s) > 6


def answers_match(
    pred: str, gold: str, *, tolerance: float = 1e-2, integer_exact: bool = True, time_limit: float = 5.0
) -> bool | None:
    """``match`` under a wall-clock limit: risky inputs run in a killable worker (timeout -> False)."""
    if len(pred) > _MAX_ANSWER_CHARS:
        return False  # not an answer: no parse
    if not (_risky(pred) or _risky(gold)):
        try:
            return match(pred, gold, tolerance, integer_exact)
        except RecursionError:
            return False
    ok, value = call_with_limit(
        "grouprl.rewards.math_answer:match", (pred, gold, tolerance, integer_exact), time_limit
    )
    return value if ok else False


def _same_answer(a: str, b: str) -> bool:
    if " ".join(a.split()) == " ".join(b.split()):
        return True
    return answers_match(a, b, tolerance=1e-9, integer_exact=True, time_limit=2.0) is True


def gold_parseable(gold: str, *, time_limit: float = 5.0) -> bool:
    """Whether math-verify can parse the ground truth (else the sample gets ``None``)."""
    if _simple_value(gold, prose=False) is not None:
        return True
    if not _risky(gold):
        return bool(_parse(gold))
    ok, value = call_with_limit("grouprl.rewards.math_answer:_parseable", (gold,), time_limit)
    return bool(ok and value)


def _parseable(gold: str) -> bool:
    return bool(_parse(gold))


def _gold_list(answer) -> list[str] | None:
    if answer is None or isinstance(answer, bool):
        return None
    items = list(answer) if isinstance(answer, (list, tuple)) else [answer]
    out = [str(a).strip() for a in items if a is not None and str(a).strip()]
    return out or None


@REWARDS.register("math")
@time_limited
def math_reward(
    completion: str,
    *,
    answer=None,
    strict: bool = False,
    tolerance: float = 1e-2,
    integer_exact: bool = True,
    time_limit: float = 5.0,
    **meta,
) -> float | None:
    r"""Math accuracy in {0, 1}: the extracted final answer equals the gold answer (math-verify + relative tolerance).

    ``answer`` may be a string, a number, or a list of accepted answers. Returns ``None`` when there
    is no ground truth or it cannot be parsed (the sample is skipped, not scored 0).

    >>> math_reward("<think>25 * pi is about 78.54</think> The area is \\boxed{25\\pi}.", answer="78.54")
    1.0
    """
    golds = _gold_list(answer)
    if golds is None:
        return None
    golds = [g for g in golds if gold_parseable(g, time_limit=time_limit)]
    if not golds:
        return None
    pred = extract_answer(completion, strict=strict)
    if pred is None or pred == HEDGE:
        return 0.0
    for gold in golds:
        if answers_match(pred, gold, tolerance=tolerance, integer_exact=integer_exact, time_limit=time_limit):
            return 1.0
    return 0.0


# fixed options (make_reward_func, reward_kwargs) must be named parameters: **meta only takes dataset columns
math_reward.passes_options_to = ()
