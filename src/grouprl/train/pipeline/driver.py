"""The trainer's side of the asynchronous pipeline: start the rollout worker, take its rounds (every wait
bounded by ``async_timeout_s``), drop and count those past the staleness bound, push the weights every
``weight_sync_steps``, and stop the worker -- or end the run with an error naming the worker, the step
and the fix when the worker dies or hangs.
"""

from __future__ import annotations

import math
import pickle
import queue
import time
from dataclasses import fields, replace
from typing import Any

import torch

from grouprl.errors import ConfigError, GroupRLError
from grouprl.train.algorithms.rounds import RunContext, Sampled, finish_round
from grouprl.train.pipeline import worker as worker_mod
from grouprl.train.pipeline.staleness import StalenessLog, pushes_at
from grouprl.train.pipeline.weights import Sender, start_timeout, trainable

_FIX_CRASH = ("Fix: the worker's traceback above names the failing call (a reward function, a tool, the model); "
              "fix it, or set max_staleness: 0 to run the same rounds in the trainer's process and debug there.")
_FIX_HANG = ("Fix: if a round legitimately takes this long (long generations, slow tools), raise async_timeout_s; "
             "otherwise look for a reward function or tool that never returns (they run in the worker process), "
             "or set max_staleness: 0 to debug in one process.")


class RolloutWorkerError(GroupRLError, RuntimeError):
    """The rollout worker died, hung, or could not start: the run stops (the worker is stopped too)."""


def open_pipeline(ctx: RunContext, ranks: Any, stream: Any, start_step: int, steps_per_round: int,
                  total_steps: int) -> AsyncRounds:
    """Start the worker for this rank (``max_staleness`` >= 1), after the checks that need the ranks."""
    cfg = ctx.cfg
    if ranks.sharded:
        raise ConfigError(f"max_staleness={cfg.max_staleness} with a sharded model (FSDP / DeepSpeed ZeRO): the "
                          f"rollout worker takes whole weights. Fix: max_staleness: 0, or plain data parallel.")
    if ranks.enabled and cfg.dynamic_sampling == "resample":
        raise ConfigError(f"max_staleness={cfg.max_staleness} with dynamic_sampling='resample' on {ranks.world} "
                          f"processes: the ranks' workers would redraw prompts out of lock-step. Fix: "
                          f"dynamic_sampling: drop (or none), or one process.")
    if ranks.enabled and cfg.rollout_backend == "vllm":
        raise ConfigError(f"max_staleness={cfg.max_staleness} with a vLLM server on {ranks.world} processes: each "
                          f"rank's worker would push its weights into the one server. Fix: one process, or "
                          f"max_staleness: 0.")
    return AsyncRounds(ctx, ranks, stream, start_step, steps_per_round, total_steps)


def eval_backend(ctx: RunContext) -> Any:
    """What the trainer evaluates with: its rollout backend, except when a rollout worker drives a vLLM
    server -- pushing the trainer's weights into that server before an evaluation would change the weights
    the worker samples with. The trainer then evaluates with the transformers backend over its own weights."""
    cfg = ctx.cfg
    if not (cfg.max_staleness and cfg.rollout_backend == "vllm"):
        return ctx.backend
    from grouprl.rollout import make_backend

    return make_backend("transformers", ctx.model, ctx.tokenizer, lean_sampler=cfg.lean_sampler)


