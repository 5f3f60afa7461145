"""Adapters: rewards called exactly the way TRL 1.16's GRPOTrainer calls reward_funcs, and verl's way."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from grouprl.errors import ConfigError, RewardError, UnknownNameError
from grouprl.registry import REWARDS
from grouprl.rewards import completion_text, compute_score, make_reward_func

HONEST = "<think>The radius is 5, so the area is pi times 25, which is about 78.54.</think> \\boxed{78.54}"
WRONG = "<think>The radius is 5, so the area is 10 pi, about 31.4.</think> \\boxed{31.4}"


def _trl_kwargs(n: int, **columns):
    """The keyword arguments TRL 1.16 passes (grpo_trainer._calculate_rewards): prompts, completions,
    completion_ids, every dataset column as a list, trainer_state, log_extra, log_metric."""
    state = SimpleNamespace(global_step=5, max_steps=10)
    return dict(
        completion_ids=[[1, 2, 3]] * n,
        trainer_state=state,
        log_extra=lambda *a, **k: None,
        log_metric=lambda *a, **k: None,
        **columns,
    )


def test_builtin_rewards_are_registered():
    for name in (
        "accuracy",
        "math",
        "exact",
        "tool_call",
        "format",
        "efficiency",
        "safety",
        "robust",
        "composite",
    ):
        assert name in REWARDS


def test_trl_call_with_plain_strings_and_columns():
    f = make_reward_func("math")
    assert f.__name__ == "math"
    out = f(
        prompts=["q1", "q2", "q3"],
        completions=[HONEST, WRONG, HONEST],
        **_trl_kwargs(3, answer=["78.54", "78.54", "???"], level=[1, 2, 3]),
    )
    assert out == [1.0, 0.0, None]  # unparseable gold -> None (TRL turns it into NaN)


def test_trl_call_with_chat_completions_and_ground_truth_alias():
    f = make_reward_func("accuracy")
    completions = [
        [{"role": "assistant", "content": HONEST}],
        [{"role": "assistant", "content": [{"type": "text", "text": "\\boxed{31.4}"}]}],
        [
            {"role": "assistant", "content": "", "reasoning_content": "25 pi"},
            {"role": "tool", "content": "78.54"},  # tool output is not the policy's answer
            {"role": "assistant", "content": "Answer: 78.54"},
        ],
    ]
    prompts = [[{"role": "user", "content": "Area of a circle of radius 5?"}]] * 3
    out = f(prompts=prompts, completions=completions, **_trl_kwargs(3, ground_truth=["78.54"] * 3))
    assert out == [1.0, 0.0, 1.0]


def test_structured_tool_calls_become_tool_call_blocks():
    msgs = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": '{"query": "GRPO"}'}}
            ],
        }
    ]
    assert (
        completion_text(msgs) == '<tool_call>{"name": "search", "arguments": {"query": "GRPO"}}</tool_call>'
    )
    f = make_reward_func("tool_call")
    assert f(completions=[msgs], prompts=None, **_trl_kwargs(1, answer=["search(query='GRPO')"])) == [1.0]


def test_fixed_kwargs_and_per_sample_columns():
    f = make_reward_func("math", strict=True)
    worked = "<think>S = 78.54</think><tool_call>calculator(expression='3.14159 * 5**2')</tool_call>"
    assert f([worked], answer=["78.54"]) == [0.0]
    g = make_reward_func("accuracy")
    out = g(
        ["Paris", "\\boxed{2}"],
        answer=["paris", "2"],
        task_type=["exact", "math"],
        case_sensitive=[False, None],
    )
    assert out == [1.0, 1.0]


def test_composite_uses_trainer_progress_for_the_schedule():
    from grouprl.rewards import RewardConfig, format_first_schedule

    sched = format_first_schedule(RewardConfig())

    def scheduled(completion, *, answer=None, progress=None, **meta):
        from grouprl.rewards import AgentRewardFunction

        return AgentRewardFunction(RewardConfig(), schedule=sched)(completion, answer, progress=progress)[
            "total"
        ]

    f = make_reward_func(scheduled)
    early = f(
        ["\\boxed{78.54}"], answer=["78.54"], trainer_state=SimpleNamespace(global_step=0, max_steps=10)
    )
    late = f(
        ["\\boxed{78.54}"], answer=["78.54"], trainer_state=SimpleNamespace(global_step=10, max_steps=10)
    )
    assert early == [pytest.approx(0.6)] and late == [pytest.approx(0.8)]  # 0.3 + 0.3 early, 0.5 + 0.3 late


def test_composite_by_name_with_template_and_schedule():
    worked = (
        "<think>\n需要计算圆的面积：S = π × r² = π × 5² ≈ 78.54\n</think>\n"
        "<tool_call>calculator(expression='3.14159 * 5**2')</tool_call>"
    )
    assert make_reward_func("composite", config="math")([worked], answer=["78.54"]) == [pytest.approx(0.97)]
    f = make_reward_func("composite", schedule="format_first")
    start = SimpleNamespace(global_step=0, max_steps=100)
    # early weights 0.3 / 0.4 / 0.15 / 0.15: 0.3 * 1 + 0.4 * 0.8 + 0.15 + 0.15
    assert f([worked], answer=["78.54"], trainer_state=start) == [pytest.approx(0.92)]
    assert f([worked], answer=["78.54"]) == [pytest.approx(0.96)]  # no progress known: the config's weights


def test_user_callables_get_only_the_arguments_they_accept():
    def exact_len(completion, answer=None):
        return float(len(completion) == int(answer))

    f = make_reward_func(exact_len)
    assert f.__name__ == "exact_len"
    assert f(["abc", "ab"], prompts=["p", "p"], **_trl_kwargs(2, answer=["3", "3"], extra=["x", "y"])) == [
        1.0,
        0.0,
    ]


def test_errors_name_the_reward_and_the_sample():
    def broken(completion, **kw):
        if completion == "bad":
            raise KeyError("boom")
        return 1.0

    with pytest.raises(RewardError, match="reward 'broken' raised on sample 1"):
        make_reward_func(broken)(["ok", "bad"])
    with pytest.raises(UnknownNameError, match="Closest match: 'format'"):
        make_reward_func("formt")


def test_reward_funcs_are_picklable():
    f = pickle.loads(pickle.dumps(make_reward_func("format", direct_answer_credit=True)))
    assert f.__name__ == "format" and f([HONEST]) == [pytest.approx(0.8)]


def test_inside_trl_grpo_trainer_reward_computation():
    """Run TRL's own GRPOTrainer._calculate_rewards on our reward functions (no model needed)."""
    pytest.importorskip("trl")
    import torch
    from transformers import TrainerState
    from trl import GRPOTrainer
    from trl.trainer.utils import get_callable_name

    funcs = [make_reward_func("math"), make_reward_func("format"), make_reward_func("composite")]
    fake = SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        reward_funcs=funcs,
        reward_processing_classes=[None] * 3,
        reward_func_names=[get_callable_name(f) for f in funcs],
        state=TrainerState(global_step=3, max_steps=10),
        args=SimpleNamespace(report_to=[]),
        _log_completion_extra=lambda *a, **k: None,
        _log_metric=lambda *a, **k: None,
        environments=None,
    )
    assert fake.reward_func_names == ["math", "format", "composite"]
    prompts = [[{"role": "user", "content": "Area of a circle of radius 5?"}]] * 2
    completions = [[{"role": "assistant", "content": HONEST}], [{"role": "assistant", "content": "no idea"}]]
    inputs = [{"prompt": p, "answer": "78.54", "level": 2} for p in prompts]
    rewards = GRPOTrainer._calculate_rewards(fake, inputs, prompts, completions, [[1, 2], [3]])
    # row 0: math 1, format 0.4 (think 0.2 + 0.2, no tool call), composite 0.5 + 0.2 * 0.4 + 0.15 + 0.15
    # row 1: math 0, format 0, composite 0.15 + 0.15
    assert rewards.flatten().tolist() == pytest.approx([1.0, 0.4, 0.88, 0.0, 0.0, 0.3])


