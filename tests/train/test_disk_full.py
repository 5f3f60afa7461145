"""A full disk (ENOSPC, simulated) during any save: the last good checkpoint and final/ stay intact, no partial
copy is left behind, and the run ends in one line that says so (exit code 2 at the command line)."""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import grouprl.train.checkpoint.store as ckpt
import grouprl.train.engine.model as model_mod
from grouprl.cli import main
from grouprl.errors import SaveError


def enospc(path="weights"):
    return OSError(errno.ENOSPC, "No space left on device", str(path))


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def parts(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return model, tok, opt, sched


def test_a_checkpoint_that_hits_a_full_disk_leaves_the_last_one_intact(tmp_path, parts, monkeypatch):
    model, tok, opt, sched = parts
    good = ckpt.save_checkpoint(tmp_path, 4, model, tok, opt, sched, {"data": 1})
    before = digest(good)
    real_save = torch.save

    def full(obj, f, *a, **k):
        real_save(obj, f, *a, **k)  # half a file, then the disk is full
        Path(f).write_bytes(Path(f).read_bytes()[:100])
        raise enospc(f)

    monkeypatch.setattr(ckpt.torch, "save", full)
    with pytest.raises(SaveError) as e:
        ckpt.save_checkpoint(tmp_path, 8, model, tok, opt, sched, {"data": 2}, total_limit=1)
    msg = str(e.value)
    assert "could not save checkpoint-8" in msg and "No space left on device" in msg
    assert "checkpoint-4 is intact" in msg and "free disk space" in msg and "--resume" in msg
    assert "\n" not in msg
    assert digest(good) == before  # the retention limit was not applied either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4"]  # no .tmp-checkpoint-8
    assert ckpt.latest_checkpoint(tmp_path) == good


def test_a_final_save_that_hits_a_full_disk_keeps_the_earlier_final(tmp_path, parts, monkeypatch):
    model, tok, _, _ = parts
    ckpt.save_final_atomic(model, tok, tmp_path, 10)
    before = digest(tmp_path / "final")
    real = model_mod.save_final

    def full(model, tok, out, **kw):
        real(model, tok, out, **kw)
        (Path(out) / "model.safetensors").write_bytes(b"trunc")
        raise enospc(Path(out) / "model.safetensors")

    monkeypatch.setattr(model_mod, "save_final", full)
    with pytest.raises(SaveError, match=r"could not save final/ .*final/ is intact"):
        ckpt.save_final_atomic(model, tok, tmp_path, 20)
    assert digest(tmp_path / "final") == before and (tmp_path / "final" / ".complete").read_text() == "10\n"
    assert not (tmp_path / ".tmp-final").exists() and not (tmp_path / ".old-final").exists()


def test_an_error_that_is_not_a_write_is_not_dressed_up_as_one(tmp_path, parts, monkeypatch):
    model, tok, opt, sched = parts

    def broken(*a, **k):
        raise RuntimeError("an unrelated bug")

    monkeypatch.setattr(ckpt.torch, "save", broken)
    with pytest.raises(RuntimeError, match="an unrelated bug"):
        ckpt.save_checkpoint(tmp_path, 1, model, tok, opt, sched, {})


def test_a_full_disk_at_the_end_of_a_run_is_one_line_and_exit_code_2(tmp_path, tiny_model_dir, monkeypatch, capsys):
    real = model_mod.save_final

    def full(model, tok, out, **kw):
        real(model, tok, out, **kw)
        raise enospc(Path(out) / "model.safetensors")

    monkeypatch.setattr(model_mod, "save_final", full)
    out = tmp_path / "run"
    rc = main(["train", f"model={tiny_model_dir}", "dataset=builtin:arithmetic", "max_steps=2", "save_steps=1",
               "num_generations=2", "per_device_train_batch_size=2", "max_new_tokens=4", "eval_before_train=false",
               "max_eval_samples=2", "report_to=none", "progress_bar=false", f"output_dir={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith("error: could not save final/") and "checkpoint-2 is intact" in err[-1]
    assert (out / "checkpoint-2" / "trainer_state.pt").is_file() and not (out / ".tmp-final").exists()
    assert (out / "report.html").is_file()
