"""Whole training runs with ``rollout_backend: vllm`` on the fake engine: weights pushed once per generation
round (not per optimizer step), and the mismatch metrics logged with the values the engine's offset implies."""

from __future__ import annotations

import json
import math

import fake_vllm
import pytest
import torch

from grouprl import GRPOConfig, GRPOTrainer

ROWS = [{"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(8)]


def _reward(completions, **kwargs):
    return [sum(ch.isalpha() for ch in c) / max(1, len(c)) for c in completions]


def _train(tmp_path, model_dir, **overrides):
    base = dict(output_dir=str(tmp_path / "out"), num_generations=4, per_device_train_batch_size=4,
                gradient_accumulation_steps=2, max_new_tokens=6, max_prompt_length=64, max_steps=2,
                learning_rate=1e-3, progress_bar=False, save_strategy="no", seed=0, eval_split=None,
                rollout_backend="vllm", vllm_sleep=True)
    cfg = GRPOConfig(**(base | overrides))
    trainer = GRPOTrainer(model=str(model_dir), config=cfg, train_dataset=[dict(r) for r in ROWS], reward_funcs=_reward)
    trainer.train()
    with open(f"{cfg.output_dir}/metrics.jsonl") as f:
        return trainer, [r for r in map(json.loads, f) if "reward" in r]


def test_weights_are_pushed_once_per_generation_round(tiny_model_dir, tmp_path, monkeypatch):
    fake_vllm.install(monkeypatch)
    # 2 optimizer steps per round (steps_per_generation = 2 x gradient_accumulation_steps), 4 steps -> 2 rounds
    trainer, records = _train(tmp_path, tiny_model_dir, max_steps=4, steps_per_generation=4)
    kinds = [e[0] for e in fake_vllm.EVENTS if e[0] in ("load_weights", "generate")]
    assert kinds == ["load_weights", "generate", "load_weights", "generate"]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    # the engine holds the weights of the start of the last round, not those after the last update
    engine = dict(fake_vllm.INSTANCES[0].model.hf.named_parameters())
    assert not all(torch.equal(engine[k], p) for k, p in trainer.model.named_parameters())


@pytest.mark.parametrize(("offset", "abs_diff", "w_mean", "w_max"), [
    (0.0, 0.0, 1.0, 1.0),                    # the engine agrees: TIS is the identity
    (-0.5, 0.5, math.exp(0.5), math.exp(0.5)),  # 0.5 nat lower everywhere: weight e^0.5 = 1.649 < cap
    (-1.0, 1.0, 2.0, 2.0),                    # 1 nat lower: e = 2.718 truncated at the cap 2
])
def test_tis_metrics_follow_the_engines_offset(tiny_model_dir, tmp_path, monkeypatch, offset, abs_diff, w_mean, w_max):
    fake_vllm.install(monkeypatch, offset=offset)
    _, records = _train(tmp_path, tiny_model_dir)
    for rec in records:
        assert rec["mismatch/logp_abs_diff"] == pytest.approx(abs_diff, abs=1e-4)
        assert rec["mismatch/is_weight_mean"] == pytest.approx(w_mean, abs=1e-4)
        assert rec["mismatch/is_weight_max"] == pytest.approx(w_max, abs=1e-4)
        assert rec["mismatch/masked_frac"] == 0.0


def test_sequence_mask_drops_every_sequence_of_a_far_off_engine(tiny_model_dir, tmp_path, monkeypatch):
    fake_vllm.install(monkeypatch, offset=-1.0)  # geometric-mean ratio e = 2.718, outside [0.99, 1.01]
    _, records = _train(tmp_path, tiny_model_dir, rollout_correction="mask")
    for rec in records:
        assert rec["mismatch/masked_frac"] == pytest.approx(1.0)
        assert rec["loss/policy"] == 0.0 and rec["grad_norm"] == 0.0


def test_server_mode_run_pushes_once_per_round_over_http(tiny_model_dir, tmp_path, monkeypatch):
    import threading

    from grouprl.cmd.vllm_serve import make_server

    vllm = fake_vllm.install(monkeypatch, offset=-0.5)
    llm = vllm.LLM(model=str(tiny_model_dir))
    server = make_server(llm, vllm, "127.0.0.1", 0, model=str(tiny_model_dir))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _, records = _train(tmp_path, tiny_model_dir, max_steps=4, steps_per_generation=4, vllm_mode="server",
                            vllm_server_url=f"http://127.0.0.1:{server.server_port}", vllm_server_timeout=30.0)
    finally:
        server.shutdown()
        server.server_close()
    kinds = [e[0] for e in fake_vllm.EVENTS if e[0] in ("load_weights", "generate")]
    assert kinds == ["load_weights", "generate", "load_weights", "generate"]
    assert [r["mismatch/is_weight_mean"] for r in records] == pytest.approx([math.exp(0.5)] * 4, abs=1e-4)


def test_vllm_serve_arguments():
    from grouprl.cli import build_parser

    args = build_parser().parse_args(["vllm-serve", "builtin:tiny", "--port", "9001", "--enforce-eager"])
    assert (args.model, args.port, args.enforce_eager, args.gpu_memory_utilization) == ("builtin:tiny", 9001, True, 0.9)


def test_gspo_with_engine_logp_skips_the_old_logp_forward(tiny_model_dir, tmp_path, monkeypatch):
    """The engine's log-probs are old_logp: the trainer's old-log-prob forward is not needed (arXiv 2507.18071)."""
    fake_vllm.install(monkeypatch, offset=-0.5)
    _, records = _train(tmp_path, tiny_model_dir, max_steps=2, steps_per_generation=4, algorithm="gspo",
                        gspo_use_engine_logp=True)
    assert all(r["time/old_logp_forward"] == 0.0 for r in records)
    assert all(r["policy/ratio_mean"] > 1.0 for r in records)  # pi_theta / pi_engine: e^0.5 before any update
    assert not any(k.startswith("mismatch/") for k in records[0])
    _, records = _train(tmp_path / "b", tiny_model_dir, max_steps=2, steps_per_generation=4, algorithm="gspo")
    assert records[1]["time/old_logp_forward"] > 0.0 or records[0]["time/old_logp_forward"] > 0.0
