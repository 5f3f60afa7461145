"""Multi-process training on accelerate: the only module where ranks exist.

``accelerate launch --num_processes N -m grouprl train -c recipe.yaml`` starts N copies of the trainer;
:func:`current` gives each its :class:`Ranks` (accelerate's ``PartialState``, which sets up the process
group -- gloo on CPU, NCCL on GPUs -- with the timeout of :data:`TIMEOUT_ENV`). A single process gets a
``Ranks`` of world size 1 whose collectives return their input: the loop calls the same hooks either way.

What N processes mean (``docs/DISTRIBUTED.md``):

* Data. The prompt order is global (``PromptStream`` draws ``prompts_per_generation x N`` prompts per
  round); rank ``r`` generates for the ``r``-th contiguous slice. A prompt's G completions stay on one
  rank. Advantages are computed on the rewards gathered from every rank, so a batch-level statistic
  (``scale_rewards: batch``) sees the global batch and a group-level one gives what it gives alone.
* Gradient. The loss of each micro-batch is normalised by the token / sequence counts of the WHOLE
  global optimizer step (``step_totals`` all-reduced), so the global loss is the SUM over ranks of the
  local losses, and its gradient is the SUM of the rank gradients. We all-reduce-sum the gradients
  once per optimizer step (one flat buffer), then clip and step identically on every rank; the
  parameters stay replicated. This is DDP's all-reduce without its mean (DDP divides by N; with a
  global-count normaliser that would shrink the step N-fold) and without its per-backward hooks, so
  ranks may run different numbers of micro-batch backwards (dynamic sampling ``drop``).
  Hand-written because it is ~10 lines and exact. With FSDP2 (``train/parallel/fsdp.py``, when accelerate is
  configured for it) the weights and optimizer states are sharded instead, and FSDP's reduce-scatter sums
  the gradients (its division by N switched off); with DeepSpeed ZeRO-2/3 (``train/parallel/deepspeed.py``) its
  engine reduces and steps, each backward of N x the loss.
* Failures. Every collective here first all-reduces an error flag. A rank that raises calls
  :meth:`Ranks.fail` from :meth:`Ranks.failures`, which joins that flag with 1 and sends its message; the
  other ranks, at their next collective, raise :class:`PeerFailure` naming the rank and the error.
  A rank that dies without raising (killed, segfault) is caught by the process group's timeout.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch

from grouprl.errors import ConfigError, GroupRLError
from grouprl.train.parallel import deepspeed, fsdp
from grouprl.train.parallel.sharding import NoSharding
from grouprl.train.parallel.sharding import (
    check_config as check_config,  # re-exported: callers use ranks.check_config
)
from grouprl.train.parallel.shares import RankStream

TIMEOUT_ENV = "GROUPRL_DIST_TIMEOUT"
"""Seconds any collective may wait for the other ranks (default 1800: rank 0 evaluating while the
others wait must fit). When it runs out the process group raises on the waiting ranks."""
DEFAULT_TIMEOUT_S = 1800


class PeerFailure(GroupRLError, RuntimeError):
    """Another rank raised; this rank stops with that rank's error."""


