"""Ordinary mistakes end in one line naming the value and the fix, in ``grouprl train --dry-run`` (the same
checks a real run makes before loading weights), exit code 2, in about a second, and load no model."""

from __future__ import annotations

import importlib.metadata
import json
import os
import time

import pytest

import grouprl.models as model_loader
from grouprl.cli import main


def _vllm_installed() -> bool:
    try:
        importlib.metadata.version("vllm")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


ROOT = os.geteuid() == 0
VLLM = _vllm_installed()
BASE = ["num_generations=4", "per_device_train_batch_size=4"]

# (overrides, fragment of the one-line error); {tmp} is a folder with the files built by `files` below
TABLE = [
    (["output_dir={tmp}/afile"], "output_dir='{tmp}/afile' is a file, not a folder. Fix: set output_dir="),
    (["output_dir={tmp}/afile/sub"], "output_dir='{tmp}/afile/sub' cannot be created: '{tmp}/afile' is a file."),
    (["output_dir=/proc/grouprl-out/run"], "output_dir='/proc/grouprl-out/run' cannot be created"),
    pytest.param(["output_dir={tmp}/readonly"], "output_dir='{tmp}/readonly' is read-only",
                 marks=pytest.mark.skipif(ROOT, reason="root writes into a chmod 555 folder")),
    (["dataset={tmp}/latin1.jsonl"], "latin1.jsonl': line 2 is not UTF-8 (byte 0xe9 at column 16)"),
    (["dataset={tmp}/roles.jsonl"], "row 1, column 'prompt': message 0 has the unknown role 'usr'; chat templates "
                                    "know system, user, assistant, tool. Did you mean 'user'?"),
    (["seed=1.5"], "seed=1.5 must be a whole number"),
    (["max_steps=2.5"], "max_steps=2.5 must be a whole number"),
    (["model={tmp}/notamodel"], "model='{tmp}/notamodel' is a folder without config.json, so it is not a saved "
                                "model"),
    (["model={tmp}/run"], "model='{tmp}/run' is a grouprl run folder, not a model. Fix: use {tmp}/run/final or "
                          "{tmp}/run/checkpoint-12."),
    (["model=./outptus/run/final"], "model='./outptus/run/final': no such folder"),
    (["adam_beta1=2"], "adam_beta1=2.0 must be >= 0.0 and < 1.0"),
    (["adam_beta2=1"], "adam_beta2=1.0 must be >= 0.0 and < 1.0"),
    (["weight_decay=-1"], "weight_decay=-1.0 must be >= 0.0. Fix: 0 turns weight decay off"),
    (["max_prompt_length=0"], "max_prompt_length=0 must be >= 1 (null = no limit"),
    (["dataset=builtin:arithmetic", "dataset_kwargs.max_valeu=20"],
     "dataset_kwargs.max_valeu is not an option of builtin:arithmetic. Did you mean 'max_value'?"),
    (["lora_r=0"], "lora_r=0 must be >= 1"),
    (["lora_target_modules=[]"], "lora_target_modules=[] must be 'all-linear', a module name or a non-empty list"),
    (["warmup_steps=-1"], "warmup_steps=-1 must be >= 0"),
    (["eval_steps=-5"], "eval_steps=-5 must be >= 0"),
    (["max_resample_rounds=-1"], "max_resample_rounds=-1 must be >= 0"),
    (["log_completions_steps=-1"], "log_completions_steps=-1 must be >= 0 (0 = never)"),
    (["save_total_limit=0"], "save_total_limit=0 must be >= 1 (null = keep every checkpoint)"),
    (["truncation=right"], "truncation='right' must be one of 'left', 'error'"),
    (["apply_chat_template=sometimes"], "apply_chat_template='sometimes' must be one of 'auto', 'always', 'never'"),
    (["resume_from_checkpoint={tmp}/run/checkpoint-9"], "resume_from_checkpoint='{tmp}/run/checkpoint-9': no such "
                                                        "folder"),
    pytest.param(["rollout_backend=vllm"], "needs the vllm package, which is not installed. Fix: pip install "
                 "'grouprl[vllm]'", marks=pytest.mark.skipif(VLLM, reason="vllm is installed here")),
    (["rollout_correction=tis"], "there is no mismatch to correct. Fix: rollout_correction: auto"),
]


