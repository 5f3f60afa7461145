"""Code repair: the builtin:code_repair task, its demonstrations (token-exact, replayed through the real
environment and sandbox), the code template's trajectory rewards, and a tiny end-to-end recipe run."""

from __future__ import annotations

import ast
import random
from dataclasses import replace

import pytest

from grouprl.builtin import code_demos
from grouprl.builtin.agent_demos import conversation_ids
from grouprl.builtin.tiny import build_tokenizer
from grouprl.builtin.warmstart import WARMSTARTS
from grouprl.data.code_repair import FAMILIES, FUNCTIONS, catchable_bugs, make_code_repair, passes
from grouprl.data.tasks import generate_rows, load_task
from grouprl.errors import DataError
from grouprl.rewards.code_repair import code_repair_reward, ended_cleanly, format_score
from grouprl.rewards.code_repair import tests_passed_reward as passed_reward
from grouprl.sandbox import configure, detect
from grouprl.sandbox.config import current

SANDBOX = detect().strict or detect().basic_python
needs_sandbox = pytest.mark.skipif(not SANDBOX, reason="no sandbox isolation available on this machine")
TINY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300, sft_rows=48, sft_steps=3,
            batch_size=8, warmup_steps=1)


@pytest.fixture
def sandbox_settings():
    before = current()
    configure(isolation="strict" if detect().strict else "basic", timeout=10.0)
    yield
    configure(before)


def _retrying_row() -> dict:
    """A training row whose demonstration (rng seed 3, never giving up) edits twice or more."""
    rows = generate_rows("code_repair", "train", n=40, seed=7)
    for row in rows:
        messages = code_demos.repair_conversation(row, random.Random(3), give_up=0.0)
        if sum('edit(' in m["content"] for m in messages if m["role"] == "assistant") >= 2:
            return row
    raise AssertionError("no retrying demonstration among 40 rows")


def test_generator_rows_splits_and_errors():
    row = make_code_repair(random.Random(0))
    name = row["work"]["name"]
    op, family = FUNCTIONS[name]
    assert row["prompt"] == [{"role": "user", "content": f"Fix {name} in solution.py."}]
    assert row["work"]["bug"] in FAMILIES[family] and row["work"]["bug"] != op and len(row["tests"]) == 3
    a, b = row["work"]["args"]
    assert row["code"] == f"def {name}({a}, {b}):\n    return {a} {row['work']['bug']} {b}\n"
    assert row["answer"] == f"def {name}({a}, {b}):\n    return {a} {op} {b}\n"
    # hand-checked: add(2, 7) == 9 fails with "-" (-5) and "%" (2) but "+" passes; less(3, 3) is False holds for ">"
    work = {"op": "+", "cases": [[2, 7], [2, 2]]}
    assert passes(work, "-") == [False, False] and passes(work, "*") == [False, True] and passes(work, "+") == [True] * 2
    assert passes({"op": "<", "cases": [[1, 4], [4, 1], [3, 3]]}, ">") == [False, False, True]
    train = generate_rows("code_repair", "train", n=300, seed=0)
    test = generate_rows("code_repair", "test", n=100, seed=0)
    assert not {r["key"] for r in train} & {r["key"] for r in test}
    assert generate_rows("code_repair", "test", n=100, seed=0) == test  # deterministic
    assert all(not all(passes(r["work"], r["work"]["bug"])) for r in train + test)  # every bug is caught
    # fail_to_pass: every test of every row fails on the buggy file; every other wrong operator fails one
    f2p = generate_rows("code_repair", "train", n=300, seed=0, fail_to_pass=True) + \
        generate_rows("code_repair", "test", n=100, seed=0, fail_to_pass=True)
    for r in f2p:
        w = r["work"]
        assert not any(passes(w, w["bug"])) and all(passes(w, w["op"]))
        assert all(not all(passes(w, o)) for o in FAMILIES[w["family"]] if o != w["op"])
    assert {r["work"]["bug"] for r in f2p if r["work"]["name"] == "less"} == {">"}
    assert any(any(passes(r["work"], r["work"]["bug"])) for r in train)  # the default keeps partial credit
    assert set(load_task("code_repair", "test", n=5).column_names) == {"prompt", "code", "tests", "answer"}
    with pytest.raises(DataError, match="functions must be among"):
        make_code_repair(random.Random(0), functions=["div"])