class Ranks:
    """This process's place in the run: ``rank`` of ``world``; collectives that are no-ops alone. The
    sharding strategy is held by composition (``sharding``: :class:`NoSharding`, ``fsdp.FSDP2`` or
    ``deepspeed.ZeRO``), chosen when the loop asks to shard (:meth:`shard`, :meth:`zero_init`)."""

    def __init__(self, state: Any = None) -> None:
        self.state = state
        self.rank = int(state.process_index) if state is not None else 0
        self.world = int(state.num_processes) if state is not None else 1
        self._in_collective = self._broken = False  # broken: a collective raised (peer gone, timeout)
        self.sharding: Any = NoSharding()

    @property
    def sharded(self) -> bool:
        """Whether FSDP2 shards the model (its reduce-scatter sums the gradients)."""
        return self.sharding.sharded

    @property
    def engine(self) -> Any:
        """The DeepSpeed ZeRO engine, or None."""
        return self.sharding.engine

    def shard(self, model: Any, reference: Any = None) -> bool:
        """FSDP2 when accelerate is configured for FSDP and several processes run (train/parallel/fsdp.py):
        the strategy becomes ``fsdp.FSDP2`` and shards ``model`` (and the reference); else nothing."""
        if not (self.enabled and fsdp.requested()):
            return False
        self.sharding = fsdp.FSDP2(self)
        return self.sharding.shard(model, reference)

    def zero_init(self, model: Any, optimizer: Any, cfg: Any) -> bool:
        """DeepSpeed ZeRO-2/3 when accelerate is configured for it and several processes run
        (train/parallel/deepspeed.py): the strategy becomes ``deepspeed.ZeRO``; else nothing."""
        if not (self.enabled and deepspeed.requested()):
            return False
        self.sharding = deepspeed.ZeRO(self)
        return self.sharding.zero_init(model, optimizer, cfg)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def device(self, default: torch.device) -> torch.device:
        """The device of this rank: accelerate's (``cuda:<local_rank>``), or ``default`` on CPU / alone."""
        if not self.enabled or default.type == "cpu":
            return default
        return self.state.device

    # ---- failure propagation --------------------------------------------------------------------
    def check(self, error: BaseException | None = None) -> None:
        """Join the error flag of every rank; if any rank failed, raise :class:`PeerFailure` here
        (a rank that passes its own ``error`` returns, and re-raises it itself)."""
        if not self.enabled:
            return
        import torch.distributed as tdist

        with self._collective():
            flag = torch.tensor([1 if error is not None else 0], dtype=torch.int64, device=self._comm_device())
            tdist.all_reduce(flag)
            if int(flag.item()) == 0:
                return
            messages: list[Any] = [None] * self.world
            mine = None if error is None else f"{type(error).__name__}: {error}"
            tdist.all_gather_object(messages, mine)
        if error is not None:
            return
        failed = "; ".join(f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None)
        raise PeerFailure(f"{failed} (this is rank {self.rank} of {self.world}; every rank stops with that error)")

    def fail(self, error: BaseException) -> None:
        """Tell the other ranks that this one failed with ``error`` (they raise at their next collective)."""
        if self.enabled and not (self._in_collective or self._broken) and not isinstance(error, PeerFailure):
            try:
                self.check(error)
            except Exception:  # noqa: BLE001 - the peers may already be gone; the original error matters
                pass

    @contextmanager
    def failures(self) -> Iterator[None]:
        """Run a block whose exception, on any rank, ends every rank (re-raised here as is)."""
        try:
            yield
        except BaseException as e:
            self.fail(e)
            raise

    @contextmanager
    def _collective(self) -> Iterator[None]:
        self._in_collective = True
        try:
            yield
        except BaseException:
            self._broken = True  # the group cannot carry an error flag any more: no second wait in fail()
            raise
        finally:
            self._in_collective = False

    def _comm_device(self) -> torch.device:
        backend = getattr(self.state, "backend", "") or ""
        return self.state.device if "nccl" in backend else torch.device("cpu")

    # ---- collectives (each one first joins the error flag) ----------------------------------------
    def all_gather(self, obj: Any) -> list[Any]:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank (picklable objects; CPU tensors)."""
        if not self.enabled:
            return [obj]
        import torch.distributed as tdist

        self.check()
        out: list[Any] = [None] * self.world
        with self._collective():
            tdist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.enabled:
            return obj
        import torch.distributed as tdist

        self.check()
        box = [obj if self.is_main else None]
        with self._collective():
            tdist.broadcast_object_list(box, src=0)
        return box[0]

    def on_main(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on rank 0 only (files, the run lock, the final model); its result on every
        rank. If it raises on rank 0, every rank stops with that error."""
        if not self.enabled:
            return fn(*args, **kwargs)
        with self.failures():
            value = fn(*args, **kwargs) if self.is_main else None
        return self.broadcast(value)

    def any_true(self, value: bool) -> bool:
        return any(self.all_gather(bool(value)))

    def sum_gradients(self, params: list[torch.Tensor]) -> None:
        """All-reduce-SUM the gradients of ``params`` (a missing gradient counts as zeros), in one buffer."""
        if not self.enabled or not params or self.sharded:  # FSDP: its reduce-scatter summed them already
            return
        import torch.distributed as tdist

        self.check()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads]).to(self._comm_device())
        with self._collective():
            tdist.all_reduce(flat)
        flat, offset = flat.to(params[0].device), 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(p).to(p.dtype)
            offset += n

    @torch.no_grad()
    def broadcast_parameters(self, model: Any) -> None:
        """Rank 0's weights and buffers on every rank (one starting point whatever the ranks' seeds did),
        tensor by tensor in place."""
        if not self.enabled:
            return
        import torch.distributed as tdist

        self.check()
        with self._collective():
            for tensor in model.state_dict().values():
                buf = tensor.detach().to(self._comm_device())
                tdist.broadcast(buf, src=0)
                tensor.copy_(buf)

    def gather_to_main(self, obj: Any) -> list[Any] | None:
        """``[obj of rank 0, obj of rank 1, ...]`` on rank 0; ``None`` on the other ranks."""
        if not self.enabled:
            return [obj]
        import torch.distributed as tdist

        self.check()
        out: list[Any] | None = [None] * self.world if self.is_main else None
        with self._collective():
            tdist.gather_object(obj, out, dst=0)
        return out

    # ---- what the loop asks -----------------------------------------------------------------------
    def global_totals(self, totals: dict[str, int]) -> dict[str, int]:
        """``step_totals`` of the whole global step: token and sequence counts summed over ranks."""
        if not self.enabled:
            return totals
        parts = self.all_gather(totals)
        return {k: (max(p[k] for p in parts) if k == "max_len" else sum(p[k] for p in parts)) for k in totals}

    def mean_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Round metrics over ranks: ``*_min`` / ``*_max`` by min / max, the rest by the mean over ranks
        (the global mean for means over equal shares of the batch; NaN-aware)."""
        if not self.enabled:
            return metrics
        parts = self.all_gather(dict(metrics))
        out: dict[str, float] = {}
        for key in metrics:
            values = [float(p[key]) for p in parts if key in p and isinstance(p[key], (int, float))]
            finite = [v for v in values if v == v]
            if not values or len(values) < len(parts):
                out[key] = metrics[key]
            elif not finite:
                out[key] = float("nan")
            elif key.endswith("_min"):
                out[key] = min(finite)
            elif key.endswith("_max"):
                out[key] = max(finite)
            else:
                out[key] = sum(finite) / len(finite)
        return out

    def announce(self, cfg: Any) -> None:
        """Rank 0 of a multi-process run says so, with the global batch (a launcher that started one
        process instead of N is visible at once: it prints nothing)."""
        if self.enabled and self.is_main:
            per, ga = cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
            print(f"grouprl: {self.world} processes ({getattr(self.state, 'backend', None)}); global batch "
                  f"{per * ga * self.world} completions per optimizer step = per_device_train_batch_size {per} "
                  f"x gradient_accumulation_steps {ga} x {self.world} processes", file=sys.stderr, flush=True)

    def shard_stream(self, stream: Any) -> Any:
        """This rank's view of the global prompt order (``stream`` draws the global batch)."""
        return stream if not self.enabled else RankStream(stream, self.rank, self.world)

    def seed_rank(self, seed: int) -> None:
        """Different sampling on every rank: ranks > 0 reseed with ``seed + rank`` (rank 0 keeps the
        single-process stream)."""
        if self.rank > 0:
            from transformers import set_seed

            set_seed(seed + self.rank)

    def rank_states(self, local: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Every rank's ``local`` state (RNG, unfinished round) on rank 0 for its checkpoint."""
        if not self.enabled:
            return None
        return self.gather_to_main(_to_cpu(local))

    def restore_rank_state(self, saved: dict[str, Any], seed: int) -> None:
        """After ``checkpoint.load_checkpoint``: this rank's RNG and unfinished round from a checkpoint of
        the same world size; otherwise the unfinished round is dropped (its groups live on ranks that
        no longer exist; the next round starts at the saved data position) and ranks reseed."""
        from grouprl.train.checkpoint.layout import set_rng_state, to_device

        ranks = saved.pop("ranks", None)
        if ranks is not None and len(ranks) == self.world:
            set_rng_state(ranks[self.rank]["rng"])
            rnd = ranks[self.rank]["round"]
            saved["round"] = to_device(rnd, self.device(torch.device("cpu"))) if rnd is not None else None
        elif ranks is not None or self.enabled:
            saved["round"] = None
            self.seed_rank(seed + int(saved.get("step", 0)))


def _to_cpu(obj: Any) -> Any:
    from grouprl.train.checkpoint.layout import to_device

    return to_device(copy.deepcopy(obj), "cpu")  # a copy: to_device moves dataclass fields in place


_CURRENT: Ranks | None = None


def current() -> Ranks:
    """This process's :class:`Ranks`: started by ``accelerate launch`` (``WORLD_SIZE`` > 1), else alone."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = Ranks(_partial_state()) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else Ranks()
    return _CURRENT


def _partial_state() -> Any:
    """accelerate's process state, with a timeout on every collective (``TIMEOUT_ENV``)."""
    from accelerate import PartialState

    raw = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(raw)
    except ValueError:
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds (e.g. {TIMEOUT_ENV}=600).") from None
    cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes") or not torch.cuda.is_available()
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true", "yes"):
        from grouprl.train.parallel.deepspeed import check_env as check_deepspeed

        check_deepspeed()  # ZeRO-2/3, no offloading, no DeepSpeed fp16/bf16
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true", "yes"):
        from grouprl.train.parallel.fsdp import check_env

        check_env()  # FSDP2 only, no parameter offloading
    return PartialState(cpu=cpu, timeout=timedelta(seconds=seconds))


def scatter_from_main(ranks: Ranks, fn: Callable[[], list[Any]]) -> Any:
    """``fn()`` on rank 0 -- a list of one picklable object per rank -- and its ``r``-th object on rank ``r``
    (each rank receives only its own). If ``fn`` raises on rank 0, every rank stops with that error, as
    with :meth:`Ranks.on_main`."""
    if not ranks.enabled:
        return fn()[0]
    import torch.distributed as tdist

    with ranks.failures():
        parts = fn() if ranks.is_main else None
    ranks.check()
    out: list[Any] = [None]
    with ranks._collective():
        tdist.scatter_object_list(out, parts, src=0)
    return out[0]
