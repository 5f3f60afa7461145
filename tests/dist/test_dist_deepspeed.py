"""DeepSpeed ZeRO-2 and ZeRO-3 on two gloo ranks train exactly like one process with the same global batch.

The ranks wrap the policy and the optimizer in a ZeRO engine (``grouprl.train.deepspeed``, through
``Dist.zero_init`` as the loop does) and take the optimizer steps of ``train.step.optimizer_step``; their
gathered parameters are compared with one plain process that sees the whole global batch
(``dist_workers.train_two_steps``). One 2-process launch per stage runs every case.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from dist_harness import run_ranks, values
from dist_workers import ROWS, explode_on_rank_1, letters, run_config, run_training, train_two_steps

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


# ---- whole GRPOTrainer runs under ZeRO-3 -------------------------------------------------------------
RUN = dict(kl_coef=0.05, eval_steps=2)  # a replicated reference; the lean sampler on gathered weights; mid-run eval


def zero_training(model_dir: str, output_dir: str, resume: str | None = None, stage: int | None = 3) -> dict:
    """One GRPOTrainer run on this rank (DeepSpeed ZeRO-``stage`` unless None): its whole weights and result,
    or the error it stopped with."""
    if stage is not None:
        os.environ.update(ds_env(stage))
    from grouprl.train import GRPOTrainer, dist

    cfg = run_config(model_dir, output_dir, **RUN)
    trainer = GRPOTrainer(config=cfg, train_dataset=list(ROWS), reward_funcs=[letters], eval_dataset=list(ROWS[:3]),
                          eval_reward_func=letters)
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except Exception as e:  # noqa: BLE001 - the refusal test reads it
        return {"error": f"{type(e).__name__}: {e}"}
    d = dist.current()
    params = whole_params(trainer.model)
    return {"params": params, "global_step": result["global_step"], "engine": d.engine is not None,
            "evals": sorted(result["evals"]), "history": result["history"],
            "local": sum(p.numel() for p in trainer.model.parameters())}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def zero3_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("zero3-run") / "out"
    ranks = values(run_ranks(zero_training, 2, str(tiny_model_dir), str(out), workdir=out.parent / "w", timeout=400))
    return out, ranks


def test_zero3_run_checkpoints_and_saves_a_plain_final(tiny_model_dir, zero3_run):
    from transformers import AutoModelForCausalLM

    out, (r0, r1) = zero3_run
    assert r0["engine"] and r1["engine"] and r0["global_step"] == 4
    assert _same(r0["params"], r1["params"])  # the gathered weights agree
    full = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())
    assert r0["local"] < full  # partitioned outside the gathered blocks
    assert r0["evals"] == ["after", "before", "step2"]  # rank 0 evaluated alone on gathered weights
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and all(r["kl"] == r["kl"] for r in steps)
    ckpt = out / "checkpoint-1"
    assert len(list((ckpt / "deepspeed" / "zero").glob("*optim_states.pt"))) == 2  # one partition per rank
    assert not list(ckpt.glob("*.safetensors")) and (ckpt / "config.json").is_file()
    final = AutoModelForCausalLM.from_pretrained(out / "final", dtype=torch.float32)
    loaded = dict(final.named_parameters())
    assert all(torch.equal(loaded[k], v) for k, v in r0["params"].items())


def test_zero3_checkpoint_resumes_on_two_ranks_bit_exactly(tiny_model_dir, zero3_run, tmp_path):
    """From checkpoint-1, the middle of a generation round (2 optimizer steps per round)."""
    out, (r0, _) = zero3_run
    again = values(run_ranks(zero_training, 2, str(tiny_model_dir), str(tmp_path / "again"),
                             str(out / "checkpoint-1"), workdir=tmp_path / "w", timeout=400))
    assert again[0]["global_step"] == 4
    assert _same(again[0]["params"], r0["params"]) and _same(again[1]["params"], r0["params"])
    assert [h["reward"] for h in again[0]["history"]] == [h["reward"] for h in r0["history"]]


def test_zero3_checkpoint_on_another_rank_count_is_refused_with_the_fix(tiny_model_dir, zero3_run, tmp_path):
    out, _ = zero3_run
    (one,) = values(run_ranks(zero_training, 1, str(tiny_model_dir), str(tmp_path / "one"), str(out / "checkpoint-2"),
                              None, workdir=tmp_path / "w", timeout=200))
    assert "written by 2 ranks" in one["error"] and "zero_to_fp32.py" in one["error"] and "--num_processes 2" in one["error"]


def test_a_reward_raising_on_one_rank_ends_both_in_seconds_under_zero2(tiny_model_dir, tmp_path):
    os.environ.update(ds_env(2))  # inherited by the spawned ranks
    try:
        res = run_ranks(run_training, 2, str(tiny_model_dir), str(tmp_path / "out"), explode_on_rank_1,
                        workdir=tmp_path / "w", timeout=200, collective_timeout=120)
    finally:
        for key in ds_env(2):
            os.environ.pop(key, None)
    r0, r1 = values(res)
    assert "reward exploded on purpose" in r1["error"]
    assert r0["error"].startswith("PeerFailure") and "rank 1" in r0["error"] and "reward exploded" in r0["error"]
    assert abs(r0["end"] - r1["end"]) < 15  # the error flag, not the 120 s collective timeout
