"""Asynchronous GRPO driving a vLLM server (``vllm_mode: server``) from the rollout worker, on the fake
engine: the worker pushes each weight version into the server through the engine interface before the
round it samples, the server's own log-probs are the behaviour log-probs, and the trainer's evaluation
does not touch the server's weights."""

from __future__ import annotations

import json
import math
import threading

import fake_vllm
import pytest

from grouprl import GRPOConfig, GRPOTrainer

ROWS = [{"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(8)]


def letters(completions, **kwargs):
    return [sum(ch.isalpha() for ch in c) / max(1, len(c)) for c in completions]


def test_the_worker_drives_a_vllm_server_one_push_per_new_version(tiny_model_dir, tmp_path, monkeypatch):
    from grouprl.cmd.vllm_serve import make_server

    vllm = fake_vllm.install(monkeypatch, offset=-0.5)  # the server's log-probs 0.5 nat below its copy's
    llm = vllm.LLM(model=str(tiny_model_dir))
    server = make_server(llm, vllm, "127.0.0.1", 0, model=str(tiny_model_dir))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = GRPOConfig(output_dir=str(tmp_path / "out"), num_generations=4, per_device_train_batch_size=4,
                     gradient_accumulation_steps=2, max_new_tokens=6, max_prompt_length=64, max_steps=4,
                     learning_rate=1e-3, progress_bar=False, save_strategy="no", seed=0, eval_split="train",
                     eval_steps=2, max_eval_samples=2, rollout_backend="vllm", vllm_mode="server",
                     vllm_server_url=f"http://127.0.0.1:{server.server_port}", vllm_server_timeout=30.0,
                     max_staleness=1, async_timeout_s=60)
    try:
        GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=[dict(r) for r in ROWS],
                    eval_dataset=[dict(r) for r in ROWS], reward_funcs=letters).train()
    finally:
        server.shutdown()
        server.server_close()
    recs = [r for r in map(json.loads, open(f"{cfg.output_dir}/metrics.jsonl")) if "reward" in r]
    assert [r["async/policy_version"] for r in recs] == [0, 0, 1, 2]
    kinds = [e[0] for e in fake_vllm.EVENTS if e[0] in ("load_weights", "generate")]
    # versions 0 (rounds 0 and 1), 1, 2: one push each, before its first round; evaluations never push
    assert kinds == ["load_weights", "generate", "generate", "load_weights", "generate", "load_weights", "generate"]
    # the first round: same weights on both sides, so the weight is exactly the engine's offset e^0.5
    assert recs[0]["mismatch/is_weight_mean"] == pytest.approx(math.exp(0.5), abs=1e-4)
    assert all(r["async/staleness_max"] <= 1 for r in recs)
