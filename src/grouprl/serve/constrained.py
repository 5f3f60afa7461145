"""Constrained decoding: generate token by token, allowing only tokens that keep the reply a viable prefix of
a :class:`~grouprl.serve.grammar.Grammar` (arXiv:2307.09702, §3: mask the logits to the allowed tokens).

The model still chooses: greedy takes the most probable *allowed* token, sampling draws from the model's
distribution restricted to the allowed tokens. Both are computed lazily -- candidates are tried in the
model's order (greedy) or drawn and, when refused, removed from the distribution and drawn again (an
exact draw from the restricted distribution) -- so a model that mostly writes valid JSON pays a few
checks per step instead of one per vocabulary entry; after ``max_tries`` refusals the full mask is built.
A token is also refused when the JSON could no longer be completed within the tokens left
(:meth:`~grouprl.serve.grammar.Grammar.remaining`), so a reply closes its strings, lists and objects in
time. Decoding stops when the reply is complete JSON of the schema, after ``max_new_tokens`` (complete
by then when the budget holds the schema's shortest JSON), or after ``max_time_s`` seconds.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from grouprl.serve.grammar import Grammar


class TokenTexts:
    """The text each token id adds when appended to a reply (decoded after an anchor token, so that
    SentencePiece's leading spaces survive). Tokens that add nothing, or only part of a UTF-8 character,
    are never allowed by a grammar."""

    def __init__(self, tokenizer: Any) -> None:
        anchor = tokenizer.encode("a", add_special_tokens=False)[-1:]
        base = tokenizer.decode(anchor)
        special = set(tokenizer.all_special_ids)
        self.texts: list[str] = []
        for i in range(len(tokenizer)):
            text = "" if i in special else tokenizer.decode(anchor + [i])[len(base):]
            self.texts.append("" if "\ufffd" in text else text)
        self.by_first: dict[str, list[int]] = {}
        for i, t in enumerate(self.texts):
            if t:
                self.by_first.setdefault(t[0], []).append(i)


def _allowed(grammar: Grammar, text: str, piece: str, first: set[str], budget: int) -> bool:
    if not piece or piece[0] not in first:
        return False
    rest = grammar.remaining(text + piece)
    return rest is not None and rest <= budget


def pick_constrained(logits: torch.Tensor, grammar: Grammar, text: str, vocab: TokenTexts, temperature: float,
                     generator: torch.Generator | None, *, budget: int, max_tries: int = 32) -> int | None:
    """One allowed token id (greedy or sampled from the restricted distribution); None when none is.
    ``budget``: tokens left after this one; a token is allowed only if the JSON can still be completed in
    that many (one character per token at worst: byte-level vocabularies hold every printable character)."""
    first = grammar.next_chars(text) | {c for c in vocab.by_first if ord(c) > 126 and grammar.viable(text + c)}
    if temperature > 0:
        probs = torch.softmax(logits / temperature, dim=-1)
        for _ in range(max_tries):
            if float(probs.sum()) <= 0:
                break
            t = int(torch.multinomial(probs, 1, generator=generator))
            if _allowed(grammar, text, vocab.texts[t], first, budget):
                return t
            probs[t] = 0.0
    else:
        for t in torch.argsort(logits, descending=True)[:max_tries].tolist():
            if _allowed(grammar, text, vocab.texts[t], first, budget):
                return t
    ok = [i for c in first for i in vocab.by_first.get(c, ()) if _allowed(grammar, text, vocab.texts[i], first, budget)]
    if not ok:
        return None
    sub = logits[ok]
    if not torch.isfinite(sub).any():  # top_p left none of the allowed tokens: choose among them as they are
        sub = torch.zeros(len(ok))
    if temperature > 0:
        return ok[int(torch.multinomial(torch.softmax(sub / temperature, dim=-1), 1, generator=generator))]
    return ok[int(torch.argmax(sub))]


@torch.no_grad()
def constrained_generate(model: Any, prompt_ids: list[int], grammar: Grammar, vocab: TokenTexts, *,
                         max_new_tokens: int, temperature: float = 0.0, max_time_s: float = 60.0,
                         generator: torch.Generator | None = None, max_tries: int = 32) -> tuple[str, int]:
    """``(reply text, tokens generated)``. The text is complete JSON of ``grammar`` unless a bound ran out."""
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt_ids], device=device)
    import inspect

    # transformers >= 5.2x names the KV-cache argument ``cache``; earlier versions ``past_key_values``.
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    past, text, n = None, "", 0
    deadline = time.monotonic() + max_time_s
    while n < max_new_tokens and not grammar.complete(text) and time.monotonic() < deadline:
        out = model(input_ids=input_ids, use_cache=True, **({cache_arg: past} if past is not None else {}))
        past = getattr(out, "cache", None) or out.past_key_values
        token = pick_constrained(out.logits[0, -1].float().cpu(), grammar, text, vocab, temperature, generator,
                                 budget=max_new_tokens - n - 1, max_tries=max_tries)
        if token is None:
            break
        text += vocab.texts[token]
        n += 1
        input_ids = torch.tensor([[token]], device=device)
    return text, n
