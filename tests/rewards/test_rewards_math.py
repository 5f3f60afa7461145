"""Math accuracy: where the answer is taken from, how it is compared, and the time limit."""

from __future__ import annotations

import threading
import time

import pytest

from grouprl.rewards import accuracy_reward, extract_answer, math_reward
from grouprl.rewards.math_answer import HEDGE, _risky, answers_match

WORKED = (
    "<think>\n需要计算圆的面积：S = π × r² = π × 5² ≈ 78.54\n</think>\n"
    "<tool_call>calculator(expression='3.14159 * 5**2')</tool_call>"
)


@pytest.mark.parametrize(
    "completion, strict, expected",
    [
        # no final-answer region (only a tool call after </think>) -> last number of the reasoning;
        # the last number of the whole string would be "2" from the tool arguments.
        (WORKED, False, "78.54"),
        (WORKED, True, None),
        ("<think>r = 5</think> The area is \\boxed{25\\pi}.", True, "25\\pi"),
        ("<think>so 7</think>\nAnswer: 42", True, "42"),
        ("<think>计算</think>答案：12", True, "12"),
        ("The answer is 3/4.", True, "3/4"),
        ("<think>try 3 then 5</think>\nSo it is 8 apples.\nHope that helps!", True, "So it is 8 apples."),
        # chat template opened <think>: only </think> appears
        ("we get 6 * 7 = 42 </think> \\boxed{42}", True, "42"),
        # unfinished reasoning: non-strict falls back to the last number, strict has nothing
        ("<think>first 3, then 9", False, "9"),
        ("<think>first 3, then 9", True, None),
        # a boxed answer inside the reasoning is preferred to its last number
        ("<think>so \\boxed{16}, check: 4 * 4</think>", False, "16"),
        ("\\boxed{\\frac{1}{2}}", False, "\\frac{1}{2}"),
        # an untagged JSON tool call is not the answer either
        (
            '<think>so 78.54</think>\n{"name": "calc", "arguments": {"expression": "3.14 * 5**2"}}',
            False,
            "78.54",
        ),
        ("no numbers here", False, None),
        # hedging: two different boxed answers / answer lines
        ("\\boxed{78} or maybe \\boxed{79}", False, HEDGE),
        ("Answer: 78\nAnswer: 79", False, HEDGE),
        # the same answer twice is not hedging
        ("\\boxed{0.5} i.e. \\boxed{\\frac{1}{2}}", False, "\\frac{1}{2}"),
        # <answer> blocks (DeepSeek-R1 format) are a final-answer region, with or without <think>
        ("<think>20 + 18 = 38</think><answer>38</answer>", True, "38"),
        ("<answer> 38 </answer>", True, "38"),
        ("<answer>38</answer><answer>39</answer>", False, HEDGE),
    ],
)
def test_extract_answer(completion, strict, expected):
    assert extract_answer(completion, strict=strict) == expected


def test_worked_example_accuracy_default_and_strict():
    assert accuracy_reward(WORKED, "78.54") == 1.0
    assert accuracy_reward(WORKED, "78.54", strict=True) == 0.0
    assert math_reward(WORKED, answer="2") == 0.0  # the tool-call argument "5**2" is never the answer


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("78.54", "78.54", True),
        ("78.9", "78.54", True),  # |78.9 - 78.54| / 78.54 = 0.46 % < 1 %
        ("79.4", "78.54", False),  # 1.09 % > 1 %
        ("25\\pi", "78.54", True),  # 78.5398..., 0.0003 % off
        ("1,000", "1000", True),
        ("1001", "1000", False),  # integer gold answers (counts) need the exact value
        ("1000.0", "1000", True),
        ("\\frac{1}{2}", "0.5", True),
        ("0.25", "25\\%", True),
        ("\\{2, 1\\}", "\\{1, 2\\}", True),
        ("[1, 2)", "[1, 2)", True),
        ("(1, 2)", "[1, 2)", False),
        ("\\sqrt{2}", "1.41421356", True),
        ("x^2 + 1", "1 + x^2", True),
        ("hello", "5", False),
        # scientific notation: math-verify alone reads "1e3" as 1, so a gold "1e3" would accept "1"
        ("1e3", "1000", True),
        ("2.5e-3", "0.0025", True),
        ("1", "1e3", False),
    ],
)
def test_answers_match(pred, gold, expected):
    assert answers_match(pred, gold) is expected


def test_tolerance_is_configurable():
    assert math_reward("\\boxed{78.9}", answer="78.54") == 1.0
    assert math_reward("\\boxed{78.9}", answer="78.54", tolerance=1e-3) == 0.0
    assert math_reward("\\boxed{1001}", answer="1000", integer_exact=False) == 1.0


@pytest.mark.parametrize("gold", [None, "", "   ", "\\text{}", "???"])
def test_unparseable_or_missing_ground_truth_is_none(gold):
    assert math_reward("\\boxed{4}", answer=gold) is None


def test_numeric_and_list_ground_truths():
    assert math_reward("\\boxed{4}", answer=4) == 1.0
    assert math_reward("\\boxed{-4}", answer=["4", "-4"]) == 1.0


def test_pathological_input_respects_the_time_limit():
    tower = "\\boxed{9^{9^{9^{9^{9}}}}}"
    start = time.monotonic()
    assert math_reward(tower, answer="5", time_limit=1.0) == 0.0
    assert time.monotonic() - start < 10.0  # killed worker, not a hang (generous bound for a loaded CI box)
    # the worker restarts: a risky-looking (nested powers) but cheap input gets its true result there
    assert math_reward("\\boxed{2^{3^{2}}}", answer="512", time_limit=20.0) == 1.0
    assert math_reward("\\boxed{2^{3^{2}}}", answer="511", time_limit=20.0) == 0.0


