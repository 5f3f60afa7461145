"""The built-in ``calculator`` task: exact 6-digit answers, disjoint splits, demonstrations, mistyped calls."""

from __future__ import annotations

import random

from grouprl.data.tasks import demonstration, generate_rows, get_task, load_task, mistyped_expression
from grouprl.envs.calculator import evaluate


def test_rows_have_exact_six_digit_answers_of_the_prompted_expression():
    rows = generate_rows("calculator", "train", n=300)
    for row in rows:
        (message,) = row["prompt"]
        assert message["role"] == "user"
        assert message["content"] == f"What is {row['work']}?"
        assert row["answer"] == str(evaluate(row["work"]))  # exact integer arithmetic, not a float
        assert len(row["answer"]) == 6
    forms = {r["work"].replace("0", "1").translate(str.maketrans("23456789", "11111111")) for r in rows}
    assert forms == {"1111 * 11 + 111", "1111 * 11 - 111", "111 + 1111 * 11"}  # the three expression forms


def test_splits_are_disjoint_and_deterministic():
    train = generate_rows("calculator", "train", n=2000)
    test = generate_rows("calculator", "test", n=200)
    assert not {r["key"] for r in train} & {r["key"] for r in test}
    assert not {r["work"] for r in train} & {r["work"] for r in test}
    assert load_task("calculator", "test", n=5).to_list() == load_task("calculator", "test", n=5).to_list()
    assert set(load_task("calculator", "test", n=5).column_names) == {"prompt", "answer"}


def test_task_rewards_and_demonstration_format():
    task = get_task("calculator")
    assert task.reward_funcs == ["accuracy"] and task.eval_reward == "accuracy"
    row = {"prompt": [{"role": "user", "content": "What is 4817 * 36 + 529?"}], "answer": "173941",
           "work": "4817 * 36 + 529"}
    assert demonstration("calculator", row) == (
        '<tool_call>calculator(expression="4817 * 36 + 529")</tool_call>Answer: 173941')
    assert demonstration("calculator", row, show_work=False) == "Answer: 173941"


def test_mistyped_expression_changes_one_digit_and_gives_its_value():
    rng = random.Random(0)
    row = {"work": "4817 * 36 + 529"}
    for _ in range(200):
        typo, value = mistyped_expression(row, rng)
        diff = [i for i, (a, b) in enumerate(zip(typo, row["work"])) if a != b]
        assert len(typo) == len(row["work"]) and len(diff) == 1 and typo[diff[0]].isdigit()
        assert not any(part.startswith("0") for part in typo.split(" ") if part.isdigit())  # no leading zero
        assert value == str(evaluate(typo)) and value != "173941"
    assert mistyped_expression(row, random.Random(0)) == ("4817 * 36 + 729", "174141")  # hand: 173412 + 729
