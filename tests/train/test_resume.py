"""Exact resume: a run stopped after step k and resumed matches the uninterrupted run."""

from __future__ import annotations

import pytest
import torch
from train_helpers import char_reward, train_records

from grouprl import GRPOTrainer
from grouprl.errors import RewardError

COMPARED = ["reward", "reward_std", "advantage/std", "loss/policy", "grad_norm", "lr", "entropy",
            "policy/ratio_mean", "policy/ratio_max", "completions/mean_length"]


def _config(fast_config, out, **kw):
    # 2 optimizer steps per generation round (steps_per_generation = 2 x GA) -> old log-probs are used and
    # a checkpoint after an odd step lies in the middle of a round.
    return fast_config(output_dir=str(out), max_steps=4, gradient_accumulation_steps=1, steps_per_generation=2,
                       save_strategy="steps", save_steps=1, lr_scheduler_type="cosine", warmup_steps=1, **kw)


def _assert_same(a, b, steps):
    by_step_a = {r["step"]: r for r in a}
    by_step_b = {r["step"]: r for r in b}
    for step in steps:
        for key in COMPARED:
            assert by_step_b[step][key] == pytest.approx(by_step_a[step][key], rel=1e-5, abs=1e-6), (step, key)


class Crash:
    """A reward that works for ``calls`` rounds and then raises: a run that dies mid-training."""

    def __init__(self, calls):
        self.calls, self.__name__ = calls, "char_reward"

    def __call__(self, completions, **kw):
        self.calls -= 1
        if self.calls < 0:
            raise KeyboardInterrupt("simulated kill")
        return char_reward(completions)


def test_resume_matches_uninterrupted_run(tiny_model_dir, train_rows, fast_config, tmp_path):
    full = _config(fast_config, tmp_path / "full")
    t_full = GRPOTrainer(model=str(tiny_model_dir), config=full, train_dataset=train_rows, reward_funcs=char_reward)
    t_full.train()
    reference = train_records(full.output_dir)
    # 2 steps per round: the first is on-policy (ratio 1), the second uses the stored old log-probs
    assert all(r["time/old_logp_forward"] > 0 for r in reference[::2])
    assert reference[0]["policy/ratio_max"] == pytest.approx(1.0, abs=1e-5)
    # 1 warm-up step then cosine over 3: lr_t = 1e-3 * 0.5 * (1 + cos(pi * (t - 1) / 3)) -> 1, 0.75, 0.25
    assert [r["lr"] for r in reference] == pytest.approx([0.0, 1e-3, 0.75e-3, 0.25e-3])
    assert reference[0]["lr"] == 0.0  # warm-up starts at 0, so step 2 still sees ratio 1
    assert reference[3]["policy/ratio_max"] > 1.0 + 1e-4  # step 3 moved the policy before step 4
    final_full = {k: v.clone() for k, v in t_full.model.state_dict().items()}

    # killed while generating the round of step 3: the newest checkpoint is step 2 (a round boundary)
    killed = _config(fast_config, tmp_path / "killed")
    t_kill = GRPOTrainer(model=str(tiny_model_dir), config=killed, train_dataset=train_rows, reward_funcs=Crash(1))
    with pytest.raises((KeyboardInterrupt, RewardError)):
        t_kill.train()
    t_resume = GRPOTrainer(model=str(tiny_model_dir), config=killed, train_dataset=train_rows,
                           reward_funcs=char_reward)
    t_resume.train(resume_from_checkpoint=True)
    resumed = train_records(killed.output_dir)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # metrics.jsonl appended, not rewritten
    _assert_same(reference, resumed, [3, 4])
    for k, v in t_resume.model.state_dict().items():
        torch.testing.assert_close(v, final_full[k], rtol=1e-5, atol=1e-6)

    # resumed from checkpoint-1, in the middle of a generation round (the round is restored, not redrawn)
    mid = _config(fast_config, tmp_path / "mid", resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    t_mid = GRPOTrainer(model=str(tiny_model_dir), config=mid, train_dataset=train_rows, reward_funcs=char_reward)
    t_mid.train()
    _assert_same(reference, train_records(mid.output_dir), [2, 3, 4])


def test_cli_resume_extends_a_finished_run(tiny_model_dir, tmp_path, capsys):
    import json
    from pathlib import Path

    from grouprl.cli import main

    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{i} + 1 =", "answer": str(i + 1)}) for i in range(8)))
    recipe = Path(__file__).parent / "recipes" / "tiny_grpo.yaml"
    args = ["train", "-c", str(recipe), f"model={tiny_model_dir}", f"dataset={data}", f"output_dir={tmp_path / 'o'}",
            "eval_split=null", "save_steps=10"]
    assert main(args) == 0
    assert (tmp_path / "o" / "checkpoint-2").is_dir()  # the last step is always checkpointed
    assert main(args + ["max_steps=3", "--resume"]) == 0
    steps = [r["step"] for r in train_records(tmp_path / "o")]
    assert steps == [1, 2, 3]
    assert "trained 3 steps" in capsys.readouterr().out


def test_checkpoints_are_atomic_and_rotated(tiny_model_dir, train_rows, fast_config, tmp_path):
    from grouprl.train.checkpoint.store import list_checkpoints

    cfg = _config(fast_config, tmp_path / "rot", save_total_limit=2)
    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=char_reward).train()
    names = [p.name for p in list_checkpoints(cfg.output_dir)]
    assert names == ["checkpoint-3", "checkpoint-4"]  # save_steps=1 over 4 steps, limit 2
    assert not list((tmp_path / "rot").glob(".tmp-*"))
    ckpt = tmp_path / "rot" / "checkpoint-3"
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert state["step"] == 3 and state["data"] == {"epoch": 0, "pos": 2 * 2}
    assert state["round_step"] == 1 and state["round"] is not None  # mid-round: the round is saved
    assert {"optimizer", "scheduler", "rng", "round", "round_step"} <= set(state)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(ckpt) is not None  # plain HF format


