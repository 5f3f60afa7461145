"""Asynchronous GRPO: a rollout worker generates and scores the next rounds while the trainer trains.

``max_staleness: k`` >= 1 (0 = the synchronous loop of ``train.algorithms.grpo``, untouched). Each training
rank starts one worker process (``torch.multiprocessing`` spawn, its own CPU copy of the weights, one torch
thread) that runs the generate-and-score half of the round (``rounds.sample_round``); the trainer runs the
other half (``rounds.finish_round``), pushes its weights every ``weight_sync_steps`` over a two-member
gloo group, and trains a round sampled by version ``v`` no later than version ``v + k``.

* ``staleness.py`` -- which weights sample which round, the bound, the ``async/*`` accounting (pure).
* ``weights.py``   -- the weight push over ``torch.distributed`` (gloo), every wait bounded.
* ``worker.py``    -- the worker process: its loop, its messages, the behaviour log-probs.
* ``driver.py``    -- the trainer's side: start, receive (bounded), drop, push, stop; clear errors.

The objective and its equations: docs/ALGORITHMS.md, "Asynchronous GRPO".
"""

from grouprl.train.pipeline.driver import AsyncRounds, RolloutWorkerError, eval_backend, open_pipeline

__all__ = ["AsyncRounds", "RolloutWorkerError", "eval_backend", "open_pipeline"]
