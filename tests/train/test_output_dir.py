"""An output_dir holding an earlier run: refused before any model loads, or cleared by overwrite_output_dir;
resume is unaffected. Also torch_num_threads (applied before the model loads) and greedy `grouprl eval`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from train_helpers import TRAIN_ROWS, char_reward, train_records

import grouprl.models as model_loader
from grouprl import GRPOConfig, GRPOTrainer
from grouprl.cli import main
from grouprl.errors import ConfigError

RECIPE = Path(__file__).parent / "recipes" / "tiny_grpo.yaml"


class Loaded(Exception):
    """Raised by the patched load_model: the checks under test had to run before it."""


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the output_dir check")

    monkeypatch.setattr(model_loader, "load_model", refuse)


def _earlier_run(root: Path, steps=(2, 10), final=True) -> None:
    for s in steps:
        (root / f"checkpoint-{s}").mkdir(parents=True)
        (root / f"checkpoint-{s}" / "trainer_state.pt").write_bytes(b"old")
    if final:
        (root / "final").mkdir(parents=True)
        (root / "final" / "model-00002-of-00002.safetensors").write_bytes(b"old shard")
    (root / "metrics.jsonl").write_text(json.dumps({"step": 10, "reward": 0.5}) + "\n")


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("\n".join(json.dumps(r) for r in TRAIN_ROWS))
    (data / "test.jsonl").write_text("\n".join(json.dumps(r) for r in TRAIN_ROWS[:2]))
    return data


def test_fresh_run_into_an_earlier_run_is_refused_before_the_model_loads(no_model_load, tmp_path, capsys):
    out = tmp_path / "run"
    _earlier_run(out)
    args = ["train", "-c", str(RECIPE), "model=/nonexistent/model", f"dataset={tmp_path}", f"output_dir={out}",
            "overwrite_output_dir=false"]
    for extra in ([], ["--dry-run"]):
        assert main(args + extra) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: output_dir '{out}' already holds checkpoints")
        assert "newest: checkpoint-10, 2 in all" in err  # by step, not by name (checkpoint-2 sorts after -10)
        assert "`--resume` (or resume_from_checkpoint=true) to continue it from checkpoint-10" in err
        assert "`overwrite_output_dir=true`" in err and err.rstrip().endswith("or a different output_dir=<dir>.")
    assert sorted(p.name for p in out.iterdir() if p.name != ".lock")  # the run lock stays == ["checkpoint-10", "checkpoint-2", "final", "metrics.jsonl"]

    only_final = tmp_path / "final_only"
    _earlier_run(only_final, steps=())
    assert main(args[:-2] + [f"output_dir={only_final}", "overwrite_output_dir=false"]) == 2
    err = capsys.readouterr().err
    assert "the final model of an earlier run (final/)" in err and "--resume" not in err


def test_python_api_refuses_before_writing_anything(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    _earlier_run(out, final=False)
    cfg = GRPOConfig(output_dir=str(out), num_generations=4, per_device_train_batch_size=4, max_new_tokens=4,
                     max_steps=1, progress_bar=False, eval_split=None)
    trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=TRAIN_ROWS, reward_funcs=char_reward)
    with pytest.raises(ConfigError, match=r"newest: checkpoint-10.*overwrite_output_dir=true"):
        trainer.train()
    assert not (out / "config.yaml").exists() and (out / "checkpoint-10" / "trainer_state.pt").read_bytes() == b"old"


def test_overwrite_starts_clean_and_resume_keeps_the_run(tiny_model_dir, tmp_path, capsys):
    data, out = _data(tmp_path), tmp_path / "run"
    args = ["train", "-c", str(RECIPE), f"model={tiny_model_dir}", f"dataset={data}", f"output_dir={out}",
            "eval_split=null", "report_to=tensorboard", "log_completions_steps=1"]
    assert main(args + ["max_steps=3"]) == 0  # the recipe says overwrite_output_dir: true
    _earlier_run(out, steps=(7,), final=False)  # plus a stray old checkpoint with a higher step
    (out / ".tmp-checkpoint-9").mkdir()
    (out / "final" / "model-00002-of-00002.safetensors").write_bytes(b"stale shard of an older save")
    (out / "notes.txt").write_text("mine")  # not a run artefact: left alone
    capsys.readouterr()

    assert main(args + ["max_steps=2"]) == 0  # the same command again, into the same directory
    assert "removed" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir() if p.name != ".lock") == [
        "checkpoint-1", "checkpoint-2", "config.yaml", "final", "metrics.jsonl", "notes.txt", "report.html",
        "run_meta.json", "samples.jsonl", "tensorboard"]
    assert not (out / "final" / "model-00002-of-00002.safetensors").exists()
    assert [r["step"] for r in train_records(out)] == [1, 2]
    assert {json.loads(line)["step"] for line in (out / "samples.jsonl").read_text().splitlines()} == {1, 2}
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert (out / "notes.txt").read_text() == "mine"

    assert main(args + ["max_steps=4", "--resume"]) == 0  # resume: overwrite_output_dir is ignored
    assert [r["step"] for r in train_records(out)] == [1, 2, 3, 4]
    assert [p.name for p in sorted(out.glob("checkpoint-*"))] == ["checkpoint-1", "checkpoint-2", "checkpoint-3",
                                                                   "checkpoint-4"]


def test_overwrite_never_deletes_the_model_it_trains(no_model_load, tmp_path, capsys):
    out = tmp_path / "run"
    _earlier_run(out)
    assert main(["train", "-c", str(RECIPE), f"model={out / 'final'}", f"dataset={tmp_path}",
                 f"output_dir={out}", "--dry-run"]) == 2
    assert "model=" in (err := capsys.readouterr().err) and "would delete" in err
    assert (out / "final").is_dir()


def test_torch_num_threads_is_applied_before_the_model_loads(monkeypatch, tiny_model_dir):
    with pytest.raises(ConfigError, match="torch_num_threads=0 must be a whole number >= 1"):
        GRPOConfig(torch_num_threads=0)
    assert GRPOConfig.from_yaml(None, ["torch_num_threads=3"]).torch_num_threads == 3
    seen = []

    def record(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise Loaded

    monkeypatch.setattr(model_loader, "load_model", record)
    before = torch.get_num_threads()
    target = 2 if before == 1 else 1
    try:
        with pytest.raises(Loaded):
            GRPOTrainer(model=str(tiny_model_dir), config=GRPOConfig(torch_num_threads=target),
                        train_dataset=TRAIN_ROWS, reward_funcs=char_reward)
        torch.set_num_threads(before)
        with pytest.raises(Loaded):  # None: torch's own setting is left alone
            GRPOTrainer(model=str(tiny_model_dir), config=GRPOConfig(), train_dataset=TRAIN_ROWS,
                        reward_funcs=char_reward)
    finally:
        torch.set_num_threads(before)
    assert seen == [target, before]


def test_eval_threads_are_applied_too(monkeypatch, tiny_model_dir, tmp_path):
    from grouprl.cmd.eval import evaluate_checkpoint

    seen = []

    def record(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise Loaded

    monkeypatch.setattr(model_loader, "load_model", record)
    before = torch.get_num_threads()
    target = 2 if before == 1 else 1
    cfg = GRPOConfig(dataset=str(_data(tmp_path)), eval_split="test", reward_funcs=["exact"], eval_reward="exact",
                     torch_num_threads=target)
    try:
        with pytest.raises(Loaded):
            evaluate_checkpoint(cfg, str(tiny_model_dir), temperature=0.0, num_samples=1, ks=(1,))
    finally:
        torch.set_num_threads(before)
    assert seen == [target]


def test_greedy_eval_of_a_pass_at_k_recipe_uses_one_sample(tmp_path):
    from grouprl.cmd.eval import decoding_plan

    cfg = GRPOConfig(eval_temperature=1.0, eval_num_samples=4)
    assert decoding_plan(cfg, None, None, None) == (1.0, 4, (1, 4))  # the recipe's sampled evaluation
    assert decoding_plan(cfg, 0.0, None, None) == (0.0, 1, (1,))  # --temperature 0: greedy, one sample
    assert decoding_plan(cfg, 0.0, 1, [1]) == (0.0, 1, (1,))
    assert decoding_plan(cfg, 0.5, 2, None) == (0.5, 2, (1, 2))
    with pytest.raises(ConfigError, match="--num-samples 4 with greedy decoding .* gives 4 identical samples"):
        decoding_plan(cfg, 0.0, 4, None)
    with pytest.raises(ConfigError, match="--k 1 4 with greedy decoding: pass@k needs several sampled"):
        decoding_plan(cfg, 0.0, None, [1, 4])


def test_cli_greedy_eval_of_a_pass_at_k_recipe(tiny_model_dir, tmp_path, capsys):
    recipe = tmp_path / "noisy.yaml"
    recipe.write_text(f"dataset: {_data(tmp_path)}\neval_split: test\nreward_funcs: [exact]\neval_reward: exact\n"
                      f"eval_temperature: 1.0\neval_num_samples: 4\nmax_new_tokens: 4\n")
    assert main(["eval", "-c", str(recipe), "--checkpoint", str(tiny_model_dir), "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert "1 sample per prompt instead of the recipe's eval_num_samples=4" in captured.err
    assert "pass@k is not computed for greedy decoding" in captured.err
    assert "(2 prompts, greedy)" in captured.out and "pass@" not in captured.out
    assert main(["eval", "-c", str(recipe), "--checkpoint", str(tiny_model_dir), "--temperature", "0", "-n", "4"]) == 2
    assert "identical samples" in capsys.readouterr().err
