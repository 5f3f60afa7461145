"""A scripted policy for the trainer path: the documented ``rollout_backend`` plug-in samples fixed texts per turn.

The loss is still computed by the real tiny model on those tokens, so everything after sampling (masks,
micro-batches, log-probs, gradients, metrics, samples) is the trainer's own code.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

E = "<|im_end|>"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTED = "extending.my_engine:ScriptedPolicy"
ROWS = [{"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(4)]


def use_script(monkeypatch, turns: list[str], logprob: float | None = None) -> str:
    """The documented scripted-policy plug-in (docs/EXTENDING.md, examples/extending/my_engine.py)
    answering turn k with ``turns[k]`` ({a}/{b}/{sum} filled from the prompt); returns its
    ``rollout_backend`` path. ``ScriptedPolicy.requests`` then records each request's turn and budget."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from extending.my_engine import ScriptedPolicy

    monkeypatch.setattr(ScriptedPolicy, "turns", list(turns))
    monkeypatch.setattr(ScriptedPolicy, "logprob", logprob)
    monkeypatch.setattr(ScriptedPolicy, "requests", [])
    return SCRIPTED


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
