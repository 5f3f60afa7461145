"""``builtin:judge``: a tiny judge for the ``retrieval`` rubric, warm-started on synthetic judge conversations.

Each demonstration is the exact chat the ``judge`` reward sends in pointwise mode with the ``retrieval``
rubric (:func:`grouprl.rewards.judge.pointwise_messages`: system line, rubric with the reference answer,
question, candidate answer, reply instruction), answered ``{"score": 10}`` when the candidate contains the
reference answer and ``{"score": 0}`` when it does not -- the answer-present rule of the retrieval reward
(:func:`grouprl.rewards.retrieval.answer_present`). So the judge learns to compare the candidate with the
reference, the one thing a 0.8M-parameter model can learn here; it knows nothing about the world.

References are words and phrases of the search corpus (capitalised words, two-word names, numbers) and
made-up names and numbers (:func:`pseudo_name`), never
an answer of the built-in retrieval questions: those questions (:data:`grouprl.data.retrieval.QUESTIONS`)
are the held-out set (:func:`heldout_items`). Candidates look like a policy's final answers: the reference
or a distractor, bare or in a short sentence, with or without ``[pN]`` citations, plus near misses (one
word of a multi-word reference). The tokenizer splits off spaces and punctuation before BPE, so a word is
the same tokens wherever it stands (after a space, a newline or a bracket) and matching is a token-identity
match for attention. The judge prompt shows the reference after the candidate, at a fixed distance before
the reply, and the SFT loss covers every token (:func:`demo_encode`): predicting the reference from the
candidate trains the duplicate-token attention the score reads.

What it reaches (``demo_version`` 1: each answer fenced by a random tag, as the judge reward sends it;
2,000 SFT steps, batch 16; ``max_positions`` 2048, so a fenced prompt with a long policy answer fits where
512 would be refused; ``python benchmarks/retrieval_curve.py --judge-only``, seed 0, one thread): **0.659**
agreement with the rule on the 88 held-out items of :func:`heldout_items` (always-0 gets 0.534; 24 of its 30
errors are a 10 for a wrong answer), 0.695 on 200 items of its training distribution (46 of its 61 errors a
0 for a right answer); every reply parses. Before the fence (``demo_version`` 0, the same SFT) it reached
0.830 held-out and 0.84 on its training distribution. The likely cause: the fence's closing tag and its
explanation stand between the candidate and the reference answer, about 180 tokens instead of 50, and the
duplicate-token match this model relies on weakens with the distance. The build took 66 min wall on a
2-core machine shared with other jobs (load 7-12; ~13 CPU-minutes, as measured before the fence). Results vary with the CPU.
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any

SCALE = 10.0
_WORDS = re.compile(r"\b(?:[A-Z][a-z]+(?: [A-Z][a-z]+)?|\d[\d,]*\d|\d)\b")
_TEMPLATES = ("Which place is linked to {t}?", "What is known about {t}?", "Who or what is {t} famous for?",
              "What name goes with {t}?", "Which number describes {t}?")


@functools.lru_cache(maxsize=1)
def reference_pool() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(references, titles)`` from the search corpus, without the held-out questions' answers."""
    from grouprl.data.retrieval import QUESTIONS
    from grouprl.envs.search import builtin_corpus

    held = [a.lower() for _, a, _ in QUESTIONS]
    found: dict[str, None] = {}
    for doc in builtin_corpus():
        for w in _WORDS.findall(doc["text"]):
            low = w.lower()
            if not any(low in h or h in low for h in held):
                found[w] = None
    titles = tuple(d["title"] for d in builtin_corpus() if d.get("title"))
    return tuple(found), titles


_SYLLABLES = ("ka", "lo", "mir", "ten", "dor", "va", "sel", "ru", "bin", "os", "tra", "quel", "an", "fe", "zu", "gor")


def pseudo_name(rng: random.Random) -> str:
    """A made-up name or number ("Kalomir", "Tendor Vasel", "4,182"), so the judge learns to match
    strings, not to recognise a fixed list."""
    if rng.random() < 0.25:
        return f"{rng.randrange(1, 10 ** rng.randint(1, 4)):,}"
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
             for _ in range(rng.choice((1, 1, 2)))]
    return " ".join(words)


def _cites(rng: random.Random) -> str:
    k = rng.choice((0, 1, 2, 2, 2, 3))
    return " ".join(f"[p{rng.randrange(70)}]" for _ in range(k))


def candidate(rng: random.Random, reference: str, distractor: str) -> str:
    """A final answer as a policy writes it: half of them contain ``reference``."""
    words = reference.split()
    if rng.random() < 0.5:
        core = rng.choice((reference, reference, f"The answer is {reference}", f"{reference}, not {distractor}",
                           f"{distractor} and {reference}"))
    elif len(words) > 1 and rng.random() < 0.3:
        core = rng.choice(words)
    else:
        core = rng.choice((distractor, distractor, f"The answer is {distractor}", f"{distractor} or so"))
    return f"{core} {_cites(rng)}".strip()