def test_catchable_bugs_hand_derived():
    # less (<) with bug ==: the a > b cases are the only ones where != differs from <, and there == agrees
    # with < (both False), so no FAIL_TO_PASS suite catches != too; with bug > (differs on a < b and a > b)
    # both a < b and a > b cases are allowed, and they catch == (a < b) and != (a > b).
    assert catchable_bugs("<", "compare") == [">"] and catchable_bugs(">", "compare") == ["<"]
    assert catchable_bugs("==", "compare") == ["<", ">", "!="] and catchable_bugs("!=", "compare") == ["=="]
    assert catchable_bugs("+", "arith") == ["-", "*", "%"]
    row = make_code_repair(random.Random(5), functions=["less"], fail_to_pass=True)
    assert row["work"]["bug"] == ">" and not any(passes(row["work"], ">"))


@needs_sandbox
def test_generator_tests_catch_the_bug_in_the_sandbox(sandbox_settings):
    from grouprl.envs import CodeRepairEnv

    for row in generate_rows("code_repair", "test", n=8, seed=3):
        env = CodeRepairEnv()
        env.reset(code=row["code"], tests=row["tests"])
        assert env.get_reward() == sum(passes(row["work"], row["work"]["bug"])) / 3 < 1
        env.write(row["answer"])
        assert env.get_reward() == 1.0
    for row in generate_rows("code_repair", "test", n=8, seed=3, fail_to_pass=True):
        env = CodeRepairEnv()
        env.reset(code=row["code"], tests=row["tests"])
        assert env.get_reward() == 0.0  # FAIL_TO_PASS: the unedited file passes none of its tests
        env.write(row["answer"])
        assert env.get_reward() == 1.0


def test_demonstrations_are_the_rollouts_tokens():
    from grouprl.rollout.chat import assistant_turn_ids, prompt_ids, tool_turn_ids

    tok = build_tokenizer()
    tools = code_demos.repair_tools()
    messages = code_demos.repair_conversation(_retrying_row(), random.Random(3), give_up=0.0)
    ids, mask = conversation_ids(tok, messages, tools)
    # what MultiTurnRollout concatenates: the prompt, then each sampled turn and each tool turn in order
    want, want_mask = list(prompt_ids(tok, messages[:1], tools)), []
    want_mask = [0] * len(want)
    for k in range(1, len(messages)):
        if messages[k]["role"] == "assistant":
            piece = assistant_turn_ids(tok, messages[:k], messages[k], tools)
            want_mask += [1] * len(piece)
        elif messages[k - 1]["role"] == "assistant":
            piece = tool_turn_ids(tok, messages[:k], messages[k:k + 1], tools)
            want_mask += [0] * len(piece)
        else:
            continue
        want += piece
    assert ids == want and mask == want_mask
    assert tok.decode(ids).startswith("<|im_start|>system\nTools: edit(old, new), run_tests(), view(), write(content)")
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained.startswith("<tool_call>view()</tool_call><|im_end|><tool_call>edit(old=\"")
    assert trained.endswith("<tool_call>run_tests()</tool_call><|im_end|>Done.<|im_end|>")
    assert "tests passed" not in trained and "def " not in trained  # tool replies are never targets
    # review=True: a retry views the file again; decide=0: that view's first token (<tool_call>, the choice to
    # go on) has loss mask 0, the rest of the turn 1
    reviewed = code_demos.repair_conversation(_retrying_row(), random.Random(3), give_up=0.0, review=True)
    views = [k for k, m in enumerate(reviewed) if m["role"] == "assistant" and m["content"] == "<tool_call>view()</tool_call>"]
    assert len(views) >= 2 and all(reviewed[k + 2]["content"].startswith("<tool_call>edit(") for k in views)
    ids1, mask1 = conversation_ids(tok, reviewed, tools)
    masked = [dict(m, mask_first=True) if k in views[1:] else m for k, m in enumerate(reviewed)]
    ids2, mask2 = conversation_ids(tok, masked, tools)
    assert ids2 == ids1
    untrained = [k for k, (a, b) in enumerate(zip(mask1, mask2)) if a != b]
    assert len(untrained) == len(views) - 1 and all(tok.decode([ids1[k]]) == "<tool_call>" for k in untrained)


