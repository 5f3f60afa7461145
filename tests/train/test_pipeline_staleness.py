"""The asynchronous pipeline's accounting, by hand: which weights sample which round, the bound, drops,
seeds, prompt ordinals, and the config checks (no processes)."""

from __future__ import annotations

import pytest

from grouprl import GRPOConfig
from grouprl.data.stream import PromptStream
from grouprl.errors import ConfigError
from grouprl.train.parallel.shares import RankStream
from grouprl.train.pipeline.staleness import StalenessLog, first_step, pushes_at, round_seed, target_version


def test_target_versions_by_hand():
    # k=1, one step per round, a push after every step: one-step-off (round j sampled by version j-1)
    assert [target_version(j, 1, 1, 1, 0) for j in range(5)] == [0, 0, 1, 2, 3]
    # k=0 through the worker: every round sampled by the weights that train it
    assert [target_version(j, 1, 0, 1, 0) for j in range(4)] == [0, 1, 2, 3]
    # k=2, pushes every 3 steps (v0=0, 3, 6): round j needs >= j-2 -> the oldest push at or above it
    assert [target_version(j, 1, 2, 3, 0) for j in range(8)] == [0, 0, 0, 3, 3, 3, 6, 6]
    # 2 steps per round, k=1: round j first trained at 2j, needs >= 2j-1
    assert [target_version(j, 2, 1, 1, 0) for j in range(4)] == [0, 1, 3, 5]
    # resumed at step 4 (v0 = 4): nothing older than the start weights exists
    assert [target_version(j, 1, 2, 1, 4) for j in range(4, 8)] == [4, 4, 4, 5]


@pytest.mark.parametrize("R,k,W", [(1, 1, 1), (1, 2, 3), (2, 1, 2), (3, 4, 5), (2, 3, 1), (1, 0, 1)])
def test_the_bound_holds_and_the_needed_push_comes_before_the_trainer_needs_the_round(R, k, W):
    for v0 in (0, 3, 7):
        for j in range(-(-v0 // R), 40):
            v = target_version(j, R, k, W, v0)
            assert 0 <= first_step(j, R) - v <= k or v == v0  # staleness within the bound (or the start weights)
            assert v <= max(first_step(j, R), v0)  # pushed before the trainer needs round j: no deadlock
            assert v == v0 or pushes_at(v, W)  # a version that is actually pushed


def test_staleness_log_admits_drops_and_counts():
    log = StalenessLog(max_staleness=2)
    assert log.admit(version=5, trainer_version=5) and log.admit(3, 5)
    assert not log.admit(2, 5)  # 3 steps old > 2: dropped
    assert log.admit(4, 6)
    assert (log.trained, log.dropped, log.staleness_sum, log.staleness_max) == (3, 1, 0 + 2 + 2, 2)
    m = log.metrics(2)
    assert m["async/staleness_mean"] == m["async/staleness_max"] == 2.0
    assert m["async/staleness_run_mean"] == pytest.approx(4 / 3) and m["async/dropped"] == 1.0
    with pytest.raises(ValueError, match="has not pushed"):
        log.admit(7, 6)


def test_round_seeds_are_fixed_and_distinct():
    assert round_seed(0, 3) == round_seed(0, 3) == 3 * 7_919
    seeds = {round_seed(s, j, r) for s in range(3) for j in range(50) for r in range(2)}
    assert len(seeds) == 300


def test_ordinals_count_every_prompt_drawn():
    s = PromptStream(num_rows=7, batch=3, seed=0)  # 2 draws per epoch, the 7th row skipped
    got = []
    for _ in range(5):
        s.next()
        got.append(s.last_ordinals)
    assert got == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13, 14]]
    g = PromptStream(num_rows=8, batch=4, seed=0)
    r1 = RankStream(g, rank=1, world=2)
    r1.next()
    assert r1.last_ordinals == [2, 3]
    r1.next()
    assert RankStream(g, rank=0, world=2).last_ordinals == [4, 5] and r1.last_ordinals == [6, 7]


def test_async_config_is_checked_before_anything_loads():
    with pytest.raises(ConfigError, match="max_staleness=-1 must be >= 0"):
        GRPOConfig(max_staleness=-1)
    with pytest.raises(ConfigError, match=r"weight_sync_steps=3 with max_staleness=1.*Fix: weight_sync_steps <= 2"):
        GRPOConfig(max_staleness=1, weight_sync_steps=3)
    with pytest.raises(ConfigError, match="weight_sync_steps=0 must be a positive integer"):
        GRPOConfig(weight_sync_steps=0)
    with pytest.raises(ConfigError, match="async_timeout_s=0 must be > 0"):
        GRPOConfig(async_timeout_s=0)
    with pytest.raises(ConfigError, match="only the GRPO-family loop runs a rollout worker"):
        GRPOConfig(algorithm="ppo", max_staleness=1)
    with pytest.raises(ConfigError, match="rollout_backend='vllm' and vllm_mode='colocate'.*Fix: vllm_mode: server"):
        GRPOConfig(max_staleness=1, rollout_backend="vllm")
    # the worker reports behaviour log-probs: the corrections apply with the transformers backend
    assert GRPOConfig(max_staleness=2, weight_sync_steps=3, rollout_correction="mask").max_staleness == 2
    assert GRPOConfig(max_staleness=1, rollout_backend="vllm", vllm_mode="server").max_staleness == 1
    with pytest.raises(ConfigError, match="no mismatch"):
        GRPOConfig(rollout_correction="tis")  # synchronous: nothing to correct, as before
