"""The gated warm start's restart rule: an SFT attempt whose copy gate is still ~0 at ``gate_restart_after``
is a plateau and starts again from a new initialisation (fake gate sequences, a 1-layer model, seconds)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from grouprl.builtin.agent_demos import conversation_ids, tool_conversation
from grouprl.builtin.sft import plateaued
from grouprl.builtin.tiny import build_tokenizer
from grouprl.builtin.warmstart import WARMSTARTS, _gate, _tiny_model, _train
from grouprl.data.tasks import generate_rows

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, batch_size=4, warmup_steps=1)
SPEC = replace(WARMSTARTS["calculator"], sft_rows=200, sft_steps=40, gate_every=10, gate_restart_after=20, **SMALL)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def encoded(tok):
    return [conversation_ids(tok, tool_conversation(r, call=True)) for r in generate_rows("calculator", "train", n=8)]


def fake_gate(scores):
    """A gate that returns ``scores`` in order, whatever the model (one per check, across attempts)."""
    it = iter(scores)
    return lambda model: next(it)


def test_the_rule_fires_only_at_its_step_and_only_below_its_threshold():
    spec = replace(SPEC, gate_restart_after=1500, gate_restart_below=0.05)
    assert plateaued([[100, 0.0], [1500, 0.0]], spec)
    assert plateaued([[1500, 0.03]], spec)  # 2 of 64 problems: still the plateau
    assert not plateaued([[1500, 0.0625]], spec)  # 4 of 64: the transition has begun, keep going
    assert not plateaued([[1400, 0.0]], spec)  # before its step: seed 0 sat at 0.00 until step 800
    assert not plateaued([[1500, 0.0], [1600, 0.0]], spec)  # after it: one decision per attempt
    assert not plateaued([], spec)
    assert not plateaued([[1500, 0.0]], replace(spec, gate_restart_after=0))  # 0: never


def test_a_plateau_restarts_from_a_new_seed_and_the_next_attempt_can_pass(tok, encoded, capsys):
    model = _tiny_model(SPEC, tok, SPEC.seed)
    # attempt 1: 0.00 at 10 and at 20 (the restart step) -> restart; attempt 2: 0.00, then 0.95 at 20 -> passes
    out, losses, checks, attempts = _train(model, tok, encoded, SPEC, fake_gate([0.0, 0.0, 0.0, 0.95]))
    assert [a["seed"] for a in attempts] == [0, 1000] and [a["steps"] for a in attempts] == [20, 20]
    assert attempts[0]["checks"] == [[10, 0.0], [20, 0.0]] and checks == [[10, 0.0], [20, 0.95]] and len(losses) == 20
    assert out is not model  # the passing model is the new initialisation
    assert "copy gate still 0.00 < 0.05 at SFT step 20: a plateau; restarting the SFT from a new " \
           "initialisation (seed 1000, attempt 2 of 3)" in capsys.readouterr().err


def test_the_last_attempt_runs_to_the_cap_and_warns(tok, encoded, capsys):
    spec = replace(SPEC, gate_attempts=2, seed=7)
    _, losses, checks, attempts = _train(_tiny_model(spec, tok, 7), tok, encoded, spec, fake_gate([0.0] * 6))
    assert [a["seed"] for a in attempts] == [7, 1007] and [a["steps"] for a in attempts] == [20, 40]
    assert checks == [[10, 0.0], [20, 0.0], [30, 0.0], [40, 0.0]] and len(losses) == 40
    err = capsys.readouterr().err
    assert err.count("restarting the SFT") == 1 and "reached its cap of 40 SFT steps with copy gate 0.00" in err


def test_a_build_that_passes_before_the_restart_step_is_unchanged_by_the_rule(tok, encoded):
    weights = []
    for restart in (20, 0):
        spec = replace(SPEC, gate_restart_after=restart)
        model, losses, checks, attempts = _train(_tiny_model(spec, tok, 0), tok, encoded, spec, fake_gate([0.5, 0.95]))
        assert checks == [[10, 0.5], [20, 0.95]] and len(attempts) == 1
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(weights[0], weights[1])


def test_an_ungated_build_never_restarts(tok, encoded):
    spec = replace(SPEC, copy_gate=0.0, sft_steps=5)
    _, losses, checks, attempts = _train(_tiny_model(spec, tok, 0), tok, encoded, spec, None)
    assert len(losses) == 5 and checks == [] and attempts == [{"seed": 0, "steps": 5, "checks": []}]


def test_a_restart_step_the_gate_never_checks_is_a_clear_error(tok):
    with pytest.raises(ValueError, match="gate_restart_after=25 .* multiple of gate_every=10"):
        _gate(replace(SPEC, gate_restart_after=25), tok)
    with pytest.raises(ValueError, match="gate_attempts >= 1"):
        _gate(replace(SPEC, gate_attempts=0), tok)


def test_the_rule_enters_the_cache_key_only_when_set():
    calc = WARMSTARTS["calculator"]
    assert calc.gate_restart_after == 1500 and calc.gate_attempts == 3
    assert replace(calc, gate_restart_after=0).digest() != calc.digest()
    assert WARMSTARTS["arithmetic"].digest() == "dbefbc085491"  # defaults leave the other builds' keys alone