class AsyncRounds:
    """One rank's rollout worker and its accounting (``new_round`` / ``after_step`` / ``close``)."""

    def __init__(self, ctx: RunContext, ranks: Any, stream: Any, start_step: int, steps_per_round: int,
                 total_steps: int) -> None:
        cfg = ctx.cfg
        self.ctx, self.cfg, self.rank = ctx, cfg, ranks.rank if ranks.enabled else 0
        self.timeout_s, self.spr = float(cfg.async_timeout_s), steps_per_round
        self.first_round = math.ceil(start_step / steps_per_round)  # mid-round resume: that round is saved
        self.wanted = max(0, math.ceil(total_steps / steps_per_round) - self.first_round)
        self.received, self.step, self.log = 0, start_step, StalenessLog(cfg.max_staleness)
        self.proc: Any = None
        blob = _pickle_spec(worker_mod.WorkerSpec(
            cfg, _cpu_copy(ctx.model), ctx.tokenizer, ctx.rows, ctx.scorer, _agent_for_worker(ctx), stream, self.first_round,
            self.wanted, steps_per_round, start_step, total_steps, self.rank))
        self.sender = Sender(self.timeout_s)  # after the checks: nothing to undo when the spec cannot cross
        mp = torch.multiprocessing.get_context("spawn")
        self.ctl, self.out = mp.Queue(), mp.Queue(maxsize=cfg.max_staleness // steps_per_round + 1)
        # not a daemon: the worker may start processes of its own (sandboxed tools); close() always stops it
        self.proc = mp.Process(target=worker_mod.main, args=(blob, self.sender.port, self.ctl, self.out),
                               name=f"grouprl-rollout-worker-{self.rank}", daemon=False)
        self.proc.start()
        try:
            self.sender.wait_connected(self._alive, time.monotonic() + start_timeout(self.timeout_s))
        except RolloutWorkerError:
            raise
        except (TimeoutError, RuntimeError) as e:
            raise self._error(f"did not start within {start_timeout(self.timeout_s):g} s ({e})", _FIX_HANG) from e
        self._push(start_step)

    @property
    def name(self) -> str:
        pid = self.proc.pid if self.proc is not None else "?"
        return f"rollout worker {self.rank} (process {pid})"

    # ---- failures ------------------------------------------------------------------------------------
    def _error(self, what: str, fix: str, detail: str = "") -> RolloutWorkerError:
        j, name = self.first_round + self.received, self.name
        self.close(ask=False)  # it is dead or stuck: no polite stop
        return RolloutWorkerError(f"the {name} {what}, while the trainer was at optimizer step {self.step} "
                                  f"waiting for round {j}.{chr(10) + detail.rstrip() if detail else ''}\n{fix}")

    def _alive(self) -> None:
        """Raise the worker's own error (when it sent one) or its exit code, if it is gone."""
        if self.proc is None:
            raise RolloutWorkerError(f"the rollout worker {self.rank} was already stopped")
        if self.proc.is_alive():
            return
        try:
            kind, j, text = self.out.get(timeout=1.0)
        except (queue.Empty, ValueError, EOFError, OSError):
            kind, text = None, ""
        if kind == "error":
            raise self._error(f"failed at round {j}", _FIX_CRASH, "Its traceback:\n" + text)
        raise self._error(f"died with exit code {self.proc.exitcode} (killed, or out of memory)", _FIX_CRASH)

    def _receive(self) -> worker_mod.RoundMsg:
        """The worker's next round, within ``async_timeout_s``, checking each second that it lives."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                item = self.out.get(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
            except queue.Empty:
                self._alive()
                if time.monotonic() > deadline:
                    raise self._error(f"delivered no round within async_timeout_s={self.timeout_s:g} s", _FIX_HANG) from None
                continue
            if item[0] == "error":
                raise self._error(f"failed at round {item[1]}", _FIX_CRASH, "Its traceback:\n" + item[2])
            return pickle.loads(item[1])

    # ---- the loop's two calls ------------------------------------------------------------------------
    def new_round(self, ranks: Any, stream: Any, timers: Any, watch: Any, run: Any) -> None:
        """The next admitted round from the worker, finished by the trainer (advantages over every rank,
        micro-batches, fixed log-probs) into ``run.rnd``; the trainer's stream moves past its draws."""
        self.step = run.step
        t0 = time.perf_counter()
        while True:
            msg = self._receive()
            self.received += 1
            if self.log.admit(msg.version, run.step):
                break
            self.wanted += 1  # dropped: the worker produces one more round in its place
            self.ctl.put(("extend", 1))
        waited = time.perf_counter() - t0
        ctx = self.ctx
        ctx.step = run.step
        run.rnd, run.round_step = finish_round(ctx, _to_device(msg.sampled, ctx.model), timers), 0
        stream.load_state(msg.stream_state)  # the trainer's data position: after the rounds it trained
        lag = run.step - msg.version
        lags = ranks.all_gather(lag) if ranks.enabled else [lag]
        metrics = self.log.metrics(lag)
        metrics.update({"async/staleness_mean": sum(lags) / len(lags), "async/staleness_max": float(max(lags)),
                        "async/trainer_wait_s": waited, "async/rollout_wait_s": msg.rollout_wait_s,
                        "async/policy_version": float(msg.version),
                        "async/worker_generate_s": msg.times.get("generate", 0.0),
                        "async/worker_reward_s": msg.times.get("reward", 0.0),
                        "async/worker_logp_s": msg.times.get("behaviour_logp", 0.0)})
        run.rnd.metrics.update(metrics)
        run.rnd.metrics = ranks.mean_metrics(run.rnd.metrics)  # the round's metrics over every rank
        run.rnd.metrics["async/staleness_max"] = float(max(lags))  # a max over ranks, not their mean
        watch.check(run.rnd.metrics)

    def after_step(self, step: int) -> None:
        """Push the weights after optimizer step ``step`` every ``weight_sync_steps``, while rounds remain."""
        self.step = step
        if pushes_at(step, self.cfg.weight_sync_steps) and self.received < self.wanted:
            self._push(step)

    def _push(self, version: int) -> None:
        try:
            self.sender.finish_push()  # the previous one (bounded by the group's timeout)
            self._alive()
            self.ctl.put(("weights", version))
            self.sender.push(trainable(self.ctx.model))
        except RolloutWorkerError:
            raise
        except RuntimeError as e:  # gloo: timed out, or the peer closed the connection
            self._alive()
            raise self._error(f"did not take the weight push of version {version} within async_timeout_s="
                              f"{self.timeout_s:g} s ({e})", _FIX_HANG) from e

    def close(self, ask: bool = True) -> None:
        """Stop the worker: asked first (``ask``), then terminated, then killed (each bounded)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if ask and proc.is_alive():
            try:
                self.ctl.put(("stop",))
            except (ValueError, OSError):
                pass
            proc.join(timeout=10)
        for stop in (proc.terminate, proc.kill):
            if proc.is_alive():
                stop()
                proc.join(timeout=5)
        for q in (self.ctl, self.out):
            q.cancel_join_thread()
            q.close()


def _cpu_copy(model: Any) -> Any:
    """The model as the worker gets it: itself when on the CPU (pickling copies it), else a CPU copy."""
    import copy

    if next(model.parameters()).device.type == "cpu":
        return model
    return copy.deepcopy(model).to("cpu")


def _agent_for_worker(ctx: RunContext) -> Any:
    """The agent itself when it pickles, else ``worker.FROM_CONFIG``: the worker builds it from the config,
    which names every tool and environment by import path (``train.agent.build_agent`` writes them back)."""
    if ctx.agent is None:
        return None
    try:
        pickle.dumps(ctx.agent)
        return ctx.agent
    except Exception:
        return worker_mod.FROM_CONFIG


def _pickle_spec(spec: Any) -> bytes:
    """The worker's spec as bytes, or a ConfigError naming the part that cannot cross to another process."""
    try:
        return pickle.dumps(spec)
    except Exception:
        for f in fields(spec):
            try:
                pickle.dumps(getattr(spec, f.name))
            except Exception as e:
                what = {"scorer": "a reward function", "agent": "the agent (its environment or tools)",
                        "rows": "the training rows"}.get(f.name, f.name)
                raise ConfigError(f"max_staleness={spec.cfg.max_staleness}: {what} cannot be sent to the rollout "
                                  f"worker process ({type(e).__name__}: {e}). Fix: define reward functions and "
                                  f"tools at module level (no lambdas or local functions), or max_staleness: 0.") from e
        raise


def _to_device(sampled: Sampled, model: Any) -> Sampled:
    """The sampled parts' tensors on the model's device (the worker samples on the CPU)."""
    device = next(model.parameters()).device
    if device.type == "cpu":
        return sampled
    parts = []
    for part in sampled.parts:
        if part is not None:
            r = part.rollout
            moved = {f.name: getattr(r, f.name).to(device) for f in fields(r)
                     if isinstance(getattr(r, f.name), torch.Tensor)}
            part = replace(part, rollout=replace(r, **moved), rewards=part.rewards.to(device))
        parts.append(part)
    return replace(sampled, parts=parts)
