"""benchmarks/gpu_check.py on a machine without a CUDA GPU: a clear message and a clean exit, no model built."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def test_gpu_check_exits_cleanly_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the check would run for real")
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", "1"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "skipped" and "no CUDA GPU" in result["reason"]
    assert "no CUDA GPU on this machine" in proc.stderr


@pytest.fixture
def gpu_check(monkeypatch):
    """The script as a module, with a CPU-sized workload (2 prompts x 4 samples x 6 tokens per step)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "G", 4)
    monkeypatch.setattr(module, "PROMPTS_PER_STEP", 2)
    monkeypatch.setattr(module, "MAX_NEW_TOKENS", 6)
    return module


def test_gpu_check_children_report_their_figures_on_cpu(gpu_check, tiny_model_dir, monkeypatch):
    """The measuring code of each child runs (on the tiny model, the fake engine for vLLM): the keys it reads
    from metrics.jsonl exist, and the vLLM run reports the mismatch metrics."""
    import fake_vllm

    from grouprl.train.engine import precision

    # the script asks for bf16, meant for a GPU (generation under autocast: the trainer's own sampler); on a CPU
    # with bf16 instructions ``rollout_dtype: auto`` would sample from a bf16 copy instead, so say "no bf16 CPU"
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    hf = gpu_check.run_child("transformers", tiny_model_dir, 1, None)
    assert hf["rollout_tokens_per_s"] > 0 and len(hf["step_time_s"]) == 1
    assert "mismatch/is_weight_mean" not in hf  # the trainer sampled: no correction
    fake_vllm.install(monkeypatch, offset=-0.5)
    colocate = gpu_check.run_child("vllm_colocate", tiny_model_dir, 1, None)
    assert colocate["rollout_tokens_per_s"] > 0
    assert colocate["mismatch/is_weight_mean"] == pytest.approx([2.718281828 ** 0.5], abs=1e-4)
    raw = gpu_check.run_child("raw_vllm", tiny_model_dir, 1, None)
    assert 0 < raw["completion_tokens"] <= 2 * 4 * 6 and raw["rollout_tokens_per_s"] > 0


def test_gpu_check_agent_round_on_cpu(gpu_check, tiny_model_dir, monkeypatch):
    """The multi-turn child on the tiny model with the fake engine scripted to call the calculator: every
    model segment is the engine's ids, masks agree, and the log-prob gap is the engine's offset."""
    import fake_vllm
    from test_vllm_agent import calculator_script
    from transformers import AutoTokenizer

    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import gpu_check_agent

    monkeypatch.setattr(gpu_check_agent, "AGENT_PROMPTS", 2)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    fake_vllm.install(monkeypatch, offset=-0.5, script=calculator_script(tok))
    out = gpu_check.run_child("agent_colocate", tiny_model_dir, 1, None)
    assert out["continuous"] and out["trajectories"] == 2 * 4 and out["end_reasons"] == {"answered": 8}
    assert out["tool_calls_per_traj"] == 1 and out["tool_tokens"] > 0
    assert out["segments_not_engine_ids"] == 0 and out["mask_errors"] == 0
    assert out["logp_gap_mean"] == pytest.approx(0.5, abs=1e-4) and out["rollout_tokens_per_s"] > 0
