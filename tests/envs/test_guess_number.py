"""The built-in guess-the-number game: feedback, end of episode, reward arithmetic, demonstrations."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from grouprl.builtin.game_demo import demo_examples, game
from grouprl.envs.guess_number import PROMPT, GuessNumberEnv, solved


def test_feedback_and_reward():
    env = GuessNumberEnv()
    assert env.reset(secret=6, prompt=[{"role": "user", "content": "Play."}]) is None  # the row has a prompt
    assert env.step(" 4\n") == ("higher: 5 to 8", None, False)  # the reply and the range left
    assert env.step("no idea") == ("Reply with one number from 5 to 8.", None, False)  # a guess all the same
    assert env.step("8") == ("lower: 5 to 7", None, False)
    assert env.step("6") == (None, None, True)
    assert env.solved and env.guesses == 4 and env.get_reward() == pytest.approx(0.7)  # 1 - 0.1 * 3
    env.reset(secret=2)
    assert env.step("2") == (None, None, True) and env.get_reward() == 1.0  # first guess: the full reward
    env.reset(secret=8)
    for _ in range(3):
        assert env.step("1")[2] is False
    assert env.step("1") == (None, None, True) and not env.solved and env.get_reward() == 0.0  # out of guesses
    assert (env.lo, env.hi) == (2, 8)  # the same wrong guess four times narrows the range once


@pytest.mark.parametrize("turn", ["I guess 6", "x6", "6 or 7", "6.", "<think>6</think>"])
def test_a_turn_that_is_not_one_number_costs_a_guess(turn):
    env = GuessNumberEnv()
    env.reset(secret=6)
    assert env.step(turn) == ("Reply with one number from 1 to 8.", None, False)  # the 6 in it does not count
    assert env.guesses == 1 and not env.solved and (env.lo, env.hi) == (1, 8)


def test_the_range_left_ignores_guesses_outside_it():
    env = GuessNumberEnv()
    env.reset(secret=3)
    assert env.step("5")[0] == "lower: 1 to 4"
    assert env.step("7")[0] == "lower: 1 to 4"  # 7 is already excluded: nothing new
    assert env.step("0")[0] == "higher: 1 to 4"  # below the game's range: the range stays
    assert env.reset(secret=3) is not None and (env.lo, env.hi) == (1, 8)  # a new game starts from 1..8


def test_without_a_dataset_reset_writes_the_prompt_and_seeds_the_secret():
    env = GuessNumberEnv()
    assert env.reset(prompt=[{"role": "user", "content": ""}]) == PROMPT.format(low=1, high=8)  # TRL placeholder
    a, b = GuessNumberEnv(), GuessNumberEnv()
    a.reset(seed=5)
    b.reset(seed=5)
    assert a.secret == b.secret == random.Random(5).randint(1, 8)


def test_solved_reads_env_state():
    assert solved("3", env_state={"solved": True}) == 1.0 and solved("3", env_state={"solved": False}) == 0.0
    assert solved("3", env_state={}) is None


def test_demonstrations_bisect_or_guess_at_random():
    rng = random.Random(0)
    for secret in range(1, 9):  # bisection finds every secret of 1..8 within 4 guesses
        messages, won = game(secret, True, rng)
        guesses = sum(m["role"] == "assistant" for m in messages)
        assert won and guesses <= 4
    assert [m["content"] for m in game(7, True, rng)[0][1:]] == ["4", "higher: 5 to 8", "6", "higher: 7 to 8", "7"]
    assert [m["content"] for m in game(8, True, rng)[0][1:]] == ["4", "higher: 5 to 8", "6", "higher: 7 to 8", "7",
                                                                 "higher: 8 to 8", "8"]  # 4 guesses: the longest
    _, rate = demo_examples(SimpleNamespace(seed=0, sft_rows=2000, noise=0.7))
    # 30% bisect (always win) + 70% random with replacement (win 1 - (7/8)^4 = 0.414): 0.3 + 0.7 * 0.414 = 0.59
    assert rate == pytest.approx(0.3 + 0.7 * (1 - (7 / 8) ** 4), abs=0.03)


def test_game_warm_start_builds_and_plays_the_ranged_replies(tmp_path):
    """builtin:guess-number's build path (its tokenizer, the chat demonstrations) on a 3-step SFT."""
    from transformers import AutoTokenizer

    from grouprl.builtin.warmstart import builtin_model_path, get_warmstart

    assert get_warmstart("guess-number").demo_version == 1  # the demonstrations carry the ranged replies
    path = builtin_model_path("guess-number", cache_dir=tmp_path, hidden_size=32, num_layers=1, num_heads=2,
                              num_kv_heads=1, sft_rows=64, sft_steps=3, batch_size=4)
    tok = AutoTokenizer.from_pretrained(path)
    messages, _ = game(7, True, random.Random(0))
    ids = tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids).count("higher") == 3  # one token each: the prompt and two replies
    assert tok.decode(ids, skip_special_tokens=True).count("5 to 8") == 1