@needs_sandbox
def test_demonstrations_replay_through_the_environment_and_fix_the_bug(sandbox_settings, no_leftovers):
    """Each call of a demonstration, run by the real environment (sandboxed tests), returns the demonstration's
    tool message; the last edit of a demonstration that ends with 3/3 leaves a file that passes every test."""
    from grouprl.envs import CodeRepairEnv, make_env_factory

    rows = [_retrying_row()] + generate_rows("code_repair", "train", n=3, seed=11)
    for row in rows:
        messages = code_demos.repair_conversation(row, random.Random(3), give_up=0.0)
        env = make_env_factory(environment_factory=CodeRepairEnv)()
        env.reset({"prompt": row["prompt"], "code": row["code"], "tests": row["tests"]})
        for k, m in enumerate(messages):
            if m["role"] != "tool":
                continue
            call = ast.parse(messages[k - 1]["content"][len("<tool_call>"):-len("</tool_call>")]).body[0].value
            assert env.call(call.func.id, {kw.arg: kw.value.value for kw in call.keywords}) == m["content"]
        assert messages[-2]["content"] == "3/3 tests passed." and messages[-1]["content"] == "Done."
        assert env.reward() == 1.0 and env.instance.code == row["answer"]
        env.close()


def _mix(spec):
    examples, fixed = code_demos.demo_examples(spec)
    first_right, failed, retried = 0, 0, 0
    for messages, tools in examples:
        assert tools == code_demos.repair_tools()
        turns = [m["content"] for m in messages if m["role"] == "assistant"]
        reports = [m["content"] for m in messages if m["role"] == "tool" and "tests passed" in m["content"]]
        first_right += reports[0].startswith("3/3")
        retried += len(reports) - 1  # every report but the last failed and was followed by another edit
        failed += len(reports) - 1 + (not reports[-1].startswith("3/3") and len(reports) < 3)  # + gave up
        assert turns[0] == "<tool_call>view()</tool_call>" and turns[-1] == "Done."
    return examples, fixed, first_right, failed, retried


def test_demonstration_mix_leaves_the_policy_to_rl():
    spec = replace(WARMSTARTS["code_repair"], sft_rows=1500)
    examples, fixed, first_right, failed, retried = _mix(spec)
    # the first operator tried is the name's in half of them (hint 0.25: 0.25 + 0.75 / 3); 30% edit again after a
    # failure; fixed: 1/2 + 1/2 x 0.3 x (1/2 + 1/2 x 0.3) = 0.5975 (the second try is right one time in two)
    assert abs(first_right / len(examples) - 0.5) < 0.04
    assert abs(retried / failed - (1 - spec.noise)) < 0.05
    assert abs(fixed - 0.5975) < 0.03
    assert not any(m.get("mask_first") for messages, _ in examples for m in messages)  # decision_fraction 1


