"""``rollout_backend: vllm`` on 2 gloo ranks, with the fake engine of the vLLM CPU tests (``tests/vllm_engine/fake_vllm``:
a separate copy of the tiny model, so a missing weight push shows).

* colocate: every rank runs its own engine (seed + rank), generates for its own share of the prompts only,
  and takes the weights once per generation round;
* server: one ``grouprl vllm-serve`` server (run in the test process) that rank 0 alone drives, as TRL does:
  one weight push per round in all, one generate request per round holding every rank's prompts; the
  2-rank run then samples exactly what one process samples, and (one optimizer step per round) must train
  to the same weights.
"""

from __future__ import annotations

import json
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from dist_harness import run_ranks, values

VLLM_TESTS = str(Path(__file__).resolve().parents[1] / "vllm_engine")
if VLLM_TESTS not in sys.path:
    sys.path.insert(0, VLLM_TESTS)

import fake_vllm  # noqa: E402

ROWS = [{"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(16)]


def letters(completions, **kwargs):
    return [sum(ch.isalpha() for ch in c) / max(1, len(c)) for c in completions]


def sgd(model, cfg, total_steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)


def vllm_run(model_dir: str, output_dir: str, mode: str, url: str = "", install: bool = True,
             steps_per_round: int = 2) -> dict[str, Any]:
    """2 generation rounds of ``steps_per_round`` optimizer steps; 2 x steps_per_round prompts x 2 completions
    per rank per round. ``install``: put the fake vllm package and SGD in place (a spawned rank)."""
    from grouprl import GRPOConfig, GRPOTrainer
    from grouprl.train.parallel import ranks as dist

    if install:
        import grouprl.train.algorithms.grpo as loop

        sys.modules["vllm"] = fake_vllm
        loop.build_optimizer = sgd
        fake_vllm.EVENTS.clear()
        fake_vllm.INSTANCES.clear()
    world = dist.current().world
    cfg = GRPOConfig(model=model_dir, output_dir=output_dir, num_generations=2,
                     per_device_train_batch_size=4 * 2 // world, gradient_accumulation_steps=1,
                     steps_per_generation=steps_per_round, max_new_tokens=4, max_prompt_length=64,
                     max_steps=2 * steps_per_round, progress_bar=False, save_strategy="no",
                     seed=0, eval_split=None, temperature=1.0, rollout_backend="vllm", vllm_mode=mode,
                     vllm_server_url=url, vllm_server_timeout=30.0, vllm_sleep=mode == "colocate",
                     max_grad_norm=0.0)
    trainer = GRPOTrainer(config=cfg, train_dataset=[dict(r) for r in ROWS], reward_funcs=[letters])
    trainer.train()
    return {"params": {k: v.detach().clone() for k, v in trainer.model.named_parameters()},
            "events": [e for e in fake_vllm.EVENTS if e[0] in ("load_weights", "generate")],
            "seeds": [llm.kwargs.get("seed") for llm in fake_vllm.INSTANCES]}


def _steps(path: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (path / "metrics.jsonl").read_text().splitlines()) if "reward" in r]


def _same(a: dict, b: dict, tol: float = 0.0) -> bool:
    return all(float((a[k] - b[k]).abs().max()) <= tol for k in a)


def both_modes(model_dir: str, out: str, url: str) -> dict[str, Any]:
    """The colocate run, then the server run (driving the test process's server), in one launch (starting
    processes is the slow part)."""
    runs = {"colocate": vllm_run(model_dir, f"{out}/colocate", "colocate"),
            "server": vllm_run(model_dir, f"{out}/server", "server", url, steps_per_round=1)}
    return runs | {"scatter": scatter_cases()}


def _engine_down() -> list:
    raise ValueError("engine down")


def scatter_cases() -> dict[str, Any]:
    """``dist.scatter_from_main``: each rank gets its own part; a failure on rank 0 ends every rank."""
    from grouprl.train.parallel import ranks as dist

    d = dist.current()
    got = dist.scatter_from_main(d, lambda: [f"rows of rank {r}" for r in range(d.world)])
    try:
        dist.scatter_from_main(d, _engine_down)
        error = None
    except Exception as e:  # noqa: BLE001 - the test reads it
        error = f"{type(e).__name__}: {e}"
    return {"got": got, "error": error}


@contextmanager
def fake_server(vllm: Any, model_dir: str):
    """A ``grouprl vllm-serve`` server on the fake engine, in a thread of this process; yields its URL."""
    from grouprl.cmd.vllm_serve import make_server

    server = make_server(vllm.LLM(model=model_dir), vllm, "127.0.0.1", 0, model=model_dir)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def _server_events() -> list[tuple]:
    return [e for e in fake_vllm.EVENTS if e[0] in ("load_weights", "generate")]


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory):
    """One 2-rank launch: (output folder, per-rank results, the events of the server rank 0 drove)."""
    tmp = tmp_path_factory.mktemp("vllm")
    with pytest.MonkeyPatch.context() as mp:
        vllm = fake_vllm.install(mp)
        with fake_server(vllm, str(tiny_model_dir)) as url:
            ranks = values(run_ranks(both_modes, 2, str(tiny_model_dir), str(tmp), url, workdir=tmp / "w",
                                     timeout=300))
        return tmp, ranks, _server_events()


