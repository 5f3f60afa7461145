"""Rewards from several functions: weighted, one column each, None = no opinion, loud errors."""

from __future__ import annotations

import math

import pytest

from grouprl.errors import ConfigError, RewardError
from grouprl.train.score import RewardScorer, resolve_reward_funcs

COMPLETIONS = ["a", "bb", "ccc"]
PROMPTS = ["p0", "p1", "p2"]


def r_len(completions, **kw):
    return [float(len(c)) for c in completions]


def r_none_on_b(completions, **kw):
    return [None if c.startswith("b") else 1.0 for c in completions]


def test_weighted_sum_components_and_none():
    scorer = RewardScorer([r_len, r_none_on_b], weights=[0.5, 2.0])
    totals, comps = scorer.score(PROMPTS, COMPLETIONS, {})
    assert scorer.names == ["r_len", "r_none_on_b"]
    # sample 0: 0.5*1 + 2*1 = 2.5; sample 1: 0.5*2 + None -> unknown (missing_reward='exclude'); 0.5*3 + 2 = 3.5
    assert totals[0] == 2.5 and math.isnan(totals[1]) and totals[2] == 3.5
    assert comps[1][0] == 2.0 and math.isnan(comps[1][1])


def test_missing_reward_zero_counts_none_as_zero():
    scorer = RewardScorer([r_len, r_none_on_b], weights=[0.5, 2.0], missing="zero")
    totals, comps = scorer.score(PROMPTS, COMPLETIONS, {})
    assert totals == [2.5, 1.0, 3.5]  # sample 1: 0.5*2 + 2*0
    assert math.isnan(comps[1][1])  # the component column still says "no opinion"
    all_none = RewardScorer([lambda completions, **kw: [None] * len(completions)], missing="zero")
    assert all_none.score(PROMPTS, COMPLETIONS, {})[0] == [0.0, 0.0, 0.0]


def test_all_none_gives_nan_total():
    totals, _ = RewardScorer([lambda completions, **kw: [None] * len(completions)]).score(PROMPTS, COMPLETIONS, {})
    assert all(math.isnan(t) for t in totals)


def test_columns_reach_the_functions_as_lists():
    seen = {}

    def r(completions, prompts=None, answer=None, **kw):
        seen.update(prompts=prompts, answer=answer)
        return [0.0] * len(completions)

    RewardScorer([r]).score(PROMPTS, COMPLETIONS, {"answer": ["1", "2", "3"]})
    assert seen == {"prompts": PROMPTS, "answer": ["1", "2", "3"]}


def test_raising_function_is_named_with_the_failing_sample():
    def picky(completions, **kw):
        return [1.0 / (len(c) - 2) for c in completions]  # division by zero on "bb"

    with pytest.raises(RewardError) as e:
        RewardScorer([picky]).score(PROMPTS, COMPLETIONS, {})
    msg = str(e.value)
    assert "reward function 'picky' raised ZeroDivisionError" in msg and "on sample 1 (completion 'bb')" in msg


def test_wrong_length_nan_and_non_numbers_are_named():
    with pytest.raises(RewardError, match="'short' returned 2 values for 3 completions"):
        RewardScorer([_named("short", lambda c: [1.0, 1.0])]).score(PROMPTS, COMPLETIONS, {})
    with pytest.raises(RewardError, match=r"'nanny' returned nan for sample 2 \(completion 'ccc'\)\. Return None"):
        RewardScorer([_named("nanny", lambda c: [1.0, 0.0, float("nan")])]).score(PROMPTS, COMPLETIONS, {})
    with pytest.raises(RewardError, match="'texty' returned 'good' for sample 0"):
        RewardScorer([_named("texty", lambda c: ["good", 1, 2])]).score(PROMPTS, COMPLETIONS, {})
    with pytest.raises(RewardError, match="'scalar' returned float, expected a list of 3 floats"):
        RewardScorer([_named("scalar", lambda c: 1.0)]).score(PROMPTS, COMPLETIONS, {})


def test_weights_must_match_and_names_resolve_through_the_registry():
    with pytest.raises(ConfigError, match="reward_weights has 1 entries but there are 2"):
        RewardScorer([r_len, r_len], weights=[1.0])
    (exact,) = resolve_reward_funcs(["exact"])
    assert exact.__name__ == "exact"
    assert exact(["42", "41"], answer=["42", "42"]) == [1.0, 0.0]
    assert RewardScorer([r_len, r_len]).names == ["r_len", "r_len_2"]


def test_reward_errors_surface_from_the_trainer(tiny_model_dir, train_rows, fast_config):
    from grouprl import GRPOTrainer

    trainer = GRPOTrainer(model=str(tiny_model_dir), config=fast_config(), train_dataset=train_rows,
                          reward_funcs=[_named("broken", lambda c: [1.0] * (len(c) - 1))])
    with pytest.raises(RewardError, match="'broken' is a batch reward .* got 7 scores for 8"):
        trainer.train()


