"""benchmarks/copy_gate_parts.py: the call and the answer copy scored apart (hand-built oracle models)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from copy_gate_parts import _Stop, parts_gate  # noqa: E402

from grouprl.builtin.tiny import build_tokenizer  # noqa: E402
from grouprl.builtin.warmstart import WARMSTARTS  # noqa: E402

SPEC = replace(WARMSTARTS["calculator"], sft_rows=200, gate_every=100)


class Oracle(torch.nn.Module):
    """Predicts the next token of its input (under teacher forcing: the demonstration), except token 0 at
    the positions ``t`` (predicting token t + 1) that ``wrong(t, n)`` names; ``n`` is the sequence length."""

    def __init__(self, vocab: int, wrong=lambda t, n: False):
        super().__init__()
        self.vocab, self.wrong, self.w = vocab, wrong, torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None):  # the gate's batch is padded, the parts' rows are not
        nxt = torch.roll(input_ids, -1, dims=1)
        for r in range(input_ids.shape[0]):
            n = int(attention_mask[r].sum()) if attention_mask is not None else input_ids.shape[1]
            self.row = input_ids[r, :n].tolist()
            for t in range(n - 1):
                if self.wrong(t, n):
                    nxt[r, t] = 0
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, self.vocab).float())


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_each_copy_is_scored_apart_and_the_gate_score_is_the_real_one(tok, tmp_path):
    log: list = []
    gate = parts_gate(SPEC, tok, log, tmp_path / "parts.json", stop=0)
    assert gate(Oracle(len(tok))) == 1.0
    assert log[-1]["step"] == 100 and log[-1]["call_ok"] == 1.0 and log[-1]["answer_ok"] == 1.0
    # the answer's last digit (token n-2, predicted at n-3) wrong everywhere: calls right, no answer right
    assert gate(Oracle(len(tok), lambda t, n: t == n - 3)) == 0.0
    assert log[-1]["step"] == 200 and log[-1]["call_ok"] == 1.0 and log[-1]["answer_ok"] == 0.0
    errors = log[-1]["first_errors"]  # "answer: '<the last digit>' -> '<token 0>'", commonest first, 64 in all
    pad = tok.decode([0])
    assert all(key.startswith("answer: '") and key.endswith(f"' -> '{pad}'") for key, _ in errors)
    assert [c for _, c in errors] == sorted((c for _, c in errors), reverse=True) and len(errors) <= 8
    example = log[-1]["example"]  # teacher-forced: the row's own tokens, token 0 for its last digit
    assert example["teacher_forced"].endswith(pad + "<|im_end|>") and example["target"].endswith("<|im_end|>")
    assert (tmp_path / "parts.json").exists()


def test_a_wrong_call_counts_against_the_call_only(tok):
    log: list = []
    gate = parts_gate(SPEC, tok, log, None, stop=0)
    (call,) = tok.encode("<tool_call>", add_special_tokens=False)
    # wrong at the token after "<tool_call>" in every problem (the call's second trained token)
    model = Oracle(len(tok))
    model.wrong = lambda t, n: t == model.row.index(call)
    assert gate(model) == 0.0
    assert log[-1]["call_ok"] == 0.0 and log[-1]["answer_ok"] == 1.0


def test_it_stops_after_the_check_at_its_stop_step(tok):
    log: list = []
    gate = parts_gate(SPEC, tok, log, None, stop=200)
    gate(Oracle(len(tok)))
    with pytest.raises(_Stop):
        gate(Oracle(len(tok)))
    assert [r["step"] for r in log] == [100, 200]