@pytest.fixture(scope="module")
def warm():
    """Cold imports (torch through the registries, datasets) are paid once, outside the timed checks."""
    import datasets  # noqa: F401

    import grouprl.builtins

    grouprl.builtins.load_builtins()


@pytest.fixture
def files(tmp_path, monkeypatch, warm):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the start-up checks failed")

    monkeypatch.setattr(model_loader, "load_model", refuse)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "readonly").mkdir(mode=0o555)
    (tmp_path / "latin1.jsonl").write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "answer": "1"},
            {"prompt": [{"role": "usr", "content": "hi"}], "answer": "1"}]
    (tmp_path / "roles.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "weights.txt").write_text("x")
    for sub in ("run/final", "run/checkpoint-4", "run/checkpoint-12"):
        (tmp_path / sub).mkdir(parents=True)
    yield tmp_path
    (tmp_path / "readonly").chmod(0o755)


@pytest.mark.parametrize("overrides, fragment", TABLE)
def test_mistake_is_one_line_before_any_model_loads(files, capsys, overrides, fragment):
    args = [o.format(tmp=files) for o in overrides]
    start = time.perf_counter()
    assert main(["train", *BASE, f"output_dir={files}/out", *args, "--dry-run"]) == 2
    took = time.perf_counter() - start
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err  # one line, no traceback
    assert fragment.format(tmp=files) in err
    assert took < 3.0, f"{took:.1f}s"  # ~0.1 s; the bound leaves room for a loaded CI machine


def test_the_same_checks_run_in_the_trainer_before_the_model_loads(files):
    from grouprl import GRPOConfig, GRPOTrainer
    from grouprl.errors import ConfigError, DataError

    def trainer(**kw):
        given = {"output_dir": str(files / "out"), **{k: v for k, v in kw.items() if k != "model"}}
        cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, **given)
        return GRPOTrainer(model=kw.get("model", str(files / "notamodel")), config=cfg)

    with pytest.raises(ConfigError, match="is a file, not a folder"):
        trainer(output_dir=str(files / "afile"), dataset="builtin:arithmetic")
    with pytest.raises(ConfigError, match="is a grouprl run folder, not a model. Fix: use .*run/final"):
        trainer(model=str(files / "run"), dataset="builtin:arithmetic")
    with pytest.raises(ConfigError, match="dataset_kwargs.nn is not an option of builtin:arithmetic"):
        trainer(model="builtin:arithmetic", dataset="builtin:arithmetic", dataset_kwargs={"nn": 3})
    with pytest.raises(DataError, match="line 2 is not UTF-8"):
        trainer(model="builtin:arithmetic", dataset=str(files / "latin1.jsonl"))


def test_dry_run_says_when_there_is_no_eval_split_and_downloads_nothing(files, capsys):
    rows = "\n".join(json.dumps({"prompt": f"{i}+1?", "answer": str(i + 1)}) for i in range(4))
    (files / "one.jsonl").write_text(rows + "\n")
    assert main(["train", *BASE, f"output_dir={files}/out", f"dataset={files}/one.jsonl", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "grouprl: no evaluation: dataset" in err and "has no 'test' split" in err
    start = time.perf_counter()  # a hub name is left for the run: no download, no network wait
    assert main(["train", *BASE, f"output_dir={files}/out", "dataset=someorg/somedata", "--dry-run"]) == 0
    assert time.perf_counter() - start < 3.0


def test_make_says_so_before_installing_bubblewrap():
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    recipe = makefile.split("\nsandbox-deps:", 1)[1].split("\n\n", 1)[0]
    said, installs = recipe.find("installing bubblewrap with apt-get"), recipe.find("apt-get install")
    assert 0 <= said < installs, recipe  # one line before apt-get runs as root
