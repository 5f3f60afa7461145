"""Per-trajectory scheduling: a slow tool holds back only its own trajectory, continuous engines take
requests as they become ready and may finish them in any order, and the engine's log-probs travel with
the sampled tokens (0 on tool tokens)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from rollout_helpers import FakeEnv, chatml_tokenizer, scripted_generate

from grouprl.rollout.engine import Engine, FunctionEngine, Generation
from grouprl.rollout.multiturn import MultiTurnParams, MultiTurnRollout
from grouprl.rollout.trajectory import stack_trajectories

E = "<|im_end|>"
CALL_F = f"<tool_call>f()</tool_call>{E}"
SLOW = f"<tool_call>slow()</tool_call>{E}"
ANSWER = f"it is 7{E}"


@pytest.fixture(scope="module")
def tok():
    return chatml_tokenizer()


class Timed(FunctionEngine):
    """A scripted engine recording ``(seconds since start, prompt text, turn)`` for each request."""

    def __init__(self, tok, scripts):
        super().__init__(scripted_generate(tok, scripts), [tok.convert_tokens_to_ids(E)])
        self.tok, self.start, self.log = tok, time.monotonic(), []

    def generate(self, prompt_ids, max_new_tokens, sampling):
        for ids in prompt_ids:
            text = self.tok.decode(ids)
            self.log.append((time.monotonic() - self.start, text.split("user\n")[1][:2], text.count("assistant") - 1))
        return super().generate(prompt_ids, max_new_tokens, sampling)


def second_turns(engine) -> dict[str, float]:
    return {q: t for t, q, turn in engine.log if turn == 1}


@pytest.mark.parametrize("schedule", ["per_trajectory", "lockstep"])
def test_a_tool_sleeping_5_s_delays_only_its_own_trajectory(tok, schedule):
    rows = [{"prompt": f"q{i}"} for i in range(4)]
    engine = Timed(tok, [[SLOW, ANSWER]] + [[CALL_F, ANSWER]] * 3)
    rollout = MultiTurnRollout(tok, engine, MultiTurnParams(max_new_tokens=200, tool_timeout_s=10, schedule=schedule),
                               env_factory=FakeEnv)
    start = time.monotonic()
    trajs = rollout.run(rows)
    wall = time.monotonic() - start
    assert [t.end_reason for t in trajs] == ["answered"] * 4 and [t.num_turns for t in trajs] == [2] * 4
    assert trajs[0].tool_calls[0]["result"] == "late" and wall >= 4.5  # the slow call did sleep 5 s
    turns = second_turns(engine)
    if schedule == "per_trajectory":  # generous bounds: the others went on long before the slow tool returned
        assert all(turns[f"q{i}"] < 2.5 for i in (1, 2, 3)), turns
        assert turns["q0"] >= 4.5
        assert rollout.last_stats.engine_calls == 3  # turn 1 together, the 3 fast second turns, the slow one
    else:  # lockstep: everyone's second turn waits for the slowest tool
        assert all(turns[f"q{i}"] >= 4.5 for i in range(4)), turns
        assert rollout.last_stats.engine_calls == 2
    assert 0 < rollout.last_stats.busy_fraction < 0.5 and rollout.last_stats.model_turns == 8


def test_fast_tools_give_the_lockstep_batches(tok):
    """Tools that return within ``batch_wait_s``: per-trajectory batches are lockstep's, row for row."""
    scripts = [[CALL_F, ANSWER], [f"<tool_call>boom()</tool_call>{E}", ANSWER], [ANSWER], [CALL_F, CALL_F, ANSWER]]
    runs = {}
    for schedule in ("lockstep", "per_trajectory"):
        calls: list = []
        p = MultiTurnParams(max_turns=3, max_new_tokens=200, schedule=schedule, batch_wait_s=5.0)
        trajs = MultiTurnRollout(tok, scripted_generate(tok, scripts, calls), p, env_factory=FakeEnv).run(
            [{"prompt": f"q{i}"} for i in range(4)])
        runs[schedule] = ([t.completion_ids for t in trajs], calls)
    assert runs["lockstep"] == runs["per_trajectory"]
    assert [len(prompts) for prompts, _ in runs["lockstep"][1]] == [4, 3, 1]


