"""The multi-turn loop with a scripted policy: every way a trajectory can end, every way a tool can fail.

Each scenario checks the end reason, the recorded calls, what the model is shown, the metrics, and that
no tool thread outlives the run (wall time bounded well below the sleeping tool's duration).
"""

from __future__ import annotations

import time

import pytest
from rollout_helpers import FakeEnv, chatml_tokenizer, scripted_generate, wait_for_threads

from grouprl.rollout.multiturn import MultiTurnParams, MultiTurnRollout, multiturn_metrics
from grouprl.rollout.trajectory import stack_trajectories

E = "<|im_end|>"
CALL_F = f"<tool_call>f()</tool_call>{E}"
ANSWER = f"7{E}"


@pytest.fixture
def tok():
    return chatml_tokenizer()


def run(tok, scripts, rows=None, group_size=1, env=FakeEnv, calls=None, **params):
    p = MultiTurnParams(**{"max_turns": 3, "max_new_tokens": 200, **params})
    rollout = MultiTurnRollout(tok, scripted_generate(tok, scripts, calls), p, env_factory=env)
    rows = rows or [{"prompt": f"q{i}"} for i in range(len(scripts))]
    return rollout.run(rows, group_size=group_size)


@pytest.mark.parametrize("call, error, shown", [
    ("f(", "malformed", "error: malformed tool call: not valid call syntax (SyntaxError)"),
    ('{"name": "f", "arguments": [1]}', "malformed", "error: malformed tool call: 'arguments' must be an object"),
    ("nope()", "unknown_tool", "error: unknown tool 'nope'; available tools: add, boom, f, slow"),
    ("add(a=1)", "bad_arguments", "error: missing argument 'b' for tool 'add'; expected: a, b"),
    ('{"name": "add", "arguments": {"a": 1, "b": "x"}}', "bad_arguments", "error: argument 'b' of tool 'add': 'x' is not"),
    ("boom()", "exception", "error: tool 'boom' raised RuntimeError: kaput"),
])
def test_a_failing_call_is_shown_to_the_model_counted_and_the_run_goes_on(tok, call, error, shown):
    (t,) = run(tok, [[f"<tool_call>{call}</tool_call>{E}", ANSWER]])
    assert t.end_reason == "answered" and t.num_turns == 2
    assert [c["error"] for c in t.tool_calls] == [error]
    assert t.tool_calls[0]["result"].startswith(shown)
    assert t.messages[2]["role"] == "tool" and t.messages[2]["content"].startswith(shown)
    assert shown in tok.decode(t.completion_ids)  # the model sees the error in its next prompt
    m = multiturn_metrics([t])
    assert m["tools/calls_per_traj"] == 1 and m["tools/failure_frac"] == 1 and m["end_reason/answered"] == 1


def test_unclosed_call_block_is_malformed(tok):
    (t,) = run(tok, [[f"<tool_call>f(){E}", ANSWER]])
    assert t.tool_calls[0]["error"] == "malformed" and "unclosed <tool_call>" in t.tool_calls[0]["result"]


def test_a_tool_that_sleeps_past_its_timeout(tok):
    start = time.monotonic()
    (t,) = run(tok, [[f"<tool_call>slow()</tool_call>{E}", ANSWER]], tool_timeout_s=0.2)
    assert time.monotonic() - start < 3  # the tool would sleep 5 s
    assert t.end_reason == "answered" and t.tool_calls[0]["error"] == "timeout"
    assert t.tool_calls[0]["result"] == "error: tool 'slow' did not finish within 0.2s"
    assert wait_for_threads() == []  # close() woke the late call: no thread left behind


def test_trajectory_timeout(tok):
    start = time.monotonic()
    (t,) = run(tok, [[f"<tool_call>slow()</tool_call>{E}", ANSWER]], tool_timeout_s=5, trajectory_timeout_s=0.3)
    assert time.monotonic() - start < 3
    assert t.end_reason == "timeout" and t.num_turns == 1 and t.tool_calls[0]["error"] == "timeout"
    assert sum(t.loss_mask) == len(t.loss_mask)  # the tool turn was not appended
    assert wait_for_threads() == []


def test_max_turns(tok):
    calls = []
    (t,) = run(tok, [[CALL_F]], max_turns=2, calls=calls)
    assert t.end_reason == "max_turns" and t.num_turns == 2 and len(calls) == 2
    assert len(t.tool_calls) == 1  # the calls of the last turn are not run: no model turn would read them
    assert t.loss_mask == [1] * 6 + [0] * 25 + [1] * 6


