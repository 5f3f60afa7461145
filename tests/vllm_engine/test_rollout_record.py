"""``Rollout.rollout_logp`` follows the rows: select (dropped groups), concat (resampled parts), micro-batches."""

from __future__ import annotations

import contextlib

import pytest
import torch

from grouprl.config import GRPOConfig
from grouprl.rollout.base import Rollout, concat_rollouts
from grouprl.rollout.vllm_backend import options_from
from grouprl.train.algorithms.rounds import RoundBatch, RunContext, micro_batches
from grouprl.train.metrics import Timers


def _rollout(N, T, logp=True, start=0.0):
    mask = torch.ones(N, T, dtype=torch.long)
    lp = (start - torch.arange(N * T, dtype=torch.float32).reshape(N, T) / 10) if logp else None
    return Rollout(torch.ones(N, 2, dtype=torch.long), torch.ones(N, 2, dtype=torch.long),
                   torch.full((N, T), 7), mask, torch.zeros(N, dtype=torch.bool), [""] * N, [""] * N, rollout_logp=lp)


def test_select_and_concat_carry_rollout_logp():
    a, b = _rollout(2, 3), _rollout(2, 1, start=5.0)
    assert torch.equal(a.select([1]).rollout_logp, a.rollout_logp[[1]])
    both = concat_rollouts([a, b], pad_id=0)
    assert both.rollout_logp.shape == (4, 3)
    assert torch.equal(both.rollout_logp[2:, 1:], torch.zeros(2, 2))  # the shorter part padded with 0
    assert concat_rollouts([_rollout(2, 3, logp=False)], pad_id=0).rollout_logp is None
    with pytest.raises(ValueError, match="some parts carry rollout_logp"):
        concat_rollouts([a, _rollout(2, 3, logp=False)], pad_id=0)


def test_micro_batches_get_their_rows_of_rollout_logp():
    cfg = GRPOConfig(num_generations=2, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                     max_new_tokens=3, rollout_backend="vllm")
    r = _rollout(4, 3)
    ctx = RunContext(cfg, None, None, None, None, None, None, contextlib.nullcontext, None)
    mbs = micro_batches(ctx, RoundBatch(r, torch.zeros(4)), Timers())
    assert torch.equal(torch.cat([mb.rollout_logp for mb in mbs]), r.rollout_logp)


def test_options_from_the_config():
    cfg = GRPOConfig(rollout_backend="vllm", vllm_mode="server", max_prompt_length=100, max_new_tokens=50,
                     eval_max_new_tokens=80, vllm_kwargs={"enforce_eager": True})
    opts = options_from(cfg)
    assert opts["mode"] == "server" and opts["max_model_len"] == 180 and opts["engine_kwargs"] == {"enforce_eager": True}
    assert options_from(GRPOConfig(vllm_max_model_len=4096))["max_model_len"] == 4096


def test_an_explicit_correction_without_engine_logprobs_is_an_error():
    from grouprl.errors import ConfigError

    cfg = GRPOConfig(num_generations=2, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                     max_new_tokens=3, rollout_backend="pkg.mod:Engine", rollout_correction="tis")
    ctx = RunContext(cfg, None, None, None, None, None, None, contextlib.nullcontext, None)
    with pytest.raises(ConfigError, match="reports no rollout_logp"):
        micro_batches(ctx, RoundBatch(_rollout(4, 3, logp=False), torch.zeros(4)), Timers())
