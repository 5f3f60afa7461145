"""What a tool or an environment hands back to the rollout, bounded and checked.

:class:`OutputCap` cuts a tool's result where it is produced (:func:`grouprl.envs.base.call_with_timeout`),
so a 10 MB string costs microseconds and never reaches the tokenizer whole; :func:`checked_env_reward` turns
a ``get_reward()`` value that is not a finite number into a :class:`BadEnvReward` that names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class OutputCap:
    """The most a tool's result may put into a trajectory (``max_tool_output_bytes`` /
    ``max_tool_output_tokens`` of the recipe; ``None`` = no limit of that kind). Bytes are cut first (one
    look at the first ``max_bytes`` characters only, so a 10 MB result costs microseconds), then tokens with ``tokenizer``
    when one is set (the run's; only the byte-capped text is tokenized)."""

    max_bytes: int | None = 16384
    max_tokens: int | None = 1024
    tokenizer: Any = None

    def apply(self, text: str) -> tuple[str, str | None]:
        """``(text, None)`` when it fits, else ``(the kept head + a note for the model, a reason)``."""
        reason = None
        if self.max_bytes is not None and len(text) > self.max_bytes // 4:
            # a character is 1-4 bytes: the first max_bytes characters hold the kept head, whatever the length
            head = text[:self.max_bytes].encode("utf-8", "surrogatepass")
            if len(head) > self.max_bytes or len(text) > self.max_bytes:
                reason = f"{len(text):,} characters, over max_tool_output_bytes={self.max_bytes}"
                text = head[:self.max_bytes].decode("utf-8", "ignore")
        if self.max_tokens is not None and self.tokenizer is not None and len(text) > self.max_tokens:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if len(ids) > self.max_tokens:
                text = self.tokenizer.decode(ids[:self.max_tokens], skip_special_tokens=True)
                reason = reason or f"{len(ids):,} tokens, over max_tool_output_tokens={self.max_tokens}"
        if reason is None:
            return text, None
        return f"{text}\n[output cut: the tool returned {reason}; ask for less]", reason


DEFAULT_OUTPUT_CAP = OutputCap()


class BadEnvReward(float):
    """NaN standing for a ``get_reward()`` value that is not a finite number; ``why`` says what it was. The
    trainer stops on it (:func:`grouprl.train.agent.add_env_rewards`) with that line, instead of dropping
    the sample and blaming the reward functions."""

    why: str

    def __new__(cls, why: str) -> BadEnvReward:
        obj = super().__new__(cls, "nan")
        obj.why = why
        return obj


def checked_env_reward(value: Any, env_name: str) -> float | None:
    """``get_reward()``'s value: None, a finite float, or a :class:`BadEnvReward` naming what came back."""
    if value is None:
        return None
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        return BadEnvReward(f"{env_name}.get_reward() returned {value!r} ({type(value).__name__}): it must return "
                            f"a float (or None for no reward). Fix: return float(...).")
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        return BadEnvReward(f"{env_name}.get_reward() returned {number}: a reward must be a finite float (or None "
                            f"for no reward). Fix the environment's reward for this trajectory.")
    return number