def test_resume_without_checkpoint_starts_a_fresh_run(tiny_model_dir, train_rows, fast_config, tmp_path, capsys):
    cfg = _config(fast_config, tmp_path / "empty")
    trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=char_reward)
    trainer.train(resume_from_checkpoint=True)  # a run killed before its first save: --resume starts it afresh
    assert "holds no complete checkpoint yet (the run stopped before its first save): starting a fresh run" in \
        capsys.readouterr().out
    assert [r["step"] for r in train_records(cfg.output_dir)] == [1, 2, 3, 4]


def test_lora_resume_restores_the_adapter(tiny_model_dir, train_rows, fast_config, tmp_path):
    def run(out, **kw):
        cfg = fast_config(output_dir=str(out), max_steps=3, use_peft=True, lora_r=4, kl_coef=0.05,
                          save_strategy="steps", save_steps=1, learning_rate=5e-3, **kw)
        trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows,
                              reward_funcs=char_reward)
        trainer.train()
        return trainer, train_records(out)

    full, full_records = run(tmp_path / "full")
    resumed, resumed_records = run(tmp_path / "res", resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    _assert_same(full_records, resumed_records, [2, 3])
    assert [r["step"] for r in resumed_records] == [2, 3]
    for (name, a), b in zip(full.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


def test_a_save_killed_midway_leaves_no_checkpoint_and_resume_takes_the_previous(tiny_model_dir, tmp_path,
                                                                                  monkeypatch):
    from transformers import AutoModelForCausalLM, get_scheduler

    from grouprl.train import checkpoint as ckpt

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = get_scheduler("constant", opt)
    state = {"data": {"epoch": 0, "pos": 0}}
    ckpt.save_checkpoint(tmp_path, 1, model, None, opt, sched, state)

    def killed(*args, **kwargs):  # the weights are on disk, the trainer state is not: the process dies here
        raise KeyboardInterrupt("killed while writing trainer_state.pt")

    monkeypatch.setattr(ckpt.store.torch, "save", killed)  # the writer module (train/checkpoint/store.py)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path, 2, model, None, opt, sched, state)
    monkeypatch.undo()
    assert (tmp_path / ".tmp-checkpoint-2" / "model.safetensors").is_file()  # the partial write...
    assert not (tmp_path / "checkpoint-2").exists()  # ...never carries a checkpoint name
    assert ckpt.resolve_resume(True, tmp_path) == tmp_path / "checkpoint-1"
    ckpt.save_checkpoint(tmp_path, 2, model, None, opt, sched, state)  # the redo replaces the leftover
    assert not (tmp_path / ".tmp-checkpoint-2").exists()
    assert ckpt.resolve_resume(True, tmp_path) == tmp_path / "checkpoint-2"


# SIGKILL of a real `grouprl train` process at ten points of the loop, then `--resume`: test_kill_resume.py


def test_to_device_moves_every_tensor_of_a_saved_round():
    from grouprl.train.algorithms.rounds import Round
    from grouprl.train.checkpoint.store import to_device
    from grouprl.train.engine.step import MicroBatch

    t = torch.ones(2, 3)
    mb = MicroBatch(t, t, t, t, t, torch.ones(2), old_logp=t.clone(), ref_logp=None)
    rnd = to_device(Round([mb, mb], {"reward": 1.0}, [{"prompt": "p"}]), "meta")
    for m in rnd.micro_batches:
        assert all(x.device.type == "meta" for x in (m.prompt_ids, m.prompt_mask, m.completion_ids,
                                                     m.completion_mask, m.loss_mask, m.adv, m.old_logp))
        assert m.ref_logp is None
    assert rnd.metrics == {"reward": 1.0} and rnd.samples == [{"prompt": "p"}]


def test_resume_puts_the_saved_round_on_the_models_device(tiny_model_dir, train_rows, fast_config, tmp_path,
                                                          monkeypatch):
    from grouprl.train import checkpoint as ckpt
    from grouprl.train.engine.model import build_optimizer

    cfg = fast_config(output_dir=str(tmp_path / "dev"), max_steps=1, gradient_accumulation_steps=1,
                      steps_per_generation=2, save_strategy="steps", save_steps=1)  # saved mid-round
    trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=char_reward)
    trainer.train()
    seen = []
    real = ckpt.to_device
    monkeypatch.setattr(ckpt.store, "to_device", lambda obj, device: seen.append(device) or real(obj, device))
    optimizer, scheduler = build_optimizer(trainer.model, cfg, 4)
    state = ckpt.load_checkpoint(tmp_path / "dev" / "checkpoint-1", trainer.model, optimizer, scheduler)
    device = next(trainer.model.parameters()).device
    assert seen and set(seen) == {device}  # a CUDA model gets its round back on CUDA, not on the CPU it was read to
    assert state["round"].micro_batches[0].prompt_ids.device == device
