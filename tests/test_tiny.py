"""The tiny tokenizer: chat/pad tokens are special, the reasoning and tool tags are added but not special.

Real reasoning models (Qwen3, the DeepSeek-R1 distills) have ``<think>`` etc. as added, non-special tokens,
so they survive ``decode(..., skip_special_tokens=True)`` (what TRL and our rollout do) and the rewards see
them. The ids must stay the ones the tokenizer always had: cached warm starts depend on them.
"""

from __future__ import annotations

import pytest

from grouprl.builtin.tiny import DEFAULT_CORPUS, EXTRA_TOKENS, SPECIAL_TOKENS, build_tokenizer

CHAT = "<|im_start|>assistant\n<think>4*3=12</think><answer>12</answer><|im_end|><|pad|><|pad|>"


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def reloaded(tok, tmp_path_factory):
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tok")
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def test_token_ids_are_the_fixed_ones(tok):
    # ids 0-3 special, 4-9 the tags, in list order (as when all ten were special tokens)
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + EXTRA_TOKENS] == list(range(10))
    assert tok.pad_token_id == 0 and tok.eos_token_id == 3
    ids = tok(CHAT, add_special_tokens=False)["input_ids"]
    assert ids[0] == 2 and ids[-3:] == [3, 0, 0]
    assert [i for i in ids if i < 10] == [2, 4, 5, 6, 7, 3, 0, 0]  # each tag is one token


def test_tags_are_added_but_not_special(tok):
    flags = {t.content: t.special for t in tok.added_tokens_decoder.values()}
    assert flags == {**dict.fromkeys(SPECIAL_TOKENS, True), **dict.fromkeys(EXTRA_TOKENS, False)}
    assert set(tok.all_special_tokens) == set(SPECIAL_TOKENS)


@pytest.mark.parametrize("which", ["built", "reloaded"])
def test_skip_special_tokens_keeps_the_tags(tok, reloaded, which):
    t = tok if which == "built" else reloaded
    ids = t(CHAT, add_special_tokens=False)["input_ids"]
    assert t.decode(ids, skip_special_tokens=True) == "assistant\n<think>4*3=12</think><answer>12</answer>"
    assert t.decode(ids, skip_special_tokens=False) == CHAT
    calls = t("<tool_call>calculator(expression='3*4')</tool_call><|endoftext|>", add_special_tokens=False)
    assert t.decode(calls["input_ids"], skip_special_tokens=True) == "<tool_call>calculator(expression='3*4')</tool_call>"


def test_reload_keeps_ids_and_flags(tok, reloaded):
    texts = DEFAULT_CORPUS + [CHAT, "Kim has 4 bags. <think>4*3=12, 12+2=14</think>Answer: 14"]
    for text in texts:
        assert reloaded(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    assert {i: (t.content, t.special) for i, t in reloaded.added_tokens_decoder.items()} == {
        i: (t.content, t.special) for i, t in tok.added_tokens_decoder.items()
    }
    assert reloaded.pad_token_id == 0 and reloaded.eos_token_id == 3


def test_ids_match_a_tokenizer_trained_with_all_tags_special():
    """Same vocabulary and merges as training with all ten as trainer special tokens (the old build)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    ref = Tokenizer(models.BPE(unk_token=None))
    ref.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIAL_TOKENS + EXTRA_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    ref.train_from_iterator(DEFAULT_CORPUS, trainer=trainer)
    tok = build_tokenizer(DEFAULT_CORPUS, vocab_size=300)
    assert tok.get_vocab() == ref.get_vocab(with_added_tokens=True)
    for text in DEFAULT_CORPUS + [CHAT]:
        assert tok(text, add_special_tokens=False)["input_ids"] == ref.encode(text).ids