@pytest.mark.parametrize(
    "data_source, solution, truth, extra, expected",
    [
        ("openai/gsm8k", "<think>6 * 7</think> The answer is 42.", "42", None, 1.0),
        ("lighteval/MATH", "\\boxed{\\frac{1}{2}}", "0.5", None, 1.0),
        ("my_tool_data", "<tool_call>search(query='x')</tool_call>", "search(query='y')", None, 0.5),
        ("anything", "Paris", "Paris", {"task_type": "exact"}, 1.0),
        ("anything", "<think>ok</think>", "unused", {"reward": "format"}, 0.2),
        ("openai/gsm8k", "\\boxed{1}", "???", None, 0.0),  # no opinion -> 0.0 (verl needs a float)
    ],
)
def test_verl_compute_score(data_source, solution, truth, extra, expected):
    assert compute_score(data_source, solution, truth, extra) == pytest.approx(expected)


def test_verl_compute_score_options():
    from grouprl.errors import ConfigError

    worked = "<think>S = 78.54</think><tool_call>calculator(expression='3.14159 * 5**2')</tool_call>"
    assert compute_score("gsm8k", worked, "78.54", {"reward_kwargs": {"strict": True}}) == 0.0
    assert compute_score("gsm8k", worked, "78.54") == 1.0
    with pytest.raises(ConfigError, match="Did you mean 'strict'"):
        compute_score("gsm8k", worked, "78.54", {"reward": "math", "reward_kwargs": {"strikt": True}})


