"""kill -9 at a chosen point of a real run, for the resume tests.

``GROUPRL_TEST_KILL="<point>:<n>[:<rank>]"`` and :func:`install` (before the run starts) make the process
``SIGKILL`` itself the ``n``-th time it reaches ``<point>`` (on process ``<rank>`` only, when given): no
``finally``, no handler, no flush runs -- what ``kill -9`` or the kernel's OOM killer does. The points wrap
the functions a run passes through, in the order of one optimizer step:

=============  ==================================================================================
point          the process dies ...
=============  ==================================================================================
generate       inside the rollout backend's ``generate`` (a round's prompts drawn, nothing sampled)
reward         inside the reward scorer (completions sampled, not scored)
logp           inside the fixed log-prob forward of a round (``batched_logps``: reference / old)
clip           inside the optimizer step: gradients accumulated, clipped, not yet applied
after_update   after the optimizer step, before its metrics are logged
log            half-way through writing a metrics.jsonl record (a line cut short)
ckpt_write     inside a checkpoint write: the weights written, ``trainer_state.pt`` not
ckpt_rename    a checkpoint complete in ``.tmp-checkpoint-<step>``, not yet renamed
after_ckpt     after a checkpoint is renamed, before the next step (the run report's refresh)
push           the trainer, inside a weight push to the rollout worker (``max_staleness`` >= 1)
worker_gen     the rollout worker, inside its ``generate`` (a round in flight)
worker_push    the rollout worker, inside taking a weight push (the broadcast half received)
=============  ==================================================================================

The ``worker_*`` points are armed in the trainer, which then starts its worker through :func:`worker_main`
(the spawned worker process reads the same ``GROUPRL_TEST_KILL``).
"""

from __future__ import annotations

import functools
import os
import signal
from typing import Any


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _counting(fn: Any, n: int, *, after: bool = False) -> Any:
    calls = [0]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == n and not after:
            _die()
        out = fn(*args, **kwargs)
        if calls[0] == n:
            _die()
        return out

    return wrapper


def _half_line(log: Any, n: int) -> Any:
    calls = [0]

    @functools.wraps(log)
    def wrapper(self: Any, step: int, metrics: dict) -> None:
        calls[0] += 1
        if calls[0] == n:
            self._metrics.write(f'{{"step": {step}, "reward": 0.')  # cut short, as a kill mid-write leaves it
            self._metrics.flush()
            _die()
        log(self, step, metrics)

    return wrapper


class _TorchSaveKills:
    """``torch`` as ``train/checkpoint/store.py`` sees it, with a ``save`` that dies on its ``n``-th call."""

    def __init__(self, torch: Any, n: int) -> None:
        self._torch, self.save = torch, _counting(torch.save, n)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


def worker_main(*args: Any) -> None:
    """The rollout worker's entry point with its kill point armed (``grouprl.train.pipeline.worker.main``)."""
    from grouprl.train.pipeline import weights, worker

    point, n = os.environ["GROUPRL_TEST_KILL"].split(":")[:2]
    if point == "worker_gen":
        from grouprl.rollout import hf

        hf.TransformersBackend.generate = _counting(hf.TransformersBackend.generate, int(n))
    elif point == "worker_push":
        weights.Receiver.receive = _counting(weights.Receiver.receive, int(n))
    worker.main(*args)


def install(spec: str | None = None) -> None:
    """Arm the kill point named by ``spec`` (default: ``$GROUPRL_TEST_KILL``); nothing when unset."""
    spec = spec if spec is not None else os.environ.get("GROUPRL_TEST_KILL", "")
    if not spec:
        return
    point, n, *rank = spec.split(":")
    if rank and os.environ.get("RANK", "0") != rank[0]:
        return
    n = int(n)
    import torch

    from grouprl.rollout import hf
    from grouprl.run import reporting
    from grouprl.train import metrics, score
    from grouprl.train.algorithms import grpo, rounds
    from grouprl.train.checkpoint import store

    if point == "generate":
        hf.TransformersBackend.generate = _counting(hf.TransformersBackend.generate, n)
    elif point == "reward":
        score.RewardScorer.score = _counting(score.RewardScorer.score, n)
    elif point == "logp":
        rounds.batched_logps = _counting(rounds.batched_logps, n)
    elif point == "clip":
        torch.nn.utils.clip_grad_norm_ = _counting(torch.nn.utils.clip_grad_norm_, n)
    elif point == "after_update":
        grpo.optimizer_step = _counting(grpo.optimizer_step, n, after=True)
    elif point == "log":
        metrics.MetricsLogger.log = _half_line(metrics.MetricsLogger.log, n)
    elif point == "ckpt_write":
        store.torch = _TorchSaveKills(torch, n)
    elif point == "ckpt_rename":
        store.fsync_tree = _counting(store.fsync_tree, 2 * n - 1)  # 2 calls per save: the files, then the rename
    elif point == "after_ckpt":
        reporting.refresh = _counting(reporting.refresh, n)
    elif point == "push":
        from grouprl.train.pipeline import weights

        weights.Sender.push = _counting(weights.Sender.push, n)
    elif point in ("worker_gen", "worker_push"):
        from grouprl.train.pipeline import driver

        os.environ["GROUPRL_TEST_KILL"] = spec  # what the spawned worker reads
        driver.worker_mod = _WorkerModule(driver.worker_mod)
    else:
        raise ValueError(f"unknown kill point {point!r} (see {__file__})")


class _WorkerModule:
    """``grouprl.train.pipeline.worker`` as the driver sees it, with the entry point :func:`worker_main`."""

    def __init__(self, module: Any) -> None:
        self._module, self.main = module, worker_main

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)
