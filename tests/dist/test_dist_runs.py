"""Whole runs on 2 gloo ranks: logging on rank 0 only, checkpoints that resume on 2 ranks bit-exactly and
on 1 rank at the saved data position, and a failure on one rank that ends both (issue 13)."""

from __future__ import annotations

import json

import torch
from dist_harness import run_ranks, values
from dist_workers import die_on_rank_1, explode_on_rank_1, letters, run_training, stall_on_rank_1


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _state(path) -> dict:
    return torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)


def test_two_rank_run_logs_once_and_resumes_on_two_and_on_one_rank(tiny_model_dir, tmp_path):
    out = tmp_path / "full"
    full = values(run_ranks(run_training, 2, str(tiny_model_dir), str(out), workdir=tmp_path / "a", timeout=300))
    assert full[0]["global_step"] == 4 and _same(full[0]["params"], full[1]["params"])  # replicated weights
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "reward" in r] == [1, 2, 3, 4]  # one writer: each step once
    assert {p.name for p in out.iterdir() if p.name.startswith("checkpoint-")} == {f"checkpoint-{i}" for i in range(1, 5)}
    mid = _state(out / "checkpoint-1")  # mid-round (2 steps per round): every rank's round and RNG saved
    assert mid["round"] is None and len(mid["ranks"]) == 2 and all(r["round"] is not None for r in mid["ranks"])
    assert mid["data"] == {"epoch": 0, "pos": 4}  # one round: 2 prompts (4 completions) on each of 2 ranks
    assert (out / "final" / "config.json").is_file()  # an ordinary save_pretrained folder

    # 2 ranks, from the middle of a round: bit-exact
    again = values(run_ranks(run_training, 2, str(tiny_model_dir), str(tmp_path / "again"), letters,
                             str(out / "checkpoint-1"), workdir=tmp_path / "b", timeout=300))
    assert again[0]["global_step"] == 4
    assert _same(again[0]["params"], full[0]["params"]) and _same(again[1]["params"], full[0]["params"])

    # 1 rank, from a round boundary: the global data position carries on (half the global batch now)
    one = run_training(str(tiny_model_dir), str(tmp_path / "one"), resume=str(out / "checkpoint-2"))
    assert one["global_step"] == 4
    assert _state(tmp_path / "one" / "checkpoint-4")["data"] == {"epoch": 0, "pos": 4 + 2}
    start = _state(out / "checkpoint-2")
    assert "ranks" in start and start["data"] == {"epoch": 0, "pos": 4}


def test_a_reward_raising_on_one_rank_ends_both_in_seconds(tiny_model_dir, tmp_path):
    res = run_ranks(run_training, 2, str(tiny_model_dir), str(tmp_path / "out"), explode_on_rank_1,
                    workdir=tmp_path / "w", timeout=200, collective_timeout=120)
    r0, r1 = values(res)
    assert "reward exploded on purpose" in r1["error"]
    assert r0["error"].startswith("PeerFailure") and "rank 1" in r0["error"] and "reward exploded" in r0["error"]
    assert abs(r0["end"] - r1["end"]) < 15  # the error flag, not the 120 s collective timeout


def test_a_rank_that_dies_silently_ends_the_other_within_the_collective_timeout(tmp_path):
    r0, r1 = run_ranks(die_on_rank_1, 2, str(tmp_path), workdir=tmp_path, timeout=120, collective_timeout=20)
    assert r1.exitcode == 3
    assert r0.exitcode == 0 and r0.value["error"] is not None, r0
    assert r0.value["waited"] < 25  # the connection closes or the 20 s timeout fires: never a hang
    assert r0.value["fail_s"] < 2  # no second wait to tell a rank that is gone


def test_a_stalled_rank_ends_the_other_at_the_collective_timeout(tmp_path):
    """GROUPRL_DIST_TIMEOUT reaches the process group (accelerate's PartialState(timeout=...))."""
    r0, _ = run_ranks(stall_on_rank_1, 2, str(tmp_path), workdir=tmp_path, timeout=120, collective_timeout=3)
    assert r0.exitcode == 0 and r0.value["error"] is not None, r0
    assert 2 <= r0.value["waited"] < 11, r0.value  # the 3 s timeout, not the 12 s stall