def test_demonstration_options_mask_the_choice_and_view_again():
    spec = replace(WARMSTARTS["code_repair"], sft_rows=1500, noise=0.25, decision_fraction=0.15, demo_version=2, hint=0.0)
    examples, fixed, first_right, failed, retried = _mix(spec)
    assert abs(retried / failed - 0.75) < 0.05
    # fixed: 1/3 + 2/3 * 0.75 * (1/2 + 1/2 * 0.75) = 0.7708 (the third operator tried is the right one)
    assert abs(fixed - 0.7708) < 0.03
    for messages, _ in examples:  # one copying rule: every edit's old= is the line of the view just before
        for k, m in enumerate(messages):
            if m["role"] == "assistant" and m["content"].startswith("<tool_call>edit("):
                assert messages[k - 2]["content"] == "<tool_call>view()</tool_call>"
                shown = messages[k - 1]["content"].splitlines()[-1].split("return ")[1]
                assert m["content"].startswith(f'<tool_call>edit(old="{shown}", ')
    # the choice to go on (a second view) is trained on 15% of the turns after a failure; "Done." on every stop
    goes_on = [m for messages, _ in examples for m in messages[2:]
               if m["role"] == "assistant" and m["content"] == "<tool_call>view()</tool_call>"]
    trained = sum(not m.get("mask_first") for m in goes_on)
    assert len(goes_on) == retried and abs(trained / len(goes_on) - 0.15) < 0.03
    # what SFT then learns after a failure: go on with probability 0.75 * 0.15 / (0.75 * 0.15 + 0.25) = 0.31
    assert abs(trained / (trained + failed - retried) - 0.31) < 0.04


def test_code_repair_reward_hand_computed():
    ok = {"error": None}
    calls = [{"name": n, **ok} for n in ("view", "edit", "run_tests", "edit", "run_tests")]
    turns = ['<tool_call>view()</tool_call>', '<tool_call>edit(old="a - b", new="a * b")</tool_call>',
             '<tool_call>run_tests()</tool_call>', '<tool_call>edit(old="a * b", new="a + b")</tool_call>',
             '<tool_call>run_tests()</tool_call>', 'Done.']
    state = {"passed": 3, "total": 3, "edits": 2, "iterations": 2}
    # 5 calls, 2 over the 3 allowed: efficiency 1 - 0.2 = 0.8; format 1; safety 1
    # 0.5 * 1 + 0.1 * 1 + 0.25 * 0.8 + 0.15 * 1 = 0.95
    assert code_repair_reward("Done.", model_turns=turns, tool_calls=calls, env_state=state) == pytest.approx(0.95)
    assert code_repair_reward("Done.", model_turns=turns, tool_calls=calls, env_state=state,
                              include_accuracy=False) == pytest.approx(0.45)
    # one malformed call of 6 turns: format 5/6; 4 edits (1 over 3): efficiency 1 - 0.1 * (2 + 1) = 0.7
    bad = calls[:4] + [{"name": None, "error": "malformed"}]
    state4 = {"passed": 1, "total": 3, "edits": 4, "iterations": 1}
    assert format_score(turns, bad) == pytest.approx(5 / 6)
    assert code_repair_reward("Done.", model_turns=turns, tool_calls=bad, env_state=state4) == pytest.approx(
        0.5 / 3 + 0.1 * 5 / 6 + 0.25 * 0.7 + 0.15)
    assert passed_reward("Done.", env_state={}) is None and code_repair_reward("x", env_state={}) is None


