"""FSDP2 on two gloo ranks trains exactly like one process with the same global batch.

The ranks shard the policy with ``fully_shard`` (``grouprl.train.parallel.fsdp``, through ``Ranks.shard`` as the loop
does) and take the optimizer steps of ``train.engine.step.accumulate_and_step``; their gathered parameters are compared
with one unsharded process that sees the whole global batch (``dist_workers.train_two_steps``).
One 2-process launch runs every case.
"""

from __future__ import annotations

import os

import pytest
import torch
from dist_harness import run_ranks, values
from dist_workers import train_two_steps

FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}
CASES = [("token_mean", 1, "sgd"), ("token_mean", 2, "sgd"), ("seq_mean_token_mean", 1, "sgd"),
         ("seq_mean_token_mean", 2, "sgd"), ("seq_mean_token_sum_norm", 2, "sgd"), ("token_mean", 2, "sgd_clip"),
         ("token_mean", 2, "adamw"), ("seq_mean_token_mean", 1, "adamw")]


def full_params(model) -> dict[str, torch.Tensor]:
    """Every parameter whole (DTensor shards gathered; every rank calls it)."""
    out = {}
    for k, v in model.named_parameters():
        out[k] = (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
    return out


def fsdp_two_steps(model_dir: str, aggregation: str, ga: int, optim: str,
                   checkpointing: bool = False) -> dict[str, torch.Tensor]:
    """``train_two_steps`` on this rank's share, with the policy sharded by FSDP2 before the optimizer is built
    (after activation checkpointing is switched on, as the loop does, when ``checkpointing``)."""
    from grouprl.train.parallel import ranks as dist
    from grouprl.train.engine.model import enable_checkpointing

    d = dist.current()

    def shard(model):
        if checkpointing:
            enable_checkpointing(model)
        assert d.shard(model) and d.sharded

    trained = train_two_steps(model_dir, aggregation, ga, optim, world=d.world, rank=d.rank, prepare=shard)
    return full_params(trained[None])


def lean_with_full_weights(model_dir: str) -> dict:
    """Greedy lean-sampler completions of a sharded model inside ``Ranks.sharding.full_weights``, rank 0 alone
    (no collective may happen inside), and how much of the model this rank holds outside it."""
    from transformers import AutoModelForCausalLM

    from grouprl.rollout.lean import lean_sample, unsupported_reason
    from grouprl.train.parallel import ranks as dist

    d = dist.current()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    full = sum(p.numel() for p in model.parameters())
    d.shard(model)
    local = sum(p.to_local().numel() for p in model.parameters())
    ids = torch.randint(5, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(3))
    out = {"local": local, "full": full}
    with d.sharding.full_weights(model):
        out["unsupported"] = unsupported_reason(model)
        if d.is_main:  # rank 0 alone, as in an evaluation: the other rank is already at the next collective
            out["lean"] = lean_sample(model, ids, torch.ones_like(ids), 2, max_new_tokens=5, temperature=0.0)
            out["generate"] = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                                             do_sample=False)[:, 6:]
    d.check()
    out["sharded_again"] = type(model.model.layers[0].self_attn.q_proj.weight).__name__
    from grouprl.train.engine.model import save_final

    try:  # one rank cannot save a sharded model by itself: a clear error instead of a hang or a partial file
        save_final(model, None, os.path.join(os.path.dirname(model_dir), f"alone{d.rank}"))
    except Exception as e:  # noqa: BLE001 - the test reads it
        out["save_error"] = f"{type(e).__name__}: {e}"
    return out


def resume_plain_checkpoint(model_dir: str, checkpoint: str) -> dict:
    """A checkpoint saved by one process without FSDP, loaded into a sharded model and AdamW."""
    from pathlib import Path

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    from transformers import AutoModelForCausalLM

    from grouprl.config import GRPOConfig
    from grouprl.train.parallel import ranks as dist
    from grouprl.train.checkpoint.store import load_checkpoint
    from grouprl.train.engine.model import build_optimizer

    d = dist.current()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    d.shard(model)
    optimizer, scheduler = build_optimizer(model, GRPOConfig(learning_rate=1e-3, max_steps=4), 4)
    load_checkpoint(Path(checkpoint), model, optimizer, scheduler)
    optim = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {"params": full_params(model), "optim": optim["state"], "lr": scheduler.get_last_lr()}


