"""DeepSpeed ZeRO-2 and ZeRO-3 on two gloo ranks train exactly like one process with the same global batch.

The ranks wrap the policy and the optimizer in a ZeRO engine (``grouprl.train.deepspeed``, through
``Dist.zero_init`` as the loop does) and take the optimizer steps of ``train.step.optimizer_step``; their
gathered parameters are compared with one plain process that sees the whole global batch
(``dist_workers.train_two_steps``). One 2-process launch per stage runs every case.
"""

from __future__ import annotations

import os

import pytest
import torch
from dist_harness import run_ranks, values
from dist_workers import train_two_steps

pytest.importorskip("deepspeed", reason="DeepSpeed is an optional extra: pip install 'grouprl[deepspeed]'")

CASES = [("token_mean", 1, "sgd"), ("token_mean", 2, "sgd"), ("seq_mean_token_mean", 2, "sgd"),
         ("token_mean", 2, "sgd_clip"), ("token_mean", 2, "adamw")]


def ds_env(stage: int) -> dict[str, str]:
    return {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": str(stage),
            "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "none", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "none",
            "DS_ACCELERATOR": "cpu"}


def whole_params(model) -> dict[str, torch.Tensor]:
    """Every parameter whole (ZeRO-3 partitions gathered; every rank calls it)."""
    from grouprl.train import dist

    with dist.current().full_weights(model):
        return {k: v.detach().clone() for k, v in model.named_parameters()}


def zero_two_steps(model_dir: str, aggregation: str, ga: int, optim: str) -> dict[str, torch.Tensor]:
    from grouprl.train import dist

    d = dist.current()
    trained = train_two_steps(model_dir, aggregation, ga, optim, world=d.world, rank=d.rank,
                              ready=lambda model, optimizer, cfg: d.zero_init(model, optimizer, cfg))
    return whole_params(trained[None])


def all_cases(model_dir: str, stage: int, cases: list) -> dict:
    os.environ.update(ds_env(stage))
    return {case: zero_two_steps(model_dir, *case) for case in cases}


@pytest.fixture(scope="module", params=[2, 3])
def zero_ranks(request, tiny_model_dir, tmp_path_factory):
    results = run_ranks(all_cases, 2, str(tiny_model_dir), request.param, CASES,
                        workdir=tmp_path_factory.mktemp(f"zero{request.param}"), timeout=300)
    return request.param, values(results)


def test_zero_ranks_match_one_process(tiny_model_dir, zero_ranks):
    from transformers import AutoModelForCausalLM

    stage, ranks = zero_ranks
    start = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()}
    for case in CASES:
        one = train_two_steps(str(tiny_model_dir), *case, world=1, rank=0)
        assert max(float((one[k] - start[k]).abs().max()) for k in one) > 1e-4, f"{case}: did not train"
        for r, got in enumerate(ranks):
            assert got[case].keys() == one.keys()
            worst = max(float((got[case][k] - one[k]).abs().max()) for k in one)
            assert worst <= (1e-5 if case[2] == "adamw" else 1e-6), f"ZeRO-{stage} {case}: rank {r} differs by {worst:.3g}"
