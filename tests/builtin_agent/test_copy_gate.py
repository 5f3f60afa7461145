"""The calculator warm start's quality gate: the score is the fraction of unseen problems solved greedily
once the model calls (hand-built oracle models), its problems are unseen, and the SFT stops at the first
check that reaches the gate (or runs to its cap and says so)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grouprl.builtin.agent_demos import copy_gate, gate_rows
from grouprl.builtin.sft import sft as _sft
from grouprl.builtin.tiny import build_tokenizer
from grouprl.builtin.warmstart import INFO_FILE, WARMSTARTS, builtin_model_path
from grouprl.data.tasks import generate_rows

SPEC = replace(WARMSTARTS["calculator"], sft_rows=200)


class Oracle(torch.nn.Module):
    """Predicts the next token of its own input (teacher forcing makes that the demonstration), except
    at the positions ``wrong(row, t, ids, length)`` names, where it predicts token 0."""

    def __init__(self, vocab: int, wrong=lambda r, t, ids, n: False):
        super().__init__()
        self.vocab, self.wrong, self.w = vocab, wrong, torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask):
        nxt = torch.roll(input_ids, -1, dims=1)
        for r in range(input_ids.shape[0]):
            n = int(attention_mask[r].sum())
            for t in range(n - 1):
                if self.wrong(r, t, input_ids[r], n):
                    nxt[r, t] = 0
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, self.vocab).float())


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_gate_problems_are_unseen():
    rows = gate_rows(SPEC, n=64)
    sft = {r["key"] for r in generate_rows("calculator", "train", n=SPEC.sft_rows, seed=1000 + SPEC.seed)}
    test = {r["key"] for r in generate_rows("calculator", "test", n=2000, seed=0)}
    assert len(rows) == 64 and not {r["key"] for r in rows} & (sft | test)


def test_score_counts_problems_solved_exactly_after_the_choice_to_call(tok):
    score = copy_gate(SPEC, tok, n=8)
    assert score(Oracle(len(tok))) == 1.0
    (call,) = tok.encode("<tool_call>", add_special_tokens=False)
    # wrong only where it would choose to call: the choice is RL's, not the gate's -> still 1.0
    assert score(Oracle(len(tok), lambda r, t, ids, n: int(ids[t + 1]) == call)) == 1.0
    # rows 0, 3, 5 miscopy the reply's last digit (a row ends "...941<|im_end|>": that digit is token n-2,
    # predicted at n-3) -> 5 of 8 problems solved
    assert score(Oracle(len(tok), lambda r, t, ids, n: r in (0, 3, 5) and t == n - 3)) == 5 / 8
    # every row wrong at its end of turn: nothing solved
    assert score(Oracle(len(tok), lambda r, t, ids, n: t == n - 2)) == 0.0


def test_sft_stops_at_the_first_check_that_reaches_the_gate(tok, capsys):
    spec = replace(SPEC, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, sft_steps=40, gate_every=10,
                   batch_size=4, warmup_steps=1, copy_gate=0.9)
    from grouprl.builtin.agent_demos import conversation_ids, tool_conversation
    from grouprl.builtin.tiny import build_tiny_model

    encoded = [conversation_ids(tok, tool_conversation(r, call=True)) for r in generate_rows("calculator", "train", n=8)]
    scores = iter([0.2, 0.95, 1.0])
    losses, checks = _sft(build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1), encoded,
                          spec, pad_id=tok.pad_token_id, gate=lambda model: next(scores))
    assert len(losses) == 20 and checks == [[10, 0.2], [20, 0.95]]
    assert "SFT step 20 (cap 40), loss" in capsys.readouterr().err
    losses, checks = _sft(build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1), encoded,
                          spec, pad_id=tok.pad_token_id, gate=lambda model: 0.5)
    assert len(losses) == 40 and checks == [[10, 0.5], [20, 0.5], [30, 0.5], [40, 0.5]]
    assert "reached its cap of 40 SFT steps with copy gate 0.50 < 0.90" in capsys.readouterr().err


def test_gated_build_records_its_checks(tmp_path):
    path = builtin_model_path("calculator", cache_dir=tmp_path, hidden_size=32, num_layers=1, num_heads=2,
                              num_kv_heads=1, vocab_size=300, sft_rows=64, sft_steps=6, gate_every=3, batch_size=8,
                              warmup_steps=1)
    info = json.loads((Path(path) / INFO_FILE).read_text())
    assert info["sft_steps_run"] == 6 and [c[0] for c in info["gate"]] == [3, 6] and info["gate_passed"] is False
    assert all(0.0 <= c[1] <= 1.0 for c in info["gate"])


def test_gate_enters_the_cache_key_only_when_set():
    assert WARMSTARTS["calculator"].copy_gate == 0.9
    assert replace(WARMSTARTS["calculator"], copy_gate=0.8).digest() != WARMSTARTS["calculator"].digest()
    assert WARMSTARTS["arithmetic"].digest() == "dbefbc085491"  # fields at their defaults leave old keys alone


def test_a_gate_where_it_cannot_apply_is_a_clear_error(tok):
    from grouprl.builtin.warmstart import _gate

    with pytest.raises(ValueError, match="environment 'calculator' or 'python' \\(got 'judge'\\)"):
        _gate(replace(WARMSTARTS["judge"], copy_gate=0.9), tok)
    with pytest.raises(ValueError, match=r"copy_gate=1.5 .* needs a value in \(0, 1\]"):
        _gate(replace(SPEC, copy_gate=1.5), tok)
