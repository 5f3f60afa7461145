"""DPO runs keep ``report.html`` up to date as GRPO runs do, and stop on Ctrl-C with GRPO's message."""

from __future__ import annotations

import os
import signal

from dpo_helpers import write_pairs

import grouprl.train.algorithms.dpo as dpo_mod
from grouprl.cli import main


def _args(model_dir, tmp_path, *extra):
    data = write_pairs(tmp_path / "data")
    return ["train", f"model={model_dir}", f"dataset={data}", f"output_dir={tmp_path / 'run'}", "algorithm=dpo",
            "max_steps=3", "per_device_train_batch_size=2", "gradient_accumulation_steps=2", "max_new_tokens=8",
            "learning_rate=1e-3", "progress_bar=false", "eval_batch_size=3", *extra]


def test_a_dpo_run_writes_report_html_at_checkpoints_evaluations_and_the_end(tiny_model_dir, tmp_path, capsys,
                                                                             monkeypatch):
    from grouprl.run import reporting

    refreshed = []
    inner = reporting.refresh
    monkeypatch.setattr(reporting, "refresh", lambda *a, **k: refreshed.append(1) or inner(*a, **k))
    assert main(_args(tiny_model_dir, tmp_path, "save_steps=2")) == 0
    out = tmp_path / "run"
    # evaluations before and after, checkpoints 2 and 3, and the end of the run
    assert len(refreshed) == 5
    assert (out / "report.html").is_file() and (out / "run_meta.json").is_file()
    assert "loss" in (out / "report.html").read_text()
    assert f"report:       {out / 'report.html'}" in capsys.readouterr().out


def test_ctrl_c_in_a_dpo_run_saves_and_prints_how_to_resume(tiny_model_dir, tmp_path, capsys, monkeypatch):
    inner, calls = dpo_mod.dpo_step, []

    def step_then_sigint(*a, **k):  # Ctrl-C arrives during the second optimizer step
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return inner(*a, **k)

    monkeypatch.setattr(dpo_mod, "dpo_step", step_then_sigint)
    args = _args(tiny_model_dir, tmp_path, "save_steps=100", "eval_split=null")
    assert main(args) == 130  # 128 + SIGINT, as GRPO runs
    out = tmp_path / "run"
    err = capsys.readouterr().err
    assert f"grouprl: stopped after step 2; checkpoint saved in {out / 'checkpoint-2'}. Continue with: " in err
    assert err.rstrip().endswith(f"{' '.join(['grouprl train', *args[1:]])} --resume")
    assert (out / "checkpoint-2").is_dir() and not (out / "final").exists() and len(calls) == 2