def judge_conversation(question: str, reference: str, answer: str) -> list[dict[str, str]]:
    """The judge's chat for one answer and the rule's reply (``{"score": 10}`` or ``{"score": 0}``)."""
    from grouprl.data.retrieval import INSTRUCTIONS
    from grouprl.rewards._judge_client import cache_key
    from grouprl.rewards.judge import pointwise_messages, render_rubric
    from grouprl.rewards.retrieval import answer_present, judge_question

    shown = judge_question(f"{INSTRUCTIONS}\n\nQuestion: {question}")
    # the reward fences each answer with a fresh random tag; a demonstration's tag is drawn from its item
    # (random-looking, the same on every build, so the build stays deterministic)
    tag = cache_key("fence", question, reference, answer)[:12]
    messages = pointwise_messages(render_rubric("retrieval", shown, reference), shown, answer, SCALE, tag=tag)
    score = int(SCALE) if answer_present(answer, reference) else 0
    return messages + [{"role": "assistant", "content": f'{{"score": {score}}}'}]


def synthetic_items(n: int, seed: int) -> list[tuple[str, str, str]]:
    """``n`` (question, reference, candidate answer) triples over the corpus references."""
    refs, titles = reference_pool()
    rng = random.Random(f"judge|{seed}")
    out = []
    for _ in range(n):
        reference, distractor = rng.sample(refs, 2)
        if rng.random() < 0.5:
            reference = pseudo_name(rng)
        if rng.random() < 0.5:
            distractor = pseudo_name(rng)
        question = rng.choice(_TEMPLATES).format(t=rng.choice(titles))
        out.append((question, reference, candidate(rng, reference, distractor)))
    return out


def heldout_items(per_question: int = 4, seed: int = 0) -> list[tuple[str, str, str]]:
    """Held-out (question, reference, answer) triples: the built-in retrieval questions, each with answers
    built like the training ones but from the question's own answer and the other questions' answers."""
    from grouprl.data.retrieval import QUESTIONS

    rng = random.Random(f"judge-heldout|{seed}")
    answers = [a for _, a, _ in QUESTIONS]
    out = []
    for question, answer, _ in QUESTIONS:
        for _ in range(per_question):
            distractor = rng.choice([a for a in answers if a != answer])
            out.append((question, answer, candidate(rng, answer, distractor)))
    return out


def demo_examples(spec: Any) -> tuple[list[tuple[list[dict], None]], float]:
    """The warm start's conversations (``spec.sft_rows`` of them) and their accuracy (1: labelled by the rule)."""
    items = synthetic_items(spec.sft_rows, spec.seed)
    return [(judge_conversation(*item), None) for item in items], 1.0


def demo_tokenizer(spec: Any):
    """A byte-level BPE tokenizer whose pre-tokenizer isolates spaces and punctuation (see the module
    docstring), trained on rendered judge conversations, with the tiny chat template."""
    import json

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from grouprl.builtin.tiny import CHAT_TEMPLATE, EXTRA_TOKENS, SPECIAL_TOKENS, build_tokenizer

    plain = build_tokenizer(["x"], vocab_size=300)
    texts = [plain.apply_chat_template(messages, tokenize=False) for messages, _ in demo_examples(
        _Spec(sft_rows=2000, seed=spec.seed + 7))[0]]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex(r"[^A-Za-z]"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=spec.vocab_size, special_tokens=SPECIAL_TOKENS + EXTRA_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    state = json.loads(tok.to_str())
    for added in state["added_tokens"]:
        added["special"] = added["content"] in SPECIAL_TOKENS
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(state)), pad_token="<|pad|>", eos_token="<|im_end|>",
        bos_token=None, unk_token=None, chat_template=CHAT_TEMPLATE, padding_side="left",
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"])


def demo_encode(tok: Any, conversations: list[tuple[list[dict], None]]) -> list[tuple[list[int], list[int]]]:
    """Token ids of each conversation with the loss on every token (not only the reply): predicting the
    reference answer, which follows the candidate, trains the copy/duplicate-token attention that the
    score needs, with a signal on many tokens instead of one digit per chat."""
    from grouprl.builtin.agent_demos import conversation_ids

    return [(ids, [1] * len(ids)) for ids, _ in (conversation_ids(tok, m, t) for m, t in conversations)]


class _Spec:
    def __init__(self, sft_rows: int, seed: int) -> None:
        self.sft_rows, self.seed = sft_rows, seed
