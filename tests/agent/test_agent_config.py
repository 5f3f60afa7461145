"""The agent config keys: recipe loading, validation before the model loads, what config.yaml records."""

from __future__ import annotations

import pytest

from grouprl import GRPOConfig, GRPOTrainer
from grouprl.errors import ConfigError
from grouprl.train.agent import build_agent


def test_a_recipe_with_the_calculator_environment_loads(tmp_path):
    recipe = tmp_path / "agent.yaml"
    recipe.write_text("environment: calculator\nmax_turns: 3\ntool_timeout_s: 2.5\nreward_funcs: [accuracy]\n")
    cfg = GRPOConfig.from_yaml(recipe)
    agent = build_agent(cfg)
    assert agent.max_turns == 3 and agent.tool_timeout_s == 2.5 and agent.trajectory_timeout_s == 300.0
    assert [t["function"]["name"] for t in agent.tool_schemas()] == ["calculator"]
    assert build_agent(GRPOConfig()) is None  # no tools, no environment: single-turn


def test_recipe_tools_by_import_path(tmp_path):
    cfg = GRPOConfig(tools=["grouprl.envs.calculator:calculator"], max_turns=2)
    agent = build_agent(cfg)
    assert [t["function"]["name"] for t in agent.tool_schemas()] == ["calculator"]
    assert cfg.tools == ["grouprl.envs.calculator:calculator"]


@pytest.mark.parametrize("key, value, message", [
    ("max_turns", 0, "max_turns=0 must be a whole number >= 1"),
    ("max_tool_failures", 0, "max_tool_failures=0 must be a whole number >= 1, or null"),
    ("tool_timeout_s", 0, "tool_timeout_s=0 must be a number of seconds > 0"),
    ("trajectory_timeout_s", -1.0, "trajectory_timeout_s=-1.0 must be a number of seconds > 0"),
    ("tools", ["calculator"], "tools entry 'calculator' must look like 'package.module:function'"),
    ("environment", "a:b:c", "environment='a:b:c' must be a built-in name"),
])
def test_bad_values_are_rejected_when_the_config_is_built(key, value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GRPOConfig(**{key: value})


@pytest.mark.parametrize("cfg, message", [
    (dict(environment="calculater"), "unknown environment 'calculater'.*Did you mean 'calculator'"),
    (dict(tools=["grouprl.envs.calculator:nope"]), "has no attribute 'nope'"),
    (dict(tools=["no_such_module_xyz:fn"]), "cannot import 'no_such_module_xyz'"),
])
def test_names_fail_at_start_up_before_the_model_loads(cfg, message):
    with pytest.raises(ConfigError, match=message):
        GRPOTrainer(model="/no/such/model", config=GRPOConfig(**cfg), train_dataset=[{"prompt": "q"}],
                    reward_funcs=["accuracy"])


class TextOnlyBackend:
    """A text-level backend (``generate(prompts, n, params) -> Rollout``): single-turn runs only."""

    def __init__(self, model, tokenizer):
        pass


def test_a_text_level_backend_with_tools_is_refused_and_an_unloadable_one_named():
    with pytest.raises(ConfigError, match="text-level backend.*subclass grouprl.rollout.engine.Engine"):
        build_agent(GRPOConfig(environment="calculator", rollout_backend=f"{__name__}:TextOnlyBackend"))
    with pytest.raises(ConfigError, match="rollout_backend='pkg.mod:Engine' cannot be loaded"):
        build_agent(GRPOConfig(environment="calculator", rollout_backend="pkg.mod:Engine"))


def test_vllm_and_engine_plug_ins_drive_agents():
    assert build_agent(GRPOConfig(environment="calculator", rollout_backend="vllm")) is not None
    agent = build_agent(GRPOConfig(environment="calculator", rollout_backend="grouprl.rollout.engine:Engine",
                                   max_concurrent_tools=3, agent_schedule="lockstep"))
    assert agent.params(64).max_concurrent_tools == 3 and agent.params(64).schedule == "lockstep"


def test_a_tool_without_a_docstring_fails_at_start_up():
    def bare(x: int) -> int:
        return x

    with pytest.raises(ConfigError, match="tool 'bare' cannot be shown to the model"):
        GRPOTrainer(model="/no/such/model", config=GRPOConfig(), train_dataset=[{"prompt": "q"}],
                    reward_funcs=["accuracy"], tools=[bare])


def test_a_template_that_is_not_prefix_preserving_stops_the_run(tmp_path, tiny_model_dir):
    from pathlib import Path

    template = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates" / "think_dropping.jinja"
    cfg = GRPOConfig(environment="calculator", chat_template=str(template), output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="cannot drive multi-turn tool rollouts"):
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=[{"prompt": "q"}], reward_funcs=["accuracy"])
