"""Preference data: bad rows named before the model loads, and builtin:arithmetic_prefs labelled by the reward."""

from __future__ import annotations

import json

import pytest
from dpo_helpers import PAIRS, WARM, dpo_config, load_tiny, write_pairs

from grouprl.cli import main
from grouprl.data.prefs import check_pref_rows, pairs_from_samples
from grouprl.errors import DataError
from grouprl.rewards import make_reward_func
from grouprl.train.algorithms.dpo_prefs import arithmetic_prefs

GOOD = {"prompt": "2+2?", "chosen": "4", "rejected": "5"}
CHAT = {"prompt": [{"role": "user", "content": "2+2?"}], "chosen": [{"role": "assistant", "content": "4"}],
        "rejected": [{"role": "assistant", "content": "5"}]}


@pytest.mark.parametrize("bad, message", [
    ({"prompt": "2+2?", "chosen": "4"}, "row 1, column 'rejected': missing value"),
    ({**GOOD, "chosen": "  "}, "row 1, column 'chosen': empty text"),
    ({**GOOD, "rejected": None}, "row 1, column 'rejected': missing value"),
    ({**GOOD, "prompt": ""}, "row 1, column 'prompt': empty text"),
    ({**GOOD, "rejected": "4"}, "row 1: chosen and rejected are the same"),
    ({**CHAT, "rejected": [{"role": "assistant", "content": "4"}]}, "row 1: chosen and rejected are the same"),
    ({**CHAT, "chosen": []}, "row 1, column 'chosen': empty message list"),
    ({**CHAT, "chosen": [{"content": "4"}]}, "row 1, column 'chosen': message 0 must be a mapping with 'role'"),
    ({**GOOD, "chosen": 4}, "row 1, column 'chosen': expected text or a list of chat messages, got int"),
])
def test_bad_rows_are_named(bad, message):
    rows = [GOOD, bad]
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace("[", r"\[")):
        check_pref_rows(rows)


def test_good_text_and_chat_rows_pass_and_a_missing_column_is_named():
    import datasets

    check_pref_rows([GOOD, CHAT])
    with pytest.raises(DataError, match="needs columns prompt, chosen, rejected; missing rejected"):
        check_pref_rows(datasets.Dataset.from_list([{"prompt": "2+2?", "chosen": "4", "answer": "4"}]))


