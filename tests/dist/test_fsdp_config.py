"""What an FSDP launch accepts and refuses, named before any model loads (no processes started)."""

from __future__ import annotations

import pytest

from grouprl.config import GRPOConfig
from grouprl.errors import ConfigError


def test_fsdp2_is_accepted_fsdp1_and_offloading_are_refused(monkeypatch):
    from grouprl.train.parallel.fsdp import check_env, requested

    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert not requested()
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert requested()
    check_env()  # accepted
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ConfigError, match="FSDP version 1 .*fsdp_version: 2"):
        check_env()
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    with pytest.raises(ConfigError, match="fsdp_offload_params: false"):
        check_env()


def test_fsdp_refuses_what_it_cannot_shard(monkeypatch):
    from grouprl.train.parallel.ranks import check_config

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    check_config(GRPOConfig(), 2)  # the default recipe shards
    with pytest.raises(ConfigError, match="dynamic_sampling='drop' with FSDP on 2 processes"):
        check_config(GRPOConfig(dynamic_sampling="drop"), 2)
    with pytest.raises(ConfigError, match="use_peft=true with FSDP"):
        check_config(GRPOConfig(use_peft=True), 2)
    with pytest.raises(ConfigError, match="dynamic_sampling='resample' with FSDP on 2 processes"):
        check_config(GRPOConfig(dynamic_sampling="resample"), 2)
    with pytest.raises(ConfigError, match="rollout_backend='vllm' with FSDP on 2 processes"):
        check_config(GRPOConfig(rollout_backend="vllm"), 2)
    check_config(GRPOConfig(dynamic_sampling="drop", use_peft=True), 1)  # one process: nothing is sharded
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    check_config(GRPOConfig(dynamic_sampling="drop", use_peft=True), 2)  # data parallel: both work


def test_layer_classes_come_from_the_config_or_the_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from grouprl.train.parallel.fsdp import layer_classes

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert [c.__name__ for c in layer_classes(model, None)] == ["Qwen2DecoderLayer"]  # _no_split_modules
    assert [c.__name__ for c in layer_classes(model, ["Qwen2MLP"])] == ["Qwen2MLP"]
    with pytest.raises(ConfigError, match="LlamaDecoderLayer"):
        layer_classes(model, ["LlamaDecoderLayer"])


def test_an_fsdp_checkpoint_given_as_a_model_names_the_fix(tiny_model_dir, tmp_path):
    import shutil

    import torch

    from grouprl.models import load_model

    shutil.copy(tiny_model_dir / "config.json", tmp_path / "config.json")
    (tmp_path / "distcp").mkdir()  # what an FSDP checkpoint holds instead of model.safetensors
    with pytest.raises(ConfigError, match="checkpoint of an FSDP run.*final/.*dcp_to_torch"):
        load_model(str(tmp_path), torch.device("cpu"))


def test_the_example_accelerate_config_is_fsdp2_and_is_the_one_documented():
    from pathlib import Path

    from accelerate.commands.config.config_args import load_config_from_file

    root = Path(__file__).resolve().parents[2]
    path = root / "examples" / "accelerate" / "fsdp2.yaml"
    config = load_config_from_file(str(path))
    assert config.distributed_type == "FSDP" and config.fsdp_config["fsdp_version"] == 2
    assert config.fsdp_config["fsdp_offload_params"] is False  # offloading is refused
    body = "".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith("#"))
    assert f"```yaml\n{body}```" in (root / "docs" / "DISTRIBUTED.md").read_text()


def test_a_stale_deepspeed_build_lock_is_an_error_naming_the_file(tmp_path):
    """A build killed mid-way leaves ``lock``; torch's cpp_extension would wait on it forever."""
    import os

    from grouprl.errors import GroupRLError
    from grouprl.train.parallel.deepspeed import STALE_LOCK_S, check_build_locks

    lock = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    mtime = os.path.getmtime(lock)
    check_build_locks(str(tmp_path), now=mtime + STALE_LOCK_S - 1)  # a build in progress: no error
    with pytest.raises(GroupRLError, match=r"deepspeed_shm_comm/lock.*Fix: delete it"):
        check_build_locks(str(tmp_path), now=mtime + STALE_LOCK_S + 60)
