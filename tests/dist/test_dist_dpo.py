"""``algorithm: dpo`` on 2 gloo ranks (arXiv:2305.18290): each rank takes its share of every global batch of
pairs, the loss is normalised by the global number of pairs and the gradients are summed, so 2 optimizer
steps on 2 ranks equal one process with the same global batch. SGD with momentum, no clipping: the update is linear in
the gradient, so a gradient N times too large or too small shows."""

from __future__ import annotations

import json
from typing import Any

import torch
from dist_harness import run_ranks, values

PAIRS = [{"prompt": f"What is {i} + 1?", "chosen": f"Answer: {i + 1}", "rejected": f"Answer: {i + 2}"}
         for i in range(16)]


def sgd(model, cfg, total_steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)


def dpo_run(model_dir: str, data: str, output_dir: str, install: bool = True) -> dict[str, Any]:
    """2 DPO steps of a global batch of 8 pairs (2 per micro-batch, 2 micro-batches per rank on 2 ranks)."""
    from grouprl import GRPOConfig
    from grouprl.train.parallel import ranks as dist
    from grouprl.train.algorithms.dpo_run import run_dpo

    if install:
        import grouprl.train.algorithms.dpo as dpo

        dpo.build_optimizer = sgd  # a spawned rank: nothing to undo
    world = dist.current().world
    cfg = GRPOConfig(algorithm="dpo", model=model_dir, dataset=data, output_dir=output_dir,
                     per_device_train_batch_size=2, gradient_accumulation_steps=2 * 2 // world, max_new_tokens=8,
                     max_prompt_length=32, max_steps=2, progress_bar=False, save_strategy="steps", save_steps=1,
                     seed=0, eval_split=None, lr_scheduler_type="constant", max_grad_norm=0.0)
    result = run_dpo(cfg)
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(result["final_model"], dtype=torch.float32)
    return {"final": {k: v.detach() for k, v in final.named_parameters()}, "global_step": result["global_step"]}


def test_dpo_on_two_ranks_equals_one_process(tiny_model_dir, tmp_path, monkeypatch):
    import grouprl.train.algorithms.dpo as dpo

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    two = values(run_ranks(dpo_run, 2, str(tiny_model_dir), str(data), str(tmp_path / "two"),
                           workdir=tmp_path / "w", timeout=240))
    monkeypatch.setattr(dpo, "build_optimizer", sgd)
    one = dpo_run(str(tiny_model_dir), str(data), str(tmp_path / "one"), install=False)  # here: one start less
    from transformers import AutoModelForCausalLM

    start = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()}
    assert max(float((one["final"][k] - start[k]).abs().max()) for k in start) > 1e-4  # the reference trained
    assert two[0]["global_step"] == two[1]["global_step"] == 2
    worst = max(float((two[0]["final"][k] - one["final"][k]).abs().max()) for k in start)
    assert worst <= 1e-6, f"2 ranks differ from one process by {worst:.3g}"
    records = [[json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
               for run in ("two", "one")]
    assert [r["step"] for r in records[0]] == [1, 2]  # rank 0 alone logs
    for a, b in zip(*records):  # the metrics are those of the global batch
        assert abs(a["loss"] - b["loss"]) <= 1e-6 and a["rewards/accuracies"] == b["rewards/accuracies"]
    assert sorted(p.name for p in (tmp_path / "two").glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    state = torch.load(tmp_path / "two" / "checkpoint-2" / "trainer_state.pt", weights_only=False)
    assert state["data"] == {"epoch": 0, "pos": 16}  # the global position: 2 steps x 8 pairs
    ref_one = torch.load(tmp_path / "one" / "checkpoint-2" / "trainer_state.pt", weights_only=False)["ref_logp"]
    torch.testing.assert_close(state["ref_logp"], ref_one, rtol=0, atol=1e-5)  # each rank computed half, gathered
