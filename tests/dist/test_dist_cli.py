"""The entry points of a multi-process run: ``python -m grouprl``, ``grouprl train --nproc N``, the batch
arithmetic message naming the world size, and what N processes refuse up front."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from grouprl.config import GRPOConfig
from grouprl.errors import ConfigError, DataError


def _args(**kw):
    base = dict(config="recipes/default.yaml", overrides=["per_device_train_batch_size=64"], resume=None, nproc=2)
    return argparse.Namespace(**{**base, **kw})


def test_nproc_builds_the_accelerate_launch_command():
    from grouprl.cmd.launch import launch_command

    cmd = launch_command(_args(), GRPOConfig(device="auto"), cuda=False)
    assert cmd[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    # --multi_gpu: accelerate's torchrun launcher, the one that starts N processes on a CPU too
    assert cmd[cmd.index("--num_processes") + 1] == "2" and "--multi_gpu" in cmd and "--cpu" not in cmd
    assert cmd[cmd.index("-m", 3):] == ["-m", "grouprl", "train", "-c", "recipes/default.yaml",
                                         "per_device_train_batch_size=64"]
    gpu = launch_command(_args(resume=True), GRPOConfig(device="auto"), cuda=True)
    assert "--multi_gpu" in gpu and "--cpu" not in gpu and gpu[-1] == "--resume"
    one = launch_command(_args(nproc=1, resume="out/checkpoint-4"), GRPOConfig(device="cpu"), cuda=True)
    assert "--cpu" in one and one[-2:] == ["--resume", "out/checkpoint-4"]
    with pytest.raises(ConfigError, match="--nproc 0"):
        launch_command(_args(nproc=0), GRPOConfig(), cuda=False)


def test_python_dash_m_grouprl_is_the_cli():
    out = subprocess.run([sys.executable, "-m", "grouprl", "train", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "--nproc" in out.stdout


def test_batch_arithmetic_names_the_world_size():
    from grouprl.train.algorithms.grpo import plan_steps

    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=8, max_steps=3)  # 2 prompts per rank
    assert plan_steps(cfg, 4, world=2) == (3, 1, 1)  # one round: 2 prompts x 2 ranks
    with pytest.raises(DataError, match=r"needs 6 prompts .*x 3 processes / num_generations 4"):
        plan_steps(cfg, 5, world=3)


def test_resample_and_vllm_are_accepted_on_several_processes():
    """Both run on N processes (tests/dist/test_dist_sampling.py, test_dist_vllm.py): no refusal any more."""
    from grouprl.train.parallel.ranks import check_config

    for world in (1, 2):
        check_config(GRPOConfig(dynamic_sampling="resample"), world)
        check_config(GRPOConfig(rollout_backend="vllm"), world)


def test_fsdp_version_1_is_refused(monkeypatch):
    from grouprl.train.parallel import ranks as dist

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # FSDP_VERSION unset: accelerate's FSDP1
    with pytest.raises(ConfigError, match="FSDP"):
        dist._partial_state()


def test_ppo_on_several_processes_is_refused():
    from grouprl.config import GRPOConfig
    from grouprl.train.parallel.ranks import check_config

    with pytest.raises(ConfigError, match="algorithm='ppo' with 2 processes"):
        check_config(GRPOConfig(algorithm="ppo"), 2)
    check_config(GRPOConfig(algorithm="ppo"), 1)


def test_one_process_has_no_ranks():
    from grouprl.train.parallel.ranks import Ranks

    d = Ranks()
    assert (d.rank, d.world, d.is_main, d.enabled) == (0, 1, True, False)
    assert d.global_totals({"num_tokens": 3, "num_seqs": 2, "max_len": 8}) == {"num_tokens": 3, "num_seqs": 2,
                                                                              "max_len": 8}
    assert d.all_gather({"a": 1}) == [{"a": 1}] and d.on_main(lambda x: x + 1, 1) == 2


def test_rank_0_announces_the_processes_and_the_global_batch(capsys):
    from types import SimpleNamespace

    from grouprl.train.parallel.ranks import Ranks

    cfg = GRPOConfig(per_device_train_batch_size=64, gradient_accumulation_steps=2)
    Ranks(SimpleNamespace(process_index=1, num_processes=2, backend="gloo")).announce(cfg)
    Ranks().announce(cfg)
    assert capsys.readouterr().err == ""  # rank 1, and a single process, say nothing
    Ranks(SimpleNamespace(process_index=0, num_processes=2, backend="gloo")).announce(cfg)
    assert "2 processes (gloo); global batch 256 completions per optimizer step = per_device_train_batch_size " \
           "64 x gradient_accumulation_steps 2 x 2 processes" in capsys.readouterr().err
