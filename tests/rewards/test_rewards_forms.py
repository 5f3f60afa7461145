"""Both reward forms work everywhere: per-sample ``fn(completion, *, answer=None, **meta)`` and TRL's
batch ``fn(prompts, completions, **kwargs) -> list``, as Python callables and as ``pkg.mod:fn`` plug-ins."""

from __future__ import annotations

import sys
import textwrap

import pytest

from grouprl.errors import ConfigError, RewardError
from grouprl.rewards import as_sample_reward, batch_reward, make_reward_func, reward_form, sample_reward

PLUGIN = '''
def per_sample(completion, *, answer=None, **meta):
    return float(completion.strip() == answer)

def trl_batch(prompts, completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]

def keyword_batch(completions, **kwargs):
    return [float(len(c)) for c in completions]

def no_form(**kwargs):
    return 1.0

def wrong_length(prompts, completions, **kwargs):
    return [1.0]
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_pkg").mkdir()
    (tmp_path / "my_rewards_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_rewards_pkg" / "mod.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards_pkg.mod"
    for name in ("my_rewards_pkg", "my_rewards_pkg.mod"):
        sys.modules.pop(name, None)


def _python_forms():
    def per_sample(completion, *, answer=None, **meta):
        return float(completion.strip() == answer)

    def trl_batch(prompts, completions, answer, **kwargs):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    return per_sample, trl_batch


CALL = dict(prompts=["p1", "p2"], completions=["4", "5"], answer=["4", "4"], trainer_state=None)


@pytest.mark.parametrize("form", ["per_sample", "trl_batch"])
def test_both_forms_as_plugins(plugin, form):
    f = make_reward_func(f"{plugin}:{form}")
    assert f(**CALL) == [1.0, 0.0]


@pytest.mark.parametrize("index", [0, 1])
def test_both_forms_as_python_callables(index):
    f = make_reward_func(_python_forms()[index])
    assert f(**CALL) == [1.0, 0.0]
    assert f(["4", "5"], answer=["4", "4"]) == [1.0, 0.0]  # positional completions, as grouprl's scorer may


def test_chat_completions_reach_a_batch_reward_unchanged(plugin):
    chat = [[{"role": "assistant", "content": "abc"}]]
    seen = []

    def batch(prompts, completions, **kwargs):
        seen.append(completions)
        return [1.0]

    assert make_reward_func(batch)(completions=chat, prompts=["p"]) == [1.0]
    assert seen == [chat]  # TRL semantics: the batch form sees what TRL would pass


@pytest.mark.parametrize(
    "fn, form",
    [
        (lambda completion: 1.0, "sample"),
        (lambda prediction, ground_truth=None: 1.0, "sample"),  # any first positional name
        (lambda prompts, completions, **kw: [], "batch"),
        (lambda completions, **kw: [], "batch"),
        (lambda *, completions, prompts=None: [], "batch"),  # keyword-only completions
        (batch_reward(lambda *args, **kw: []), "batch"),
        (sample_reward(lambda *args, **kw: 0.0), "sample"),
    ],
)
def test_reward_form_rule(fn, form):
    assert reward_form(fn) == form


@pytest.mark.parametrize(
    "fn",
    [lambda **kwargs: 1.0, lambda *args: 1.0, lambda: 1.0, lambda prompts, responses: [1.0]],
    ids=["kwargs only", "args only", "no parameters", "prompts without completions"],
)
def test_a_signature_that_is_neither_form_says_which_forms_are_accepted(fn):
    with pytest.raises(ConfigError, match=r"fn\(completion, \*, answer=None.*fn\(prompts, completions, \*\*kwargs\)"):
        make_reward_func(fn)


def test_plugin_errors_name_the_forms(plugin):
    with pytest.raises(ConfigError, match="neither form"):
        make_reward_func(f"{plugin}:no_form")
    with pytest.raises(RewardError, match="one score per completion: got 1 scores for 2"):
        make_reward_func(f"{plugin}:wrong_length")(**CALL)


def test_batch_options_are_checked(plugin):
    def batch(prompts, completions, scale=1.0):
        return [scale] * len(completions)

    assert make_reward_func(batch, scale=2.0)(completions=["a"]) == [2.0]
    with pytest.raises(ConfigError, match="Did you mean 'scale'"):
        make_reward_func(batch, scael=2.0)


def test_as_sample_reward_scores_one_completion_with_either_form(plugin):
    import importlib

    mod = importlib.import_module(plugin)
    for fn in (mod.per_sample, mod.trl_batch, mod.keyword_batch):
        one = as_sample_reward(fn)
        assert one("4", answer="4") in (1.0, 1)
