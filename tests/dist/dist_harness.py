"""Run a function on N local processes joined by a gloo process group (loopback only).

``run_ranks(fn, world, *args)`` spawns ``world`` processes with the environment ``accelerate launch
--multi_gpu`` (torchrun) gives each rank (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free
MASTER_PORT) plus ACCELERATE_USE_CPU, calls
``fn(*args)`` in each (``grouprl.train.parallel.ranks.current()`` then starts accelerate's PartialState) and returns
one :class:`RankResult` per rank. Every wait is bounded: a rank still running after ``timeout`` s is killed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class RankResult:
    rank: int
    exitcode: int | None  # None: killed at the timeout
    value: Any = None
    error: str | None = None
    seconds: float = 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int, timeout_s: float) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "ACCELERATE_USE_CPU": "true",
            "GROUPRL_DIST_TIMEOUT": str(timeout_s), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}


def _child(fn: Callable, args: tuple, env: dict[str, str], out: str) -> None:
    os.environ.update(env)
    torch.set_num_threads(1)
    try:
        value = fn(*args)
        torch.save({"value": value}, out)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        torch.save({"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}, out)
        os._exit(1)
    os._exit(0)  # skip interpreter teardown (gloo threads) once the result is written


def run_ranks(fn: Callable, world: int, *args: Any, workdir: str | Path, timeout: float = 120.0,
              collective_timeout: float = 60.0) -> list[RankResult]:
    """``fn(*args)`` on ``world`` gloo ranks; results (or errors) per rank, each process bounded by ``timeout``."""
    ctx = mp.get_context("spawn")
    port, workdir = free_port(), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    start, procs = time.monotonic(), []
    for r in range(world):
        out = str(workdir / f"rank{r}.pt")
        p = ctx.Process(target=_child, args=(fn, args, rank_env(r, world, port, collective_timeout), out))
        p.start()
        procs.append((p, out))
    results = []
    for r, (p, out) in enumerate(procs):
        p.join(max(1.0, timeout - (time.monotonic() - start)))
        if p.is_alive():
            p.kill()
            p.join(10)
            results.append(RankResult(r, None, error="killed at the timeout", seconds=time.monotonic() - start))
            continue
        got = torch.load(out, weights_only=False) if os.path.exists(out) else {"error": "no result written"}
        results.append(RankResult(r, p.exitcode, got.get("value"), got.get("error"), time.monotonic() - start))
    return results


def values(results: list[RankResult]) -> list[Any]:
    """Every rank's value; a failed rank fails the test with its traceback."""
    for res in results:
        assert res.exitcode == 0, f"rank {res.rank} exit {res.exitcode}: {res.error}"
    return [res.value for res in results]
