"""A rollout-engine plug-in for these tests: the scripted policy is a plain function.

``FnEngine.policy(model, tokenizer)`` returns ``generate(prompt_ids, budgets, params) -> [token ids]``;
each test sets it (``monkeypatch.setattr(FnEngine, "policy", staticmethod(fn))``) and names the engine
with ``rollout_backend=FN`` -- the documented plug-in path (docs/EXTENDING.md), no private name patched.
"""

from __future__ import annotations

from grouprl.rollout.engine import Engine, Generation

FN = f"{__name__}:FnEngine"


class FnEngine(Engine):
    policy = None  # set by each test

    def generate(self, prompt_ids, max_new_tokens, sampling):
        budgets = [max_new_tokens] * len(prompt_ids) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        outs = type(self).policy(self.model, self.tokenizer)(prompt_ids, budgets, sampling)
        return [Generation(list(o)[:b], None, "stop" if len(o) <= b else "length") for o, b in zip(outs, budgets)]