def test_code_repair_reward_on_success_options_hand_computed():
    ok = {"error": None}
    calls = [{"name": n, **ok} for n in ("view", "edit", "run_tests")]
    turns = ['<tool_call>view()</tool_call>', '<tool_call>edit(old="a - b", new="a * b")</tool_call>',
             '<tool_call>run_tests()</tool_call>', 'Done.']
    failed = {"passed": 1, "total": 3, "edits": 1, "iterations": 1}
    solved = {**failed, "passed": 3}
    # a failure: efficiency 0 instead of 1 -> 0.5/3 + 0.1 + 0.15 = 0.41667; with format too: 0.5/3 + 0.15
    assert code_repair_reward("Done.", model_turns=turns, tool_calls=calls, env_state=failed,
                              efficiency_on_success=True) == pytest.approx(0.5 / 3 + 0.25)
    assert code_repair_reward("Done.", model_turns=turns, tool_calls=calls, env_state=failed, efficiency_on_success=True,
                              format_on_success=True) == pytest.approx(0.5 / 3 + 0.15)
    # a repair keeps every term: 1.0
    assert code_repair_reward("Done.", model_turns=turns, tool_calls=calls, env_state=solved,
                              efficiency_on_success=True, format_on_success=True) == pytest.approx(1.0)
    # answering at once ("Done.", no call) on the FAIL_TO_PASS file (0/3): 0.5 in full (format, efficiency,
    # safety 1 each), 0.25 when efficiency pays only on success -- no better than a failed attempt (0.41667)
    stop = {"passed": 0, "total": 3, "edits": 0, "iterations": 0}
    assert code_repair_reward("Done.", model_turns=["Done."], tool_calls=[], env_state=stop) == pytest.approx(0.5)
    assert code_repair_reward("Done.", model_turns=["Done."], tool_calls=[], env_state=stop,
                              efficiency_on_success=True) == pytest.approx(0.25)
    # without the accuracy term (the recipe: the environment adds k/n) success is still read: 0.25 vs 0.5
    assert code_repair_reward("Done.", model_turns=turns, tool_calls=calls, env_state=failed, include_accuracy=False,
                              efficiency_on_success=True) == pytest.approx(0.25)
    assert code_repair_reward("Done.", model_turns=turns, tool_calls=calls, env_state=solved, include_accuracy=False,
                              efficiency_on_success=True) == pytest.approx(0.5)
    assert code_repair_reward("x", env_state={}, include_accuracy=False, efficiency_on_success=True) is None


def test_clean_success_pays_efficiency_only_for_a_tested_repair_hand_computed():
    ok = {"error": None}
    solved = {"passed": 3, "total": 3, "edits": 1, "iterations": 1}
    clean = [{"name": n, **ok} for n in ("view", "edit", "run_tests")]
    turns = ['<tool_call>view()</tool_call>', '<tool_call>edit(old="a - b", new="a * b")</tool_call>',
             '<tool_call>run_tests()</tool_call>', 'Done.']
    opts = {"efficiency_on_success": True, "clean_success": True}
    # a clean repair keeps every term: 1.0 (0.5 without accuracy)
    assert code_repair_reward("Done.", model_turns=turns, tool_calls=clean, env_state=solved, end_reason="answered",
                              **opts) == pytest.approx(1.0)
    assert code_repair_reward("Done.", model_turns=turns, tool_calls=clean, env_state=solved, end_reason="answered",
                              include_accuracy=False, **opts) == pytest.approx(0.5)
    # the hack: the right edit, then a broken call instead of run_tests (the rollout stops on its tool-error
    # budget of 2).
    hack_turns = turns[:2] + ["<tool_call>run_.", "<tool_call>run_ vi"]
    hack_calls = clean[:2] + [{"name": None, "error": "malformed"}] * 2
    # 2 malformed of 4 turns: format 1/2; 4 calls, 1 over the 3 allowed: efficiency 0.9.
    # Without clean_success: 0.5 + 0.05 + 0.25 * 0.9 + 0.15 = 0.925
    assert code_repair_reward("x", model_turns=hack_turns, tool_calls=hack_calls, env_state={**solved, "iterations": 0},
                              end_reason="tool_error_budget", efficiency_on_success=True) == pytest.approx(0.925)
    # with it: efficiency 0 -> 0.5 + 0.05 + 0.15 = 0.70
    assert code_repair_reward("x", model_turns=hack_turns, tool_calls=hack_calls, env_state={**solved, "iterations": 0},
                              end_reason="tool_error_budget", **opts) == pytest.approx(0.70)
    # the right edit and "Done." without a test run: format 1, efficiency 0 -> 0.5 + 0.1 + 0.15 = 0.75
    untested = ["<tool_call>view()</tool_call>", turns[1], "Done."]
    assert code_repair_reward("Done.", model_turns=untested, tool_calls=clean[:2], env_state=solved,
                              end_reason="answered", **opts) == pytest.approx(0.75)
    # tested, then edited again and stopped without testing that edit: not clean
    assert not ended_cleanly(clean + [{"name": "edit", **ok}], "answered")
    # a failed edit after the passing run changes nothing: still clean
    assert ended_cleanly(clean + [{"name": "edit", "error": "exception"}], "answered")
    # cut by the token budget or the turn limit: not clean, whatever the calls
    assert not ended_cleanly(clean, "max_tokens") and not ended_cleanly(clean, "max_turns")
    # a failed repair is unchanged by the option (efficiency is 0 either way): 0.5/3 + 0.1 + 0.15
    failed = {**solved, "passed": 1}
    assert code_repair_reward("Done.", model_turns=turns, tool_calls=clean, env_state=failed, end_reason="answered",
                              **opts) == pytest.approx(0.5 / 3 + 0.25)