def _named(name, body):
    def fn(completions, **kw):
        return body(completions)

    fn.__name__ = name
    return fn


def test_trl_style_reward_gets_completion_ids_trainer_state_and_columns():
    """A reward written for TRL's GRPOTrainer receives what TRL passes it (and the per-sample adapter still
    works next to it)."""
    import contextlib
    from types import SimpleNamespace

    import torch

    from grouprl.builtins import load_builtins
    from grouprl.config import GRPOConfig
    from grouprl.data.stream import PromptStream
    from grouprl.rewards import make_reward_func
    from grouprl.rollout.base import Rollout
    from grouprl.train.algorithms.grpo import advantage_function
    from grouprl.train.algorithms.rounds import RunContext, generate_round
    from grouprl.train.metrics import Timers

    class Backend:  # completion k of a prompt: tokens 10+k, 11+k, ... (k+1 of them), then padding 0
        def generate(self, prompts, n, params):
            N = len(prompts) * n
            ids = torch.zeros(N, n, dtype=torch.long)
            for i in range(N):
                k = i % n
                ids[i, :k + 1] = torch.arange(10 + k, 11 + 2 * k)
            mask = (ids > 0).long()
            return Rollout(torch.ones(N, 2, dtype=torch.long), torch.ones(N, 2, dtype=torch.long), ids, mask,
                           torch.zeros(N, dtype=torch.bool), [str(i % n) for i in range(N)],
                           [p for p in prompts for _ in range(n)])

    seen = {}

    def trl_reward(prompts, completions, completion_ids, trainer_state, answer, **kwargs):
        seen.update(prompts=prompts, ids=completion_ids, step=trainer_state.global_step, answer=answer)
        return [float(len(ids)) for ids in completion_ids]

    def per_sample(completion, *, answer=None, **meta):
        return float(completion == "0")

    load_builtins()
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=2, seed=0)
    rows = [{"prompt": "p0", "answer": "a0"}, {"prompt": "p1", "answer": "a1"}]
    ctx = RunContext(cfg, None, SimpleNamespace(pad_token_id=0), Backend(),
                     RewardScorer([trl_reward, make_reward_func(per_sample)]), advantage_function(cfg), None,
                     contextlib.nullcontext, rows, 3, 10)
    rnd = generate_round(ctx, PromptStream(2, 2, seed=0), Timers())
    expected = [list(range(10 + k, 11 + 2 * k)) for _ in range(2) for k in range(4)]
    assert seen["ids"] == expected and all(type(t) is int for ids in seen["ids"] for t in ids)
    assert seen["step"] == 3 and sorted(set(seen["answer"])) == ["a0", "a1"] and len(seen["prompts"]) == 8
    assert rnd.metrics["rewards/trl_reward/mean"] == 2.5 and rnd.metrics["rewards/per_sample/mean"] == 0.25


def test_a_reward_can_log_its_own_metric_with_log_metric():
    """TRL's ``log_metric(name, value)`` keyword: what a reward logs lands in the scorer's last_metrics."""
    from grouprl.train.score import RewardScorer

    def judged(completions, log_metric=None, **kw):
        log_metric("judge/agreement", 0.75)
        return [1.0] * len(completions)

    scorer = RewardScorer([judged])
    scorer.score(["p", "q"], ["a", "b"], {})
    assert scorer.last_metrics == {"judge/agreement": 0.75}

    def silent(completions, **kw):
        return [0.0] * len(completions)

    scorer = RewardScorer([silent])
    scorer.score(["p"], ["a"], {})
    assert scorer.last_metrics == {}


def test_round_metrics_carry_each_weighted_component(tiny_model_dir, tmp_path):
    """The run report plots each reward component raw and weighted (its share of the total)."""
    import json

    from grouprl import GRPOConfig, GRPOTrainer

    def one(completions, **kw):
        return [1.0] * len(completions)

    def half(completions, **kw):
        return [0.5] * len(completions)

    cfg = GRPOConfig(output_dir=str(tmp_path / "o"), num_generations=2, per_device_train_batch_size=4,
                     max_new_tokens=4, max_steps=1, reward_funcs=[one, half], reward_weights=[2.0, 0.5],
                     eval_split=None,
                     progress_bar=False, report_to="none")
    rows = [{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(4)]
    from datasets import Dataset

    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=Dataset.from_list(rows)).train()
    record = [json.loads(line) for line in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()][0]
    assert record["rewards/one/weighted_mean"] == 2.0 and record["rewards/half/weighted_mean"] == 0.25
    assert record["reward"] == 2.25