class Continuous(Engine):
    """A continuous engine: ``add_request`` any time, ``step`` emits one scripted token per running request
    and returns the finished ones in reverse order; log-probs ``-0.01 * (position + 1)``."""

    continuous = True

    def __init__(self, tok, scripts):
        super().__init__(None, tok)
        self.fn, self.running, self.max_running, self.order = scripted_generate(tok, scripts), {}, 0, []

    def add_request(self, request_id, prompt_ids, max_new_tokens, sampling):
        ids = self.fn([prompt_ids], [max_new_tokens], sampling)[0][:max_new_tokens]
        self.running[request_id] = [ids, 0]

    def step(self):
        self.max_running = max(self.max_running, len(self.running))
        done = []
        for rid, state in list(self.running.items()):
            state[1] += 1
            if state[1] >= len(state[0]):
                ids = state[0]
                done.append((rid, Generation(ids, [-0.01 * (k + 1) for k in range(len(ids))], "stop")))
                del self.running[rid]
        self.order.extend(rid for rid, _ in done[::-1])
        return done[::-1]


def test_a_continuous_engine_finishing_out_of_order_gives_the_lockstep_trajectories(tok):
    scripts = [[CALL_F, ANSWER], [ANSWER], [f"<tool_call>add(a=1, b=2)</tool_call>{E}", CALL_F, ANSWER], ["no"]]
    rows = [{"prompt": f"q{i}"} for i in range(4)]
    cont = Continuous(tok, scripts)
    got = MultiTurnRollout(tok, cont, MultiTurnParams(max_new_tokens=200), env_factory=FakeEnv).run(rows, 2)
    want = MultiTurnRollout(tok, scripted_generate(tok, scripts), MultiTurnParams(max_new_tokens=200, schedule="lockstep"),
                            env_factory=FakeEnv).run(rows, 2)
    assert [t.completion_ids for t in got] == [t.completion_ids for t in want]
    assert [t.end_reason for t in got] == [t.end_reason for t in want] == ["answered"] * 6 + ["max_tokens"] * 2
    assert cont.order != sorted(cont.order, key=int) and cont.max_running == 8  # out of order, all at once
    for t in got:  # the engine's log-probs on model tokens, 0.0 on tool tokens
        assert len(t.rollout_logp) == len(t.completion_ids)
        assert all((lp < 0) == bool(m) for lp, m in zip(t.rollout_logp, t.loss_mask))
    assert all(t.rollout_logp is None for t in want)  # a generate_fn reports none
    b = stack_trajectories(got, tok.pad_token_id)
    assert b.rollout_logp is not None and torch.all(b.rollout_logp[b.loss_mask == 0] == 0)
    first = got[0].rollout_logp[:got[0].loss_mask.index(0)]
    assert first == pytest.approx([-0.01 * (k + 1) for k in range(len(first))])


def test_a_job_past_its_bound_is_reported_and_the_round_ends(tok):
    """A custom ``call_tool`` that ignores its timeout: the trajectory gets ``timeout`` records after
    ``job_bound`` and the round ends; the other trajectory is not held back."""
    release = threading.Event()

    def stuck(env, name, arguments, timeout_s):
        if name == "slow":
            release.wait(30)
        return "7", None

    p = MultiTurnParams(max_new_tokens=200, tool_timeout_s=0.2, trajectory_timeout_s=0.5)
    rollout = MultiTurnRollout(tok, scripted_generate(tok, [[SLOW, ANSWER], [CALL_F, ANSWER]]), p,
                               env_factory=FakeEnv, call_tool=stuck)
    start = time.monotonic()
    trajs = rollout.run([{"prompt": "q0"}, {"prompt": "q1"}])
    release.set()
    assert time.monotonic() - start < 10
    assert trajs[0].end_reason == "timeout" and trajs[0].tool_calls[0]["error"] == "timeout"
    assert trajs[1].end_reason == "answered"