@needs_sandbox
def test_tests_passed_scores_the_final_file_not_the_last_run(sandbox_settings, no_leftovers):
    from grouprl.envs import CodeRepairEnv

    env = CodeRepairEnv()
    env.reset(code="def add(a, b):\n    return a - b\n", tests=["assert add(2, 7) == 9", "assert add(3, 3) == 6"])
    env.run_tests()
    env.edit("a - b", "a + b")  # edited after its last run: the stale count says 0/2
    state = {"passed": env.passed, "total": env.total}
    assert passed_reward("Done.", env_state=state) == 0.0
    assert passed_reward("Done.", environments=env, env_state=state) == 1.0


def test_env_counters_are_logged_per_trajectory():
    from grouprl.rollout.trajectory import Trajectory
    from grouprl.train.agent import agent_metrics

    trajs = [Trajectory(prompt_ids=[1], messages=[], num_turns=1, tool_calls=[], end_reason="answered")
             for _ in range(2)]
    trajs[0].env_state = {"edits": 1, "iterations": 2, "code": "x", "solved": True}
    trajs[1].env_state = {"edits": 3, "iterations": 1}
    m = agent_metrics(trajs)
    assert (m["env/edits"], m["env/iterations"]) == (2.0, 1.5) and "env/code" not in m and "env/solved" not in m


@needs_sandbox
def test_recipe_smoke_end_to_end(tmp_path, sandbox_settings, no_leftovers):
    """recipes/code_repair.yaml on a tiny warm start: one GRPO step with sandboxed test runs, held-out k/n
    and the edits / iterations per trajectory logged."""
    import json

    from grouprl.builtin.warmstart import builtin_model_path
    from grouprl.config import GRPOConfig
    from grouprl.train import GRPOTrainer

    model = builtin_model_path("code_repair", cache_dir=tmp_path / "cache", **TINY)
    isolation = "strict" if detect().strict else "basic"
    cfg = GRPOConfig.from_yaml("recipes/code_repair.yaml", [
        f"model={model}", "max_steps=1", "per_device_train_batch_size=4", "num_generations=2", "max_eval_samples=2",
        "eval_num_samples=1", "eval_steps=1", "max_new_tokens=96", f"output_dir={tmp_path / 'out'}",
        "report_to=none", "progress_bar=false", "save_steps=100", f"sandbox.isolation={isolation}"])
    result = GRPOTrainer(config=cfg).train()
    records = [json.loads(line) for line in open(result["metrics_path"])]
    evals = [r for r in records if "eval/accuracy" in r]
    assert evals and all(0.0 <= r["eval/accuracy"] <= 1.0 for r in evals)
    step = next(r for r in records if "time/step" in r)
    assert "rewards/CodeRepairEnv/mean" in step and "env/iterations" in step and "env/edits" in step
