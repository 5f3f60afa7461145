"""The ``reward_model`` reward: a tiny sequence-classification model built locally, and the example script."""

from __future__ import annotations

import math
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

from grouprl.builtins import load_builtins  # noqa: E402
from grouprl.errors import ConfigError  # noqa: E402
from grouprl.rewards import make_reward_func  # noqa: E402
from grouprl.scorers.reward_model import RewardModelScorer, RunningStats, get_scorer  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    from grouprl.builtin.tiny import build_tokenizer

    tok = build_tokenizer(vocab_size=200)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    path = tmp_path_factory.mktemp("tiny-rm")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


PROMPTS = ["What is 2 + 2?", "Name a planet.", "What is 2 + 2?", "Say hi"]
ANSWERS = ["4", "Mars is the fourth planet from the Sun, red with iron oxide dust.", "The answer is 5.", "hi"]


def test_batches_score_exactly_as_one_at_a_time(rm_dir):
    batched = get_scorer(rm_dir, batch_size=4).score(PROMPTS, ANSWERS)
    single = get_scorer(rm_dir, batch_size=1).score(PROMPTS, ANSWERS)
    assert batched == pytest.approx(single, abs=1e-5)
    assert len(set(round(x, 6) for x in single)) == 4  # distinct inputs, distinct scores: the head is live


def test_the_registered_reward_uses_the_chat_template_and_takes_chat_prompts(rm_dir):
    load_builtins()
    f = make_reward_func("reward_model", path=rm_dir, batch_size=3)
    chat = [[{"role": "user", "content": p}] for p in PROMPTS]
    assert f(ANSWERS, prompts=PROMPTS) == pytest.approx(f(ANSWERS, prompts=chat), abs=1e-6)
    scorer = get_scorer(rm_dir, batch_size=3)
    text = scorer.text("What is 2 + 2?", "4")
    assert text.startswith("<|im_start|>user\nWhat is 2 + 2?") and "<|im_start|>assistant\n4" in text


def test_running_stats_by_hand():
    s = RunningStats()
    s.update([1.0, 2.0, 3.0, 4.0])
    assert s.mean == 2.5 and s.std == pytest.approx(math.sqrt(1.25))


def test_normalisation_uses_all_scores_so_far_then_clips():
    class Fixed(RewardModelScorer):
        def __init__(self):
            self.stats = RunningStats()

        def score(self, prompts, completions):
            return [float(c) for c in completions]

    s = Fixed()
    assert s.reward([None] * 2, ["1", "3"], normalize=True) == pytest.approx([-1.0, 1.0])  # mean 2, std 1
    # now over [1, 3, 5]: mean 3, std sqrt(8/3) = 1.633; (5 - 3) / 1.633 = 1.2247, clipped to 1
    assert s.reward([None], ["5"], normalize=True) == pytest.approx([2 / math.sqrt(8 / 3)])
    assert s.stats.count == 2 + 1
    assert s.reward([None], ["-7"], clip=2.0) == [-2.0]


def test_a_missing_path_or_bad_dtype_is_a_config_error(rm_dir):
    with pytest.raises(ConfigError, match="`path` is required"):
        get_scorer(None)
    with pytest.raises(ConfigError, match="dtype='fp8'"):
        get_scorer(rm_dir, dtype="fp8")


def test_the_example_trains_a_reward_model_and_scores_with_it(tmp_path):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import reward_model as example
    finally:
        sys.path.remove(str(EXAMPLES))
    result = example.main(["--steps", "6", "--pairs", "16", "--heldout", "8", "--batch-size", "4",
                           "--hidden-size", "16", "--out", str(tmp_path / "rm")])
    assert (tmp_path / "rm" / "config.json").is_file()
    assert result["last_loss"] < result["first_loss"]
    assert set(result["heldout_pairwise_accuracy"]) == {"wrong", "no_answer"}
