"""The cap on a tool's result (bytes, then tokens), applied where the result is produced (envs/base.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from grouprl.config import GRPOConfig
from grouprl.envs.base import DEFAULT_OUTPUT_CAP, OutputCap, call_with_timeout, make_env_factory
from grouprl.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
from rollout_helpers import chatml_tokenizer, scripted_generate  # noqa: E402

TEN_MB = "x" * 10_000_000


def big(n: int) -> str:
    """Return n characters.

    Args:
        n: how many.
    """
    return "ab" * (n // 2)


def ten_mb() -> str:
    """Return ten megabytes."""
    return TEN_MB


class CharTokens:
    """One token per character (so the expected cut is counted by hand)."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_a_ten_megabyte_result_is_cut_in_milliseconds_and_counts_as_a_failure():
    env = make_env_factory(tools=[ten_mb])()
    t0 = time.perf_counter()
    text, kind = call_with_timeout(env, "ten_mb", {}, 5.0)
    elapsed = time.perf_counter() - t0
    assert kind == "output_too_long"
    head, note = text.split("\n[output cut: ", 1)
    assert head == "x" * 16384
    assert note == "the tool returned 10,000,000 characters, over max_tool_output_bytes=16384; ask for less]"
    assert elapsed < 2.0  # bounded, not a benchmark (before: one 313 s step)
    t0 = time.perf_counter()
    DEFAULT_OUTPUT_CAP.apply(TEN_MB)
    assert time.perf_counter() - t0 < 0.05


def test_bytes_are_cut_on_a_character_boundary():
    text, reason = OutputCap(max_bytes=5, max_tokens=None).apply("éééé")  # 8 bytes: 2 bytes each
    assert text.startswith("éé\n[output cut") and "over max_tool_output_bytes=5" in reason
    assert OutputCap(max_bytes=8, max_tokens=None).apply("éééé") == ("éééé", None)


def test_the_token_cap_uses_the_runs_tokenizer():
    cap = OutputCap(max_bytes=None, max_tokens=3, tokenizer=CharTokens())
    text, reason = cap.apply("abcdef")
    assert text == "abc\n[output cut: the tool returned 6 tokens, over max_tool_output_tokens=3; ask for less]"
    assert cap.apply("abc") == ("abc", None)
    assert OutputCap(max_bytes=None, max_tokens=3).apply("abcdef") == ("abcdef", None)  # no tokenizer yet


def test_a_result_within_the_caps_is_untouched_and_not_an_error():
    env = make_env_factory(tools=[big], output_cap=OutputCap(max_bytes=100, max_tokens=None))()
    assert call_with_timeout(env, "big", {"n": 100}, 5.0) == ("ab" * 50, None)
    text, kind = call_with_timeout(env, "big", {"n": 102}, 5.0)
    assert kind == "output_too_long" and text.startswith("ab" * 50 + "\n[output cut")


def test_the_multiturn_rollout_shows_the_cut_result_and_counts_it():
    from grouprl.rollout.multiturn import MultiTurnParams, MultiTurnRollout, multiturn_metrics

    tok = chatml_tokenizer()
    end = "<|im_end|>"
    factory = make_env_factory(tools=[ten_mb], output_cap=OutputCap(max_bytes=40, max_tokens=None))
    runner = MultiTurnRollout(tok, scripted_generate(tok, [[f"<tool_call>ten_mb()</tool_call>{end}", f"7{end}"]]),
                              MultiTurnParams(max_turns=3, max_new_tokens=400), env_factory=factory)
    (t,) = runner.run([{"prompt": "q"}], group_size=1)
    assert [c["error"] for c in t.tool_calls] == ["output_too_long"]
    assert t.messages[2]["content"].startswith("x" * 40 + "\n[output cut")
    assert multiturn_metrics([t])["tools/failure_frac"] == 1


@pytest.mark.parametrize("field, value", [("max_tool_output_bytes", 0), ("max_tool_output_tokens", -5),
                                          ("max_tool_output_bytes", 1.5), ("max_tool_output_tokens", True)])
def test_the_caps_are_checked_when_the_config_is_built(field, value):
    with pytest.raises(ConfigError, match=f"{field}={value!r} must be a whole number"):
        GRPOConfig(tools=["grouprl.envs.calculator:calculator"], **{field: value})


def test_build_agent_takes_the_caps_from_the_recipe():
    from grouprl.train.agent import build_agent

    cfg = GRPOConfig(environment="calculator", max_tool_output_bytes=64, max_tool_output_tokens=None)
    agent = build_agent(cfg)
    assert (agent.output_cap.max_bytes, agent.output_cap.max_tokens) == (64, None)
    assert agent.env_factory().output_cap is agent.output_cap
