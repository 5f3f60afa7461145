"""Start-up checks that must fail in seconds, before any model loads: the sandbox section, the model source."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from train_helpers import TRAIN_ROWS

import grouprl.sandbox.capabilities as capabilities
import grouprl.sandbox.config as sandbox_config
import grouprl.train.model as model_mod
from grouprl import GRPOConfig, GRPOTrainer
from grouprl.cli import main
from grouprl.errors import ConfigError
from grouprl.sandbox import SandboxUnavailable


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading weights is a test failure: every check below must fire before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the start-up checks failed")

    monkeypatch.setattr(model_mod, "load_model", refuse)
    monkeypatch.setattr(sandbox_config, "_CURRENT", sandbox_config._CURRENT)  # restored after the test


@pytest.fixture
def no_strict(monkeypatch):
    """A machine without bubblewrap: strict (and auto) cannot be had; basic can."""
    fake = dataclasses.replace(capabilities.detect(), strict_missing=("bubblewrap (bwrap) is not installed",),
                               basic_python=sys.executable)
    monkeypatch.setattr(capabilities, "detect", lambda: fake)


def test_sandbox_section_is_checked_at_start_up_not_by_the_config(no_model_load, tiny_model_dir):
    # the config package never imports the sandbox: its section is checked by grouprl.sandbox.config
    with pytest.raises(ConfigError, match=r"sandbox.isolaton is not a sandbox setting. Did you mean 'isolation'\?"):
        sandbox_config.check_section({"isolaton": "strict"})
    with pytest.raises(ConfigError, match=r"sandbox.timeout=0 must be > 0 seconds"):
        sandbox_config.check_section({"timeout": 0})
    cfg = GRPOConfig(sandbox={"isolaton": "strict"}, num_generations=4, per_device_train_batch_size=4)
    with pytest.raises(ConfigError, match=r"sandbox.isolaton is not a sandbox setting"):  # before the model
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=TRAIN_ROWS)
    assert main(["train", "sandbox.isolaton=strict", "num_generations=4", "--dry-run"]) == 2
    with pytest.raises(ConfigError, match="sandbox=.* must be a mapping"):  # a field type: checked by the config
        GRPOConfig(sandbox="strict")
    assert GRPOConfig.from_yaml(None, ["sandbox.timeout=3", "sandbox.workers=2"]).sandbox == {"timeout": 3,
                                                                                             "workers": 2}


def test_sandbox_section_is_applied_at_start_up(no_model_load, no_strict, tiny_model_dir):
    cfg = GRPOConfig(reward_funcs=["exact"], sandbox={"isolation": "basic", "timeout": 2.5, "workers": 3},
                     num_generations=4, per_device_train_batch_size=4)
    with pytest.raises(AssertionError, match="a model was loaded"):  # got past the checks, to the model
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=TRAIN_ROWS)
    now = sandbox_config.current()
    assert (now.isolation, now.timeout, now.workers) == ("basic", 2.5, 3)
    # no section and no code reward: the sandbox is not touched (a machine without bwrap can still train)
    assert sandbox_config.configure_for_run(GRPOConfig(reward_funcs=["exact"], eval_reward="exact")) is None


@pytest.mark.parametrize("settings", [dict(sandbox={"isolation": "strict"}),
                                      dict(reward_funcs=["code"]),  # the code reward implies the default, auto
                                      dict(reward_kwargs={"accuracy": {"task_type": "code"}})])
def test_unavailable_isolation_fails_before_the_model_loads(no_model_load, no_strict, settings, tiny_model_dir):
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, **settings)
    with pytest.raises(SandboxUnavailable, match="needs strict isolation.*bubblewrap"):
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=TRAIN_ROWS)


def test_cli_dry_run_checks_the_sandbox(no_strict, monkeypatch, capsys):
    monkeypatch.setattr(sandbox_config, "_CURRENT", sandbox_config._CURRENT)
    assert main(["train", "sandbox.isolation=strict", "num_generations=4", "--dry-run"]) == 2
    assert "needs strict isolation" in capsys.readouterr().err
    assert main(["train", "sandbox.isolation=basic", "num_generations=4", "--dry-run"]) == 0


def test_missing_local_model_path_is_a_one_line_error(no_model_load, tmp_path):
    cfg = GRPOConfig(reward_funcs=["exact"], num_generations=4, per_device_train_batch_size=4)
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(ConfigError, match="neither a local directory nor a hub id"):
        GRPOTrainer(model=missing, config=cfg, train_dataset=TRAIN_ROWS)


def test_unreachable_hub_fails_fast_with_the_fixes(no_model_load, monkeypatch):
    import huggingface_hub.utils
    from huggingface_hub import constants

    class Offline:
        def head(self, url, timeout):
            assert timeout <= 5  # one short request, no retry loop
            raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: Offline())
    cfg = GRPOConfig(reward_funcs=["exact"], num_generations=4, per_device_train_batch_size=4)
    with pytest.raises(ConfigError) as e:
        GRPOTrainer(model="no-such-org/no-such-model-xyz", config=cfg, train_dataset=TRAIN_ROWS)
    msg = str(e.value)
    assert "model='no-such-org/no-such-model-xyz'" in msg and "unreachable" in msg and "Name or service" in msg
    assert "hf download no-such-org/no-such-model-xyz" in msg and "HF_ENDPOINT" in msg


def test_options_for_a_reward_not_in_use_are_an_error(no_model_load, tiny_model_dir):
    cfg = GRPOConfig(reward_funcs=["accuracy"], reward_kwargs={"acuracy": {"task_type": "math"}}, num_generations=4,
                     per_device_train_batch_size=4)
    with pytest.raises(ConfigError, match=r"options for 'acuracy', which is not among .* Did you mean 'accuracy'\?"):
        cfg.check_reward_kwargs()
    # the trainer checks against the reward functions it is actually given
    cfg = GRPOConfig(reward_kwargs={"format": {}}, eval_reward="exact", num_generations=4,
                     per_device_train_batch_size=4)
    with pytest.raises(ConfigError, match="options for 'format'"):
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=TRAIN_ROWS, reward_funcs=["exact"])
    with pytest.raises(AssertionError, match="a model was loaded"):  # in use: accepted
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=TRAIN_ROWS, reward_funcs=["format"])