def test_token_budget_ends_a_model_turn_without_eos(tok):
    (t,) = run(tok, [["abcdefghij"]], max_new_tokens=5)
    assert t.end_reason == "max_tokens" and t.completion_ids == tok.encode("abcde") and t.loss_mask == [1] * 5
    assert stack_trajectories([t], pad_id=0).truncated.tolist() == [True]


def test_token_budget_covers_tool_tokens_and_rolls_back_a_tool_turn_that_does_not_fit(tok):
    calls = []
    # 6 sampled + 25 tool-turn tokens = 31: fits in 32 (one token left for the model), not in 31
    (t,) = run(tok, [[CALL_F, "78"]], max_new_tokens=32, calls=calls)
    assert calls[1][1] == [1] and t.end_reason == "max_tokens"  # the second turn got the 1 token left
    assert t.loss_mask == [1] * 6 + [0] * 25 + [1]
    (t,) = run(tok, [[CALL_F, ANSWER]], max_new_tokens=31)
    assert t.end_reason == "max_tokens" and t.loss_mask == [1] * 6  # rolled back
    assert t.tool_calls == [{"name": "f", "arguments": {}, "result": "7", "error": None}]
    assert [m["role"] for m in t.messages] == ["user", "assistant"]


def test_tool_error_budget(tok):
    (t,) = run(tok, [[f"<tool_call>boom()</tool_call><tool_call>nope()</tool_call>{E}", ANSWER]], max_tool_failures=2)
    assert t.end_reason == "tool_error_budget" and t.num_turns == 1
    assert [c["error"] for c in t.tool_calls] == ["exception", "unknown_tool"]


def test_environment_reward_observation_and_groups(tok):
    rows = [{"prompt": "q0", "observation": "You are in room 1."}, {"prompt": "q1"}]
    trajs = run(tok, [[CALL_F, ANSWER], [ANSWER]], rows=rows, group_size=2, env=lambda: FakeEnv(reward=0.5))
    assert [t.group for t in trajs] == [0, 0, 1, 1]
    assert trajs[0].messages[0]["content"] == "q0\n\nYou are in room 1."
    assert "room 1." in tok.decode(trajs[0].prompt_ids) and "room" not in tok.decode(trajs[2].prompt_ids)
    assert [t.env_reward for t in trajs] == [0.5] * 4
    assert [t.num_turns for t in trajs] == [2, 2, 1, 1]
    assert trajs[0].completion == "<tool_call>f()</tool_call>\nuser\n<tool_response>\n7\n</tool_response>\nassistant\n7"
    m = multiturn_metrics(trajs)
    assert m["env_reward/mean"] == 0.5 and m["turns/mean"] == 1.5 and m["tools/calls_per_traj"] == 0.5
    assert m["tokens/model"] == (8 + 8 + 2 + 2) / 4 and m["tokens/tool"] == (25 + 25) / 4


def test_batch_metrics_and_only_active_trajectories_are_generated(tok):
    calls = []
    scripts = [[CALL_F, ANSWER], [f"<tool_call>boom()</tool_call>{E}", ANSWER], [ANSWER], ["abc"]]
    trajs = run(tok, scripts, calls=calls, schedule="lockstep")  # per-trajectory batches: test_schedule.py
    assert [t.end_reason for t in trajs] == ["answered", "answered", "answered", "max_tokens"]
    assert [len(prompts) for prompts, _ in calls] == [4, 2]
    m = multiturn_metrics(trajs)
    assert m["tools/calls_per_traj"] == 0.5 and m["tools/failure_frac"] == 0.5 and m["turns/mean"] == 6 / 4
    assert m["end_reason/answered"] == 0.75 and m["end_reason/max_tokens"] == 0.25 and m["end_reason/timeout"] == 0


