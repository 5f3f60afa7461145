"""Runs that cannot be lost or mixed: the output_dir lock, resume_from_checkpoint: auto, --resume with no
checkpoint, atomic final/, logs cut back to the checkpoint, config changes on resume, no reward signal."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from train_helpers import TRAIN_ROWS, char_reward, read_metrics, train_records

import grouprl.models as model_loader
import grouprl.train.engine.model as model_mod
from grouprl import GRPOConfig, GRPOTrainer
from grouprl.cli import main
from grouprl.errors import ConfigError, RewardError
from grouprl.run import lock
from grouprl.run.output_dir import decide_resume

RECIPE = Path(__file__).parent / "recipes" / "tiny_grpo.yaml"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the check under test")

    monkeypatch.setattr(model_loader, "load_model", refuse)


def _env():
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)


# ---- 1. one run per output_dir ------------------------------------------------------------------------------
HOLD = ("import sys, time; from grouprl.run import lock; lock.acquire(sys.argv[1]); print('held', flush=True); "
        "time.sleep(120)")


def test_a_second_run_into_a_locked_output_dir_refuses_naming_the_holder(tmp_path, no_model_load, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError) as e:
            lock.acquire(out)
        msg = str(e.value)
        assert f"pid {holder.pid} on " in msg and "running since" in msg and f"(command: -c {out})" in msg
        assert f"kill -INT {holder.pid}" in msg and "another output_dir=<dir>" in msg
        # the CLI refuses before any model loads, in --dry-run too, with that one line
        args = ["train", "-c", str(RECIPE), "model=/nonexistent", f"dataset={tmp_path}", f"output_dir={out}"]
        for extra in ([], ["--dry-run"]):
            capsys.readouterr()
            assert main(args + extra) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"error: output_dir '{out}' is in use by another grouprl run: pid {holder.pid}")
    finally:
        holder.kill()  # SIGKILL: the kernel drops its flock
        holder.wait(timeout=30)
    note = lock.acquire(out)  # a dead holder's lock is taken over
    try:
        assert note and f"from pid {holder.pid}" in note and "no longer running" in note
        assert json.loads((out / ".lock").read_text())["pid"] == os.getpid()
        assert lock.acquire(out) is None  # re-entrant in one process
        lock.release(out)
    finally:
        lock.release(out)
    assert (out / ".lock").read_text() == ""  # released: the holder's record is cleared, the file stays


# ---- 2. Ctrl-C -------------------------------------------------------------------------------------------------
def test_graceful_stop_restores_the_previous_handlers():
    from grouprl.run.signals import GracefulStop

    seen = []
    previous = signal.signal(signal.SIGINT, lambda s, f: seen.append(s))
    try:
        with GracefulStop() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            assert stop.requested == signal.SIGINT  # the first: noted, the run continues
            with pytest.raises(KeyboardInterrupt, match="second SIGINT"):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        assert seen == [signal.SIGINT]  # the caller's handler is back
        assert stop.interrupted(3, "x").exit_code == 130
    finally:
        signal.signal(signal.SIGINT, previous)


def _cli(out, data, *extra):
    code = "import sys; from grouprl.cli import main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-c", code, "train", "-c", str(RECIPE), f"model={extra[0]}", f"dataset={data}",
            f"output_dir={out}", "eval_split=null", "max_steps=8", "max_new_tokens=16", "save_steps=100",
            "learning_rate=1e-2", "reward_funcs=[train_helpers:alpha_fraction]", *extra[1:]]


def test_sigint_saves_a_checkpoint_and_resume_reaches_the_same_weights(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{i} + 1 =", "answer": str(i + 1)}) for i in range(8)))
    subprocess.run(_cli(tmp_path / "full", data, tiny_model_dir), check=True, env=_env(), capture_output=True,
                   timeout=300)
    out = tmp_path / "int"
    proc = subprocess.Popen(_cli(out, data, tiny_model_dir), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # interrupt once step 2 is logged
        if (out / "metrics.jsonl").is_file() and '"step": 2' in (out / "metrics.jsonl").read_text():
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    step = max(r["step"] for r in train_records(out))
    assert 2 <= step < 8 and (out / f"checkpoint-{step}").is_dir()  # save_steps=100: saved because of Ctrl-C
    assert f"stopped after step {step}; checkpoint saved in {out / f'checkpoint-{step}'}" in err
    assert "--resume" in err and not (out / "final").exists()
    subprocess.run(_cli(out, data, tiny_model_dir, "--resume"), check=True, env=_env(), capture_output=True,
                   timeout=300)
    assert [r["step"] for r in train_records(out)] == list(range(1, 9))
    full, resumed = load_file(str(tmp_path / "full" / "final" / "model.safetensors")), \
        load_file(str(out / "final" / "model.safetensors"))
    for k, v in full.items():
        torch.testing.assert_close(resumed[k], v, rtol=1e-5, atol=1e-6)


# ---- 3. SIGKILL at bad moments ---------------------------------------------------------------------------------
def _trainer(model_dir, cfg, rows=None, reward=char_reward, **kw):
    return GRPOTrainer(model=str(model_dir), config=cfg, train_dataset=rows or [dict(r) for r in TRAIN_ROWS],
                       reward_funcs=reward, **kw)


def test_a_kill_during_the_final_save_logs_the_final_evaluation_once(tiny_model_dir, fast_config, tmp_path,
                                                                    monkeypatch):
    from grouprl.train import checkpoint as ckpt

    cfg = fast_config(output_dir=str(tmp_path / "k"), max_steps=2, save_strategy="steps", save_steps=1,
                      eval_before_train=False)
    rows = [dict(r) for r in TRAIN_ROWS]
    real = ckpt.save_final_atomic

    def killed(model, tokenizer, output_dir, step):  # the weights are half written when the process dies
        model_mod.save_final(model, None, Path(output_dir) / ".tmp-final")
        raise KeyboardInterrupt("killed during the final save")

    monkeypatch.setattr(ckpt, "save_final_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        _trainer(tiny_model_dir, cfg, eval_dataset=rows).train()
    assert not (tmp_path / "k" / "final").exists()  # (b) nothing that looks like a finished model
    assert sum("eval/tag" in r for r in read_metrics(cfg.output_dir)) == 1  # "after" was logged...
    samples = (tmp_path / "k" / "samples.jsonl").read_text()
    assert '"eval": "after"' in samples
    monkeypatch.setattr(ckpt, "save_final_atomic", real)
    _trainer(tiny_model_dir, cfg, eval_dataset=rows).train(resume_from_checkpoint=True)
    records = read_metrics(cfg.output_dir)
    assert [r.get("eval/tag") for r in records if "eval/tag" in r] == ["after"]  # (a) ...and is logged once
    assert [r["step"] for r in records if "reward" in r] == [1, 2]
    assert (tmp_path / "k" / "samples.jsonl").read_text() == samples  # its samples too, not repeated
    assert (tmp_path / "k" / "final" / ".complete").read_text().strip() == "2"
    assert not (tmp_path / "k" / ".tmp-final").exists()


def test_final_is_replaced_atomically(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from grouprl.train.checkpoint.store import save_final_atomic

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    save_final_atomic(model, None, tmp_path, 3)
    before = (tmp_path / "final" / "model.safetensors").read_bytes()

    def dies(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(model_mod, "save_final", dies)
    with pytest.raises(KeyboardInterrupt):
        save_final_atomic(model, None, tmp_path, 5)
    assert (tmp_path / "final" / "model.safetensors").read_bytes() == before  # the old final is untouched
    assert (tmp_path / "final" / ".complete").read_text().strip() == "3"


def test_resume_with_no_checkpoint_starts_fresh_before_the_model_loads(tmp_path, no_model_load, capsys):
    out = tmp_path / "new"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "reward": 0.1}\n')  # killed before its first save
    args = ["train", "-c", str(RECIPE), "model=builtin:arithmetic", "dataset=builtin:arithmetic", f"output_dir={out}",
            "--resume"]  # a dry run checks the model folder and the data too: names that need no download
    assert main(args + ["--dry-run"]) == 0
    assert "holds no complete checkpoint yet (the run stopped before its first save): starting a fresh run" in \
        capsys.readouterr().out


# ---- 4. resume_from_checkpoint: auto -------------------------------------------------------------------------
def _folder(root: Path, steps=(), final=None):
    root.mkdir(parents=True, exist_ok=True)
    for s in steps:
        (root / f"checkpoint-{s}").mkdir()
    if final is not None:
        (root / "final").mkdir()
        (root / "final" / ".complete").write_text(f"{final}\n")
    return root


@pytest.mark.parametrize("steps, final, resume, said", [
    ((), None, False, None),                                 # empty: fresh
    ((20, 40), None, True, "holds an unfinished run (newest checkpoint checkpoint-40"),
    ((80, 100), 100, False, "holds a finished run (complete final/): starting afresh, deleting"),
    ((100, 120), 100, True, "unfinished run"),               # finished, extended with --resume, killed
])
def test_auto_resumes_an_unfinished_run_and_restarts_after_a_finished_one(tmp_path, steps, final, resume, said):
    cfg = GRPOConfig(output_dir=str(_folder(tmp_path / "o", steps, final)), resume_from_checkpoint="auto",
                     overwrite_output_dir=True)
    value, note = decide_resume(cfg)
    assert value == resume
    assert (note is None) if said is None else (said in note)


def test_auto_in_the_recipes_continues_then_restarts(tiny_model_dir, tmp_path, capsys):
    for recipe in sorted((REPO / "recipes").glob("*.yaml")):
        text = recipe.read_text()
        assert re.search(r"^resume_from_checkpoint: auto\b", text, re.M), recipe.name
        assert re.search(r"^save_steps: \d+\b", text, re.M), recipe.name  # periodic saves: Ctrl-C/kill lose little
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{i} + 1 =", "answer": str(i + 1)}) for i in range(8)))
    out = tmp_path / "o"
    args = ["train", "-c", str(RECIPE), f"model={tiny_model_dir}", f"dataset={data}", f"output_dir={out}",
            "eval_split=null", "resume_from_checkpoint=auto", "save_steps=2", "max_steps=4"]
    assert main(args + ["max_steps=2"]) == 0  # an interrupted run, as far as the folder shows: no final/
    import shutil

    shutil.rmtree(out / "final")
    capsys.readouterr()
    assert main(args) == 0
    assert "holds an unfinished run (newest checkpoint checkpoint-2, no complete final/): resuming it" in \
        capsys.readouterr().out
    assert [r["step"] for r in train_records(out)] == [1, 2, 3, 4]
    assert main(args) == 0  # finished: start afresh
    said = capsys.readouterr().out
    assert "holds a finished run (complete final/): starting afresh, deleting" in said and "removed" in said
    assert [r["step"] for r in train_records(out)] == [1, 2, 3, 4]


# ---- 5. --resume with a changed config -----------------------------------------------------------------------
@pytest.mark.parametrize("field, value, safe", [
    ("max_steps", 9, True), ("learning_rate", 5e-4, True), ("eval_steps", 3, True), ("save_steps", 7, True),
    ("logging_steps", 2, True), ("report_to", ["tensorboard"], True), ("output_dir", "elsewhere", True),
    ("num_generations", 8, False), ("algorithm", "gspo", False), ("advantage", "rloo", False),
    ("loss_aggregation", "token_mean", False), ("model", "other", False), ("dataset", "other", False),
    ("seed", 1, False), ("per_device_train_batch_size", 16, False), ("max_new_tokens", 9, False),
    ("reward_funcs", ["exact"], False), ("kl_coef", 0.1, False), ("temperature", 0.5, False),
])
def test_resume_config_changes_are_safe_or_refused(field, value, safe):
    from grouprl.run.resume_config import SAFE, compare, config_record

    base = dict(num_generations=4, per_device_train_batch_size=8, model="m", dataset="d", max_steps=4)
    saved = config_record(GRPOConfig(**base))
    ok, bad = compare(saved, GRPOConfig(**{**base, field: value}))
    assert (field in ok) == safe and (field in bad) == (not safe) and (field in SAFE) == safe


def test_resume_applies_a_new_learning_rate_and_records_it(tiny_model_dir, fast_config, tmp_path, capsys):
    kw = dict(output_dir=str(tmp_path / "lr"), save_strategy="steps", save_steps=1, gradient_accumulation_steps=1,
              lr_scheduler_type="constant")
    _trainer(tiny_model_dir, fast_config(max_steps=2, **kw)).train()
    cfg = fast_config(max_steps=4, learning_rate=5e-4, **kw)
    _trainer(tiny_model_dir, cfg).train(resume_from_checkpoint=True)
    assert "resuming with a changed config: max_steps 2 -> 4, learning_rate 0.001 -> 0.0005" in capsys.readouterr().out
    lrs = [r["lr"] for r in train_records(cfg.output_dir)]
    assert lrs == pytest.approx([1e-3, 1e-3, 5e-4, 5e-4])  # the restored optimizer uses the new value
    changes = [json.loads(line) for line in (tmp_path / "lr" / "config_changes.jsonl").read_text().splitlines()]
    assert changes[0]["step"] == 2 and changes[0]["changes"] == {"max_steps": [2, 4], "learning_rate": [1e-3, 5e-4]}
    import yaml

    assert yaml.safe_load((tmp_path / "lr" / "config.yaml").read_text())["learning_rate"] == 5e-4  # in effect


def test_resume_with_a_changed_num_generations_is_refused_before_the_model_loads(tmp_path, no_model_load, capsys):
    out = tmp_path / "o"
    (out / "checkpoint-2").mkdir(parents=True)
    saved = GRPOConfig.from_yaml(str(RECIPE), ["model=/nonexistent", f"dataset={tmp_path}", f"output_dir={out}"])
    from grouprl.run.resume_config import config_record

    (out / "checkpoint-2" / "trainer_state.json").write_text(json.dumps({"step": 2, "config": config_record(saved)}))
    (out / "config.yaml").write_text("kept: as is\n")
    args = ["train", "-c", str(RECIPE), "model=/nonexistent", f"dataset={tmp_path}", f"output_dir={out}",
            "num_generations=2", "per_device_train_batch_size=2", "--resume"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "cannot resume from" in err and "num_generations: 4 -> 2" in err and "batch arithmetic" in err
    assert (out / "config.yaml").read_text() == "kept: as is\n"  # no config written that is not in effect


# ---- 6. no reward signal --------------------------------------------------------------------------------------
def nothing(completions, **kw):
    return [None] * len(completions)


def test_all_none_rewards_stop_after_three_rounds(tiny_model_dir, fast_config, tmp_path, capsys):
    cfg = fast_config(output_dir=str(tmp_path / "none"), max_steps=10)
    with pytest.raises(RewardError, match=r"first 3 generation rounds: reward function 'nothing' returned None"):
        _trainer(tiny_model_dir, cfg, reward=nothing).train()
    assert [r["step"] for r in train_records(cfg.output_dir)] == [1, 2]  # stopped at the third round
    assert "no sample of the first round has a reward" in capsys.readouterr().err


def test_a_dataset_without_answer_warns_before_the_model_loads(fast_config, tmp_path, capsys, no_model_load):
    rows = [{"prompt": r["prompt"]} for r in TRAIN_ROWS]
    with pytest.raises(ConfigError):  # the model path does not exist: everything before it has run
        GRPOTrainer(model=str(tmp_path / "missing"), config=fast_config(), train_dataset=rows,
                    reward_funcs=["accuracy"])
    err = capsys.readouterr().err
    assert "reward function 'accuracy' reads the column `answer` / `ground_truth` / `solution`, which is not in the dataset" in err
    from grouprl.run.reward_signal import missing_reward_columns

    assert missing_reward_columns(["code"], [{"prompt": "p", "tests": None}])[0].startswith(
        "reward function 'code' reads the column `tests` / `test` / `test_list`, which is null in every row")
    assert missing_reward_columns(["accuracy", "code"], [dict(r) for r in TRAIN_ROWS]) == [
        missing_reward_columns(["code"], [{"prompt": "p"}])[0]]


def test_an_output_dir_that_is_a_file_is_one_clear_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"output_dir '.*file' cannot be used: .*Fix: give output_dir"):
        lock.acquire(tmp_path / "file")