def test_batch_capable_rewards_are_called_once_with_column_lists():
    # A reward exposing ``fn.batch`` (like the sandboxed code reward) gets the whole batch in one call:
    # per-sample columns as lists (answer aliases resolved), fixed options as scalars.
    calls = []

    def per_sample(completion, *, answer=None, **meta):
        raise AssertionError("the batch path must be used")

    def batch(completions, **cols):
        calls.append(cols)
        return [float(c == a) for c, a in zip(completions, cols["answer"])]

    per_sample.batch = batch
    f = make_reward_func(per_sample, timeout=3.0)
    out = f(["4", [{"role": "assistant", "content": "5"}]], prompts=["p1", "p2"], ground_truth=["4", "4"], tests=[1, 2])
    assert out == [1.0, 0.0]
    assert len(calls) == 1
    assert calls[0]["answer"] == ["4", "4"] and calls[0]["tests"] == [1, 2] and calls[0]["prompt"] == ["p1", "p2"]
    assert calls[0]["timeout"] == 3.0


def test_batch_reward_returning_wrong_length_is_a_clear_error():
    def per_sample(completion, **meta):
        return 1.0

    per_sample.batch = lambda completions, **cols: [1.0]
    with pytest.raises(RewardError, match="returned 1 scores for 2"):
        make_reward_func(per_sample)(["a", "b"])


NEEDS_SETUP = {"judge": "base_url", "reward_model": "path"}


@pytest.mark.parametrize("name", sorted(REWARDS.names()))
def test_every_registered_reward_takes_trls_call_unchanged(name):
    """Each registry entry, lifted by make_reward_func, accepts TRL's exact call with chat completions
    and returns one float-or-None per completion (the code reward runs its sandbox only if available)."""
    if name == "code":
        from grouprl.sandbox import detect

        if not detect().strict:
            pytest.skip("the code sandbox (strict isolation) is not available on this machine")
    completions = [
        [{"role": "assistant", "content": HONEST}],
        [{"role": "assistant", "content": "```python\ndef f():\n    return 1\n```"}],
    ]
    prompts = [[{"role": "user", "content": "q"}]] * 2
    f = make_reward_func(name)
    if name in NEEDS_SETUP:  # without its endpoint / model the first call is a ConfigError (tests/judge)
        with pytest.raises(ConfigError, match=NEEDS_SETUP[name]):
            f(prompts=prompts, completions=completions, **_trl_kwargs(2))
        return
    extra = {"tool_calls": [[], []]} if name == "retrieval" else {}  # an agent trainer's trajectory column
    out = f(prompts=prompts, completions=completions,
            **_trl_kwargs(2, answer=["78.54", "78.54"], tests=[["assert f() == 1"]] * 2, **extra))
    assert f.__name__ == name and len(out) == 2
    assert all(v is None or (isinstance(v, float) and 0.0 <= v <= 1.0) for v in out), out
    if name in ("math", "accuracy", "robust"):
        assert out[0] == 1.0
    if name == "code":
        assert out == [0.0, 1.0]  # prose has no code; f() == 1 passes its one test


def test_fixed_options_are_checked_against_what_the_reward_understands():
    from grouprl.errors import ConfigError

    with pytest.raises(ConfigError, match="reward 'math' takes no option 'strcit'.*Did you mean 'strict'"):
        make_reward_func("math", strcit=True)
    with pytest.raises(ConfigError, match="Did you mean 'shaped'"):
        make_reward_func("accuracy", task_type="tool_call", shapd=True)
    with pytest.raises(ConfigError, match="Did you mean 'tolerance'"):
        make_reward_func("composite", config="math", tolerence=0.1)
    # options a reward hands on to the functions it calls are accepted
    make_reward_func("accuracy", task_type="tool_call", shaped=True, schema={"type": "object"})
    make_reward_func("robust", strict=True, max_words=500, tolerance=0.05)
    make_reward_func("composite", config="math", schedule="format_first", strict=True)
    make_reward_func("code", entry_point="f", workers=2, budget=30.0, timeout=5.0)
    # user callables: named parameters only, unless they take **kwargs
    with pytest.raises(ConfigError, match="reward '_exact_len' takes no option 'tolerance'"):
        make_reward_func(_exact_len, tolerance=3)
    make_reward_func(lambda completion, **kw: 1.0, anything=1)


def _exact_len(completion, answer=None):
    return float(len(completion) == int(answer))
