"""A scripted policy for the trainer path: the tiny model's generate is replaced by fixed texts per turn.

The loss is still computed by the real tiny model on those tokens, so everything after sampling (masks,
micro-batches, log-probs, gradients, metrics, samples) is the trainer's own code.
"""

from __future__ import annotations

import json
import threading
import time

E = "<|im_end|>"
ROWS = [{"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(4)]


def scripted(tokenizer, turns: list[str], calls: list | None = None):
    """A ``generate_fn`` answering every trajectory with ``turns[k]`` at its turn ``k`` (text with ``{a}`` /
    ``{b}`` / ``{sum}`` filled from the numbers of its first prompt). ``calls`` gets each call's budgets."""
    import re


    def generate(prompts, budgets, params):
        if calls is not None:
            calls.append(list(budgets) if not isinstance(budgets, int) else [budgets] * len(prompts))
        out = []
        for prompt in prompts:
            text = tokenizer.decode(prompt)
            a, b = (int(x) for x in re.search(r"What is (\d+) \+ (\d+)\?", text).groups())
            k = text.count("<|im_start|>assistant") - 1  # assistant turns before this one
            script = turns[min(k, len(turns) - 1)]
            out.append(tokenizer.encode(script.format(a=a, b=b, sum=a + b), add_special_tokens=False))
        return out

    return generate


def use_script(monkeypatch, turns: list[str], calls: list | None = None) -> None:
    """Make the agent rollout sample ``turns`` instead of the tiny model's random text."""
    import grouprl.rollout.multiturn as mt

    monkeypatch.setattr(mt, "hf_generate_fn", lambda model, tokenizer, stop_ids=None, **kw: scripted(tokenizer, turns, calls))


def read_jsonl(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer.
        b: the second integer.
    """
    return a + b


def explode(x: int) -> int:
    """Always fails.

    Args:
        x: anything.
    """
    raise RuntimeError("kaput")


def nap(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long.
    """
    time.sleep(seconds)
    return "woke"


class Adder:
    """A TRL ``environment_factory`` class, written exactly as for TRL: ``reset(**kwargs)``, public methods
    are tools, ``get_reward`` is the environment's reward (1 when the model added the right numbers)."""

    def reset(self, **kwargs) -> str | None:
        self.answer = int(kwargs["answer"])
        self.total = None
        self.calls = 0
        return None

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first integer.
            b: the second integer.
        """
        self.calls += 1
        self.total = a + b
        return self.total

    def get_reward(self) -> float:
        return 1.0 if self.total == self.answer else 0.0


def tool_threads() -> list[str]:
    """Tool threads still alive after up to 5 s (the sleeping tool's thread ends when it wakes)."""
    deadline = time.monotonic() + 5
    while True:
        alive = [t.name for t in threading.enumerate() if t.name.startswith("grouprl-tool")]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)
