"""Datasets from the ecosystem: Python rows of any kind, reasoning-gym tasks, and clear errors for the rest."""

from __future__ import annotations

import itertools
import json

import datasets
import pytest

from grouprl.data.load import MAX_ROWS, load_dataset_any, with_chat_template_kwargs
from grouprl.errors import DataError

rg = pytest.importorskip("reasoning_gym")  # in the test extra; skipped only on a bare install


def test_python_rows_of_every_kind():
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    for given in (rows, tuple(rows), iter(rows), (r for r in rows), datasets.Dataset.from_list(rows),
                  datasets.IterableDataset.from_generator(lambda: iter(rows))):
        ds = load_dataset_any(given)
        assert ds.to_list() == rows, type(given)


@pytest.mark.parametrize("bad, said", [
    (object(), "got a object object, which is not a dataset"),
    (42, "got a int object"),
    ({"prompt": ["a"]}, "got a dict object"),  # columns-as-dict is not rows (Dataset.from_dict it first)
    ([{"prompt": "a"}, "b"], "row 1 is a str"),
    ([], "has no rows"),
])
def test_other_objects_are_a_clear_error_never_a_hub_lookup(bad, said, monkeypatch):
    def no_hub(*a, **k):
        raise AssertionError("a Python object must never reach the hub")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    with pytest.raises(DataError, match=said):
        load_dataset_any(bad)


def test_an_endless_iterable_is_an_error_not_a_hang(monkeypatch):
    monkeypatch.setattr("grouprl.data.load.MAX_ROWS", 5)
    with pytest.raises(DataError, match="more than 5 rows"):
        load_dataset_any({"prompt": str(i)} for i in itertools.count())
    assert MAX_ROWS == 1_000_000


def test_reasoning_gym_by_name_with_config_keys_and_a_held_out_split():
    config = dict(size=20, seed=3, min_terms=2, max_terms=2, max_digits=1, operators=("+",))
    train = load_dataset_any("reasoning_gym:basic_arithmetic", "train", **config)
    held = load_dataset_any("reasoning_gym:basic_arithmetic", "test", eval_size=30, **config)
    direct = rg.create_dataset("basic_arithmetic", **config)
    assert train["prompt"] == [e["question"] for e in direct] and train["answer"] == [e["answer"] for e in direct]
    assert json.loads(train[0]["reasoning_gym"]) == {"name": "basic_arithmetic", "index": 0,
                                                     "config": json.loads(json.dumps(config))}
    assert not set(held["prompt"]) & set(train["prompt"]) and 0 < len(held) <= 30  # no training question repeats
    assert json.loads(held[0]["reasoning_gym"])["config"]["seed"] == 3 + 20  # entry i is Random(seed + i)


def test_reasoning_gym_errors_name_the_key_and_the_task():
    with pytest.raises(DataError, match="Did you mean 'max_digits'"):
        load_dataset_any("reasoning_gym:basic_arithmetic", size=3, max_digit=2)
    with pytest.raises(DataError, match="Did you mean 'basic_arithmetic'"):
        load_dataset_any("reasoning_gym:basic_arithmetc")
    with pytest.raises(DataError, match="min_terms"):  # the task's own validation, named
        load_dataset_any("reasoning_gym:basic_arithmetic", size=3, min_terms=5, max_terms=2)


def test_reasoning_gym_object_and_its_scorer():
    from grouprl.rewards import make_reward_func

    obj = rg.create_dataset("leg_counting", size=4, seed=1)
    ds = load_dataset_any(obj)
    assert ds["prompt"] == [e["question"] for e in obj]
    reward = make_reward_func("reasoning_gym")
    gold, refs = list(ds["answer"]), list(ds["reasoning_gym"])
    completions = [f"<answer>{gold[0]}</answer>", f"Answer: {gold[1]}", f"<answer>{int(gold[2]) + 1}</answer>",
                   f"I think {gold[3]}"]
    # tag and "Answer:" lines are extracted; a wrong number and an untagged one score 0 (no raw-text credit)
    assert reward(completions, reasoning_gym=refs, answer=gold) == [1.0, 1.0, 0.0, 0.0]
    assert reward(["<answer>1</answer>"], answer=["1"]) == [None]  # not a reasoning-gym row: no opinion


def test_reasoning_gym_partial_credit_is_the_tasks_own():
    from grouprl.rewards.reasoning_gym import entry_for, reasoning_gym_reward

    ds = load_dataset_any("reasoning_gym:spell_backward", size=3, seed=0)
    dataset, entry = entry_for(ds[0]["reasoning_gym"])
    near = entry["answer"][:-1]
    expected = dataset.score_answer(answer=near, entry=entry)
    assert reasoning_gym_reward(f"<answer>{near}</answer>", reasoning_gym=ds[0]["reasoning_gym"]) == expected
    assert reasoning_gym_reward(f"<answer>{entry['answer']}</answer>", reasoning_gym=ds[0]["reasoning_gym"]) == 1.0


def test_chat_template_kwargs_reach_every_rendering():
    from grouprl.builtin.tiny import build_tokenizer

    tok = build_tokenizer(["hello world"])
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}|thinking={{ enable_thinking }}"
    wrapped = with_chat_template_kwargs(tok, {"enable_thinking": False})
    msgs = [{"role": "user", "content": "hi"}]
    assert wrapped.apply_chat_template(msgs, tokenize=False) == "hi|thinking=False"
    assert wrapped.apply_chat_template(msgs, tokenize=False, enable_thinking=True) == "hi|thinking=True"
    assert tok.apply_chat_template(msgs, tokenize=False) == "hi|thinking="  # the original is untouched
    assert with_chat_template_kwargs(tok, {}) is tok
