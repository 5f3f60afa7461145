"""The LLM-judge reward against a fake OpenAI-compatible server on loopback (tests/judge/fake_judge.py)."""

from __future__ import annotations

import json
import logging
import re
import time

import pytest
from fake_judge import FakeJudge, answers_in

from grouprl.errors import ConfigError, RewardError
from grouprl.rewards import make_reward_func
from grouprl.rewards.judge import group_slices, judge_agreement, judge_reward, parse_group, render_rubric


def ok(text):
    return lambda body: (200, text, 0.0, None)


def by_number(body):
    """Pointwise: the score is the number written in the answer."""
    (answer,) = answers_in(body)
    return 200, json.dumps({"score": int(re.search(r"\d+", answer).group())}), 0.0, None


def test_pointwise_scores_are_parsed_and_divided_by_the_scale():
    with FakeJudge(by_number) as srv:
        out = judge_reward(["q"] * 3, ["it is 7", "it is 10", "it is 0"], base_url=srv.base_url, model="m")
    assert out == [0.7, 1.0, 0.0]
    body = srv.requests[0][0]
    assert body["model"] == "m" and body["temperature"] == 0.0 and "Question:\nq" in body["messages"][-1]["content"]


@pytest.mark.parametrize("reply, reason", [
    ("I think it deserves a 7", "not JSON"),
    ('{"score": 7', "not JSON"),
    ('{"score": 11}', "outside [0, 10]"),
    ('{"score": -1}', "outside [0, 10]"),
    ('{"grade": 7}', "no 'score'"),
    ('{"score": "high"}', "not a number"),
    ('{"score": true}', "not a number"),
])
def test_an_unusable_reply_is_no_opinion_with_the_reason_logged(reply, reason, caplog):
    with FakeJudge(ok(reply)) as srv, caplog.at_level(logging.WARNING, logger="grouprl.rewards.judge"):
        out = judge_reward(["q"], ["a"], base_url=srv.base_url, model="m")
    assert out == [None]
    assert reason in caplog.text


def test_json_inside_prose_or_a_fence_is_read():
    with FakeJudge(ok('Sure.\n```json\n{"score": 4}\n```')) as srv:
        assert judge_reward(["q"], ["a"], base_url=srv.base_url, model="m") == [0.4]


def test_a_500_is_retried_then_no_opinion():
    with FakeJudge(lambda body: (500, "", 0.0, None)) as srv:
        out = judge_reward(["q"], ["a"], base_url=srv.base_url, model="m", max_retries=2, backoff_s=0.01)
    assert out == [None] and len(srv.requests) == 3


def test_a_slow_reply_times_out_and_is_no_opinion(caplog):
    with FakeJudge(lambda body: (200, '{"score": 5}', 1.5, None)) as srv, \
            caplog.at_level(logging.WARNING, logger="grouprl.rewards.judge"):
        t0 = time.monotonic()
        out = judge_reward(["q"], ["a"], base_url=srv.base_url, model="m", timeout_s=0.2, max_retries=1,
                           backoff_s=0.01)
        elapsed = time.monotonic() - t0
    assert out == [None] and elapsed < 1.4
    assert "within timeout_s=0.2s" in caplog.text


def test_a_429_waits_retry_after_and_then_succeeds():
    calls = []

    def limited(body):
        calls.append(time.monotonic())
        return (429, "", 0.0, {"Retry-After": "0.3"}) if len(calls) == 1 else (200, '{"score": 9}', 0.0, None)

    with FakeJudge(limited) as srv:
        out = judge_reward(["q"], ["a"], base_url=srv.base_url, model="m", backoff_s=0.01)
    assert out == [0.9] and len(calls) == 2 and calls[1] - calls[0] >= 0.28


