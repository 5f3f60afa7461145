"""The code-repair warm start's options: the name hint of the first edit and the skill gate of the SFT."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from grouprl.builtin import code_demos
from grouprl.builtin.agent_demos import argmax_gate, conversation_ids
from grouprl.builtin.tiny import build_tokenizer
from grouprl.builtin.warmstart import WARMSTARTS
from grouprl.data.code_repair import FUNCTIONS
from grouprl.data.tasks import generate_rows


def _first_ops(spec, n=1500):
    examples, _ = code_demos.demo_examples(replace(spec, sft_rows=n))
    rows = generate_rows("code_repair", "train", n=n, seed=1000 + spec.seed)
    out = []
    for row, (messages, _) in zip(rows, examples):
        edit = next(m["content"] for m in messages if m["role"] == "assistant" and "edit(" in m["content"])
        new = edit.split('new="')[1].split('"')[0].split()
        out.append((row["work"]["name"], new[1], row["work"]["op"]))
    return out


def test_hint_zero_leaves_the_demonstrations_as_they_were():
    spec = replace(WARMSTARTS["code_repair"], hint=0.0)
    a, _ = code_demos.demo_examples(replace(spec, sft_rows=200))
    rng = random.Random(f"repair|{spec.seed}")  # the demonstrations before the option: no draw for the hint
    rows = generate_rows("code_repair", "train", n=200, seed=1000)
    env = code_demos.demo_env_class()()
    b = [code_demos.repair_conversation(r, rng, give_up=spec.noise, env=env) for r in rows]
    assert [m for m, _ in a] == b
    assert replace(spec, hint=0.25).digest() != spec.digest()
    # a spec without the later fields keeps the cache key it had before they existed (the old built-in's)
    old = replace(WARMSTARTS["code_repair"], hint=0.0, copy_gate=0.0, sft_steps=500)
    assert old.digest() == "f5edeb06e6b4"


@pytest.mark.parametrize("hint", [0.25, 1.0])
def test_hint_makes_the_first_edit_depend_on_the_name(hint):
    ops = _first_ops(replace(WARMSTARTS["code_repair"], hint=hint))
    right = sum(op == want for _, op, want in ops) / len(ops)
    # P(right) = hint + (1 - hint) / 3: 0.5 for 0.25 (sd of the mean over 1500 rows: 0.013), 1 for 1
    assert abs(right - (hint + (1 - hint) / 3)) < (0.04 if hint < 1 else 1e-9)
    for name in FUNCTIONS:  # per name too, not only on average
        mine = [op == want for n, op, want in ops if n == name]
        assert abs(sum(mine) / len(mine) - (hint + (1 - hint) / 3)) < (0.13 if hint < 1 else 1e-9)


def _retrying(tok):
    rows = generate_rows("code_repair", "train", n=40, seed=7)
    for row in rows:
        messages = code_demos.repair_conversation(row, random.Random(3), give_up=0.0)
        if sum("edit(" in m["content"] for m in messages if m["role"] == "assistant") >= 2:
            ids, mask = conversation_ids(tok, messages, code_demos.repair_tools())
            return messages, ids, mask
    raise AssertionError("no retrying demonstration among 40 rows")


def test_skill_flags_leave_out_exactly_the_policy_tokens():
    tok = build_tokenizer()
    messages, ids, mask = _retrying(tok)
    flags = code_demos._skill_flags(tok, messages, ids, mask)
    assert all(f <= m for f, m in zip(flags, mask))
    policy = tok.decode([t for t, f, m in zip(ids, flags, mask) if m and not f])
    edits = [m["content"] for m in messages if m["role"] == "assistant" and "edit(" in m["content"]]
    ops = "".join(" " + e.split('new="')[1].split('"')[0].split()[1] for e in edits)
    retries = len(edits) - 1  # each edit after a failed run: its first token, the choice to go on
    # the default tokenizer splits " op" into the space and the operator's characters: all left out, nothing else
    assert policy.replace("<tool_call>", "", retries) == ops, policy
    trained = tok.decode([t for t, f in zip(ids, flags) if f])
    assert trained.count('old="') == len(edits) and trained.endswith("Done.<|im_end|>")


class _Oracle(torch.nn.Module):
    """A "model" whose next-token argmax is the given sequence's next token, except at ``wrong`` positions."""

    def __init__(self, vocab, wrong=()):
        super().__init__()
        self.vocab, self.wrong = vocab, set(wrong)

    def forward(self, input_ids, attention_mask=None):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        for r in range(input_ids.shape[0]):
            for j in range(input_ids.shape[1] - 1):
                nxt = int(input_ids[r, j + 1])
                logits[r, j, (nxt + 1) % self.vocab if (r, j + 1) in self.wrong else nxt] = 1.0
        return type("Out", (), {"logits": logits})()


