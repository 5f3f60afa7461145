"""``text_coherence``: a cheap, deterministic guess at whether reasoning text is language, not noise.

A common cheap check is the fraction of "valid" characters (CJK, ``\\w``, whitespace, basic punctuation).
Letter gibberish ("asdkj qwoeiu zmxn") is all ``\\w`` and scores 1.0 there, so this takes the minimum
of five checks, each in [0, 1]:

- ``chars``: that valid-character fraction, widened to math symbols and Markdown punctuation;
- ``lexical``: with >= 8 Latin words, the fraction of common function words ("the", "is", "so", ...)
  divided by 0.15 -- English prose has 30-50 %, letter gibberish and word salad about none;
- ``repetition``: with >= 16 tokens, the fraction of distinct token bigrams divided by 0.3
  ("the the the ..." has one bigram);
- ``runs``: 0 when more than 30 % of the text is runs of >= 12 identical characters ("aaaa...");
- ``numbers``: 0.2 when the text is mostly a list of numbers (>= 20 numbers, > 80 % of tokens).

Limitation: random CJK characters pass ``lexical`` (no Chinese word list is bundled).
"""

from __future__ import annotations

import re
import unicodedata

from grouprl.rewards import _text

_EXTRA_VALID = set(".,!?;:'\"()[]{}<>=+-*/^%$\\|_~`#&@·…、，。！？；：（）【】《》“”‘’「」—–")
_LATIN_WORD = re.compile(r"[A-Za-z]+")
_RUN = re.compile(r"([^\s\-=_.*#~])\1{11,}")
_FUNCTION_WORDS = frozenset(
    """a an the and or but if then so because since as of to in on at by for with from into over under
    is are was were be been being am do does did have has had will would can could should may might must
    it its this that these those there here we i you he she they me us our your their his her them
    not no yes all each both any some many much more most less few than too very just only also
    what which who whom whose when where why how let now first next finally thus therefore hence
    get gets got need needs use using given since about up down out after before between equals equal
    one two three four five six seven eight nine ten""".split()
)


def _char_score(text: str) -> float:
    valid = 0
    for ch in text:
        if ch.isspace() or ch in _EXTRA_VALID:
            valid += 1
            continue
        cat = unicodedata.category(ch)
        if cat[0] in "LN" or cat == "Sm":
            valid += 1
    return valid / max(len(text), 1)


def _lexical_score(text: str) -> float:
    words = [w.lower() for w in _LATIN_WORD.findall(text) if len(w) > 1]
    if len(words) < 8:
        return 1.0
    hits = sum(1 for w in words if w in _FUNCTION_WORDS)
    return min(1.0, hits / len(words) / 0.15)


def _repetition_score(toks: list[str]) -> float:
    if len(toks) < 16:
        return 1.0
    bigrams = list(zip(toks, toks[1:]))
    return min(1.0, len(set(bigrams)) / len(bigrams) / 0.3)


def text_coherence(text: str) -> float:
    """Coherence in [0, 1] (see the module docstring); 0.0 for blank text.

    >>> text_coherence("First we square the radius, then multiply by pi, so the area is 78.54.")
    1.0
    >>> text_coherence("asdkj qwoeiu zmxncb poiqwe lkjasd mnbzxc qweoiu asdlkj") < 0.5
    True
    """
    if not text.strip():
        return 0.0
    stripped = text.strip()
    toks = _text.tokens(stripped)
    scores = [_char_score(stripped), _lexical_score(stripped), _repetition_score([t.lower() for t in toks])]
    run_chars = sum(len(m.group(0)) for m in _RUN.finditer(stripped))
    if run_chars > 0.3 * len(stripped):
        scores.append(0.0)
    nums = _text.numbers(stripped)
    if len(nums) >= 20 and len(nums) > 0.8 * len(toks):
        scores.append(0.2)
    return round(min(scores), 6)
