"""The countdown task brings its own reward: the expression is checked, not the value it claims."""

from __future__ import annotations

import pytest

from grouprl.data.tasks import demonstration, generate_rows, get_task, load_task, split_size
from grouprl.registry import REWARDS
from grouprl.rewards import accuracy_reward, countdown_reward, make_reward_func

NUMBERS, TARGET = [2, 3, 4], 20


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("Answer: 20", 0.0),  # the target, copied from the prompt
        ("<answer>20</answer>", 0.0),
        ("<think>2+3=5, 5*4=20</think>Answer: (2+3)*4", 1.0),  # each number exactly once
        ("<answer>4*(3+2)</answer>", 1.0),
        ("<answer>5*4</answer>", 0.0),  # 5 is not given
        ("<answer>4*4+4</answer>", 0.0),  # 4 three times
        ("<answer>(2+3)*4*1</answer>", 0.0),  # an extra number
        ("<answer>2*3+4</answer>", 0.0),  # each number once, but 10
        ("<answer>2**3+4*3</answer>", 0.0),  # powers are not allowed
        ("<answer>" * 20_000 + "(2+3)*4", 0.0),  # unclosed tags: linear scan, nothing to read
    ],
)
def test_countdown_reward_table(completion, expected):
    assert countdown_reward(completion, numbers=NUMBERS, target=TARGET) == expected


def test_accuracy_would_pay_for_the_copied_target():
    # why the task cannot train on accuracy: the target is in the prompt
    assert accuracy_reward("Answer: 20", "20") == 1.0
    assert countdown_reward("Answer: 20", numbers=NUMBERS, target=TARGET) == 0.0


def test_countdown_task_defaults_load_and_bring_their_reward():
    task = get_task("countdown")
    assert task.reward_funcs == ["countdown"] and task.eval_reward == "countdown"
    assert REWARDS.get("countdown") is countdown_reward
    train = generate_rows("countdown", "train")  # default sizes and kwargs: 5,000 distinct problems
    test = load_task("countdown", "test")
    assert len(train) == 5000 and len(test) == 200
    assert len({r["key"] for r in train}) == 5000
    reward = make_reward_func(task.eval_reward)
    rows = test.to_list()[:20]
    demos = [demonstration("countdown", dict(r, work=w)) for r, w in zip(rows, _solutions(rows))]
    copied = [f"Answer: {r['target']}" for r in rows]
    columns = {k: [r[k] for r in rows] for k in ("numbers", "target", "answer")}
    assert reward(demos, **columns) == [1.0] * 20
    assert reward(copied, **columns) == [0.0] * 20


def _solutions(rows):
    """An expression using each number once that reaches the target (brute force over 3 numbers)."""
    import itertools

    from grouprl.rewards.countdown import safe_eval

    out = []
    for r in rows:
        for a, b, c in itertools.permutations(r["numbers"]):
            found = next(
                (e for o1 in "+-*" for o2 in "+-*" for e in (f"({a}{o1}{b}){o2}{c}", f"{a}{o1}({b}{o2}{c})")
                 if safe_eval(e) == r["target"]),
                None,
            )
            if found:
                out.append(found)
                break
    return out


@pytest.mark.parametrize(
    "split, kwargs, rows",
    [
        ("train", {}, 5000),
        ("test", {}, 200),
        ("train", {"n": 300}, 300),
        ("test", {"n": 300}, 200),  # one dataset_kwargs n sizes training, not a 300-row held-out split
        ("test", {"n": 50}, 50),
        ("test", {"n": 300, "n_test": 250}, 250),
        ("train", {"n": 300, "n_train": 100}, 100),
    ],
)
def test_split_sizes(split, kwargs, rows):
    assert split_size(split, **kwargs) == rows


def test_dataset_kwargs_n_does_not_ask_for_more_test_problems_than_exist():
    assert len(load_task("countdown", "test", n=3000)) == 200
    assert len(load_task("countdown", "test", n_test=20, n_train=100)) == 20