def test_colocate_one_engine_per_rank_each_generating_its_share(two_ranks):
    tmp, (r0, r1), _ = two_ranks
    r0, r1 = r0["colocate"], r1["colocate"]
    for r in (r0, r1):  # per rank: one push per generation round, then 4 prompts (its share of 8) x n=2
        assert r["events"] == [("load_weights", 26), ("generate", 4, 2)] * 2, r["events"]
    assert (r0["seeds"], r1["seeds"]) == ([0], [1])  # rank r samples with seed + r: different completions
    assert _same(r0["params"], r1["params"])  # the gradient sum keeps the weights replicated
    assert _steps(tmp / "colocate") == [1, 2, 3, 4]


def test_server_driven_by_rank_0_equals_one_process(tiny_model_dir, two_ranks, tmp_path, monkeypatch):
    from grouprl.train.algorithms import grpo as loop

    tmp, (r0, r1), events = two_ranks
    r0, r1 = r0["server"], r1["server"]
    assert _same(r0["params"], r1["params"]) and r0["seeds"] == r1["seeds"] == []  # no engine on any rank
    # rank 0 alone: one weight push per round in all, and one request with all 4 prompts (2 per rank). One
    # optimizer step per round: with more, each step takes a slice of every rank's share, not of the global round
    assert events == [("load_weights", 26), ("generate", 4, 2)] * 2
    assert _steps(tmp / "server") == [1, 2]
    vllm = fake_vllm.install(monkeypatch)
    monkeypatch.setattr(loop, "build_optimizer", sgd)
    with fake_server(vllm, str(tiny_model_dir)) as url:  # a fresh server (same seed): the same samples
        one = vllm_run(str(tiny_model_dir), str(tmp_path / "one"), "server", url, install=False, steps_per_round=1)
        assert _server_events() == events
    worst = max(float((r0["params"][k] - one["params"][k]).abs().max()) for k in one["params"])
    assert worst <= 1e-6, f"2 ranks differ from one process by {worst:.3g}"


def test_rank_0_hands_each_rank_its_own_rows_and_its_failure(two_ranks):
    _, (r0, r1), _ = two_ranks
    assert (r0["scatter"]["got"], r1["scatter"]["got"]) == ("rows of rank 0", "rows of rank 1")
    assert r0["scatter"]["error"] == "ValueError: engine down"  # rank 0 re-raises its own error
    assert r1["scatter"]["error"].startswith("PeerFailure: rank 0: ValueError: engine down")  # not a hang


def test_a_rank_above_0_has_no_server_engine(tiny_model_dir):
    """Server mode: only rank 0 connects (no server needs to answer rank 1) and pushes weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grouprl.rollout.vllm_backend import EngineError, VLLMBackend

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    backend = VLLMBackend(model, AutoTokenizer.from_pretrained(tiny_model_dir), mode="server",
                          server_url="http://127.0.0.1:9", timeout=0.1, rank=1)
    assert backend.engine is None and backend.shared_engine
    backend.sync_weights(model)
    assert backend.weight_syncs == 0
    with pytest.raises(EngineError, match="rank 1 has no vLLM engine"):
        backend.generate(["hi"], 2, None)
