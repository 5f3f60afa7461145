"""Built-in tasks: deterministic, disjoint splits; reward recipes score known answers correctly."""

from __future__ import annotations

import random

import pytest

from grouprl.data.tasks import (
    TASKS,
    demonstration,
    generate_rows,
    get_task,
    load_task,
    plausible_wrong_answer,
)
from grouprl.errors import DataError, UnknownNameError
from grouprl.rewards.countdown import countdown_reward


@pytest.mark.parametrize("task", sorted(set(TASKS) - {"retrieval"}))  # retrieval: 22 hand-written questions
def test_splits_are_deterministic_and_disjoint(task):
    a = load_task(task, "train", n=300)
    b = load_task(task, "train", n=300)
    assert a.to_list() == b.to_list()
    test = generate_rows(task, "test", n=100)
    train = generate_rows(task, "train", n=1000)
    assert len({r["key"] for r in train}) == 1000  # no duplicate problems inside a split
    assert not {r["key"] for r in train} & {r["key"] for r in test}


def test_seed_changes_rows_and_sizes_are_honoured():
    assert load_task("arithmetic", "test", n=50, seed=0).to_list() != load_task("arithmetic", "test", n=50, seed=1).to_list()
    ds = load_task("arithmetic", "test")
    assert len(ds) == 200 and ds.column_names == ["prompt", "answer"]
    assert load_task("countdown", "test", n=7).column_names == ["prompt", "answer", "numbers", "target"]


def test_prefix_of_a_longer_split_is_the_same_rows():
    # n only decides where the deterministic stream stops: recipes that ask for fewer rows see a prefix.
    assert load_task("arithmetic", "train", n=20).to_list() == load_task("arithmetic", "train", n=40).to_list()[:20]


@pytest.mark.parametrize("num_steps", [1, 2])
def test_arithmetic_answers_are_the_worked_results(num_steps):
    for row in generate_rows("arithmetic", "train", n=200, num_steps=num_steps):
        value = None
        for step in row["work"].split(", "):
            expr, result = step.split("=")
            assert eval(expr) == int(result)  # the working is arithmetic that holds
            value = int(result)
        assert str(value) == row["answer"] and value >= 0
        assert row["prompt"].endswith("\n")


def test_arithmetic_hand_checked_row():
    row = {"work": "7*3=21, 21-5=16", "answer": "16"}
    assert demonstration("arithmetic", row) == "<think>7*3=21, 21-5=16</think>Answer: 16"
    assert demonstration("arithmetic", row, show_work=False) == "Answer: 16"
    assert demonstration("arithmetic", row, wrong_answer="17") == "<think>7*3=21, 21-5=17</think>Answer: 17"


def test_plausible_wrong_answer_is_wrong_and_near():
    rng = random.Random(0)
    row = {"answer": "42"}
    seen = {plausible_wrong_answer(row, rng) for _ in range(200)}
    assert seen == {"41", "43", "32", "52", "24"}


def test_accuracy_recipe_scores_demonstrations():
    from grouprl.rewards import make_reward_func

    rows = generate_rows("arithmetic", "test", n=30)
    reward = make_reward_func(get_task("arithmetic").eval_reward)
    answers = [r["answer"] for r in rows]
    right = [demonstration("arithmetic", r) for r in rows]
    direct = [demonstration("arithmetic", r, show_work=False) for r in rows]
    rng = random.Random(1)
    wrong = [demonstration("arithmetic", r, wrong_answer=plausible_wrong_answer(r, rng)) for r in rows]
    assert reward(right, answer=answers) == [1.0] * 30
    # a tokenizer whose <think> tags are special tokens loses them under skip_special_tokens=True
    stripped = [c.replace("<think>", "").replace("</think>", "") for c in right]
    assert reward(stripped, answer=answers) == [1.0] * 30
    assert reward(direct, answer=answers) == [1.0] * 30
    assert reward(wrong, answer=answers) == [0.0] * 30


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>(2+3)*4</answer>", 1.0),
        ("<think>2+3=5, 5*4=20</think><answer>4*(3+2)</answer>", 1.0),
        ("<answer>2*3+4</answer>", 0.0),  # uses the numbers but makes 10
        ("<answer>20</answer>", 0.0),  # the target alone: a number that was not given
        ("<answer>4*4+4</answer>", 0.0),  # 4 used three times
        ("<answer>(2+3)*4</answer><answer>1</answer>", 0.0),  # the last answer counts
        ("(2+3)*4", 0.0),  # no answer tags or line
        ("<think>2+3=5, 5*4=20</think>Answer: (2+3)*4", 1.0),  # the demonstrations' format
        ("2+3=5, 5*4=20Answer: (2+3)*4", 1.0),  # the same with the special <think> tags decoded away
        ("Answer: (2+3)*4\nAnswer: 2*3", 0.0),  # the last answer line counts
        ("<answer>__import__('os')</answer>", 0.0),  # not arithmetic: never evaluated
        ("<answer>2**3*4</answer>", 0.0),  # powers are not allowed
    ],
)
def test_countdown_reward_table(completion, expected):
    assert countdown_reward(completion, numbers=[2, 3, 4], target=20) == expected


def test_countdown_reward_without_numbers_has_no_opinion():
    assert countdown_reward("<answer>1+1</answer>", answer="2") is None


def test_countdown_demonstrations_solve_their_rows():
    rows = generate_rows("countdown", "test", n=50)
    for row in rows:
        assert 1 <= row["target"] <= 100
        assert countdown_reward(demonstration("countdown", row), numbers=row["numbers"], target=row["target"]) == 1.0


def test_countdown_reward_resolves_as_a_plugin():
    from grouprl.registry import REWARDS

    fn = REWARDS.get(get_task("countdown").eval_reward)
    assert fn("<answer>5+5</answer>", numbers=[5, 5], target=10) == 1.0


def test_errors_name_the_problem():
    with pytest.raises(UnknownNameError, match="arithmetic"):
        load_task("arithmatic", "train")
    with pytest.raises(DataError, match="split"):
        load_task("arithmetic", "validation")
    with pytest.raises(DataError, match="num_steps"):
        load_task("arithmetic", "test", n=3, num_steps=3)
    with pytest.raises(DataError, match="fewer than"):
        load_task("arithmetic", "test", n=500, max_value=2, max_factor=2, num_steps=1)
