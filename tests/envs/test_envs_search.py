"""The search environment (BM25 over the built-in corpus) and the citation check."""

from __future__ import annotations

import math

import pytest

from grouprl.envs import BM25, SearchEnv, citations_valid, cited_ids, make_env_factory
from grouprl.envs.search import builtin_corpus, tokenize


def test_builtin_corpus_has_unique_ids_and_text():
    corpus = builtin_corpus()
    assert 50 <= len(corpus) <= 200
    assert len({d["id"] for d in corpus}) == len(corpus)
    assert all(d["id"] == f"p{i}" and d["text"] for i, d in enumerate(corpus))


def test_bm25_by_hand():
    docs = [{"id": "a", "text": "red apple"}, {"id": "b", "text": "green apple tree"}, {"id": "c", "text": "sky"}]
    index = BM25(docs)
    # 'red' appears in 1 of 3 docs: idf = ln(1 + (3 - 1 + 0.5) / (1 + 0.5)) = ln(8/3)
    # doc a: f = 1, |a| = 2, avg = 2: tf part = 1 * 2.5 / (1 + 1.5 * (0.25 + 0.75 * 1)) = 1
    assert index.scores("red") == pytest.approx([math.log(8 / 3), 0.0, 0.0])
    # 'apple' in 2 of 3: idf = ln(1 + 1.5 / 2.5) = ln(1.6); doc b (|b| = 3): 2.5 / (1 + 1.5 * 1.375) = 0.8163...
    assert index.scores("apple")[1] == pytest.approx(math.log(1.6) * 2.5 / (1 + 1.5 * (0.25 + 0.75 * 1.5)))
    assert [d["id"] for d in index.top("red apple", 3)] == ["a", "b"]  # c scores 0 and is left out
    assert tokenize("What is the Capital of France?") == ["capital", "france"]


def test_search_returns_relevant_passages_with_ids_and_tracks_them():
    env = make_env_factory(environment_factory=SearchEnv)()
    assert [t["function"]["name"] for t in env.tools] == ["search"]
    assert env.tools[0]["function"]["parameters"]["required"] == ["query"]
    env.reset({"prompt": "Where did the inventor of the Web work, and in which country is that?"})
    first = env.call("search", {"query": "inventor of the World Wide Web"})
    assert first.splitlines()[0].startswith("[p41] Tim Berners-Lee:") and "CERN" in first
    second = env.call("search", {"query": "CERN Large Hadron Collider", "k": 1})
    assert second.startswith("[p42] CERN:") and len(second.splitlines()) == 1
    state = env.instance
    ids = [line.split("]")[0][1:] for line in first.splitlines()]
    assert state.num_searches == 2 and state.returned_ids == [*ids, "p42"]
    assert env.call("search", {"query": "Tim Berners-Lee", "k": 1}).startswith("[p41]")
    assert state.num_searches == 3 and state.returned_ids == [*ids, "p42"]  # p41 shown twice, kept once
    assert env.call("search", {"query": "zzzz qqqq"}) == "no passage matches 'zzzz qqqq'; try other keywords"
    assert env.reward() is None  # the citation check is a reward function, not the environment's


def test_search_k_is_clamped():
    env = SearchEnv()
    assert len(env.search("the capital city", k=50).splitlines()) == 10
    assert len(env.search("capital", k=0).splitlines()) == 1


@pytest.mark.parametrize("answer,returned,expected", [
    ("CERN is near Geneva [p41] [p42].", ["p41", "p42", "p7"], 1.0),
    ("CERN [p42], Geneva [p42].", ["p41", "p42"], 0.0),  # one passage cited twice is one citation
    ("CERN [p42].", ["p41", "p42"], 0.0),  # fewer than two
    ("CERN [p41] [p42] [p99].", ["p41", "p42"], 0.0),  # a made-up id: zero whatever else is cited
    ("CERN [p41] [p42].", [], 0.0),  # no search was made: nothing may be cited
    ("no citations at all", ["p1", "p2"], 0.0),
    ("p41 and p42 without brackets", ["p41", "p42"], 0.0),
])
def test_citations_valid(answer, returned, expected):
    assert citations_valid(answer, returned) == expected


def test_citations_min_and_order():
    assert citations_valid("[p3]", ["p3"], min_citations=1) == 1.0
    assert cited_ids("[p2] then [p10] then [p2]") == ["p2", "p10"]