def test_argmax_gate_counts_rows_whose_checked_tokens_are_all_argmax():
    tok = build_tokenizer()
    messages, ids, mask = _retrying(tok)
    flags = code_demos._skill_flags(tok, messages, ids, mask)
    rows = [(ids, flags)] * 4
    vocab = len(tok)
    assert argmax_gate(tok, rows)(_Oracle(vocab)) == 1.0
    skill = next(j for j, f in enumerate(flags) if f)
    policy = next(j for j, (f, m) in enumerate(zip(flags, mask)) if m and not f)
    untrained = mask.index(0, 1)
    # a wrong argmax on a skill token fails its row; on a policy or untrained token it does not
    assert argmax_gate(tok, rows)(_Oracle(vocab, [(1, skill), (3, skill)])) == 0.5
    assert argmax_gate(tok, rows)(_Oracle(vocab, [(0, policy), (2, untrained)])) == 1.0


def test_repair_gate_scores_a_build():
    from grouprl.builtin.warmstart import _demos, _gate, _tiny_model

    spec = replace(WARMSTARTS["code_repair"], hidden_size=32, num_layers=1, num_heads=2,
                   num_kv_heads=1, vocab_size=300, sft_rows=48)
    tok = _demos("python").demo_tokenizer(replace(spec, sft_rows=48))
    score = _gate(spec, tok)
    assert score(_tiny_model(spec, tok, 0)) == 0.0  # an untrained model copies nothing
    with pytest.raises(ValueError, match="'calculator' or 'python'"):
        _gate(replace(spec, environment="search"), tok)


def test_the_sft_trains_on_the_tokenizer_the_checkpoint_loads(tmp_path):
    """AutoTokenizer gives a qwen2 checkpoint Qwen2Tokenizer, whose pre-tokenizer splits runs of spaces unlike the
    tokenizer the build trains: the build's SFT uses the loaded one (grouprl.builtin.tiny.loaded_tokenizer), so a
    rollout sees the ids the warm start learned."""
    from transformers import AutoTokenizer

    from grouprl.builtin.tiny import loaded_tokenizer
    from grouprl.builtin.warmstart import _tiny_model, builtin_model_path

    tiny = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, sft_rows=48, sft_steps=3,
                batch_size=8, warmup_steps=1, copy_gate=0.0)
    spec = replace(WARMSTARTS["code_repair"], **tiny)
    loaded = AutoTokenizer.from_pretrained(builtin_model_path("code_repair", cache_dir=tmp_path, **tiny))
    raw = code_demos.demo_tokenizer(spec)
    built = loaded_tokenizer(raw, _tiny_model(spec, raw, 0))
    conversations, _ = code_demos.demo_examples(replace(spec, sft_rows=20))
    # why: the build's own tokenizer is not what loads (the view's indented lines)
    assert sum(conversation_ids(raw, m, t) != conversation_ids(loaded, m, t) for m, t in conversations) >= 10
    assert all(conversation_ids(built, m, t) == conversation_ids(loaded, m, t) for m, t in conversations)
    assert type(built).__name__ == type(loaded).__name__ == "Qwen2Tokenizer"
