"""Start-up checks that must fail in seconds, before any model loads: the sandbox section, the model source."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from train_helpers import TRAIN_ROWS

import grouprl.models as model_loader
import grouprl.sandbox.capabilities as capabilities
import grouprl.sandbox.config as sandbox_config
from grouprl import GRPOConfig, GRPOTrainer
from grouprl.cli import main
from grouprl.errors import ConfigError
from grouprl.sandbox import SandboxUnavailable


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading weights is a test failure: every check below must fire before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the start-up checks failed")

    monkeypatch.setattr(model_loader, "load_model", refuse)
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
    with pytest.raises(ConfigError, match=r"no_such_model': no such folder \(looked in .*\). Fix: check the path"):
        GRPOTrainer(model=missing, config=cfg, train_dataset=TRAIN_ROWS)
    with pytest.raises(ConfigError, match="neither a local directory nor a hub id"):  # not path-like, not org/name
        GRPOTrainer(model="no such model", config=cfg, train_dataset=TRAIN_ROWS)


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


# ---- prompt length, truncation, chat template, LoRA targets, resume architecture (issue 11) -------------------
LONG_ROWS = [{"prompt": "What is 1 + 2?", "answer": "3"}] * 7 + [{"prompt": " ".join(["word"] * 10_000), "answer": "1"}]


def test_a_prompt_longer_than_the_context_fails_before_the_model_loads(no_model_load, tiny_model_dir, fast_config):
    # max_prompt_length null and a 10,000-word prompt: an error naming the row and the limit, not a 25 GB allocation
    cfg = fast_config(max_prompt_length=None)
    with pytest.raises(ConfigError, match=r"the longest prompt \(train row 7\) is \d{5} tokens; with 8 new tokens "
                                          r"that is \d+ positions, above the model's context of 512. Fix: set "
                                          r"max_prompt_length <= 504"):
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=LONG_ROWS)
    with pytest.raises(ConfigError, match=r"max_prompt_length=600 \(the longest prompt, train row 7, is \d+ tokens\)"):
        GRPOTrainer(model=str(tiny_model_dir), config=fast_config(max_prompt_length=600), train_dataset=LONG_ROWS)


def test_truncation_error_names_the_row_and_left_warns_once_with_the_count(no_model_load, tiny_model_dir, fast_config):
    from grouprl.errors import DataError

    with pytest.raises(DataError, match=r"train row 7: the prompt is \d+ tokens, above max_prompt_length=64 "
                                        r"\(truncation=error\)"):
        GRPOTrainer(model=str(tiny_model_dir), config=fast_config(truncation="error"), train_dataset=LONG_ROWS)
    with pytest.warns(UserWarning, match=r"^1 prompt\(s\) are longer than max_prompt_length=64 tokens and will be cut "
                                         r"from the left") as record:
        with pytest.raises(AssertionError, match="a model was loaded"):  # past every check, to the weights
            GRPOTrainer(model=str(tiny_model_dir), config=fast_config(), train_dataset=LONG_ROWS)
    assert len([w for w in record if "cut from the left" in str(w.message)]) == 1


def test_short_prompts_pass_the_length_check_silently(tiny_model_dir, fast_config):
    import warnings

    from grouprl.models import load_tokenizer
    from grouprl.run import checks as startup

    tok = load_tokenizer(str(tiny_model_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert startup.check_prompt_lengths(fast_config(), tok, 512, {"train": _train_rows_ds()}) == 0
    assert startup.model_context(str(tiny_model_dir)) == 512


def _train_rows_ds():
    import datasets

    return datasets.Dataset.from_list(TRAIN_ROWS)


def test_apply_chat_template_rule(tiny_model_dir):
    from grouprl.data.load import render_prompt
    from grouprl.errors import DataError
    from grouprl.models import load_tokenizer

    tok = load_tokenizer(str(tiny_model_dir))
    templated = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True)
    chat = [{"role": "user", "content": "2+2?"}]
    assert templated != "2+2?"
    # auto (the default, what the default recipe renders): plain text as written, chat messages templated
    assert render_prompt("2+2?", tok) == render_prompt("2+2?", tok, None, "auto") == "2+2?"
    assert render_prompt(chat, tok) == templated
    assert render_prompt("2+2?", tok, "Be brief.").startswith(tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}], tokenize=False)[:10])
    assert render_prompt("2+2?", tok, None, "always") == templated
    assert render_prompt(chat, tok, None, "never") == render_prompt("2+2?", tok, None, "never") + "\n" == "2+2?\n"
    assert render_prompt("2+2?", tok, "Be brief.", "never") == "Be brief.\n2+2?\n"
    tok.chat_template = None
    with pytest.raises(DataError, match="apply_chat_template=always but the tokenizer has no chat template"):
        render_prompt("2+2?", tok, None, "always")


def test_lora_target_modules_that_match_nothing_name_the_available_ones(tiny_model_dir):
    import torch

    from grouprl.models import load_model
    from grouprl.train.engine.model import apply_peft

    cfg = GRPOConfig(use_peft=True, lora_target_modules=["qproj"], num_generations=4, per_device_train_batch_size=4)
    with pytest.raises(ConfigError, match=r"lora_target_modules=.*'qproj'.* matches no module of this model. Fix: "
                                          r"use all-linear or names among its linear layers: .*k_proj.*q_proj"):
        apply_peft(load_model(str(tiny_model_dir), torch.device("cpu")), cfg)


def test_resume_from_a_checkpoint_of_another_architecture_is_a_clear_error(tiny_model_dir, tiny_llama_dir, fast_config,
                                                                           tmp_path):
    import shutil


    ckpt = tmp_path / "out" / "checkpoint-2"
    shutil.copytree(tiny_llama_dir, ckpt)
    cfg = fast_config(resume_from_checkpoint=True)
    trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=TRAIN_ROWS)
    with pytest.raises(ConfigError, match=r"resuming from .*checkpoint-2.: its model has model_type='llama' but the "
                                          r"model given has model_type='qwen2'"):
        trainer.train()
    # the dry run compares config.json files without loading anything
    assert main(["train", f"model={tiny_model_dir}", f"output_dir={tmp_path / 'out'}", "num_generations=4",
                 "per_device_train_batch_size=4", "--resume", "--dry-run"]) == 2


def test_a_single_file_without_eval_split_says_so_and_prints_no_broken_command(no_model_load, tiny_model_dir, tmp_path,
                                                                               capsys, fast_config):
    import json

    from grouprl.train.trainer import print_summary

    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in TRAIN_ROWS) + "\n")
    with pytest.raises(AssertionError, match="a model was loaded"):
        GRPOTrainer(model=str(tiny_model_dir), config=fast_config(dataset=str(data), eval_split="test"))
    assert "grouprl: no evaluation: dataset" in capsys.readouterr().out
    result = {"global_step": 2, "history": [], "evals": {}, "final_model": "out/final", "metrics_path": "m",
              "samples_path": "s"}
    print_summary(result, fast_config(dataset=str(data), eval_split="test"))
    out = capsys.readouterr().out
    assert "grouprl eval" not in out and "has no 'test' split, so this run has no held-out evaluation" in out


def test_python_api_run_records_what_it_used(tiny_model_dir, train_rows, fast_config):
    from pathlib import Path

    import torch
    import yaml
    from train_helpers import char_reward

    from grouprl.models import load_model

    model = load_model(str(tiny_model_dir), torch.device("cpu"))
    cfg = fast_config(max_steps=1, eval_before_train=False)
    trainer = GRPOTrainer(model=model, config=cfg, train_dataset=train_rows, reward_funcs=[char_reward, "exact"])
    trainer.train()
    saved = yaml.safe_load((Path(cfg.output_dir) / "config.yaml").read_text())
    assert saved["model"] == str(tiny_model_dir)
    assert saved["dataset"] == "<python object: 8 rows>"
    assert saved["reward_funcs"] == ["train_helpers:char_reward", "exact"]


@pytest.mark.parametrize("given, expected", [
    ({}, (["countdown"], "countdown")),  # the task's own reward, for training and held-out evaluation
    ({"reward_funcs": ["accuracy"]}, (["accuracy"], "countdown")),  # the user's choice stays
    ({"eval_reward": "accuracy"}, (["countdown"], "accuracy")),
])
def test_a_builtin_task_brings_its_default_reward(given, expected):
    from grouprl.config import GRPOConfig
    from grouprl.run.checks import apply_task_defaults

    cfg = GRPOConfig(dataset="builtin:countdown", **given)
    apply_task_defaults(cfg)
    assert (cfg.reward_funcs, cfg.eval_reward) == expected
    arithmetic = GRPOConfig(dataset="builtin:arithmetic")
    apply_task_defaults(arithmetic)
    assert (arithmetic.reward_funcs, arithmetic.eval_reward) == (["accuracy"], "accuracy")
    python_given = GRPOConfig(dataset="builtin:countdown")
    apply_task_defaults(python_given, reward_funcs=[len])  # reward functions passed to GRPOTrainer win
    assert python_given.reward_funcs == ["accuracy"]
