"""Guess-the-number demonstrations for a built-in warm start (``builtin:guess-number``, recipes/guess_number.yaml).

A demonstration is one game of :class:`grouprl.envs.guess_number.GuessNumberEnv` as chat messages: the
environment's prompt, then assistant guesses answered by ``higher: 5 to 8``-style user turns (the reply and the
range left), until the number is found or the guesses run out. Two kinds of player: a fraction ``1 - noise``
bisect the range left (they always win within 4 guesses on 1..8), the others guess uniformly at random from 1..8
whatever the feedback said (they win 1 - (7/8)^4 = 41% of the time). The SFT learns the assistant turns only (:func:`grouprl.builtin.agent_demos.
conversation_ids`), so the warm start knows the format -- one number per turn -- and bisects only some of the
time: the start GRPO needs, where fewer turns and solved games earn more.
"""

from __future__ import annotations

import random
from typing import Any

from grouprl.envs.guess_number import PROMPT, GuessNumberEnv


def game(secret: int, bisect: bool, rng: random.Random) -> tuple[list[dict], bool]:
    """The messages of one game for ``secret`` by a bisecting (or a random) player, and whether it was won."""
    env = GuessNumberEnv()
    env.reset(secret=secret)
    messages = [{"role": "user", "content": PROMPT.format(low=env.low, high=env.high)}]
    while True:
        guess = (env.lo + env.hi) // 2 if bisect else rng.randint(env.low, env.high)
        messages.append({"role": "assistant", "content": str(guess)})
        feedback, _, done = env.step(str(guess))
        if done:
            return messages, env.solved
        messages.append({"role": "user", "content": feedback})


def demo_examples(spec: Any) -> tuple[list[tuple[list[dict], None]], float]:
    """``(messages, None)`` games (no tools) and the fraction the players won."""
    rng = random.Random(f"guess|{spec.seed}")
    out, won = [], 0
    for _ in range(spec.sft_rows):
        messages, solved = game(rng.randint(GuessNumberEnv.low, GuessNumberEnv.high), rng.random() >= spec.noise, rng)
        won += solved
        out.append((messages, None))
    return out, won / len(out)


def demo_tokenizer(spec: Any):
    """BPE trained on the games as the tiny chat template renders them."""
    from dataclasses import replace

    from grouprl.builtin.agent_demos import _render
    from grouprl.builtin.tiny import build_tokenizer

    games, _ = demo_examples(replace(spec, sft_rows=400))
    first = build_tokenizer([m["content"] for messages, _ in games for m in messages])
    return build_tokenizer([_render(first, messages, None, False) for messages, _ in games], vocab_size=spec.vocab_size)
