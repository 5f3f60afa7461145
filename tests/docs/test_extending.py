"""docs/EXTENDING.md: every worked plug-in in examples/extending/ passes its registry's contract, plugs in
both ways (decorator name and "pkg.mod:fn"), runs in a 2-step training run, and the doc shows each
file exactly as it is."""

from __future__ import annotations

import math
import pathlib
import re
import sys

import pytest
import torch

from grouprl.builtins import load_builtins
from grouprl.errors import ConfigError
from grouprl.registry import ADVANTAGES, ALL_REGISTRIES, ENVIRONMENTS, POLICY_LOSSES, REWARDS

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DOC = ROOT / "docs" / "EXTENDING.md"
ROWS = [{"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(8)]
D = torch.float64

load_builtins()
sys.path.insert(0, str(ROOT / "tests" / "algo"))
import test_algo_contracts as contracts  # noqa: E402  -- the registry contract checks, reused as they are


@pytest.fixture(autouse=True)
def plugins(monkeypatch):
    """examples/ on the path; the registries and sys.modules as they were afterwards (the examples
    register names at import, and other tests list every registered name)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    saved = {kind: dict(reg._fns) for kind, reg in ALL_REGISTRIES.items()}
    yield
    for kind, reg in ALL_REGISTRIES.items():
        reg._fns.clear()
        reg._fns.update(saved[kind])
    for name in [m for m in sys.modules if m == "extending" or m.startswith("extending.")]:
        del sys.modules[name]


def counting(module, attr, monkeypatch):
    """Replace ``module.attr`` by a wrapper that counts its calls (same signature, same name), so a
    "pkg.mod:attr" string given to the trainer resolves to the wrapper."""
    import functools

    fn, calls = getattr(module, attr), []

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        calls.append(kwargs)
        return fn(*args, **kwargs)

    monkeypatch.setattr(module, attr, wrapper)
    return calls


def close(tensor, expected):
    return torch.allclose(tensor.detach().to(D), torch.tensor(expected, dtype=D), atol=1e-12)


def config(tmp_path, **overrides):
    from grouprl import GRPOConfig

    base = dict(output_dir=str(tmp_path / "out"), num_generations=4, per_device_train_batch_size=4,
                gradient_accumulation_steps=2, max_new_tokens=8, max_prompt_length=64, max_steps=2,
                learning_rate=1e-3, progress_bar=False, save_strategy="no", seed=0, eval_split=None)
    base.update(overrides)
    return GRPOConfig(**base)


def train(tiny_model_dir, cfg, **kwargs):
    """Run ``cfg`` on the tiny model; return the per-step records (each with a finite policy loss)."""
    import json

    from grouprl import GRPOTrainer

    result = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=[dict(r) for r in ROWS],
                         **kwargs).train()
    assert result["global_step"] == 2
    with open(f"{cfg.output_dir}/metrics.jsonl") as f:
        records = [r for r in map(json.loads, f) if "reward" in r]
    assert [r["step"] for r in records] == [1, 2]
    assert all(math.isfinite(r["loss/policy"]) and math.isfinite(r["grad_norm"]) for r in records)
    return records


# ---- the loss -----------------------------------------------------------------------------------------
def test_loss_registers_by_name_and_by_path_and_passes_the_contract():
    from extending import my_loss

    assert POLICY_LOSSES.get("cpi") is my_loss.cpi_loss
    assert POLICY_LOSSES.get("extending.my_loss:cpi_loss") is my_loss.cpi_loss
    fn = my_loss.cpi_loss
    contracts.check_finite_output_and_metrics(fn)
    contracts.check_masked_tokens_get_zero_gradient_even_with_garbage(fn)
    contracts.check_zero_advantage_gives_zero_gradient(fn)
    for log_ratio in (100.0, 1000.0):
        for dtype in (torch.float32, torch.float64):
            contracts.check_extreme_log_ratios_stay_finite(fn, log_ratio, dtype)


def test_loss_hand_numbers_against_the_clipped_grpo_loss():
    from extending.my_loss import cpi_loss

    # ratios 1.5 and 0.5 (A = 1), 1.5 and 0.5 (A = -2); third token is padding
    old_logp = torch.log(torch.tensor([[0.2, 0.4, 0.3], [0.2, 0.4, 0.3]], dtype=D))
    logp = (old_logp + torch.log(torch.tensor([1.5, 0.5, 1.0], dtype=D))).requires_grad_(True)
    adv, mask = torch.tensor([1.0, -2.0], dtype=D), torch.tensor([[1, 1, 0], [1, 1, 0]])
    per_token, metrics = cpi_loss(logp, old_logp, adv, mask)
    assert close(per_token, [[-1.5, -0.5, 0.0], [3.0, 1.0, 0.0]])
    (grad,) = torch.autograd.grad(per_token.sum(), logp)  # d(-rho A)/d logp = -rho A
    assert close(grad, [[-1.5, -0.5, 0.0], [3.0, 1.0, 0.0]])
    assert metrics["ratio_mean"].item() == pytest.approx(1.0)
    grpo, _ = POLICY_LOSSES.get("grpo")(logp, old_logp, adv, mask)  # clip 0.2: 1.5 -> 1.2, 0.5 -> 0.8
    assert close(grpo, [[-1.2, -0.5, 0.0], [3.0, 1.6, 0.0]])


def test_loss_gets_only_what_it_declares(tmp_path):
    import extending.my_loss  # noqa: F401 -- registers "cpi"

    assert config(tmp_path, policy_loss="cpi").resolved()["loss_hparams"] == {"max_log_ratio": 20.0}
    cfg = config(tmp_path, policy_loss="extending.my_loss:cpi_loss", loss_kwargs={"max_log_ratio": 5.0})
    assert cfg.resolved()["loss_hparams"] == {"max_log_ratio": 5.0}
    with pytest.raises(ConfigError, match="takes no 'eps_low'"):
        config(tmp_path, policy_loss="cpi", epsilon=0.1).resolved()
    with pytest.raises(ConfigError, match="max_log_ratio"):
        config(tmp_path, policy_loss="cpi", loss_kwargs={"max_ratio": 5.0}).resolved()


# ---- the advantage estimator --------------------------------------------------------------------------
def test_advantage_hand_numbers():
    from extending.my_advantage import rank_advantages

    nan = float("nan")
    rewards = torch.tensor([[1, 3, 2, 6], [0, 1, 1, 1], [nan, 5, 1, nan], [4, 4, 4, 4]], dtype=D)
    assert close(rank_advantages(rewards), [
        [-1, 1 / 3, -1 / 3, 1],  # ranks 1, 3, 2, 4 -> (2r - 5) / 3
        [-1, 1 / 3, 1 / 3, 1 / 3],  # ties share rank (2 + 3 + 4) / 3 = 3
        [0, 1, -1, 0],  # NaN left out: n = 2, ranks 2, 1 -> (2r - 3) / 1
        [0, 0, 0, 0],  # all equal: nothing to learn
    ])
    # only the order counts: an outlier does not change the advantages
    assert close(rank_advantages(torch.tensor([[1.0, 3.0, 2.0, 600.0]], dtype=D)), [[-1, 1 / 3, -1 / 3, 1]])


@pytest.mark.parametrize("name", ["rank", "extending.my_advantage:rank_advantages"])
def test_advantage_registers_and_passes_the_contract(name):
    from extending.my_advantage import rank_advantages

    assert ADVANTAGES.get(name) is rank_advantages
    contracts.test_advantage_contract(name)
    contracts.test_advantage_nan_rewards_mixed_and_all_nan_groups(name)


# ---- the rewards --------------------------------------------------------------------------------------
def test_rewards_in_both_forms_plug_in_by_name_and_path():
    from extending import my_reward

    from grouprl.rewards import make_reward_func
    from grouprl.rewards.adapters import reward_form

    assert reward_form(my_reward.mentions_answer) == "sample" and reward_form(my_reward.length_penalty) == "batch"
    assert REWARDS.get("mentions_answer") is my_reward.mentions_answer
    for spec in ("mentions_answer", "extending.my_reward:mentions_answer"):
        fn = make_reward_func(spec)
        assert fn(["so it is 12.", "112", "12.5", "x"], answer=["12", "12", "12", None]) == [1.0, 0.0, 0.0, None]
    fn = make_reward_func("extending.my_reward:length_penalty", target_chars=20)
    chat = [{"role": "assistant", "content": "y" * 30}]
    assert fn(["x" * 20, "x" * 10, chat], answer=["1", "2", "3"]) == [1.0, 0.5, 0.5]


def test_reward_docstring_examples_hold():
    import doctest

    from extending import my_reward

    result = doctest.testmod(my_reward, verbose=False)
    assert result.attempted == 2 and result.failed == 0


# ---- the backend --------------------------------------------------------------------------------------
def test_backend_plugs_in_by_path(tiny_model_dir):
    from extending.my_backend import RecordingBackend

    from grouprl.models import load_model, load_tokenizer
    from grouprl.rollout import SamplingParams, make_backend

    RecordingBackend.history.clear()
    model, tok = load_model(str(tiny_model_dir), "cpu"), load_tokenizer(str(tiny_model_dir))
    backend = make_backend("extending.my_backend:RecordingBackend", model, tok)
    out = backend.generate(["hi", "What is 1 + 2?"], 3, SamplingParams(max_new_tokens=4, temperature=0.0))
    assert len(out) == 6 and out.completion_ids.shape[1] <= 4
    assert [{k: h[k] for k in ("call", "prompts", "n", "temperature")} for h in RecordingBackend.history] == [
        {"call": "generate", "prompts": 2, "n": 3, "temperature": 0.0}]


# ---- a 2-step training run with every plug-in given as "pkg.mod:fn" -------------------------------------
def test_two_step_training_with_all_plugins_as_strings(tiny_model_dir, tmp_path, monkeypatch):
    from extending import my_advantage, my_backend, my_loss, my_reward

    loss_calls = counting(my_loss, "cpi_loss", monkeypatch)
    adv_calls = counting(my_advantage, "rank_advantages", monkeypatch)
    sample_calls = counting(my_reward, "mentions_answer", monkeypatch)
    batch_calls = counting(my_reward, "length_penalty", monkeypatch)
    my_backend.RecordingBackend.history.clear()
    cfg = config(tmp_path, policy_loss="extending.my_loss:cpi_loss", loss_kwargs={"max_log_ratio": 10.0},
                 advantage="extending.my_advantage:rank_advantages",
                 reward_funcs=["extending.my_reward:mentions_answer", "extending.my_reward:length_penalty"],
                 reward_kwargs={"extending.my_reward:length_penalty": {"target_chars": 20}},
                 rollout_backend="extending.my_backend:RecordingBackend")
    records = train(tiny_model_dir, cfg)
    assert len(loss_calls) >= 2 and all(kw == {"max_log_ratio": 10.0} for kw in loss_calls)
    assert len(adv_calls) >= 2
    assert len(sample_calls) == 16  # per-sample: 2 steps x 8 completions
    assert len(batch_calls) == 2 and all(kw["target_chars"] == 20 for kw in batch_calls)
    assert [h["call"] for h in my_backend.RecordingBackend.history] == ["sync_weights", "generate"] * 2
    for rec in records:
        assert math.isfinite(rec["rewards/extending.my_reward:length_penalty/mean"])
        assert rec["advantage/max"] <= 1.0 and rec["advantage/min"] >= -1.0  # centred ranks lie in [-1, 1]


def test_two_step_training_with_plugins_by_registered_name(tiny_model_dir, tmp_path, monkeypatch):
    import extending.my_advantage  # noqa: F401 -- registers "rank"
    import extending.my_loss  # noqa: F401 -- registers "cpi"
    from extending import my_reward

    calls = counting(my_reward, "length_penalty", monkeypatch)
    cfg = config(tmp_path, policy_loss="cpi", advantage="rank")  # names registered by the imports above
    train(tiny_model_dir, cfg, reward_funcs=["mentions_answer", my_reward.length_penalty])
    assert len(calls) == 2


# ---- the tool and the environment ---------------------------------------------------------------------
def test_tool_and_environment_resolve_and_run():
    from grouprl.envs import BadArgumentsError, make_env_factory, resolve_environment, resolve_tools

    tools = resolve_tools(["extending.my_tool:convert_length"])
    env = make_env_factory(tools=tools)()
    assert env.tools[0]["function"]["parameters"]["required"] == ["value", "from_unit", "to_unit"]
    assert env.call("convert_length", {"value": 1.5, "from_unit": "km", "to_unit": "m"}) == "1500.0"
    with pytest.raises(BadArgumentsError, match="missing argument 'to_unit'"):
        env.call("convert_length", {"value": 1.5, "from_unit": "km"})
    assert "lengths" in ENVIRONMENTS  # registered at import by the decorator
    for spec in ("lengths", "extending.my_tool:LengthEnv"):
        env = make_env_factory(environment_factory=resolve_environment(spec))()
        assert sorted(env.tool_names) == ["convert", "submit"]
        env.reset({"prompt": "1.5 km in m?", "answer": "1500"})
        assert env.reward() == 0.0
        assert env.call("convert", {"value": 1.5, "from_unit": "km", "to_unit": "m"}) == "1500.0"
        env.call("submit", {"value": 1500})
        assert env.reward() == 1.0


def test_environment_in_a_multi_turn_rollout_and_one_training_step(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grouprl.envs import make_env_factory, resolve_environment
    from grouprl.rollout.base import SamplingParams
    from grouprl.rollout.multiturn import MultiTurnParams, MultiTurnRollout, hf_generate_fn
    from grouprl.rollout.trajectory import stack_trajectories
    from grouprl.train.engine.step import completion_logps

    torch.manual_seed(0)
    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    hf, turns = hf_generate_fn(model, tok), []
    script = ['<tool_call>{"name": "convert", "arguments": {"value": 1.5, "from_unit": "km", "to_unit": "m"}}'
              '</tool_call><|im_end|>', '<tool_call>{"name": "submit", "arguments": {"value": 1500}}</tool_call>'
              '<|im_end|>']

    def generate(prompts, budgets, params):  # turns 1-2 scripted (the random model cannot call tools), then the model
        turns.append(len(prompts))
        k = len(turns) - 1
        return [tok.encode(script[k])] * len(prompts) if k < len(script) else hf(prompts, budgets, params)

    env_factory = make_env_factory(environment_factory=resolve_environment("extending.my_tool:LengthEnv"))
    rollout = MultiTurnRollout(tok, generate, MultiTurnParams(max_turns=3, max_new_tokens=200), env_factory=env_factory)
    trajs = rollout.run([{"prompt": "How many metres is 1.5 km?", "answer": "1500"}], group_size=2,
                        params=SamplingParams(max_new_tokens=200, temperature=1.0))
    for t in trajs:
        assert [c["name"] for c in t.tool_calls] == ["convert", "submit"]
        assert t.tool_calls[0]["result"] == "1500.0" and t.env_reward == 1.0
        assert 0 in t.loss_mask and t.num_turns == 3  # tool output is in the completion, masked out
    batch = stack_trajectories(trajs, pad_id=tok.pad_token_id)
    logp, _ = completion_logps(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    adv = torch.tensor([1.0, -1.0])
    per_token, _ = POLICY_LOSSES.get("extending.my_loss:cpi_loss")(logp, logp.detach(), adv, batch.loss_mask)
    loss = per_token.sum() / batch.loss_mask.sum()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


# ---- the doc shows the files exactly ------------------------------------------------------------------
BLOCK = re.compile(r"```python\n# (examples/extending/[\w/]+\.py)\n(.*?)```", re.S)


def test_doc_code_blocks_are_the_example_files():
    text = DOC.read_text(encoding="utf-8")
    blocks = BLOCK.findall(text)
    shown = {path for path, _ in blocks}
    files = {str(p.relative_to(ROOT)) for p in (EXAMPLES / "extending").glob("my_*.py")}
    assert shown == files, f"EXTENDING.md shows {sorted(shown)}, the folder has {sorted(files)}"
    for path, body in blocks:
        assert body == (ROOT / path).read_text(encoding="utf-8"), f"{path} differs from its block in EXTENDING.md"


RESOLVED = re.compile(r">>> (GRPOConfig\(.*?\)(?:\.resolved\(\))?)[^\n]*\n(\{.*?\}|ConfigError: .*?)(?=\n>>>|\n```)", re.S)


def test_algorithms_doc_shows_the_real_resolved_output():
    import ast

    from grouprl import GRPOConfig

    section = (ROOT / "docs" / "ALGORITHMS.md").read_text(encoding="utf-8").split("## How the config picks")[1]
    examples = RESOLVED.findall(section)
    assert len(examples) == 4
    for expr, shown in examples:  # the doc's own expressions, e.g. GRPOConfig(policy_loss="cispo").resolved()
        if shown.startswith("ConfigError: "):
            with pytest.raises(ConfigError) as err:
                eval(expr, {"GRPOConfig": GRPOConfig})
            assert " ".join(str(err.value).split()) == " ".join(shown.removeprefix("ConfigError: ").split())
        else:
            assert eval(expr, {"GRPOConfig": GRPOConfig}) == ast.literal_eval(shown), expr


def test_choosing_doc_preset_table_is_the_presets():
    from grouprl.config.presets import ALGORITHM_PRESETS

    text = (ROOT / "docs" / "CHOOSING.md").read_text(encoding="utf-8")
    rows = [line.strip("| ").split(" | ") for line in text.splitlines() if line.startswith("| `")]
    assert {r[0].strip("`") for r in rows} == set(ALGORITHM_PRESETS)
    for name, loss, eps, adv, scale, agg, dyn, mask in rows:
        p = ALGORITHM_PRESETS[name.strip("`")]
        eps_low, eps_high = (float(x) for x in eps.split(" / "))
        assert (loss.strip("`"), eps_low, eps_high, adv.strip("`"), agg.strip("`"), dyn) == (
            p["policy_loss"], p["epsilon"], p["epsilon_high"], p["advantage"], p["loss_aggregation"],
            p["dynamic_sampling"]), name
        assert scale == p.get("scale_rewards", "group") and mask == str(p["mask_truncated_completions"]).lower()
        assert p["kl_coef"] == 0.0


# --- an algorithm plug-in: REINFORCE with a moving-average baseline (examples/extending/my_algorithm.py) ----


@pytest.fixture
def reinforce():
    """The plug-in imported (it registers the loop and declares what it supports), removed afterwards."""
    import extending.my_algorithm as module

    from grouprl.config.algorithms import SUPPORTS
    from grouprl.registry import ALGORITHMS

    yield module
    ALGORITHMS._fns.pop("reinforce", None)
    SUPPORTS.pop("reinforce", None)


def test_reinforce_plugin_trains_through_the_trainer(reinforce, tiny_model_dir, tmp_path):
    from grouprl import GRPOConfig, GRPOTrainer
    from grouprl.train.algorithms import algorithm_for

    cfg = GRPOConfig(algorithm="reinforce", num_generations=1, per_device_train_batch_size=4, max_steps=4,
                     max_new_tokens=8, max_prompt_length=64, learning_rate=1e-3, output_dir=str(tmp_path / "out"),
                     save_strategy="no", eval_split=None, progress_bar=False, seed=0)
    assert algorithm_for(cfg).train is reinforce.train  # the trainer dispatches through ALGORITHMS
    result = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=ROWS,
                         reward_funcs=lambda completions, **kw: [len(c) % 3 / 2 for c in completions]).train()
    lines = [r for r in map(__import__("json").loads, (tmp_path / "out" / "metrics.jsonl").read_text().splitlines())
             if "reward" in r]
    assert [r["step"] for r in lines] == [1, 2, 3, 4] and result["global_step"] == 4
    baseline = 0.0  # b_1 = 0; b_{t+1} = 0.9 b_t + 0.1 mean r_t, as logged before each step's update
    for r in lines:
        assert r["baseline"] == pytest.approx(baseline, abs=1e-12)
        assert math.isfinite(r["loss/policy"]) and 0.0 <= r["reward"] <= 1.0
        baseline = 0.9 * baseline + 0.1 * r["reward"]
    assert (tmp_path / "out" / "final" / "config.json").is_file()


def test_reinforce_declaration_is_what_the_checks_read(reinforce):
    from grouprl import GRPOConfig
    from grouprl.train.parallel.ranks import check_config

    GRPOConfig(algorithm="reinforce", num_generations=1, per_device_train_batch_size=4)  # groups=False: G = 1
    with pytest.raises(ConfigError, match="algorithm='reinforce' with 2 processes is not supported"):
        check_config(GRPOConfig(algorithm="reinforce", num_generations=1, per_device_train_batch_size=4), 2)
    with pytest.raises(ConfigError, match="not a known preset"):
        GRPOConfig(algorithm="reinforce_typo", num_generations=2, per_device_train_batch_size=4)
