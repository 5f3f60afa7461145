"""Weight pushes from the trainer to its rollout worker over a two-member torch.distributed gloo group.

The trainer hosts a ``TCPStore`` on a free local port; trainer (rank 0) and worker (rank 1) build a
``ProcessGroupGloo`` on it (gloo on CPU, as TRL's and verl's CPU paths do; the group is separate from the
training ranks' own group, so the worker is never part of a gradient collective). A push is one
``broadcast`` of the trainable parameters flattened into a single fp32 buffer, started asynchronously:
the trainer copies its weights into the buffer and goes on training while the worker takes the buffer
when it is between rounds. Every wait is bounded: the worker's start by ``max(async_timeout_s, 120 s)``,
each broadcast by ``async_timeout_s`` (a broadcast the other side never joins ends with an error), and the trainer waits for the previous push with that deadline
before it starts the next (prime-rl PR #3050: an unbounded broadcast hung its launcher forever).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import torch

HOST = "127.0.0.1"
START_S = 120.0
"""The least time the worker gets to start (a spawned Python importing torch and transformers, unpickling the
model) and join the group: on a loaded 2-core machine that alone can take tens of seconds."""


def start_timeout(timeout_s: float) -> float:
    """The bound on the worker's start: ``async_timeout_s``, but never under :data:`START_S`."""
    return max(float(timeout_s), START_S)


def trainable(model: Any) -> list[torch.Tensor]:
    """The parameters a push carries (frozen ones, a LoRA base say, never change): same order on both sides."""
    return [p for p in model.parameters() if p.requires_grad]


def flatten(params: list[torch.Tensor]) -> torch.Tensor:
    """One fp32 CPU buffer holding every parameter (a copy: training may go on while it travels)."""
    return torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in params])


def load_flat(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``flat`` (from :func:`flatten`) into ``params`` in place."""
    total = sum(p.numel() for p in params)
    if flat.numel() != total:
        raise ValueError(f"weight push of {flat.numel()} values for {total} parameter values")
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[offset:offset + n].view_as(p).to(p.dtype))
            offset += n


def host_store(timeout_s: float) -> Any:
    """The trainer's store on a free port (``.port``); the worker connects with :func:`client_store`."""
    from torch.distributed import TCPStore

    return TCPStore(HOST, 0, 2, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def client_store(port: int, timeout_s: float) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(HOST, port, 2, False, timeout=timedelta(seconds=timeout_s))


def group(store: Any, rank: int, timeout_s: float) -> Any:
    """The two-member gloo group (blocks until both members joined, at most ``timeout_s``)."""
    from torch.distributed import ProcessGroupGloo

    return ProcessGroupGloo(store, rank, 2, timedelta(seconds=timeout_s))


class Sender:
    """The trainer's end: connects in a background thread (so the trainer can watch the worker process
    while it starts), then pushes asynchronously, at most one push in flight."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.store = host_store(start_timeout(timeout_s))
        self.port = self.store.port
        self.pg: Any = None
        self.error: BaseException | None = None
        self._work: Any = None
        self._buffer: torch.Tensor | None = None
        self._thread = threading.Thread(target=self._connect, name="grouprl-weights-connect", daemon=True)
        self._thread.start()

    def _connect(self) -> None:
        try:
            self.pg = group(self.store, 0, start_timeout(self.timeout_s))
        except BaseException as e:  # reported by wait_connected
            self.error = e

    def wait_connected(self, alive: Any, deadline: float) -> None:
        """Until the worker joined the group; ``alive()`` raises when the worker died (checked each second)."""
        while self._thread.is_alive():
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError("the rollout worker did not join the weight-push group")
            self._thread.join(timeout=1.0)
        if self.error is not None or self.pg is None:
            raise RuntimeError(f"the weight-push group could not form: {self.error}")

    def finish_push(self) -> float:
        """Wait (bounded by the group's timeout) for the push in flight; returns the seconds waited."""
        if self._work is None:
            return 0.0
        t0 = time.perf_counter()
        work, self._work = self._work, None
        work.wait(timedelta(seconds=self.timeout_s))
        self._buffer = None
        return time.perf_counter() - t0

    def push(self, params: list[torch.Tensor]) -> float:
        """Start broadcasting ``params`` (the previous push waited for first); returns the seconds waited."""
        waited = self.finish_push()
        self._buffer = flatten(params)
        self._work = self.pg.broadcast(self._buffer, 0, timedelta(seconds=self.timeout_s))
        return waited


class Receiver:
    """The worker's end: joins the group, takes each push into a fresh buffer."""

    def __init__(self, port: int, numel: int, timeout_s: float) -> None:
        self.timeout_s, self.numel = timeout_s, numel
        self.pg = group(client_store(port, start_timeout(timeout_s)), 1, start_timeout(timeout_s))

    def receive(self) -> torch.Tensor:
        buf = torch.empty(self.numel, dtype=torch.float32)
        self.pg.broadcast(buf, 0, timedelta(seconds=self.timeout_s)).wait(timedelta(seconds=self.timeout_s))
        return buf
