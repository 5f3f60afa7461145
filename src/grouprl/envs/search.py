"""The ``search`` environment: keyword search over a small corpus, for retrieval QA with citations.

Ranking is Okapi BM25 (Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond",
2009, eq. 3.15 with the non-negative idf ``log(1 + (N - n + 0.5) / (n + 0.5))``), written out here in a
few lines because the corpus is tiny and a search library would be a heavy dependency for it.
The built-in corpus (``envs/data/corpus.jsonl``, 70 short encyclopaedic passages with ids ``p0`` ...)
is enough for questions that need two passages, e.g. "In which country is the city where the inventor
of the Web worked?". The environment records which passage ids the model was shown
(``returned_ids``) so that :func:`citations_valid` can reject citations of passages it never saw.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from importlib import resources

from grouprl.registry import ENVIRONMENTS

K1, B = 1.5, 0.75
MAX_K = 10
_WORD = re.compile(r"[a-z0-9]+")
_CITATION = re.compile(r"\[(p\d+)\]")
_STOP = frozenset("a an and are as at be by for from has in is it its of on or that the this to was were "
                  "what when where which who whose with did does do how many".split())


def tokenize(text: str) -> list[str]:
    """Lower-case alphanumeric words, without a few very common English words."""
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


class BM25:
    """Okapi BM25 over ``docs`` (a list of ``{"id", "text", optional "title"}`` dicts)."""

    def __init__(self, docs: Sequence[dict]) -> None:
        self.docs = list(docs)
        self.tokens = [Counter(tokenize(f"{d.get('title', '')} {d['text']}")) for d in self.docs]
        self.lengths = [sum(c.values()) for c in self.tokens]
        self.avg_len = sum(self.lengths) / max(len(self.docs), 1)
        df = Counter(w for c in self.tokens for w in c)
        n = len(self.docs)
        self.idf = {w: math.log(1 + (n - m + 0.5) / (m + 0.5)) for w, m in df.items()}

    def scores(self, query: str) -> list[float]:
        terms = tokenize(query)
        out = []
        for counts, length in zip(self.tokens, self.lengths):
            s = 0.0
            for w in terms:
                f = counts.get(w, 0)
                if f:
                    s += self.idf[w] * f * (K1 + 1) / (f + K1 * (1 - B + B * length / self.avg_len))
            out.append(s)
        return out

    def top(self, query: str, k: int) -> list[dict]:
        """The ``k`` best documents with a positive score, best first (ties: corpus order)."""
        scored = [(s, i) for i, s in enumerate(self.scores(query)) if s > 0]
        scored.sort(key=lambda t: (-t[0], t[1]))
        return [self.docs[i] for _, i in scored[:k]]


@functools.lru_cache(maxsize=1)
def builtin_corpus() -> tuple[dict, ...]:
    """The passages shipped with grouprl (``grouprl/envs/data/corpus.jsonl``)."""
    text = resources.files("grouprl.envs").joinpath("data/corpus.jsonl").read_text(encoding="utf-8")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


@functools.lru_cache(maxsize=1)
def _builtin_index() -> BM25:
    return BM25(builtin_corpus())


@ENVIRONMENTS.register("search")
class SearchEnv:
    """Keyword search (BM25) over a small built-in corpus, for retrieval QA that cites passage ids.

    Attributes read by rewards: ``returned_ids`` (passage ids shown to the model, in first-seen order)
    and ``num_searches``. Subclass and set ``index = BM25(my_passages)`` to search another corpus.
    """

    index: BM25 | None = None

    def __init__(self) -> None:
        self.reset()

    def reset(self, **row) -> str | None:
        self.returned_ids: list[str] = []
        self.num_searches = 0
        return None

    def search(self, query: str, k: int = 3) -> str:
        """
        Search the passages for the words of a query.

        Args:
            query: Keywords to look for, e.g. 'capital of France river'.
            k: How many passages to return (1 to 10).

        Returns:
            The best matching passages, each starting with its id in brackets, e.g. [p12].
        """
        index = self.index or _builtin_index()
        self.num_searches += 1
        hits = index.top(query, max(1, min(int(k), MAX_K)))
        if not hits:
            return f"no passage matches {query!r}; try other keywords"
        for d in hits:
            if d["id"] not in self.returned_ids:
                self.returned_ids.append(d["id"])
        return "\n".join(f"[{d['id']}] {d.get('title', '')}: {d['text']}" if d.get("title")
                         else f"[{d['id']}] {d['text']}" for d in hits)


def cited_ids(answer_text: str) -> list[str]:
    """Passage ids cited as ``[p12]`` in ``answer_text``, in first-cited order, without repeats."""
    return list(dict.fromkeys(_CITATION.findall(answer_text or "")))


def citations_valid(answer_text: str, returned_ids: Iterable[str], min_citations: int = 2) -> float:
    """1.0 when the answer cites at least ``min_citations`` distinct passages, every one of which the
    search tool returned in this trajectory; 0.0 otherwise (a made-up id scores 0 whatever else it cites).

    >>> citations_valid("Berlin [p23], on the Spree [p22].", ["p22", "p23"])
    1.0
    >>> citations_valid("Berlin [p23] [p99].", ["p22", "p23"])
    0.0
    """
    cited = cited_ids(answer_text)
    shown = set(returned_ids)
    if any(c not in shown for c in cited):
        return 0.0
    return 1.0 if len(cited) >= min_citations else 0.0
