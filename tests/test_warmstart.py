"""The built-in warm start: builds deterministically, caches by settings, loads like a hub model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from grouprl.builtin.warmstart import (
    INFO_FILE,
    WARMSTARTS,
    WarmStart,
    builtin_model_path,
    default_cache_dir,
    get_warmstart,
    sft_examples,
)
from grouprl.errors import UnknownNameError

# A few seconds on one CPU thread: a 1-layer model, a handful of SFT steps.
TINY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300, sft_rows=64, sft_steps=3,
            batch_size=8, warmup_steps=1)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return cache, builtin_model_path("arithmetic", cache_dir=cache, **TINY)


def test_builds_and_loads_through_from_pretrained(built):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, path = built
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == "qwen2" and model.config.hidden_size == 32
    info = json.loads((Path(path) / INFO_FILE).read_text())
    assert info["settings"]["sft_steps"] == 3 and info["settings"]["hasty_error"] == 0.5
    assert info["demo_accuracy"] == sft_examples(replace(get_warmstart("arithmetic"), **TINY))[1]
    assert info["sft_loss_last"] < info["sft_loss_first"]
    ids = tok("Ana has 3 pens.\n", return_tensors="pt")["input_ids"]
    assert [tok.decode([i]) for i in tok("123", add_special_tokens=False)["input_ids"]] == ["1", "2", "3"]
    demo = tok("<think>4*3=12</think>Answer: 12", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(demo, skip_special_tokens=True) == "<think>4*3=12</think>Answer: 12"  # tags kept, EOS not
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    assert ids.shape[1] < out.shape[1] <= ids.shape[1] + 3


def test_second_call_uses_the_cache(built):
    cache, path = built
    stamp = (Path(path) / "model.safetensors").stat().st_mtime_ns
    assert builtin_model_path("arithmetic", cache_dir=cache, **TINY) == path
    assert (Path(path) / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in (cache / "warmstart").iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_build_is_deterministic(built, tmp_path):
    from safetensors.torch import load_file

    _, path = built
    again = builtin_model_path("arithmetic", cache_dir=tmp_path, **TINY)
    a, b = load_file(f"{path}/model.safetensors"), load_file(f"{again}/model.safetensors")
    assert a.keys() == b.keys()
    assert all(bool((a[k] == b[k]).all()) for k in a)


def test_settings_change_the_cache_key():
    base = WarmStart(**TINY)
    assert base.digest() == WarmStart(**TINY).digest()
    assert base.digest() != WarmStart(**{**TINY, "sft_steps": 4}).digest()
    assert base.digest() != WarmStart(**TINY, noise=0.3).digest()


@pytest.mark.parametrize(
    "spec, low, high",
    [
        (WarmStart(noise=0.3, sft_rows=1000), 0.65, 0.75),  # 30% plausible wrong answers
        # 60% answer-only, half of those stop after the first step (when that differs from the answer)
        (WarmStart(direct_fraction=0.6, hasty_error=0.5, sft_rows=1000), 0.68, 0.78),
    ],
)
def test_noisy_demonstrations_are_wrong_as_often_as_reported(spec, low, high):
    from grouprl.data.tasks import generate_rows
    from grouprl.rewards import make_reward_func

    examples, demo_accuracy = sft_examples(spec)
    rows = generate_rows(spec.task, "train", n=spec.sft_rows, seed=1000 + spec.seed, **spec.task_kwargs)
    scores = make_reward_func("accuracy")([c for _, c in examples], answer=[r["answer"] for r in rows])
    assert sum(scores) / len(scores) == pytest.approx(demo_accuracy)
    assert low < demo_accuracy < high


def test_hasty_answers_are_the_first_step():
    examples, _ = sft_examples(WarmStart(direct_fraction=1.0, hasty_error=1.0, sft_rows=50))
    from grouprl.data.tasks import generate_rows

    rows = generate_rows("arithmetic", "train", n=50, seed=1000)
    for (_, completion), row in zip(examples, rows):
        first = row["work"].split(", ")[0]  # e.g. "7*3=21"
        assert completion == f"Answer: {first.rsplit('=', 1)[1]}"


def test_direct_fraction_drops_the_working():
    examples, _ = sft_examples(WarmStart(direct_fraction=0.6, sft_rows=1000))
    direct = sum(not c.startswith("<think>") for _, c in examples) / len(examples)
    assert 0.55 < direct < 0.65


def test_builtin_names():
    assert {"arithmetic", "arithmetic-noisy", "countdown"} <= set(WARMSTARTS)
    assert get_warmstart("arithmetic-noisy").noise == pytest.approx(0.3)
    with pytest.raises(UnknownNameError, match="builtin:arithmetic"):
        get_warmstart("arithmetc")


def test_countdown_warm_start_builds_with_its_own_demonstrations(tmp_path):
    from transformers import AutoTokenizer

    path = builtin_model_path("countdown", cache_dir=tmp_path, **TINY)
    info = json.loads((Path(path) / INFO_FILE).read_text())
    assert info["settings"]["task"] == "countdown" and info["demo_accuracy"] == 1.0
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.convert_ids_to_tokens(tok("<answer>", add_special_tokens=False)["input_ids"]) == ["<answer>"]


def test_cache_dir_is_the_user_cache_never_the_current_folder(tmp_path, monkeypatch):
    home, xdg, own = tmp_path / "home", tmp_path / "xdg", tmp_path / "own"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GROUPRL_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_dir() == home / ".cache" / "grouprl"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    assert default_cache_dir() == xdg / "grouprl"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # the XDG spec says: ignore a relative path
    assert default_cache_dir() == home / ".cache" / "grouprl"
    monkeypatch.setenv("GROUPRL_CACHE", str(own))  # the explicit override wins
    assert default_cache_dir() == own
    assert tmp_path / ".cache" not in default_cache_dir().parents


def test_builtin_models_are_looked_up_by_name(tmp_path, monkeypatch):
    import grouprl.builtin
    import grouprl.builtin.warmstart
    from grouprl.models import resolve_model_path

    asked = []
    monkeypatch.setattr(grouprl.builtin.warmstart, "builtin_model_path",
                        lambda name, cache_dir=None: asked.append((name, cache_dir)) or str(tmp_path))
    assert set(grouprl.builtin.MODELS) == set(WARMSTARTS)
    assert resolve_model_path("builtin:arithmetic-noisy") == str(tmp_path)
    assert grouprl.builtin.model_path("countdown", cache_dir="c") == str(tmp_path)
    assert asked == [("arithmetic-noisy", None), ("countdown", "c")]
    assert resolve_model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # anything else unchanged
    with pytest.raises(UnknownNameError, match="did you mean|Closest|builtin:arithmetic"):
        resolve_model_path("builtin:arithmetc")
