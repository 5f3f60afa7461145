"""Schedulers of a multi-turn round: per trajectory (default) or in lockstep.

Both drive the state machine of :class:`grouprl.rollout.multiturn.MultiTurnRollout` (``ready`` ->
``request`` -> engine -> ``next_action`` -> job in the tool pool -> ``apply`` -> ``ready`` ...), call the
engine from the calling thread only (a model under FSDP / ZeRO is never entered from two threads), and
run the jobs (a trajectory's tool calls, in order) in the pool, each bounded by ``job_bound``.

- ``run_lockstep``: turn k is one engine call over every trajectory still running, then every job of the
  turn runs and the next turn waits for the slowest (the behaviour of TRL's ``_tool_call_loop`` and of
  most synchronous agent loops). Batches depend only on the trajectories: same seed, same batches.
- ``run_per_trajectory``: a trajectory's next turn is submitted as soon as its own job returned. A
  continuous engine (``engine.continuous``: vLLM) takes each request the moment it is ready and is stepped
  while anything runs; a batch engine (transformers, the lean sampler, a server request) generates for the
  ready set, after waiting at most ``batch_wait_s`` for trajectories whose tools are still running. With
  tools that all return within ``batch_wait_s`` the batches are those of lockstep; slower tools change
  which trajectories share an engine call (docs/AGENTS.md, "Scheduling and determinism").

A round ends when all its trajectories ended (each has a time limit, each job a bound).
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any


@dataclass
class RoundStats:
    """Wall time of one round, the time the engine spent generating (``engine_s``; its busy fraction is
    ``engine_s / wall_s``), the engine calls (or steps) made and the model turns they served."""

    wall_s: float = 0.0
    engine_s: float = 0.0
    engine_calls: int = 0
    model_turns: int = 0

    @property
    def busy_fraction(self) -> float:
        return self.engine_s / self.wall_s if self.wall_s > 0 else 0.0


def _generate(rollout: Any, batch: list, params: Any, stats: RoundStats) -> list:
    requests = [rollout.request(live) for live in batch]
    start = time.monotonic()
    gens = rollout.engine.generate([ids for ids, _ in requests], [b for _, b in requests], params)
    stats.engine_s += time.monotonic() - start
    stats.engine_calls += 1
    stats.model_turns += len(batch)
    if len(gens) != len(batch):
        raise ValueError(f"multi-turn rollout: {type(rollout.engine).__name__}.generate returned {len(gens)} "
                         f"generations for {len(batch)} prompts; it must return one per prompt")
    return gens


def run_lockstep(rollout: Any, lives: list, params: Any, pool: Any) -> RoundStats:
    """Every turn waits for the slowest trajectory (see the module docstring)."""
    stats, start = RoundStats(), time.monotonic()
    for _ in range(rollout.params.max_turns):
        active = [live for live in lives if rollout.ready(live)]
        if not active:
            break
        gens = _generate(rollout, active, params, stats)
        pending = [(live, rollout.next_action(live, gen)) for live, gen in zip(active, gens)]
        pending = [(live, action) for live, action in pending if action is not None]
        jobs = [(live, action, rollout.job_bound(live), pool.submit(rollout.run_job, live, action))
                for live, action in pending]
        for live, action, bound, job in jobs:
            try:
                result = job.result(timeout=bound)
            except FutureTimeout:
                result = rollout.overran(action, bound)
            rollout.apply(live, action, result)
    stats.wall_s = time.monotonic() - start
    return stats


class _Jobs:
    """The jobs in flight: each finished future lands on one queue; a job past its bound is reported as
    overrun (its thread may still run; its late result is ignored)."""

    def __init__(self, rollout: Any, pool: Any) -> None:
        self.rollout, self.pool = rollout, pool
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.inflight: dict[Future, tuple[Any, Any, float, float]] = {}

    def submit(self, live: Any, action: Any) -> None:
        bound = self.rollout.job_bound(live)
        job = self.pool.submit(self.rollout.run_job, live, action)
        self.inflight[job] = (live, action, time.monotonic() + bound, bound)
        job.add_done_callback(self.done.put)

    def collect(self, timeout: float) -> list[tuple[Any, Any, Any]]:
        """``(live, action, result)`` of the jobs that finished (waiting up to ``timeout`` s for the first),
        plus the overrun ones."""
        out, futures = [], []
        try:
            futures.append(self.done.get(timeout=timeout) if timeout > 0 else self.done.get_nowait())
            while True:
                futures.append(self.done.get_nowait())
        except queue.Empty:
            pass
        for job in futures:
            if job in self.inflight:
                live, action, _, _ = self.inflight.pop(job)
                out.append((live, action, job.result()))
        now = time.monotonic()
        for job, (live, action, deadline, bound) in list(self.inflight.items()):
            if now >= deadline:
                del self.inflight[job]
                out.append((live, action, self.rollout.overran(action, bound)))
        return out

    def next_deadline(self) -> float:
        return min((d for _, _, d, _ in self.inflight.values()), default=time.monotonic())


def run_per_trajectory(rollout: Any, lives: list, params: Any, pool: Any) -> RoundStats:
    """Each trajectory goes on as soon as its own tools returned (see the module docstring)."""
    stats, start = RoundStats(), time.monotonic()
    jobs, engine = _Jobs(rollout, pool), rollout.engine
    ready = [live for live in lives if rollout.ready(live)]
    waiting_since: float | None = None
    running: dict[Any, Any] = {}  # request id -> live (continuous engines)
    ids = iter(range(1 << 62))

    def on_turn(live: Any, gen: Any) -> None:
        action = rollout.next_action(live, gen)
        if action is not None:
            jobs.submit(live, action)

    while ready or jobs.inflight or running:
        if engine.continuous:
            for live in ready:
                rid = str(next(ids))
                prompt, budget = rollout.request(live)
                engine.add_request(rid, prompt, budget, params)
                running[rid] = live
            ready = []
            if running:
                t0 = time.monotonic()
                finished = engine.step()
                stats.engine_s += time.monotonic() - t0
                stats.engine_calls += 1
                for rid, gen in finished:
                    stats.model_turns += 1
                    on_turn(running.pop(rid), gen)
                timeout = 0.0
            else:
                timeout = jobs.next_deadline() - time.monotonic()
        else:
            now = time.monotonic()
            if ready and waiting_since is None:
                waiting_since = now
            if ready and (not jobs.inflight or now - waiting_since >= rollout.params.batch_wait_s):
                batch, ready, waiting_since = sorted(ready, key=lambda x: x.index), [], None
                for live, gen in zip(batch, _generate(rollout, batch, params, stats)):
                    on_turn(live, gen)
                timeout = 0.0
            elif ready:
                timeout = min(waiting_since + rollout.params.batch_wait_s, jobs.next_deadline()) - now
            else:
                timeout = jobs.next_deadline() - now
        for live, action, result in jobs.collect(timeout if jobs.inflight else 0.0):
            rollout.apply(live, action, result)
            if rollout.ready(live):
                ready.append(live)
    stats.wall_s = time.monotonic() - start
    return stats