def test_a_judge_down_past_its_budget_stops_the_run():
    with FakeJudge(lambda body: (503, "", 0.0, None)) as srv:
        f = make_reward_func("judge", base_url=srv.base_url, model="m", budget_s=0.2, max_retries=2,
                             backoff_s=0.1)
        with pytest.raises(RewardError, match="budget_s=0.2"):
            for _ in range(20):  # bounded: each call takes >= 0.3 s of backoff
                f(["a"], prompts=["q"])


def test_an_unreachable_judge_stops_the_run_with_the_url_in_the_message():
    with FakeJudge(ok("{}")) as srv:
        url = srv.base_url
    with pytest.raises(RewardError, match=re.escape(url)):
        for _ in range(20):
            judge_reward(["q"], ["a"], base_url=url, model="m", budget_s=0.05, max_retries=3, backoff_s=0.05)


def _group_by_number(seen_orders):
    def behaviour(body):
        shown = answers_in(body)
        seen_orders.append(shown)
        return 200, json.dumps({"scores": [int(re.search(r"\d+", a).group()) for a in shown]}), 0.0, None
    return behaviour


def test_group_mode_undoes_its_shuffle():
    """Each answer carries its own score; whatever order the judge saw, each comes back to its row."""
    seen: list[list[str]] = []
    prompts = [f"q{i}" for i in range(6) for _ in range(4)]
    completions = [f"answer {(3 * i + 1) % 11}" for i in range(24)]
    with FakeJudge(_group_by_number(seen)) as srv:
        out = judge_reward(prompts, completions, base_url=srv.base_url, model="m", mode="group",
                           num_generations=4)
    assert out == [int(c.split()[1]) / 10 for c in completions]
    assert len(seen) == 6  # one request per group
    groups = [completions[i:i + 4] for i in range(0, 24, 4)]
    assert sorted(map(sorted, seen)) == sorted(map(sorted, groups))  # each group shown whole
    assert any(shown not in groups for shown in seen)  # and at least one in a shuffled order


def test_group_mode_infers_groups_from_repeated_prompts_and_labels_by_dict():
    with FakeJudge(ok('{"1": 2, "2": 8}')) as srv:
        out = judge_reward(["a", "a", "b", "b"], ["x", "y", "z", "w"], base_url=srv.base_url, model="m",
                           mode="group")
    assert sorted(out[:2]) == [0.2, 0.8] and sorted(out[2:]) == [0.2, 0.8] and len(srv.requests) == 2


def test_group_reply_with_the_wrong_count_is_no_opinion_for_the_group():
    assert parse_group('{"scores": [1, 2]}', 3, 10.0)[0] == [None, None, None]
    assert parse_group('{"scores": [1, 20, 3]}', 3, 10.0)[0] == [0.1, None, 0.3]


def test_group_slices_check_the_group_size():
    assert [list(r) for r in group_slices(None, 4, 2)] == [[0, 1], [2, 3]]
    with pytest.raises(RewardError, match="num_generations=3"):
        group_slices(None, 4, 3)


def test_the_cache_is_hit_on_the_second_call_and_after_a_restart(tmp_path):
    from grouprl.rewards import judge as judge_module

    with FakeJudge(by_number) as srv:
        kw = {"base_url": srv.base_url, "model": "m", "cache_dir": str(tmp_path)}
        first = judge_reward(["q", "q"], ["a 3", "b 4"], **kw)
        assert len(srv.requests) == 2
        assert judge_reward(["q", "q"], ["a 3", "b 4"], **kw) == first
        assert len(srv.requests) == 2
        judge_module._CLIENTS.clear()  # a resumed run: a new client, the same cache directory
        assert judge_reward(["q", "q"], ["a 3", "b 5"], **kw) == [0.3, 0.5]
        assert len(srv.requests) == 3  # only the new completion is paid for
        assert judge_reward(["q"], ["a 3"], **{**kw, "model": "other"}) == [0.3]
        assert len(srv.requests) == 4  # another judge model is another key


