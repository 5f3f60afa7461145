"""Conversational environments: the environment answers the model's free-text turn as the next user message.

The rollout is driven by a scripted generate_fn on the tiny model's tokenizer, so the token ids, masks and end
reasons can be checked exactly; textarena's GuessTheNumber is the real package (in the ``test`` extra).
"""

from __future__ import annotations

import json
import re

import pytest
from fn_engine import FN, FnEngine

from grouprl import GRPOConfig, GRPOTrainer
from grouprl.envs import make_env_factory
from grouprl.envs.conversational import StepError, check_step_result
from grouprl.envs.guess_number import GuessNumberEnv
from grouprl.rollout.chat import tool_turn_ids
from grouprl.rollout.multiturn import MultiTurnParams, MultiTurnRollout

E = "<|im_end|>"


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def binary_search(tokenizer, low=1, high=8, fmt="{g}"):
    """A policy that reads the environment's higher / lower replies from its own context and bisects."""

    def generate(prompts, budgets, params):
        out = []
        for ids in prompts:
            text = tokenizer.decode(ids)
            lo, hi = low, high
            for guess, reply in re.findall(r"assistant\n\[?(\d+)\]?" + re.escape(E) + r".*?(higher|lower)", text, re.S):
                lo, hi = (int(guess) + 1, hi) if reply == "higher" else (lo, int(guess) - 1)
            out.append(tokenizer.encode(fmt.format(g=(lo + hi) // 2) + E, add_special_tokens=False))
        return out

    return generate


def test_step_results_are_checked():
    assert check_step_result("G", ["lower", 1, 0]) == ("lower", 1.0, False)
    for bad, said in [("lower", "must return"), ((1, 0, False), "observation of type int"),
                      (("x", "a lot", False), "reward 'a lot'"), (("x", float("nan"), False), "finite")]:
        with pytest.raises(StepError, match=said):
            check_step_result("G", bad)


def test_guess_number_rollout_is_token_exact_and_masked(tok):
    rows = [{"prompt": "Guess my number from 1 to 8.", "secret": 7}]
    runner = MultiTurnRollout(tok, binary_search(tok), MultiTurnParams(max_turns=6, max_new_tokens=200),
                              env_factory=make_env_factory(environment_factory=GuessNumberEnv))
    (traj,) = runner.run(rows, 1)
    # bisection on 1..8 for 7: 4 (higher), 6 (higher), 7 -> solved in 3 guesses
    assert traj.end_reason == "env_done" and traj.num_turns == 3
    assert [m["content"] for m in traj.messages if m["role"] == "user"][1:] == ["higher: 5 to 8", "higher: 7 to 8"]
    assert traj.env_reward == pytest.approx(0.8)
    assert traj.env_state == {"guesses": 3, "secret": 7, "solved": True, "lo": 7, "hi": 8}
    # the ids: each model turn (mask 1) then the template's user turn (mask 0), exactly as the template renders
    expected_ids, expected_mask, history = [], [], [{"role": "user", "content": rows[0]["prompt"]}]
    for guess, reply in [("4", "higher: 5 to 8"), ("6", "higher: 7 to 8"), ("7", None)]:
        sampled = tok.encode(guess + E, add_special_tokens=False)
        expected_ids += sampled
        expected_mask += [1] * len(sampled)
        history.append({"role": "assistant", "content": guess})
        if reply:
            glue = tool_turn_ids(tok, history, [{"role": "user", "content": reply}])
            expected_ids += glue
            expected_mask += [0] * len(glue)
            history.append({"role": "user", "content": reply})
    assert traj.completion_ids == expected_ids and traj.loss_mask == expected_mask


def test_end_reasons_max_turns_and_env_error(tok):
    class Broken(GuessNumberEnv):
        def step(self, text):
            raise RuntimeError("server gone")

    fixed = lambda tokenizer: lambda prompts, b, p: [tok.encode("1" + E, add_special_tokens=False)] * len(prompts)  # noqa: E731
    runner = MultiTurnRollout(tok, fixed(tok), MultiTurnParams(max_turns=2, max_new_tokens=200),
                              env_factory=make_env_factory(environment_factory=GuessNumberEnv))
    (traj,) = runner.run([{"prompt": "Guess.", "secret": 8}], 1)
    assert traj.end_reason == "max_turns" and traj.num_turns == 2 and traj.env_reward == 0.0
    runner.env_factory = make_env_factory(environment_factory=Broken)
    (traj,) = runner.run([{"prompt": "Guess.", "secret": 8}], 1)
    assert traj.end_reason == "env_error" and traj.num_turns == 1


def test_tools_still_work_in_a_conversational_environment(tok):
    class WithHint(GuessNumberEnv):
        def hint(self) -> str:
            """Whether the secret is even."""
            return "even" if self.secret % 2 == 0 else "odd"

    turns = iter(['<tool_call>{"name": "hint", "arguments": {}}</tool_call>', "6", "8"])
    gen = lambda prompts, b, p: [tok.encode(next(turns) + E, add_special_tokens=False) for _ in prompts]  # noqa: E731
    runner = MultiTurnRollout(tok, gen, MultiTurnParams(max_turns=4, max_new_tokens=300),
                              env_factory=make_env_factory(environment_factory=WithHint))
    (traj,) = runner.run([{"prompt": "Guess.", "secret": 8}], 1)
    assert [t["function"]["name"] for t in make_env_factory(environment_factory=WithHint)().tools] == ["hint"]
    assert traj.tool_calls[0]["result"] == "even" and traj.end_reason == "env_done" and traj.num_turns == 3
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "tool", "assistant", "user", "assistant"]


def test_textarena_guess_the_number_adapter():
    pytest.importorskip("textarena")
    from grouprl.envs.resolve import resolve_environment

    cls = resolve_environment("textarena:GuessTheNumber-v0")
    env = make_env_factory(environment_factory=cls)()
    assert env.conversational and env.tools == []
    first = env.reset({"seed": 3})
    assert "Guess The Number" in first and "between 1 and 20" in first
    lo, hi, replies = 1, 20, []
    for _ in range(10):
        guess = (lo + hi) // 2
        observation, reward, done = env.respond(f"[{guess}]")
        if done:
            break
        replies.append(observation)
        lo, hi = (guess + 1, hi) if "higher" in observation else (lo, guess - 1)
    assert done and env.reward() == 1.0  # textarena's win
    assert replies[0] == "[Player] [10]\n[GAME] The target number is lower."  # only what is new to the model
    env.close()
    env.close()  # once is enough: a second close is a no-op


def test_textarena_game_trains_for_20_steps(tmp_path, tiny_model_dir, monkeypatch):
    pytest.importorskip("textarena")
    tokenizer_box = {}

    def policy(model, tokenizer, stop_ids=None, **kw):
        tokenizer_box["tok"] = tokenizer
        return binary_search(tokenizer, 1, 20, fmt="[{g}]")

    monkeypatch.setattr(FnEngine, "policy", staticmethod(policy))
    rows = [{"seed": s} for s in range(4)]  # no prompt column: the game writes the prompt, the seed picks the number
    cfg = GRPOConfig(output_dir=str(tmp_path / "out"), rollout_backend=FN, num_generations=2, per_device_train_batch_size=4,
                     max_new_tokens=400, max_prompt_length=400, max_steps=20, max_turns=6, learning_rate=1e-3,
                     progress_bar=False, save_strategy="no", seed=0, eval_split=None, logging_steps=1,
                     environment="textarena:GuessTheNumber-v0")
    trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=rows)
    assert trainer.reward_funcs == []  # the game owns the reward
    trainer.train()
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 20
    name = "rewards/TextArena_GuessTheNumber_v0/mean"
    # bisection over 1..20 needs at most 5 guesses: with 6 model turns every game ends won (+1)
    assert all(r[name] == 1.0 and r["end_reason/env_done"] == 1.0 for r in records)  # every game won
    assert GRPOConfig.from_yaml(f"{cfg.output_dir}/config.yaml").environment == "textarena:GuessTheNumber-v0"
