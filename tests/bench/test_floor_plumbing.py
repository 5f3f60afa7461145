"""Plumbing of ``benchmarks/floor.py`` on a very small setting (no timing asserts): the plain-PyTorch
phases do the stated work and the JSON has the shape the README table is built from."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import floor  # noqa: E402
from _common import GRPO  # noqa: E402

torch = pytest.importorskip("torch")
W = replace(GRPO, max_new_tokens=4, threads=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(floor.make_model(tmp_path_factory.mktemp("floor") / "m", 32, 1, None))


def test_measure_floor_json_shape(model_dir):
    out = floor.measure_floor(model_dir, W, repeats=1)
    assert set(out["floor_s"]) == set(floor.PHASES)
    for phase, seconds in out["floor_s"].items():
        timed = [v for v in out["candidates_s"][phase].values() if isinstance(v, float)]
        assert seconds == min(timed) > 0  # the floor is the fastest candidate
    assert out["sequences"] == W.prompts_per_step * W.num_generations == 16
    assert out["completion_tokens"] == 4
    assert out["pad_tokens"] == 0  # the workload's prompts all have one length: the batch is unpadded


def test_decoders_produce_exactly_T_tokens_and_agree(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.generation_config.eos_token_id = None
    ids, mask = floor.prompt_batch(tok, W)
    a = floor.decode_loop(model, ids, mask, 5)
    b = floor.decode_shared_prefix(model, ids, mask, 5, W.num_generations)
    assert a.shape == (16, ids.shape[1] + 5)
    assert torch.equal(a, b)  # greedy: prefilling each prompt once changes nothing


def test_completion_logp_matches_full_logits(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    seq = torch.randint(0, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        lp = floor.completion_logp(model, seq, 3)
        full = torch.log_softmax(model(input_ids=seq).logits.float(), -1)
    expected = full[:, -4:-1].gather(-1, seq[:, -3:, None]).squeeze(-1)
    assert torch.allclose(lp, expected, atol=1e-5)


def test_compare_and_markdown():
    floor_result = {"floor_s": {"generate": 0.5, "policy_fwd_bwd": 0.2, "ref_logp": 0.1}}
    runs = [{"ok": True, "breakdown_s_per_step": {"generate": 0.4, "policy_fwd_bwd": 0.3, "ref_logp": 0.1}}]
    out = floor.compare(floor_result, runs)
    assert out["phases"]["generate"]["ratio"] == pytest.approx(0.8)
    assert out["phases"]["policy_fwd_bwd"]["ratio"] == pytest.approx(1.5)
    assert out["phases"]["policy_fwd_bwd"]["within_1_3x"] is False
    assert out["phases"]["ref_logp"]["within_1_3x"] is True
    failed = floor.compare(floor_result, [{"ok": False, "log_tail": "boom"}])
    assert failed["phases"]["generate"]["grouprl_s"] is None and failed["grouprl_errors"] == ["boom"]
    out.update(model={"parameters": 1000})
    table = floor.markdown({"sizes": {"tiny": out}})
    assert "| tiny | 0.00M | policy_fwd_bwd | 200.0 | 300.0 | 1.50x | False |" in table
