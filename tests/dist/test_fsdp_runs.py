"""Whole GRPOTrainer runs sharded with FSDP2 on 2 gloo ranks: DCP checkpoints that resume on 2 ranks
bit-exactly (from the middle of a round) and on 1 process without FSDP at the saved data position, a
``final/`` that is an ordinary ``save_pretrained`` folder, and evaluations on rank 0 alone."""

from __future__ import annotations

import json
import os

import pytest
import torch
from dist_harness import run_ranks, values
from dist_workers import ROWS, letters, run_config

FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}
RUN = dict(kl_coef=0.05, lean_sampler=False, eval_steps=2)  # a sharded reference; generate(); a mid-run evaluation


def fsdp_training(model_dir: str, output_dir: str, resume: str | None = None, fsdp: bool = True) -> dict:
    """One GRPOTrainer run on this rank (FSDP2 when ``fsdp``): its whole parameters and result."""
    if fsdp:
        os.environ.update(FSDP_ENV)
    from grouprl.train import GRPOTrainer

    from grouprl.train.parallel import ranks as dist
    cfg = run_config(model_dir, output_dir, **RUN)
    trainer = GRPOTrainer(config=cfg, train_dataset=list(ROWS), reward_funcs=[letters], eval_dataset=list(ROWS[:3]),
                          eval_reward_func=letters)
    result = trainer.train(resume_from_checkpoint=resume)
    params = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
              for k, v in trainer.model.named_parameters()}
    return {"params": params, "global_step": result["global_step"], "sharded": dist.current().sharded,
            "evals": sorted(result["evals"])}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _state(path) -> dict:
    return torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def full_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp-run") / "out"
    ranks = values(run_ranks(fsdp_training, 2, str(tiny_model_dir), str(out), workdir=out.parent / "w", timeout=400))
    return out, ranks


def test_fsdp_run_writes_sharded_checkpoints_and_a_plain_final(full_run):
    from transformers import AutoModelForCausalLM

    out, (r0, r1) = full_run
    assert r0["sharded"] and r1["sharded"] and r0["global_step"] == 4
    assert _same(r0["params"], r1["params"])  # the gathered weights agree
    assert r0["evals"] == ["after", "before", "step2"]  # rank 0 evaluated alone while rank 1 waited
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "reward" in r] == [1, 2, 3, 4]
    ckpt = out / "checkpoint-1"
    assert (ckpt / "distcp" / ".metadata").is_file() and not list(ckpt.glob("*.safetensors"))
    assert len(list((ckpt / "distcp").glob("*.distcp"))) == 2  # one shard file per rank
    mid = _state(ckpt)
    assert "optimizer" not in mid and len(mid["ranks"]) == 2 and mid["data"] == {"epoch": 0, "pos": 4}
    final = AutoModelForCausalLM.from_pretrained(out / "final", dtype=torch.float32)
    assert json.loads((out / "final" / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    loaded = dict(final.named_parameters())
    assert all(torch.equal(loaded[k], v) for k, v in r0["params"].items())


def test_fsdp_checkpoint_resumes_on_two_ranks_bit_exactly(tiny_model_dir, full_run, tmp_path):
    out, (r0, _) = full_run
    again = values(run_ranks(fsdp_training, 2, str(tiny_model_dir), str(tmp_path / "again"),
                             str(out / "checkpoint-1"), workdir=tmp_path / "w", timeout=400))
    assert again[0]["global_step"] == 4
    assert _same(again[0]["params"], r0["params"]) and _same(again[1]["params"], r0["params"])


def test_fsdp_checkpoint_resumes_on_one_process_without_fsdp(tiny_model_dir, full_run, tmp_path):
    """DCP reshards 2 ranks' shards into one whole model; the global data position carries on."""
    out, _ = full_run
    one = run_ranks(fsdp_training, 1, str(tiny_model_dir), str(tmp_path / "one"), str(out / "checkpoint-2"), False,
                    workdir=tmp_path / "w", timeout=300)
    (res,) = values(one)
    assert res["global_step"] == 4 and not res["sharded"]
    assert _state(tmp_path / "one" / "checkpoint-4")["data"] == {"epoch": 0, "pos": 4 + 2}
    assert (tmp_path / "one" / "checkpoint-4" / "model.safetensors").is_file()  # a one-process checkpoint again
