"""max_prompt_length applies to an agent's first prompt as the agent renders it (chat template + tool schemas):
too long is refused at start-up, before the model loads, whatever ``truncation`` says."""

from __future__ import annotations

import pytest
from agent_helpers import add
from datasets import Dataset

import grouprl.models as model_loader
from grouprl import GRPOConfig, GRPOTrainer
from grouprl.errors import DataError
from grouprl.rollout.chat import prompt_ids
from grouprl.run import checks as startup
from grouprl.train.agent import build_agent, rollout_rows

ROWS = [{"prompt": "What is 1 + 2?", "answer": "3"},
        {"prompt": "What is 2 + 3? Use the tool, then give the sum.", "answer": "5"}]


def _rendered_length(tokenizer, agent, prompt, system_prompt=None):
    """The first prompt's ids exactly as the multi-turn rollout builds them (grouprl.rollout.multiturn)."""
    messages = rollout_rows([{"prompt": prompt}], "prompt", system_prompt)[0]["prompt"]
    return len(prompt_ids(tokenizer, messages, agent.tool_schemas() or None))


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the check under test")

    monkeypatch.setattr(model_loader, "load_model", refuse)


@pytest.mark.parametrize("truncation", ["left", "error"])
def test_an_agent_prompt_longer_than_max_prompt_length_stops_before_the_model_loads(tiny_model_dir, tmp_path,
                                                                                   no_model_load, truncation):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    agent = build_agent(GRPOConfig(output_dir=str(tmp_path)), tools=[add])
    n = _rendered_length(tok, agent, ROWS[1]["prompt"])
    plain = len(tok(ROWS[1]["prompt"], add_special_tokens=False)["input_ids"])
    assert n > plain + 20  # the tool block is most of the rendered prompt: a plain count would miss it
    cfg = GRPOConfig(output_dir=str(tmp_path), max_prompt_length=n - 1, truncation=truncation, max_new_tokens=8)
    with pytest.raises(DataError) as e:
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=[ROWS[0], ROWS[1]],
                    reward_funcs=["accuracy"], tools=[add])
    msg = str(e.value)
    assert f"train row 1: the agent's first prompt (chat template with the tool schemas) is {n} tokens, above " \
           f"max_prompt_length={n - 1}" in msg
    assert "never cut from the left" in msg and f"raise max_prompt_length to at least {n}" in msg
    assert "tool descriptions" in msg


def test_agent_prompts_within_max_prompt_length_pass_and_count_the_system_prompt(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    agent = build_agent(GRPOConfig(output_dir=str(tmp_path)), tools=[add])
    system = "You are a careful calculator. Use the add tool for every sum."
    n = max(_rendered_length(tok, agent, r["prompt"], system) for r in ROWS)
    assert agent.first_prompt_lengths(tok, [r["prompt"] for r in ROWS], system) == \
        [_rendered_length(tok, agent, r["prompt"], system) for r in ROWS]
    ok = GRPOConfig(output_dir=str(tmp_path), max_prompt_length=n, system_prompt=system, max_new_tokens=8)
    assert startup.check_prompt_lengths(ok, tok, None, {"train": Dataset.from_list(ROWS)}, agent=agent) == 0
    short = GRPOConfig(output_dir=str(tmp_path), max_prompt_length=n - 1, system_prompt=system, max_new_tokens=8)
    with pytest.raises(DataError, match=f"is {n} tokens, above max_prompt_length={n - 1}"):
        startup.check_prompt_lengths(short, tok, None, {"train": Dataset.from_list(ROWS)}, agent=agent)
    # without the agent (a single-turn run) the same config only cuts: the plain prompt is far shorter
    assert startup.check_prompt_lengths(short, tok, None, {"train": Dataset.from_list(ROWS)}) == 0
