"""The ToolEnv contract: schemas from plain functions, TRL's environment_factory class, call_with_timeout."""

from __future__ import annotations

import random
import threading
import time

import pytest

from grouprl.envs import (
    ERROR_KINDS,
    BadArgumentsError,
    ToolEnv,
    UnknownToolError,
    call_with_timeout,
    make_env_factory,
)
from grouprl.errors import ConfigError


def add(a: int, b: int) -> int:
    """
    Add two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum.
    """
    return a + b


def divide(a: float, b: float) -> float:
    """
    Divide a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


def nap(seconds: float) -> str:
    """
    Sleep, ignoring any deadline.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "awake"


# Written exactly as TRL's docs show an environment (docs/source/grpo_trainer.md, "Environments").
class IncrementEnv:
    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.counter = 0
        self.target = random.randint(1, 6)  # self-sample the task
        return f"Increment the counter by {self.target}."  # returned string becomes the prompt

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


# TRL's variant with an external dataset: the row's `target` column arrives as a keyword argument.
class DatasetIncrementEnv:
    def reset(self, target, **kwargs) -> None:  # the row's `target` column arrives as a keyword argument
        self.counter = 0
        self.target = target

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


def test_schema_from_a_plain_function():
    env = make_env_factory(tools=[add])()
    assert isinstance(env, ToolEnv) and env.instance is None
    assert env.tools == [{
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer", "description": "The first integer."},
                               "b": {"type": "integer", "description": "The second integer."}},
                "required": ["a", "b"],
            },
            "return": {"type": "integer", "description": "The sum."},
        },
    }]
    assert env.reset({"prompt": "hi"}) is None and env.reward() is None
    assert env.call("add", {"a": 2, "b": 40}) == "42"  # non-string results are shown as JSON


def test_trl_environment_class_runs_unchanged():
    factory = make_env_factory(environment_factory=IncrementEnv)
    env = factory()
    assert [t["function"]["name"] for t in env.tools] == ["increment"]  # reset / get_reward are not tools
    assert env.tools[0]["function"]["parameters"]["properties"] == {
        "step": {"type": "integer", "description": "Value to add to the counter."}}
    prompt = env.reset({"prompt": "ignored", "answer": 3})
    target = env.instance.target
    assert prompt == f"Increment the counter by {target}."
    assert env.reward() == 0.0
    assert env.call("increment", {"step": target}) == str(target)
    assert env.reward() == 1.0
    other = factory()  # a fresh instance per trajectory
    other.reset({})
    assert other.instance is not env.instance and other.instance.counter == 0

    env = make_env_factory(environment_factory=DatasetIncrementEnv)()
    row = {"prompt": [{"role": "user", "content": "Increment the counter to 4."}], "target": 4}
    assert env.reset(row) is None and env.instance.target == 4
    env.call("increment", {"step": 1})
    assert env.reward() == 0.0
    env.call("increment", {"step": 3})
    assert env.reward() == 1.0


def test_tools_and_environment_compose_and_async_tools_are_awaited():
    async def lookup(key: str) -> str:
        """
        Look a key up.

        Args:
            key: The key.
        """
        return key.upper()

    class AsyncEnv:
        def reset(self, **kwargs) -> None:
            self.calls = 0

        async def get_reward(self) -> float:
            return 0.5 * self.calls

        @staticmethod
        def helper() -> str:  # static methods are not tools (TRL takes bound methods only)
            return "no"

        def poke(self) -> str:
            """Poke the environment."""
            self.calls += 1
            return "ok"

    env = make_env_factory(tools=[lookup], environment_factory=AsyncEnv)()
    assert [t["function"]["name"] for t in env.tools] == ["poke", "lookup"]
    env.reset({})
    assert call_with_timeout(env, "lookup", {"key": "ab"}, 5.0) == ("AB", None)
    assert call_with_timeout(env, "poke", {}, 5.0) == ("ok", None)
    assert env.reward() == 0.5
    with pytest.raises(ConfigError, match=r"\['poke'\] are both a method of AsyncEnv and a function"):
        def poke() -> str:
            """Poke."""
            return ""

        make_env_factory(tools=[poke], environment_factory=AsyncEnv)()


def test_reset_without_kwargs_receives_only_the_columns_it_names():
    class Env:
        def reset(self, code: str) -> None:
            self.code = code

        def show(self) -> str:
            """Show the code."""
            return self.code

    env = make_env_factory(environment_factory=Env)()
    assert env.reset({"code": "x = 1", "prompt": "p", "answer": "a"}) is None
    assert env.call("show", {}) == "x = 1"


