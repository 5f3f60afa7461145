"""The asynchronous pipeline on 2 gloo training ranks: each rank's rollout worker samples that rank's share
of every round; the staleness bound holds on both and every prompt of the global stream is trained once."""

from __future__ import annotations

import json
from functools import partial

from dist_harness import run_ranks, values
from dist_workers import run_training


def test_two_ranks_each_with_a_worker_hold_the_bound(tiny_model_dir, tmp_path):
    out = tmp_path / "async"
    run = partial(run_training, max_staleness=1, steps_per_generation=1, save_strategy="no", async_timeout_s=120)
    res = values(run_ranks(run, 2, str(tiny_model_dir), str(out), workdir=tmp_path / "a", timeout=400))
    assert res[0]["global_step"] == 4 and res[1]["global_step"] == 4
    assert all(res[0]["params"][k].equal(res[1]["params"][k]) for k in res[0]["params"])  # one replicated model
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "reward" in r]
    # one optimizer step per round: round j sampled by version max(0, j - 1), on both ranks
    assert [r["async/staleness_max"] for r in recs] == [0, 1, 1, 1]
    assert [r["async/policy_version"] for r in recs] == [0, 0, 1, 2]
    assert all(r["async/dropped"] == 0 for r in recs)
