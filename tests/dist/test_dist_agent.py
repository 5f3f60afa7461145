"""Agent (multi-turn, tool-calling) rollouts on 2 gloo ranks: GRPOTrainer with the ``calculator`` environment.

The policy's sampled text is scripted (the rest -- the multi-turn rollout, the calculator, the rewards that
see trajectories, ``loss_mask`` in the micro-batches, the gradient sum -- is the trainer's own path). The
script depends only on the conversation so far and on the member's place among the identical conversations
of its group, never on the batch around it, so a rank sampling its share and one process sampling the whole
global batch produce the same trajectories: the 2-rank run must then equal the 1-process run (SGD with
momentum, no clipping: linear in the gradient, so a gradient N times too large or too small shows).
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch
from dist_harness import run_ranks, values

E = "<|im_end|>"
ROWS = [{"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(8)]
CALL = "<tool_call>calculator(expression='{a} + {b}')</tool_call>" + E


def scripted(tokenizer: Any):
    """A ``generate_fn``: in its first turn the k-th identical conversation of a call calls the calculator
    (k even) or answers a + b + 1 at once (k odd, wrong); after a tool turn it answers the tool's sum."""

    def generate(prompts, budgets, params):
        seen: dict[tuple, int] = {}
        out = []
        for ids in prompts:
            k = seen[tuple(ids)] = seen.get(tuple(ids), -1) + 1
            text = tokenizer.decode(ids)
            a, b = (int(x) for x in re.search(r"What is (\d+) \+ (\d+)\?", text).groups())
            if text.count("<|im_start|>assistant") > 1:  # a tool turn came back
                reply = f"{a + b}{E}"
            else:
                reply = CALL.format(a=a, b=b) if k % 2 == 0 else f"{a + b + 1}{E}"
            out.append(tokenizer.encode(reply, add_special_tokens=False))
        return out

    return generate


def sgd(model, cfg, total_steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)


def patch(setattr_: Any = setattr) -> None:
    """The scripted policy and SGD (``setattr`` in a spawned rank; ``monkeypatch.setattr`` in the test process)."""
    import grouprl.rollout.multiturn as mt
    import grouprl.train.algorithms.grpo as loop

    setattr_(mt, "hf_generate_fn", lambda model, tokenizer, stop_ids=None, **kw: scripted(tokenizer))
    setattr_(loop, "build_optimizer", sgd)


def agent_run(model_dir: str, output_dir: str, patched: bool = False) -> dict[str, Any]:
    """2 optimizer steps with the calculator environment; 2 prompts x 2 trajectories per rank per step."""
    from grouprl import GRPOConfig, GRPOTrainer
    from grouprl.train.parallel import ranks as dist

    if not patched:
        patch()
    world = dist.current().world
    cfg = GRPOConfig(model=model_dir, output_dir=output_dir, environment="calculator", reward_funcs=["accuracy"],
                     num_generations=2, per_device_train_batch_size=4 * 2 // world, gradient_accumulation_steps=1,
                     max_new_tokens=64, max_prompt_length=128, max_steps=2, progress_bar=False, save_strategy="no",
                     seed=0, eval_split=None, log_completions_steps=1, num_completions_to_log=4, max_grad_norm=0.0)
    trainer = GRPOTrainer(config=cfg, train_dataset=[dict(r) for r in ROWS])
    result = trainer.train()
    return {"params": {k: v.detach().clone() for k, v in trainer.model.named_parameters()},
            "global_step": result["global_step"]}


def _records(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_agent_rollouts_on_two_ranks_equal_one_process(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    two = values(run_ranks(agent_run, 2, str(tiny_model_dir), str(tmp_path / "two"), workdir=tmp_path / "w2",
                           timeout=240))
    patch(monkeypatch.setattr)  # the 1-process reference runs here (one process start less)
    one = agent_run(str(tiny_model_dir), str(tmp_path / "one"), patched=True)
    start = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()}
    assert max(float((one["params"][k] - start[k]).abs().max()) for k in start) > 1e-4  # the reference trained
    for r, got in enumerate(two):
        assert got["global_step"] == 2
        worst = max(float((got["params"][k] - one["params"][k]).abs().max()) for k in start)
        assert worst <= 1e-6, f"rank {r} differs from one process by {worst:.3g}"
    two_m = [m for m in _records(tmp_path / "two" / "metrics.jsonl") if "reward" in m]
    one_m = [m for m in _records(tmp_path / "one" / "metrics.jsonl") if "reward" in m]
    assert [m["step"] for m in two_m] == [1, 2]  # each step logged once (rank 0 alone writes)
    for a, b in zip(two_m, one_m):
        # half the trajectories call the calculator (2 turns), half answer wrong at once: on every rank
        assert a["tools/calls_per_traj"] == b["tools/calls_per_traj"] == 0.5 and a["turns/mean"] == 1.5
        assert a["reward"] == b["reward"] == 0.5
        assert a["num_tokens"] == b["num_tokens"]  # model tokens only (loss_mask), summed over the ranks
        assert abs(a["loss/policy"] - b["loss/policy"]) <= 1e-6
    samples = _records(tmp_path / "two" / "samples.jsonl")
    assert {s["step"] for s in samples} == {1, 2} and all("tool_calls" in s for s in samples)  # rank 0's trajectories
    assert [c["result"] for c in samples[0]["tool_calls"]] == [str(2 * int(re.search(r"What is (\d+)", samples[0][
        "prompt"]).group(1)) + 1)]
