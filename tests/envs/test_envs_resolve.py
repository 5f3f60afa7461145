"""Tools and environments named in a recipe: built-in names, 'pkg.mod:name' plug-ins, clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grouprl.builtins import load_builtins
from grouprl.envs import (
    CalculatorEnv,
    CodeRepairEnv,
    GuessNumberEnv,
    SearchEnv,
    make_env_factory,
    resolve_environment,
    resolve_tools,
)
from grouprl.errors import ConfigError
from grouprl.registry import ENVIRONMENTS

PLUGIN = '''
def shout(text: str) -> str:
    """
    Upper-case a text.

    Args:
        text: The text.
    """
    return text.upper()


class EchoEnv:
    def reset(self, **row):
        return None

    def echo(self, text: str) -> str:
        """
        Repeat a text.

        Args:
            text: The text.
        """
        return text
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "my_envs_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_envs_plugin"
    sys.modules.pop("my_envs_plugin", None)


def test_builtin_environments_are_registered():
    assert "environments" in load_builtins()
    assert {"calculator": CalculatorEnv, "python": CodeRepairEnv, "search": SearchEnv, "guess_number": GuessNumberEnv} == {
        n: ENVIRONMENTS.get(n) for n in ENVIRONMENTS.names()}
    for name in ENVIRONMENTS.names():
        assert resolve_environment(name) is ENVIRONMENTS.get(name)
        make_env_factory(environment_factory=resolve_environment(name))  # every schema builds


def test_plugins_from_a_module_path(plugin):
    [shout] = resolve_tools([f"{plugin}:shout"])
    env = make_env_factory(tools=[shout])()
    assert env.call("shout", {"text": "hi"}) == "HI"
    env = make_env_factory(environment_factory=resolve_environment(f"{plugin}:EchoEnv"))()
    env.reset({})
    assert env.call("echo", {"text": "hi"}) == "hi"
    assert resolve_tools([len]) == [len] and resolve_environment(SearchEnv) is SearchEnv


def test_resolve_errors_say_what_to_do(plugin):
    with pytest.raises(ConfigError, match="unknown environment 'calculater'.*Did you mean 'calculator'"):
        resolve_environment("calculater")
    with pytest.raises(ConfigError, match="No module named 'not_a_module'.*PYTHONPATH"):
        resolve_environment("not_a_module:Env")
    with pytest.raises(ConfigError, match="has no attribute 'shoot'.*Did you mean 'shout'"):
        resolve_tools([f"{plugin}:shoot"])
    with pytest.raises(ConfigError, match="is not a function; a class goes under environment"):
        resolve_tools([f"{plugin}:EchoEnv"])
    with pytest.raises(ConfigError, match="must look like 'package.module:name'"):
        resolve_tools([f"{plugin}:"])
    with pytest.raises(ConfigError, match="must be a list"):
        resolve_tools(f"{plugin}:shout")


def test_importing_the_environments_stays_light():
    # grouprl list / config validation import grouprl.envs: transformers and jsonschema load on first use
    code = ("import sys, grouprl.builtins as b; b.load_builtins(); "
            "print(sorted(m for m in ('transformers', 'jsonschema', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "transformers" not in out.stdout and "jsonschema" not in out.stdout