def test_dict_factory_picks_the_environment_from_the_row():
    class Other:
        def reset(self, **kw) -> None:
            self.seen = kw

        def ping(self) -> str:
            """Answer pong."""
            return "pong"

    factory = make_env_factory(environment_factory={"counter": IncrementEnv, "other": Other})
    env = factory()
    env.reset({"environment": "other", "level": 2})
    assert env.instance.seen == {"level": 2}  # the routing column is not forwarded to reset (TRL)
    assert [t["function"]["name"] for t in env.tools] == ["ping"] and env.call("ping", {}) == "pong"
    env = factory()
    env.reset({"environment": "counter"})
    assert env.call("increment", {"step": 2}) == "2"
    with pytest.raises(ConfigError, match="one of: counter, other"):
        factory().reset({"environment": "nope"})


def test_factory_errors_name_the_function_and_what_is_missing():
    def no_doc(x: int) -> int:
        return x

    def no_hint(x):
        """
        Echo.

        Args:
            x: Anything.
        """
        return x

    with pytest.raises(ConfigError, match="'no_doc'.*no docstring"):
        make_env_factory(tools=[no_doc])
    with pytest.raises(ConfigError, match="'no_hint'.*type hint"):
        make_env_factory(tools=[no_hint])

    class BadEnv:
        def reset(self, **kw):
            return None

        def go(self, where):
            """Go."""

    with pytest.raises(ConfigError, match="'BadEnv.go'"):
        make_env_factory(environment_factory=BadEnv)
    with pytest.raises(ConfigError, match="neither"):
        make_env_factory()

    class NoReset:
        def go(self) -> str:
            """Go."""
            return ""

    with pytest.raises(ConfigError, match="NoReset has no reset"):
        make_env_factory(environment_factory=NoReset)
    with pytest.raises(ConfigError, match="not a function"):
        make_env_factory(tools=[IncrementEnv])
    with pytest.raises(ConfigError, match="must be a class"):
        make_env_factory(environment_factory="IncrementEnv")


def test_arguments_are_checked_against_the_schema_before_the_call():
    env = make_env_factory(tools=[add, divide])()
    with pytest.raises(UnknownToolError, match="available tools: add, divide"):
        env.call("mul", {"a": 1})
    with pytest.raises(BadArgumentsError, match="unknown argument 'c' for tool 'add'; expected: a, b"):
        env.call("add", {"a": 1, "b": 2, "c": 3})
    with pytest.raises(BadArgumentsError, match="missing argument 'b' for tool 'add'"):
        env.call("add", {"a": 1})
    with pytest.raises(BadArgumentsError, match="argument 'a' of tool 'add': 'one' is not of type 'integer'"):
        env.call("add", {"a": "one", "b": 2})
    with pytest.raises(BadArgumentsError, match="must be a JSON object"):
        env.call("add", "1, 2")
    assert env.call("divide", {"a": 1, "b": 4}) == "0.25"


@pytest.mark.parametrize("name,args,kind,text", [
    ("add", {"a": 1, "b": 2}, None, "3"),
    ("mul", {"a": 1}, "unknown_tool", "error: unknown tool 'mul'; available tools: add, divide, nap"),
    ("add", {"x": 1}, "bad_arguments", "error: unknown argument 'x' for tool 'add'; expected: a, b"),
    ("divide", {"a": 1, "b": 0}, "exception",
     "error: tool 'divide' raised ZeroDivisionError: division by zero"),
])
def test_call_with_timeout_error_kinds(name, args, kind, text):
    env = make_env_factory(tools=[add, divide, nap])()
    assert call_with_timeout(env, name, args, timeout_s=5) == (text, kind)
    assert kind is None or kind in ERROR_KINDS


def test_call_with_timeout_returns_at_the_deadline_and_never_raises():
    env = make_env_factory(tools=[nap])()
    t0 = time.monotonic()
    text, kind = call_with_timeout(env, "nap", {"seconds": 3.0}, timeout_s=0.2)
    elapsed = time.monotonic() - t0
    assert (text, kind) == ("error: tool 'nap' did not finish within 0.2s", "timeout")
    assert elapsed < 1.5
    # the abandoned worker is a daemon thread: it cannot keep the interpreter alive
    assert all(t.daemon for t in threading.enumerate() if t.name == "grouprl-tool-nap")

    class Broken(ToolEnv):
        def call(self, name, arguments):
            raise KeyboardInterrupt  # even a BaseException comes back as text

    text, kind = call_with_timeout(Broken({}, []), "x", {}, 1.0)
    assert kind == "exception" and text == "error: tool 'x' raised KeyboardInterrupt"