@pytest.mark.parametrize(
    "text, risky",
    [
        ("78.54", False),
        ("\\frac{1}{2}", False),
        ("x^2 + 1", False),
        ("10^{99}", False),
        ("9^{9^{9}}", True),  # tower of powers
        ("2**99999", True),
        ("x^{100000}", True),
        ("1000!", True),
        ("\\sum_{k=1}^{n} k", True),
        ("(" * 8 + "1" + ")" * 8, True),  # the LaTeX parser is slow on deep nesting (~6 s for 35 levels)
        ("1+" * 300 + "1", True),  # long
    ],
)
def test_which_inputs_go_to_the_killable_worker(text, risky):
    assert _risky(text) is risky


def test_works_outside_the_main_thread():
    """math-verify's signal-based timeout would raise here; ours is disabled."""
    out = []
    t = threading.Thread(target=lambda: out.append(math_reward("\\boxed{\\frac{3}{4}}", answer="0.75")))
    t.start()
    t.join(60)
    assert out == [1.0]


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("<think>r=5</think>\n\nThe area is $25\\pi \\approx 78.54$.", "78.54", 1.0),
        ("<think>r=5</think>\n\nThe area is $25\\pi$.", "25\\pi", 1.0),
        ("<think>r=5</think>\n\nThe area is $25\\pi$.", "25", 0.0),
        ("<think>r=5</think>\n\nThe area is $\\frac{\\sqrt{3}}{2}$ units.", "\\frac{\\sqrt{3}}{2}", 1.0),
        ("<think>r=5</think>\n\nThe area is $\\frac{\\sqrt{3}}{2}$ units.", "\\frac{\\sqrt{2}}{2}", 0.0),
        ("<think>x</think>\n\n**Final Answer**\n\n$$\\boxed{\\dfrac{3}{4}}$$", "0.75", 1.0),
        ("<think>x</think>\nThe final answer is $\\boxed{12}$. I hope it is correct.", "12", 1.0),
        ("<think>x</think>\nSo she has 18 dollars left.", "18", 1.0),
        ("<think>x</think>\nSo she has 18 dollars left.", "17", 0.0),
        (
            "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72",
            "72",
            1.0,
        ),
        ("<think>x</think>The answer is: 3.5%", "3.5\\%", 1.0),
        ("<think>x</think>The solutions are $x = 2$ and $x = 3$.", "\\{2, 3\\}", 1.0),
        ("<think>x</think>The solutions are $x = 2$ and $x = 3$.", "\\{2, 4\\}", 0.0),
    ],
)
def test_realistic_final_answers(completion, gold, expected):
    assert math_reward(completion, answer=gold) == expected


R1 = "<think>Kim has 4 bags of 3 pens: 4*3=12, plus 26 loose: 12+26=38</think>"


@pytest.mark.parametrize(
    "completion, gold, strict, expected",
    [
        # DeepSeek-R1 format: the <answer> block is the final-answer region (the tags were once part of it: 0.0)
        (R1 + "<answer>38</answer>", "38", False, 1.0),
        (R1 + "<answer>38</answer>", "38", True, 1.0),
        (R1 + "<answer>38</answer>", "12", False, 0.0),
        (R1 + "\n<answer>\n38\n</answer>", "38", True, 1.0),
        (R1 + "<answer>38</answer><|im_end|>", "38", True, 1.0),
        # without <think>, and with the <think> opened by the chat template
        ("<answer>38</answer>", "38", True, 1.0),
        ("<answer>38</answer>", "39", True, 0.0),
        ("4*3=12, 12+26=38</think>\n<answer>38</answer>", "38", True, 1.0),
        # what a block may hold: a boxed answer, an answer line, working ending in the result, LaTeX
        (R1 + "<answer>\\boxed{38}</answer>", "38", True, 1.0),
        (R1 + "<answer>The answer is 38.</answer>", "38", True, 1.0),
        (R1 + "<answer>\n12 + 26 = 38\n</answer>", "38", True, 1.0),
        (R1 + "<answer>$\\frac{3}{4}$</answer>", "0.75", True, 1.0),
        (R1 + "<answer>$\\frac{3}{4}$</answer>", "0.5", True, 0.0),
        # the block wins over prose around it; a boxed answer / answer line next to it must agree
        (R1 + "So there are 38 pens.\n<answer>38</answer>", "38", True, 1.0),
        (R1 + "\\boxed{38}<answer>38</answer>", "38", True, 1.0),
        (R1 + "\\boxed{40}<answer>38</answer>", "38", False, 0.0),
        (R1 + "<answer>38</answer>\nAnswer: 12", "38", False, 0.0),
        # several blocks: the same answer is fine, different answers are hedging
        (R1 + "<answer>38</answer><answer>38.0</answer>", "38", True, 1.0),
        (R1 + "<answer>12</answer><answer>38</answer>", "38", False, 0.0),
        # a tool call's numbers stay out of it
        (R1 + "<tool_call>calc(expression='12+26')</tool_call><answer>38</answer>", "38", True, 1.0),
        # an empty block is no answer: strict has nothing; non-strict falls back to the reasoning's last number
        (R1 + "<answer></answer>", "38", True, 0.0),
        (R1 + "<answer></answer>", "38", False, 1.0),
        # a block inside unfinished reasoning is not a final answer
        ("<think>maybe <answer>38</answer> but", "38", True, 0.0),
    ],
)
def test_answer_tags_are_a_final_answer_region(completion, gold, strict, expected):
    assert math_reward(completion, answer=gold, strict=strict) == expected