def plain_checkpoint(model_dir: str, root) -> tuple:
    """One process, one AdamW step, a checkpoint: (its path, parameters, optimizer state by name)."""
    from transformers import AutoModelForCausalLM

    from grouprl.config import GRPOConfig
    from grouprl.train.checkpoint.store import save_checkpoint
    from grouprl.train.engine.model import build_optimizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer, scheduler = build_optimizer(model, GRPOConfig(learning_rate=1e-3, max_steps=4), 4)
    ids = torch.randint(5, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(5))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    path = save_checkpoint(root, 1, model, None, optimizer, scheduler, {})
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    state = {names[i]: v for i, v in optimizer.state_dict()["state"].items()}
    return path, {k: v.detach().clone() for k, v in model.named_parameters()}, state, scheduler.get_last_lr()


def all_cases(model_dir: str, cases: list, plain: str) -> dict:
    os.environ.update(FSDP_ENV)
    out: dict = {case: fsdp_two_steps(model_dir, *case) for case in cases}
    out["plain_resume"] = resume_plain_checkpoint(model_dir, plain)
    out["checkpointing"] = fsdp_two_steps(model_dir, "token_mean", 2, "sgd", checkpointing=True)
    out["lean"] = lean_with_full_weights(model_dir)
    return out


@pytest.fixture(scope="module")
def plain(tiny_model_dir, tmp_path_factory):
    return plain_checkpoint(str(tiny_model_dir), tmp_path_factory.mktemp("plain"))


@pytest.fixture(scope="module")
def fsdp_ranks(tiny_model_dir, tmp_path_factory, plain):
    results = run_ranks(all_cases, 2, str(tiny_model_dir), CASES, str(plain[0]),
                        workdir=tmp_path_factory.mktemp("fsdp"), timeout=300)
    return values(results)


def test_fsdp_ranks_match_one_process(tiny_model_dir, fsdp_ranks):
    from transformers import AutoModelForCausalLM

    start = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()}
    for case in CASES:
        one = train_two_steps(str(tiny_model_dir), *case, world=1, rank=0)
        assert max(float((one[k] - start[k]).abs().max()) for k in one) > 1e-4, f"{case}: did not train"
        for r, got in enumerate(fsdp_ranks):
            assert got[case].keys() == one.keys()
            worst = max(float((got[case][k] - one[k]).abs().max()) for k in one)
            # SGD: a gradient 2x too small (FSDP's default mean) would differ by ~1e-3; AdamW: see dist_workers
            assert worst <= (1e-5 if case[2] == "adamw" else 1e-6), f"{case}: rank {r} differs by {worst:.3g}"
            if case == ("token_mean", 2, "sgd"):  # the same with activation checkpointing under FSDP
                assert max(float((got["checkpointing"][k] - one[k]).abs().max()) for k in one) <= 1e-6


def test_sharded_model_generates_whole_on_one_rank(tiny_model_dir, fsdp_ranks):
    from transformers import AutoModelForCausalLM

    from grouprl.rollout.lean import lean_sample

    r0, r1 = (r["lean"] for r in fsdp_ranks)
    assert r0["local"] + r1["local"] == r0["full"] and r0["local"] < r0["full"]  # each rank holds a shard
    assert r0["unsupported"] is None and r0["sharded_again"] == "DTensor"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.randint(5, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(3))
    expected = lean_sample(model, ids, torch.ones_like(ids), 2, max_new_tokens=5, temperature=0.0)
    assert torch.equal(r0["lean"], expected)
    assert torch.equal(r0["generate"], expected[::2])  # generate, with transformers' synced_gpus kept off


def test_one_process_checkpoint_resumes_sharded(fsdp_ranks, plain):
    """Saved without FSDP (full weights, optimizer state by index), loaded on 2 FSDP ranks: every rank's
    shards hold exactly the saved weights and AdamW moments, and the schedule carries on."""
    _, params, state, lr = plain
    for r in fsdp_ranks:
        got = r["plain_resume"]
        assert got["params"].keys() == params.keys()
        assert all(torch.equal(got["params"][k], v) for k, v in params.items())
        assert got["optim"].keys() == state.keys()
        for k, moments in state.items():
            for m in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(got["optim"][k][m], moments[m]), (k, m)
        assert got["lr"] == lr


def test_a_sharded_model_is_not_saved_by_one_rank(fsdp_ranks):
    for r in fsdp_ranks:
        assert "sharded with FSDP" in r["lean"]["save_error"] and "final" in r["lean"]["save_error"]