def test_a_bad_row_fails_before_the_model_loads(tmp_path, capsys):
    data = write_pairs(tmp_path / "data", pairs=[*PAIRS[:3], {**PAIRS[3], "rejected": PAIRS[3]["chosen"]}])
    code = main(["train", "model=/no/such/model", f"dataset={data}", "algorithm=dpo",
                 f"output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code != 0 and "row 3: chosen and rejected are the same" in err and "/no/such/model" not in err


def test_pairs_from_samples_on_a_table():
    rows = [{"prompt": f"p{i}", "answer": "1"} for i in range(4)]
    samples = [["a", "b", "c"], ["a", "b", "c"], ["a", "b", "c"], ["same", "same", "x"]]
    rewards = [[1.0, 0.0, float("nan")], [1.0, 1.0, 1.0], [0.0, 0.0, float("nan")], [1.0, 0.0, float("nan")]]
    pairs = pairs_from_samples(rows, samples, rewards, seed=0)
    # p0: a > b (c has no opinion); p1 all right, p2 all wrong: none; p3: "same" is both right and wrong: not a pair
    assert pairs == [{"prompt": "p0", "answer": "1", "chosen": "a", "rejected": "b"}]
    assert len(pairs_from_samples(rows[:1], [["a", "b", "c", "d"]], [[1, 0, 1, 0]], seed=0, pairs_per_prompt=2)) == 2


def test_arithmetic_prefs_are_right_versus_wrong_deterministic_and_cached(tiny_model_dir, tmp_path):
    model, tok = load_tiny(tiny_model_dir)
    cfg = dpo_config(tmp_path, dataset="builtin:arithmetic_prefs", rollout_backend="dpo_helpers:OracleBackend",
                     dataset_kwargs={"n": 30, "samples_per_prompt": 4, "batch": 7})
    pairs, meta = arithmetic_prefs(cfg, model, tok, cache_dir=tmp_path / "cache")
    accuracy = make_reward_func("accuracy")
    chosen = accuracy([p["chosen"] for p in pairs], answer=[p["answer"] for p in pairs])
    rejected = accuracy([p["rejected"] for p in pairs], answer=[p["answer"] for p in pairs])
    assert pairs and chosen == [1.0] * len(pairs) and rejected == [0.0] * len(pairs)
    assert not any("Kim" in p["prompt"] for p in pairs)  # all samples right: no pair
    assert (meta["num_prompts"], meta["samples_drawn"], meta["num_pairs"]) == (30, 120, len(pairs))
    leo = sum(" Leo " in f" {p['prompt']}" for p in pairs) + 0  # the oracle cuts the last sample of Leo's prompts
    assert meta["samples_truncated"] >= leo
    again, _ = arithmetic_prefs(cfg, model, tok, cache_dir=tmp_path / "other-cache")  # rebuilt: same pairs
    assert again == pairs
    (built,) = (tmp_path / "cache" / "prefs").iterdir()
    assert json.loads((built / "meta.json").read_text())["samples_drawn"] == 120
    edited = [{**pairs[0], "chosen": "from the cache"}, *pairs[1:]]  # as many pairs as built: a whole entry
    (built / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in edited))
    cached, _ = arithmetic_prefs(cfg, model, tok, cache_dir=tmp_path / "cache")
    assert cached[0]["chosen"] == "from the cache"  # the second call reads the cache, samples nothing
    other = dpo_config(tmp_path, dataset="builtin:arithmetic_prefs", rollout_backend="dpo_helpers:OracleBackend",
                       dataset_kwargs={"n": 30, "samples_per_prompt": 4, "batch": 7}, seed=1)
    reseeded, _ = arithmetic_prefs(other, model, tok, cache_dir=tmp_path / "cache")
    assert reseeded != pairs and len(list((tmp_path / "cache" / "prefs").iterdir())) == 2


@pytest.fixture(scope="module")
def warm_start(tmp_path_factory):
    from grouprl.builtin.warmstart import builtin_model_path

    return builtin_model_path("arithmetic", cache_dir=tmp_path_factory.mktemp("warm"), **WARM)


def test_arithmetic_prefs_from_the_models_own_samples(warm_start, tmp_path, monkeypatch, capsys):
    """The transformers sampler end to end: the warm start's samples, labelled by the accuracy reward, then
    `grouprl train` on them (held-out evaluation on the arithmetic test split, as GRPO's)."""
    monkeypatch.setenv("GROUPRL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    args = ["train", f"model={warm_start}", "dataset=builtin:arithmetic_prefs", "algorithm=dpo",
            "dataset_kwargs.n=24", "max_new_tokens=12", "max_steps=2", "per_device_train_batch_size=2",
            "progress_bar=false", "max_eval_samples=2", f"output_dir={out}"]
    assert main(args) == 0
    meta = json.loads((out / "prefs_meta.json").read_text())
    assert meta["samples_drawn"] == 24 * 8 and meta["num_pairs"] >= 2  # 8 samples per prompt by default
    assert "held-out accuracy: before" in capsys.readouterr().out
    (built,) = (tmp_path / "cache" / "prefs").iterdir()
    pairs = [json.loads(line) for line in (built / "pairs.jsonl").read_text().splitlines()]
    accuracy = make_reward_func("accuracy")
    answers = [p["answer"] for p in pairs]
    assert accuracy([p["chosen"] for p in pairs], answer=answers) == [1.0] * len(pairs)
    assert accuracy([p["rejected"] for p in pairs], answer=answers) == [0.0] * len(pairs)
    model, tok = load_tiny(warm_start)
    cfg = dpo_config(tmp_path, dataset="builtin:arithmetic_prefs", dataset_kwargs={"n": 24}, max_new_tokens=12,
                     max_prompt_length=512, seed=42)  # the CLI run's settings
    again, _ = arithmetic_prefs(cfg, model, tok, cache_dir=tmp_path / "rebuilt")
    assert again == pairs  # built again from scratch: the same pairs


def test_no_pairs_is_a_clear_error(tiny_model_dir, tmp_path):
    model, tok = load_tiny(tiny_model_dir)  # random weights: never ends within 4 tokens
    cfg = dpo_config(tmp_path, dataset="builtin:arithmetic_prefs", dataset_kwargs={"n": 3, "samples_per_prompt": 2},
                     max_new_tokens=4)
    with pytest.raises(DataError, match="no pair from 3 prompts x 2 samples.*Fix: raise"):
        arithmetic_prefs(cfg, model, tok, cache_dir=tmp_path / "cache")


def test_the_held_out_split_of_arithmetic_prefs_is_the_arithmetic_test_split():
    from grouprl.data.load import load_dataset_any
    from grouprl.data.tasks import load_task

    held_out = load_dataset_any("builtin:arithmetic_prefs", "test", n=24, samples_per_prompt=4)
    assert held_out.to_list() == load_task("arithmetic", "test", n=24).to_list()  # what `grouprl eval` reads
    with pytest.raises(DataError, match="made from a model's own samples: train on it with `algorithm: dpo`"):
        load_dataset_any("builtin:arithmetic_prefs", "train")


def test_tokenised_pairs_end_as_the_model_must_end(tiny_model_dir, tmp_path):
    from grouprl.train.algorithms.dpo import tokenize_pairs

    model, tok = load_tiny(tiny_model_dir)
    cfg = dpo_config(tmp_path)
    text, chat = tokenize_pairs([PAIRS[0], CHAT], tok, cfg)
    assert tok.decode(text.chosen_ids) == "Answer: 1" + tok.eos_token  # text completions: EOS appended
    assert tok.decode(text.prompt_ids) == PAIRS[0]["prompt"]
    assert tok.decode(chat.prompt_ids) == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(chat.chosen_ids) == "4<|im_end|>\n"  # chat completions end as the template ends a turn
    assert tok.decode(chat.rejected_ids) == "5<|im_end|>\n"
    with pytest.raises(DataError, match="row 0: chosen and rejected have the same first 1 tokens"):
        tokenize_pairs([PAIRS[0]], tok, dpo_config(tmp_path, max_new_tokens=1))
