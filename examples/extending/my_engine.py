"""A rollout-engine plug-in: a scripted policy that answers every model turn with fixed tokens.

An engine subclasses ``grouprl.rollout.engine.Engine``, is built as ``Cls(model, tokenizer)`` and
implements ``generate(prompt_ids, max_new_tokens, sampling) -> list[Generation]``: one prompt id list and
one token budget per request, each answered with the sampled ids, their log-probs (or None) and the
finish reason. It drives single-turn and multi-turn (agent) runs alike; the trainer still computes the
loss with the training model on these tokens, so a scripted policy tests everything after sampling.
"""

from __future__ import annotations

import re

from grouprl.rollout.engine import Engine, Generation


class ScriptedPolicy(Engine):
    """Turn k of a trajectory samples ``turns[k]`` (the last one repeats), with ``{a}``, ``{b}`` and ``{sum}``
    filled from the first "A + B" of the conversation. Class-wide settings, because the trainer builds
    the instance: ``turns``, ``logprob`` (each token's log-prob; None = not reported, as a script has no
    distribution), ``requests`` (a record of each request's turn and budget)."""

    turns: list[str] = ["Answer: {sum}<|im_end|>"]
    logprob: float | None = None
    requests: list[dict] = []

    def generate(self, prompt_ids, max_new_tokens, sampling):
        budgets = [max_new_tokens] * len(prompt_ids) if isinstance(max_new_tokens, int) else max_new_tokens
        out = []
        for ids, budget in zip(prompt_ids, budgets):
            text = self.tokenizer.decode(ids)
            turn = text.count("<|im_start|>assistant") - 1  # ChatML: earlier assistant turns
            found = re.search(r"(\d+) \+ (\d+)", text)
            a, b = (int(found[1]), int(found[2])) if found else (0, 0)
            reply = self.turns[min(turn, len(self.turns) - 1)].format(a=a, b=b, sum=a + b)
            tokens = self.tokenizer.encode(reply, add_special_tokens=False)
            ScriptedPolicy.requests.append({"turn": turn, "budget": budget})
            kept = tokens[:budget]
            logprobs = None if self.logprob is None else [self.logprob] * len(kept)
            out.append(Generation(kept, logprobs, "stop" if len(kept) == len(tokens) else "length"))
        return out
