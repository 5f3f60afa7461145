"""``builtin:retriever``: a tiny search agent for ``recipes/retrieval.yaml``, warm-started on tool-use chats.

Each demonstration is one rollout of the ``retrieval`` task as :mod:`grouprl.rollout.multiturn` builds it
(token ids and loss mask from :func:`grouprl.builtin.agent_demos.conversation_ids`): the question, an
assistant turn ``<tool_call>search(query="France Paris")</tool_call>`` whose query names the two gold
passages' titles, the ``search`` environment's real reply (BM25 over the built-in corpus, run here), and
``Answer: Seine [p20] [p21]`` citing the gold passages it returned. A fraction ``spec.noise`` of the
answers name another question's answer instead (still cited, so supported but wrong), so that sampled
rollouts mix right and wrong supported answers -- what the judge/rule agreement is measured on.

Only the training split's questions are shown (the held-out ones stay unseen). A model this size does not
learn to read passages: it memorises which titles to search for and which answer goes with a question,
and learns to copy passage ids from the tool's reply into its citations. That is enough for the
retrieval reward to be non-trivial and for GRPO to have groups with mixed rewards.
"""

from __future__ import annotations

import random
from typing import Any

SEARCH_TOOLS = [{"type": "function", "function": {
    "name": "search", "description": "Search the passages for the words of a query.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
                   "required": ["query"]}}}]


def _rows() -> list[dict]:
    from grouprl.data.retrieval import QUESTIONS
    from grouprl.data.tasks import _bucket_is_test, generate_rows

    n = sum(not _bucket_is_test(f"retrieval|{q}") for q, _, _ in QUESTIONS)
    return generate_rows("retrieval", "train", n=n, seed=0)


def search_conversation(row: dict, rng: random.Random, wrong: str | None = None) -> list[dict]:
    """The messages of one demonstration for a retrieval ``row`` (see the module docstring)."""
    from grouprl.envs.search import SearchEnv, builtin_corpus

    titles = {d["id"]: d.get("title", "") for d in builtin_corpus()}
    gold = list(row["gold_ids"])
    rng.shuffle(gold)
    query = " ".join(titles[g] for g in gold)
    env = SearchEnv()
    result = env.search(query)
    cited = [g for g in row["gold_ids"] if g in env.returned_ids] or env.returned_ids[:2]
    answer = wrong if wrong is not None else row["answer"]
    return [{"role": "user", "content": row["prompt"]},
            {"role": "assistant", "content": f'<tool_call>search(query="{query}")</tool_call>'},
            {"role": "tool", "name": "search", "content": result},
            {"role": "assistant", "content": f"Answer: {answer} " + " ".join(f"[{c}]" for c in cited)}]


def demo_examples(spec: Any) -> tuple[list[tuple[list[dict], list[dict]]], float]:
    """``spec.sft_rows`` demonstrations over the training questions and the fraction answered right."""
    rows = _rows()
    rng = random.Random(f"search|{spec.seed}")
    out, right = [], 0
    for _ in range(spec.sft_rows):
        row = rng.choice(rows)
        wrong = rng.choice([r["answer"] for r in rows if r["answer"] != row["answer"]]) \
            if rng.random() < spec.noise else None
        right += wrong is None
        out.append((search_conversation(row, rng, wrong), SEARCH_TOOLS))
    return out, right / max(1, len(out))


def demo_tokenizer(spec: Any):
    """BPE trained on the demonstrations as the tiny chat template renders them, plus the corpus passages."""
    from dataclasses import replace

    from grouprl.builtin.tiny import build_tokenizer
    from grouprl.envs.search import builtin_corpus

    plain = build_tokenizer(["x"], vocab_size=300)
    conversations, _ = demo_examples(replace(spec, sft_rows=400))
    texts = [plain.apply_chat_template(m, tools=t, tokenize=False) for m, t in conversations]
    texts += [f"[{d['id']}] {d.get('title', '')}: {d['text']}" for d in builtin_corpus()]
    return build_tokenizer(texts, vocab_size=spec.vocab_size)
