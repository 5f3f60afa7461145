"""The rollout worker: a separate process with its own copy of the weights that generates and scores the
next rounds while the trainer trains (``max_staleness`` >= 1; docs/ALGORITHMS.md, "Asynchronous GRPO").

It runs the generate-and-score half of the synchronous round, :func:`grouprl.train.algorithms.rounds.
sample_round` (single-turn and agent rollouts alike, dynamic sampling included), on its own share of the
prompt stream, starting where the trainer says; the trainer runs the other half (advantages over every
rank, micro-batches, the fixed log-probs). Round ``j`` is sampled with exactly the weights
:func:`grouprl.train.pipeline.staleness.target_version` names and the seed :func:`~grouprl.train.pipeline.
staleness.round_seed` gives, so a regenerated round is the same round. The worker also records the
behaviour log-probs -- its own log-prob of each sampled token under the weights that sampled it -- as the
rollout's ``rollout_logp``, which the trainer's loss corrects with (``rollout_correction``).

Messages. Trainer -> worker (``ctl``): ``("weights", v)`` (a gloo broadcast of version ``v`` follows,
:mod:`grouprl.train.pipeline.weights`), ``("extend", n)`` (produce ``n`` more rounds: the trainer dropped
some), ``("stop",)``. Worker -> trainer (``out``, bounded): ``("round", bytes)`` (a pickled
:class:`RoundMsg`), ``("error", round_index, traceback)``. The worker stops when told, when its parent
process is gone (a trainer killed with -9 leaves no orphan generating), or on an error, which it reports.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from grouprl.train.algorithms.rounds import RunContext, Sampled, sample_round, sampling_params
from grouprl.train.engine.logp import batched_logps
from grouprl.train.metrics import Timers
from grouprl.train.pipeline.staleness import round_seed, target_version
from grouprl.train.pipeline.weights import Receiver, load_flat, trainable

FROM_CONFIG = "agent: build it from the config"  # the agent did not pickle: cfg.tools / cfg.environment name it
POLL_S = 0.5  # how often a waiting worker looks at its parent and its control queue
_CLEARED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED")


@dataclass
class WorkerSpec:
    """Everything the worker builds its half of the run from (pickled by the trainer)."""

    cfg: Any
    model: Any  # a CPU copy; its weights are replaced by the first push before any round
    tokenizer: Any
    rows: Any
    scorer: Any
    agent: Any
    stream: Any  # this rank's prompt stream, at the position of the first round to produce
    first_round: int
    n_rounds: int
    steps_per_round: int
    start_version: int
    total_steps: int
    rank: int = 0


@dataclass
class RoundMsg:
    """One produced round: its index, the version that sampled it, the sampled half, the stream position
    after its draws, the worker's phase times and how long it waited (for weights or queue room) before."""

    round_index: int
    version: int
    sampled: Sampled
    stream_state: dict
    times: dict = field(default_factory=dict)
    rollout_wait_s: float = 0.0


class _Stop(Exception):
    pass


def main(spec_blob: bytes, port: int, ctl: Any, out: Any) -> None:
    """The worker process's entry point (``torch.multiprocessing`` spawn)."""
    for name in _CLEARED_ENV:  # this process is no training rank: grouprl.train.parallel sees one process
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    # Ctrl-C reaches the whole process group: the trainer finishes its step, saves and stops this worker
    # (run/signals.py); dying here first would turn a graceful stop into a worker error
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, name="grouprl-worker-watchdog", daemon=True).start()
    worker = None
    try:
        worker = Worker(pickle.loads(spec_blob), port, ctl, out)
        worker.serve()
    except BaseException:  # reported to the trainer, which names the worker and the step
        j = worker.next_round if worker is not None else -1
        try:
            out.put(("error", j, traceback.format_exc()), timeout=10)
        finally:
            out.close()
            out.join_thread()
            sys.exit(1)


def _watch_parent() -> None:
    """End this process within ``POLL_S`` of its trainer's death (kill -9 included), wherever it is blocked
    (generating, in a reward function, inside a weight broadcast): nobody would train what it produces."""
    parent = multiprocessing.parent_process()
    while parent is None or parent.is_alive():
        time.sleep(POLL_S)
    os._exit(0)


