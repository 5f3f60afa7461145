"""examples/serve_agent.py: the client loop runs the calculator and sends the result back, and the whole
example runs offline on the built-in model."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import openai
import pytest
from serve_helpers import CALC, Scripted, serving

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "serve_agent.py"


def _example():
    spec = importlib.util.spec_from_file_location("serve_agent", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_agent_loop_executes_the_call_and_sends_the_result_back(tiny):
    """A scripted policy calls the calculator on its first turn; the example's loop runs it with the
    training environment's calculator and sends a tool message; the second turn is the answer."""
    model, tokenizer = tiny
    row = {"prompt": [{"role": "user", "content": "What is 4817 * 36 + 529?"}], "answer": "173941"}
    policy = Scripted(model, tokenizer, '<tool_call>calculator(expression="4817 * 36 + 529")</tool_call>')
    with serving(policy, tokenizer) as (chat, url):
        policy.prompt_len = len(chat.prompt_ids(row["prompt"], [CALC]))
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        out = _example().run_agent(client, "tiny", row, [CALC], max_turns=2, temperature=0.0)
    roles = [m["role"] for m in out["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"] and out["turns"] == 2
    call = out["messages"][1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"expression": "4817 * 36 + 529"}
    assert out["messages"][2] == {"role": "tool", "tool_call_id": call["id"], "content": "173941"}


@pytest.mark.slow
def test_the_example_runs_offline_on_the_builtin_model():
    """The real example on builtin:calculator (built once by SFT and cached): every problem calls the tool."""
    out = subprocess.run([sys.executable, str(EXAMPLE), "--model", "builtin:calculator", "--problems", "4"],
                         capture_output=True, text=True, timeout=3600,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["problems"] == 4 and summary["tool_calls_per_problem"] >= 0.5, summary