class TrlStyleEnv:
    """A TRL ``environment_factory`` class: ``reset(**row)``, public methods are tools, ``get_reward``."""

    def reset(self, **row) -> str:
        self.key, self.found = row["key"], None
        return f"Find the value of {row['key']}."

    def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: the key to look up.
        """
        self.found = {"a": "1", "b": "2"}[key]
        return self.found

    def get_reward(self) -> float:
        return 1.0 if self.found == "2" else 0.0


def test_trl_style_environment_class(tok):
    rows = [{"prompt": "go", "key": "b"}]
    (t,) = run(tok, [['<tool_call>{"name": "lookup", "arguments": {"key": "b"}}</tool_call>' + E, f"2{E}"]],
               rows=rows, env=TrlStyleEnv)
    assert t.end_reason == "answered" and t.tool_calls[0]["result"] == "2" and t.env_reward == 1.0
    assert "Tools: lookup<|im_end|>" in tok.decode(t.prompt_ids) and "Find the value of b." in t.messages[0]["content"]
    (t,) = run(tok, [[f"<tool_call>lookup(key='z')</tool_call>{E}", ANSWER]], rows=rows, env=TrlStyleEnv)
    assert t.tool_calls[0]["error"] == "exception" and "KeyError" in t.tool_calls[0]["result"]
    assert t.env_reward == 0.0


class CountingEnv(TrlStyleEnv):
    def reset(self, **row) -> str:
        self.lookups, self.seen, self._secret, self.lock = 0, {"b"}, 1, __import__("threading").Lock()
        return super().reset(**row)

    def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: the key to look up.
        """
        self.lookups += 1
        return super().lookup(key)

    def get_reward(self) -> float:
        self.scored = True
        return super().get_reward()


def test_env_state_holds_the_public_plain_data_after_the_reward(tok):
    rows = [{"prompt": "go", "key": "b"}]
    (t,) = run(tok, [['<tool_call>lookup(key="b")</tool_call>' + E, f"2{E}"]], rows=rows, env=CountingEnv)
    # private (_secret) and non-data (a lock) attributes are left out; a set becomes a sorted list
    assert t.env_state == {"key": "b", "found": "2", "lookups": 1, "seen": ["b"], "scored": True}
    (t,) = run(tok, [[ANSWER]], env=None)
    assert t.env_state == {}


def test_no_environment_means_no_tools(tok):
    (t,) = run(tok, [[CALL_F, ANSWER]], env=None)
    assert t.tool_calls[0]["error"] == "unknown_tool" and "available tools: none" in t.tool_calls[0]["result"]


@pytest.mark.parametrize("field, value", [("max_turns", 0), ("tool_timeout_s", 0), ("max_tool_failures", 0)])
def test_params_are_validated(field, value):
    with pytest.raises(ValueError, match=f"MultiTurnParams.{field}={value}"):
        MultiTurnParams(**{field: value}).validate()


class BrokenRewardEnv(FakeEnv):
    def reward(self):
        raise ZeroDivisionError("no score")


def test_a_reward_that_raises_leaves_the_trajectory_unscored(tok, caplog):
    FakeEnv.instances.clear()
    (t,) = run(tok, [[ANSWER]], env=BrokenRewardEnv)
    assert t.end_reason == "answered" and t.env_reward is None
    assert "BrokenRewardEnv.reward() raised ZeroDivisionError: no score" in caplog.text
    assert FakeEnv.instances[0].closed.is_set()


def test_a_template_file_path_and_a_generate_fn_that_drops_rows(tok):
    from rollout_helpers import FIXTURES

    rollout = MultiTurnRollout(tok, lambda prompts, budgets, params: [], env_factory=FakeEnv,
                               chat_template=str(FIXTURES / "llama3_tools.jinja"))
    assert rollout.chat_template.startswith("{#- Header style")
    with pytest.raises(ValueError, match="generate_fn returned 0 rows for 1 prompts"):
        rollout.run([{"prompt": "q"}])


def test_a_hanging_custom_call_tool_is_bounded(tok):
    import threading

    release = threading.Event()

    def hanging(env, name, args, timeout_s):  # ignores its timeout
        release.wait(10)
        return "late", None

    p = MultiTurnParams(max_turns=2, tool_timeout_s=0.1, trajectory_timeout_s=0.2)
    rollout = MultiTurnRollout(tok, scripted_generate(tok, [[CALL_F, ANSWER]]), p, env_factory=FakeEnv,
                               call_tool=hanging)
    start = time.monotonic()
    (t,) = rollout.run([{"prompt": "q"}])
    assert time.monotonic() - start < 3
    release.set()
    assert t.end_reason == "timeout" and t.tool_calls[0]["error"] == "timeout"
    assert wait_for_threads("grouprl-tools") == []