def test_the_api_key_is_sent_but_never_logged_cached_or_saved(tmp_path, monkeypatch, caplog):
    from grouprl.config.io import write_yaml

    secret = "sk-FAKE-judge-key-5f3a9c0e71"
    monkeypatch.setenv("GROUPRL_TEST_JUDGE_KEY", secret)
    kwargs = {"model": "m", "api_key_env": "GROUPRL_TEST_JUDGE_KEY", "cache_dir": str(tmp_path / "cache")}
    with FakeJudge(ok("not json at all")) as srv, caplog.at_level(logging.DEBUG):
        f = make_reward_func("judge", base_url=srv.base_url, **kwargs)
        assert f(["a"], prompts=["q"]) == [None]
        with FakeJudge(ok('{"score": 1}')) as srv2:
            make_reward_func("judge", base_url=srv2.base_url, **kwargs)(["b"], prompts=["q"])
        from grouprl.rewards._judge_client import JudgeClient

        client_repr = repr(JudgeClient(srv.base_url, "m", api_key_env="GROUPRL_TEST_JUDGE_KEY"))
    assert srv.requests[0][1]["Authorization"] == f"Bearer {secret}"
    write_yaml({"reward_funcs": ["judge"], "reward_kwargs": {"judge": kwargs}}, tmp_path / "config.yaml")
    texts = {"logs": caplog.text, "repr": repr(f) + client_repr,
             **{p.name: p.read_bytes().decode("latin-1") for p in tmp_path.rglob("*") if p.is_file()}}
    assert "not JSON" in caplog.text  # the log was captured
    assert (tmp_path / "config.yaml").read_text().count("GROUPRL_TEST_JUDGE_KEY") == 1
    for where, text in texts.items():
        assert secret not in text, where


def test_a_key_variable_that_is_not_set_is_a_config_error(monkeypatch):
    monkeypatch.delenv("GROUPRL_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="GROUPRL_TEST_NO_SUCH_KEY"):
        judge_reward(["q"], ["a"], base_url="http://127.0.0.1:9/v1", model="m", api_key_env="GROUPRL_TEST_NO_SUCH_KEY")


def test_options_are_checked_by_name():
    with pytest.raises(ConfigError, match="api_key"):
        make_reward_func("judge", base_url="http://127.0.0.1:9/v1", model="m", api_key="sk-x")


def test_rubrics_take_the_reference_and_custom_templates():
    assert "Reference answer: Paris" in render_rubric("open_qa", "capital?", "Paris")
    assert "Reference" not in render_rubric("retrieval", "q", None)
    assert render_rubric("Q={{ prompt }} A={{ answer }}", "x", 5) == "Q=x A=5"
    with pytest.raises(ConfigError, match="double other braces"):
        render_rubric("{nope}", "x")


def test_agreement_between_judge_and_rules():
    assert judge_agreement([0.9, 0.2, 0.6], [1.0, 0.0, 0.0]) == pytest.approx(2 / 3)
    assert judge_agreement([None], [1.0]) is None


def test_the_concurrency_limit_caps_requests_in_flight():
    import threading

    lock, state = threading.Lock(), {"now": 0, "max": 0}

    def slow(body):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.1)
        with lock:
            state["now"] -= 1
        return 200, '{"score": 1}', 0.0, None

    with FakeJudge(slow) as srv:
        out = judge_reward(["q"] * 6, [f"a{i}" for i in range(6)], base_url=srv.base_url, model="m", concurrency=2)
    assert out == [0.1] * 6 and state["max"] == 2


def test_the_rate_limit_spaces_request_starts():
    starts = []

    def record(body):
        starts.append(time.monotonic())
        return 200, '{"score": 1}', 0.0, None

    with FakeJudge(record) as srv:
        judge_reward(["q"] * 4, [f"a{i}" for i in range(4)], base_url=srv.base_url, model="m", concurrency=4,
                     rate_limit_per_s=5)
    starts.sort()
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(starts) == 4 and min(gaps) >= 0.15  # 1 / 5 s apart, less scheduling jitter
