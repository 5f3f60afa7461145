"""Functions each rank runs in the distributed tests (importable by name from a spawned process)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from grouprl.builtins import load_builtins
from grouprl.config import GRPOConfig
from grouprl.registry import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grouprl.rollout.base import Rollout
from grouprl.train.parallel import ranks as dist
from grouprl.train.metrics import Timers
from grouprl.train.engine.model import build_optimizer
from grouprl.train.algorithms.rounds import RoundBatch, RunContext, micro_batches
from grouprl.train.engine.step import LossSpec, optimizer_step

ROWS_PER_STEP = 8  # global rows (completions) of one optimizer step
STEPS = 2
ADV = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.0, -0.4, 1.1, -0.9, 0.6, 0.2, -0.1, 1.3, -0.7, 0.5, -1.0])


def global_rollout(vocab: int, T: int = 7) -> Rollout:
    """16 rows of random prompts (some left-padded) and completions of varied length (some truncated)."""
    N, P = ROWS_PER_STEP * STEPS, 5
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, vocab, (N, P), generator=g)
    prompt_mask = torch.ones(N, P, dtype=torch.long)
    prompt_mask[::3, :2] = 0
    prompt_ids[prompt_mask == 0] = 0
    lengths = torch.tensor([7, 3, 5, 1, 7, 6, 2, 4, 1, 2, 7, 7, 3, 6, 5, 2])
    completion_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()
    completion_ids = torch.randint(5, vocab, (N, T), generator=g).masked_fill(completion_mask == 0, 0)
    return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, lengths == T, [""] * N, [""] * N)


def train_two_steps(model_dir: str, aggregation: str, ga: int, optim: str = "sgd", *, world: int,
                    rank: int, prepare: Any = None, ready: Any = None) -> dict[str, torch.Tensor]:
    """Two optimizer steps where this process holds the ``rank``-th of ``world`` equal contiguous shares
    of each global step's 8 rows, split into ``ga`` micro-batches.

    ``optim='sgd'``: SGD with momentum, no clipping: the update is linear in the gradient (a gradient N
    times too large or small shows), so parameters differ by lr x the gradient's fp32 summation-order
    noise. ``'sgd_clip'``: the same with max_grad_norm 0.5 (clipping by the global norm). ``'adamw'`` (the trainer's optimizer) divides by sqrt(v): where a gradient
    is ~0 the same noise moves a parameter by up to lr, so it is compared with a looser bound.
    ``prepare(model)`` (e.g. FSDP sharding) runs before the optimizer is built, ``ready(model, optimizer, cfg)``
    (e.g. a DeepSpeed engine) after; the trained model is returned under the key ``None`` when one is given."""
    from transformers import AutoModelForCausalLM

    load_builtins()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if prepare is not None:
        prepare(model)
    share = ROWS_PER_STEP // world
    cfg = GRPOConfig(num_generations=2, per_device_train_batch_size=share // ga, gradient_accumulation_steps=ga,
                     max_new_tokens=7, mask_truncated_completions=True, learning_rate=1e-3, max_grad_norm=0.0 if optim == "sgd" else 0.5,
                     warmup_ratio=0.0, max_steps=STEPS)
    spec = LossSpec(POLICY_LOSSES.get("grpo"), {"eps_low": 0.2, "eps_high": 0.28}, AGGREGATIONS.get(aggregation),
                    KL_ESTIMATORS.get("k3"), 0.0, 0.9)
    optimizer, scheduler = build_optimizer(model, cfg, STEPS)
    if optim.startswith("sgd"):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    if ready is not None:
        ready(model, optimizer, cfg)
    ctx = RunContext(cfg, model, None, None, None, None, None, contextlib.nullcontext, None)
    rollout = global_rollout(model.config.vocab_size)
    for step in range(STEPS):
        rows = list(range(step * ROWS_PER_STEP + rank * share, step * ROWS_PER_STEP + (rank + 1) * share))
        mbs = micro_batches(ctx, RoundBatch(rollout.select(rows), ADV[rows]), Timers())
        optimizer_step(ctx, mbs, spec, optimizer, scheduler, Timers())
    if prepare is not None or ready is not None:
        return {None: model}
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def equality_cases(model_dir: str, cases: list[tuple[str, int, str]], rewards: torch.Tensor) -> dict[Any, Any]:
    """Every (aggregation, gradient_accumulation_steps, optimizer) case on this rank of the launched world,
    and ``batch_advantage(rewards)`` (one launch for both: starting processes is the slow part)."""
    d = dist.current()
    out: dict[Any, Any] = {case: train_two_steps(model_dir, *case, world=d.world, rank=d.rank) for case in cases}
    out["advantages"] = batch_advantage(rewards, ["batch", "group"])
    out["broadcast"] = broadcast_weights(model_dir)
    return out


def broadcast_weights(model_dir: str) -> dict[str, torch.Tensor]:
    """Rank r > 0 starts from other weights; after ``broadcast_parameters`` every rank holds rank 0's."""
    from transformers import AutoModelForCausalLM

    d = dist.current()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(float(d.rank))
    d.broadcast_parameters(model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def batch_advantage(rewards: torch.Tensor, scales: list[str]) -> dict[str, torch.Tensor]:
    """grpo advantages of this rank's groups for each scale; rank r holds the r-th of the world's equal shares."""
    from grouprl.registry import ADVANTAGES

    load_builtins()
    d = dist.current()
    B = rewards.shape[0] // d.world
    mine = rewards[d.rank * B:(d.rank + 1) * B]
    grpo = ADVANTAGES.get("grpo")
    from grouprl.train.algorithms.rounds import global_advantage

    return {scale: global_advantage(d, lambda r, s=scale: grpo(r, scale=s), mine) for scale in scales}


# ---- whole runs (GRPOTrainer.train) on every rank -------------------------------------------------
ROWS = [{"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(16)]


def letters(completions, **kwargs):
    """Deterministic, varied reward: the fraction of ASCII letters in the completion."""
    return [sum(ch.isalpha() for ch in c) / max(1, len(c)) for c in completions]


def explode_on_rank_1(completions, **kwargs):
    """Raises on rank 1 only (a reward that fails on one rank); rank 0 must stop with it too."""
    import os

    if os.environ.get("RANK") == "1":
        raise ValueError("reward exploded on purpose")
    return letters(completions)


def run_config(model_dir: str, output_dir: str, **overrides: Any) -> GRPOConfig:
    base = dict(model=model_dir, output_dir=output_dir, num_generations=2, per_device_train_batch_size=2,
                gradient_accumulation_steps=1, steps_per_generation=2, max_new_tokens=6, max_prompt_length=64,
                max_steps=4, learning_rate=1e-2, progress_bar=False, save_strategy="steps", save_steps=1,
                seed=0, eval_split=None, log_completions_steps=1, temperature=1.0)
    return GRPOConfig(**{**base, **overrides})


def run_training(model_dir: str, output_dir: str, reward: Any = letters, resume: Any = None,
                 **overrides: Any) -> dict[str, Any]:
    """One GRPOTrainer run on this rank; its final parameters, result and wall-clock end (or its error)."""
    import time

    from grouprl.train import GRPOTrainer

    cfg = run_config(model_dir, output_dir, **overrides)
    trainer = GRPOTrainer(config=cfg, train_dataset=list(ROWS), reward_funcs=[reward])
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except Exception as e:  # noqa: BLE001 - the failure test inspects every rank's error
        return {"error": f"{type(e).__name__}: {e}", "end": time.time()}
    params = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    return {"params": params, "global_step": result["global_step"], "end": time.time(),
            "history": result["history"]}


def _meet(workdir: str) -> dist.Ranks:
    """Both ranks up (a file each, waited for up to 90 s), then the process group: a short collective
    timeout in a test then never meets a slow interpreter start."""
    import os
    import time
    from pathlib import Path

    rank, deadline = int(os.environ["RANK"]), time.time() + 90
    (Path(workdir) / f"up{rank}").touch()
    while not (Path(workdir) / f"up{1 - rank}").exists() and time.time() < deadline:
        time.sleep(0.05)
    return dist.current()


def die_on_rank_1(workdir: str) -> dict[str, Any]:
    """Rank 1 exits without a word (a killed process); rank 0's next collective must not hang."""
    import os
    import time

    d = _meet(workdir)
    d.all_gather("ready")
    if d.rank == 1:
        os._exit(3)
    start = time.time()
    try:
        d.all_gather("still there?")
    except Exception as e:  # noqa: BLE001 - the test reads the error
        waited, start = time.time() - start, time.time()
        d.fail(e)  # what the loop does with any error: must not wait on the broken group a second time
        return {"error": f"{type(e).__name__}: {e}", "waited": waited, "fail_s": time.time() - start}
    return {"error": None, "waited": time.time() - start}


def stall_on_rank_1(workdir: str) -> dict[str, Any]:
    """Rank 1 stays alive but never joins the next collective; rank 0 must give up at the timeout."""
    import os
    import time

    d = _meet(workdir)
    d.all_gather("ready")
    if d.rank == 1:
        time.sleep(12)
        os._exit(0)
    start = time.time()
    try:
        d.all_gather("anyone?")
    except Exception as e:  # noqa: BLE001 - the test reads the error
        return {"error": f"{type(e).__name__}: {e}", "waited": time.time() - start}
    return {"error": None, "waited": time.time() - start}



KILL_RUN = dict(max_steps=6, save_steps=3, logging_steps=1)  # tests/dist/test_dist_kill_resume.py


def run_training_killed(kill: str, model_dir: str, output_dir: str, resume: Any = None,
                        max_staleness: int = 0) -> dict[str, Any]:
    """:func:`run_training` of :data:`KILL_RUN` with a SIGKILL armed (``tests/train/kill_points.py``:
    ``"<point>:<n>:<rank>"``; ``""`` = none)."""
    import kill_points  # tests/train, on the path of the test that spawns this rank

    kill_points.install(kill)
    return run_training(model_dir, output_dir, resume=resume, max_staleness=max_staleness, **KILL_RUN)
