"""Agent (multi-turn, tool-calling) rollouts on 2 gloo ranks -- plain data parallel, FSDP2, ZeRO-2 and
ZeRO-3 -- through GRPOTrainer with the ``calculator`` environment, each equal to one process.

The policy's sampled text comes from a scripted ``rollout_backend`` plug-in (:class:`GroupScript`, an
``grouprl.rollout.engine.Engine``); the rest -- the per-trajectory scheduler, the calculator, the rewards
that see trajectories, ``loss_mask`` in the micro-batches, sharded generation and the gradient sum -- is
the trainer's own path. The script depends only on the conversation so far and on the member's place among
the identical conversations of one engine call, never on the batch around it, so a rank sampling its
share and one process sampling the whole global batch produce the same trajectories: the 2-rank run must
then equal the 1-process run (SGD with momentum, no clipping: linear in the gradient, so a gradient N
times too large or too small shows).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dist"))
from dist_harness import run_ranks, values  # noqa: E402

from grouprl.rollout.engine import Engine, Generation  # noqa: E402

E = "<|im_end|>"
ROWS = [{"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(8)]
CALL = "<tool_call>calculator(expression='{a} + {b}')</tool_call>" + E
PLUGIN = f"{__name__}:GroupScript"


class GroupScript(Engine):
    """In its first turn the k-th identical conversation of an engine call calls the calculator (k even) or
    answers a + b + 1 at once (k odd, wrong); after a tool turn it answers the tool's sum."""

    def generate(self, prompt_ids, max_new_tokens, sampling):
        seen: dict[tuple, int] = {}
        out = []
        for ids in prompt_ids:
            k = seen[tuple(ids)] = seen.get(tuple(ids), -1) + 1
            text = self.tokenizer.decode(ids)
            a, b = (int(x) for x in re.search(r"What is (\d+) \+ (\d+)\?", text).groups())
            if text.count("<|im_start|>assistant") > 1:  # a tool turn came back
                reply = f"{a + b}{E}"
            else:
                reply = CALL.format(a=a, b=b) if k % 2 == 0 else f"{a + b + 1}{E}"
            out.append(Generation(self.tokenizer.encode(reply, add_special_tokens=False), None, "stop"))
        return out


def sgd(model, cfg, total_steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)


def whole_params(model) -> dict[str, torch.Tensor]:
    """Every parameter whole (FSDP2 DTensors and ZeRO-3 partitions gathered; every rank calls it)."""
    from grouprl.train.parallel import ranks as dist

    with dist.current().sharding.full_weights(model):
        return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                for k, v in model.named_parameters()}


def agent_run(model_dir: str, output_dir: str, env: dict | None = None, patched: bool = False) -> dict[str, Any]:
    """2 optimizer steps with the calculator environment; 2 prompts x 2 trajectories per rank per step."""
    import grouprl.train.algorithms.grpo as loop
    from grouprl import GRPOConfig, GRPOTrainer
    from grouprl.train.parallel import ranks as dist

    os.environ.update(env or {})
    if not patched:
        loop.build_optimizer = sgd
    world = dist.current().world
    cfg = GRPOConfig(model=model_dir, output_dir=output_dir, environment="calculator", reward_funcs=["accuracy"],
                     rollout_backend=PLUGIN, num_generations=2, per_device_train_batch_size=4 * 2 // world,
                     gradient_accumulation_steps=1, max_new_tokens=64, max_prompt_length=128, max_steps=2,
                     progress_bar=False, save_strategy="no", seed=0, eval_split=None, log_completions_steps=1,
                     num_completions_to_log=4, max_grad_norm=0.0)
    trainer = GRPOTrainer(config=cfg, train_dataset=[dict(r) for r in ROWS])
    result = trainer.train()
    return {"params": whole_params(trainer.model), "global_step": result["global_step"],
            "sharded": dist.current().sharded}


def _records(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, tmp_path_factory):
    import grouprl.train.algorithms.grpo as loop

    out = tmp_path_factory.mktemp("agent-one")
    saved = loop.build_optimizer
    try:
        loop.build_optimizer = sgd
        return out, agent_run(str(tiny_model_dir), str(out / "one"), patched=True)
    finally:
        loop.build_optimizer = saved


def _zero_env(stage: int, folder: Path) -> dict[str, str]:
    pytest.importorskip("deepspeed", reason="DeepSpeed is an optional extra: pip install 'grouprl[deepspeed]'")
    base = {"ACCELERATE_USE_DEEPSPEED": "true", "DS_ACCELERATOR": "cpu", "ACCELERATE_MIXED_PRECISION": "no"}
    if stage == 2:
        return {**base, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "none",
                "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "none"}
    path = folder / "zero3.json"  # every parameter partitioned (DeepSpeed keeps small ones whole by default)
    path.write_text(json.dumps({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}))
    return {**base, "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(path)}


@pytest.mark.parametrize("setup", ["ddp", "fsdp2", "zero2", "zero3"])
def test_agent_rollouts_on_two_ranks_equal_one_process(setup, tiny_model_dir, tmp_path, one_process):
    from transformers import AutoModelForCausalLM

    env = {"ddp": {}, "fsdp2": {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"},
           "zero2": None, "zero3": None}[setup]
    if env is None:
        env = _zero_env(int(setup[-1]), tmp_path)
    two = values(run_ranks(agent_run, 2, str(tiny_model_dir), str(tmp_path / "two"), env, workdir=tmp_path / "w",
                           timeout=300))
    folder, one = one_process
    start = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()}
    assert max(float((one["params"][k] - start[k]).abs().max()) for k in start) > 1e-4  # the reference trained
    for r, got in enumerate(two):
        assert got["global_step"] == 2 and got["sharded"] == (setup == "fsdp2")
        worst = max(float((got["params"][k] - one["params"][k]).abs().max()) for k in start)
        assert worst <= 1e-6, f"{setup}: rank {r} differs from one process by {worst:.3g}"
    two_m = [m for m in _records(tmp_path / "two" / "metrics.jsonl") if "reward" in m]
    one_m = [m for m in _records(folder / "one" / "metrics.jsonl") if "reward" in m]
    assert [m["step"] for m in two_m] == [1, 2]  # each step logged once (rank 0 alone writes)
    for a, b in zip(two_m, one_m):
        # half the trajectories call the calculator (2 turns), half answer wrong at once: on every rank
        assert a["tools/calls_per_traj"] == b["tools/calls_per_traj"] == 0.5 and a["turns/mean"] == 1.5
        assert a["reward"] == b["reward"] == 0.5
        assert a["num_tokens"] == b["num_tokens"]  # model tokens only (loss_mask), summed over the ranks
        assert abs(a["loss/policy"] - b["loss/policy"]) <= 1e-6
    samples = _records(tmp_path / "two" / "samples.jsonl")
    assert {s["step"] for s in samples} == {1, 2} and all("tool_calls" in s for s in samples)  # rank 0's trajectories
    first = re.search(r"What is (\d+)", samples[0]["prompt"]).group(1)
    assert [c["result"] for c in samples[0]["tool_calls"]] == [str(2 * int(first) + 1)]