class Worker:
    """The worker's state: its model copy at version ``held``, the pushed buffers it may still need, its
    prompt stream and the next round to produce."""

    def __init__(self, spec: WorkerSpec, port: int, ctl: Any, out: Any) -> None:
        from grouprl.rollout import make_backend
        from grouprl.train.engine.model import autocast_factory
        from grouprl.train.engine.precision import resolve_rollout_dtype

        cfg, model = spec.cfg, spec.model
        if isinstance(spec.agent, str) and spec.agent == FROM_CONFIG:
            from grouprl.train.agent import build_agent

            spec.agent = build_agent(cfg)
        self.spec, self.ctl, self.out, self.cfg = spec, ctl, out, cfg
        self.params = trainable(model)
        self.receiver = Receiver(port, sum(p.numel() for p in self.params), cfg.async_timeout_s)
        self.buffers: dict[int, torch.Tensor] = {}
        self.held: int | None = None
        from grouprl.rollout.vllm_backend import options_from

        # a vLLM server (vllm_mode: server) is driven from here over HTTP: its weights come from this copy
        backend = make_backend(cfg.rollout_backend, model, spec.tokenizer, lean_sampler=cfg.lean_sampler,
                               vllm_options=options_from(cfg), rollout_dtype=resolve_rollout_dtype(cfg, model))
        self.ctx = RunContext(cfg, model, spec.tokenizer, backend, spec.scorer, None, None,
                              autocast_factory(cfg.bf16, torch.device("cpu")), spec.rows, spec.start_version,
                              spec.total_steps, sampling_params(cfg), spec.agent)
        self.next_round, self.last_round = spec.first_round, spec.first_round + spec.n_rounds
        self.waited = 0.0

    # ---- control messages ----------------------------------------------------------------------------
    def handle(self, msg: tuple) -> None:
        if msg[0] == "weights":
            self.buffers[int(msg[1])] = self.receiver.receive()
            self.forget_old()
        elif msg[0] == "extend":
            self.last_round += int(msg[1])
        elif msg[0] == "stop":
            raise _Stop
        else:
            raise ValueError(f"rollout worker: unknown control message {msg!r}")

    def poll(self, block: bool) -> bool:
        """Handle one control message (waiting up to ``POLL_S`` when ``block``); False when none came."""
        try:
            msg = self.ctl.get(timeout=POLL_S) if block else self.ctl.get_nowait()
        except queue.Empty:
            parent = multiprocessing.parent_process()
            if parent is not None and not parent.is_alive():
                raise _Stop from None  # the trainer is gone (killed): nobody will train what this produces
            return False
        self.handle(msg)
        return True

    def target(self) -> int:
        s = self.spec
        return target_version(self.next_round, s.steps_per_round, self.cfg.max_staleness,
                              self.cfg.weight_sync_steps, s.start_version)

    def forget_old(self) -> None:
        """Drop the pushed buffers no later round will be sampled with (versions below the next target)."""
        low = self.target()
        for v in [v for v in self.buffers if v < low]:
            del self.buffers[v]

    # ---- the loop --------------------------------------------------------------------------------
    def serve(self) -> None:
        try:
            while True:
                while self.poll(block=False):
                    pass
                if self.next_round >= self.last_round or (self.target() not in self.buffers
                                                          and self.held != self.target()):
                    t0 = time.perf_counter()
                    self.poll(block=True)  # done for now, or the weights of the next round not pushed yet
                    self.waited += time.perf_counter() - t0
                    continue
                self.send(self.produce())
        except _Stop:
            return

    def produce(self) -> RoundMsg:
        """Round ``next_round`` with the weights of its target version and its own seed."""
        from transformers import set_seed

        version = self.target()
        if self.held != version:
            load_flat(self.params, self.buffers[version])
            self.held = version
            # through the engine interface: a backend with its own copy (the lean sampler's bf16 copy, an
            # Engine plug-in) takes the new weights now, before it samples the round
            self.ctx.backend.sync_weights(self.ctx.model)
        self.forget_old()
        set_seed(round_seed(self.cfg.seed, self.next_round, self.spec.rank))
        self.ctx.step = version  # what reward functions see as global_step: the step of the sampling weights
        timers = Timers()
        sampled = sample_round(self.ctx, self.spec.stream, timers)
        sampled.version = version
        with timers("behaviour_logp"):
            behaviour_logp(self.ctx, sampled)
        msg = RoundMsg(self.next_round, version, sampled, self.spec.stream.state(), dict(timers.totals), self.waited)
        self.waited = 0.0
        return msg

    def send(self, msg: RoundMsg) -> None:
        """Put the round on the bounded queue, taking weight pushes while it is full."""
        blob = pickle.dumps(msg)
        t0 = time.perf_counter()
        while True:
            try:
                self.out.put(("round", blob), timeout=POLL_S)
                break
            except queue.Full:
                self.poll(block=False)
        self.waited += time.perf_counter() - t0
        self.next_round += 1


def behaviour_logp(ctx: RunContext, sampled: Sampled) -> None:
    """Each sampled part's ``rollout_logp [N,T]``: the log-prob of each sampled token under the weights
    that sampled it (0 on padding), unless the engine reported its own (the lean sampler's bf16 copy)."""
    cfg = ctx.cfg
    for part in sampled.parts:
        if part is None or part.rollout.rollout_logp is not None:
            continue
        r = part.rollout
        lp = batched_logps(ctx.model, [r], cfg.temperature, ctx.autocast, chunk_size=cfg.logits_chunk_size,
                           padding_free=cfg.padding_free)[0]
        if lp.shape[1] < r.completion_ids.shape[1]:  # trimmed to the longest completion: pad back
            lp = torch.nn.functional.pad(lp, (0, r.completion_ids.shape[1] - lp.shape[1]))
        r.rollout_logp = lp.float().masked_fill(r.completion_mask == 0, 0.0)
