"""``guess_number``: a built-in, offline multi-turn game for conversational environments.

The environment holds a secret integer in ``[low, high]``; each model turn is a guess -- one integer, spaces
around it allowed -- and the environment answers as the next user message: ``higher`` or ``lower`` and the
range the replies so far leave (``higher: 5 to 8``). The episode ends (``env_done``) when the guess is right or
after ``max_guesses`` guesses. A turn that is not one integer ("I guess 4", "4 or 5", a stray token before the
number) counts as a guess all the same and is answered with a reminder of the format (and the range): the
prompt asks for one number, so stray text costs a guess. Without that rule nothing in the reward tells a
turn "4" from "x4", and late in a run the policy drifted into such prefixes (it did in recipes/guess_number.yaml
before the rule: in 7 of the 8 games logged at step 100 of seed 0, a turn began with stray tokens).

Why the reply states the range: it makes the observation Markov -- the best next guess (the middle of the
range) is a function of the last reply alone. Answered only ``higher`` / ``lower``, a player must combine every
earlier reply; the 0.8M-parameter built-in model did not (its third guess after ``4: higher, 6: lower`` and
after ``4: lower, 2: lower`` was the same mixture of 1 and 5, whatever the first reply had said), so GRPO
started from a bisection it could not finish. ``lo`` and ``hi`` (the range left) are public attributes too.

Reward (``get_reward``): ``1 - 0.1 * (guesses - 1)`` for a solved game, 0 otherwise: solving pays, and fewer
turns pay more (binary search over 1..8 needs at most 4 guesses: at least 0.7). ``guesses`` and ``solved`` are
public attributes, so reward functions see them in ``env_state``.

Rows: ``reset(secret=..., **row)`` takes the secret from the row's ``secret`` column, so the ``G`` rollouts
of a prompt play the same game (GRPO's group baseline compares like with like); without one, a secret is
drawn from ``seed`` (a row column) or at random. ``recipes/data/guess_number.jsonl`` holds 512 such rows
(:data:`PROMPT` and a secret). The prompt is the row's; with no dataset (or an empty prompt), ``reset``
returns :data:`PROMPT`, as TRL's contract allows.
"""

from __future__ import annotations

import random
import re

from grouprl.registry import ENVIRONMENTS

PROMPT = "Guess my number from {low} to {high}. Reply with one number; I say higher or lower."
_GUESS = re.compile(r"\s*(-?\d+)\s*")


def _has_prompt(prompt: object) -> bool:
    """Whether the row brings its own prompt (TRL's placeholder row is one empty user message)."""
    if isinstance(prompt, str):
        return bool(prompt.strip())
    return isinstance(prompt, list) and any(m.get("role") == "user" and m.get("content") for m in prompt)


@ENVIRONMENTS.register("guess_number")
class GuessNumberEnv:
    """Guess-the-number with higher / lower feedback (see the module docstring)."""

    conversational = True
    low, high, max_guesses = 1, 8, 4

    def reset(self, secret: int | None = None, seed: int | None = None, **row) -> str | None:
        if secret is None:
            secret = random.Random(seed).randint(self.low, self.high) if seed is not None else \
                random.randint(self.low, self.high)
        self.secret, self.guesses, self.solved = int(secret), 0, False
        self.lo, self.hi = self.low, self.high
        return None if _has_prompt(row.get("prompt")) else PROMPT.format(low=self.low, high=self.high)

    def step(self, text: str) -> tuple[str | None, float | None, bool]:
        """One guess: ``(feedback, None, done)``; the reward comes once, from :meth:`get_reward`."""
        self.guesses += 1
        found = _GUESS.fullmatch(text)
        guess = int(found.group(1)) if found else None
        if guess == self.secret:
            self.solved = True
            return None, None, True
        if guess is not None:  # the range left: a guess outside it (or repeated) narrows nothing
            if guess < self.secret:
                self.lo = max(self.lo, guess + 1)
            else:
                self.hi = min(self.hi, guess - 1)
        if self.guesses >= self.max_guesses:
            return None, None, True
        if guess is None:
            return f"Reply with one number from {self.lo} to {self.hi}.", None, False
        return f"{'higher' if guess < self.secret else 'lower'}: {self.lo} to {self.hi}", None, False

    def get_reward(self) -> float:
        return 1.0 - 0.1 * (self.guesses - 1) if self.solved else 0.0


def solved(completion: str, *, env_state: dict | None = None, **meta) -> float | None:
    """1.0 when the rollout's game was won, else 0.0 (None outside this environment): the solved rate, logged
    as ``rewards/grouprl.envs.guess_number:solved/mean`` by a recipe that gives it weight 0 (recipes/guess_number.yaml).

    >>> solved("7", env_state={"solved": True, "guesses": 3}), solved("7")
    (1.0, None)
    """
    if not env_state or "solved" not in env_state:
        return None
    return 1.0 if env_state["solved"] else 0.0
