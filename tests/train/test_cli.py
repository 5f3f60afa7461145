"""`grouprl train` options that load no model: --help-config, --dry-run, and errors before loading."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grouprl.cli import main

RECIPE = Path(__file__).parent / "recipes" / "tiny_grpo.yaml"


def test_help_config_lists_every_field_with_its_doc(capsys):
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "num_generations (default: 8):\n    G: completions sampled per prompt." in out
    assert "kl_coef (default: null):\n" in out and "beta (default: null):\n    Alias of kl_coef" in out


def test_dry_run_prints_the_resolved_recipe(capsys):
    assert main(["train", "-c", str(RECIPE), "algorithm=gspo", "learning_rate=2e-6", "--dry-run"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert (cfg["policy_loss"], cfg["epsilon"], cfg["epsilon_high"]) == ("gspo", 3e-4, 4e-4)
    assert cfg["learning_rate"] == 2e-6 and cfg["reward_funcs"] == ["exact"]


def test_config_errors_are_one_line_and_exit_2(capsys):
    assert main(["train", "-c", str(RECIPE), "per_device_train_batch_size=3", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: generation batch 6 (= per_device_train_batch_size 3 x steps_per_generation 2)")
    assert main(["train", "-c", str(RECIPE), "num_generation=4"]) == 2
    assert "Did you mean 'num_generations'?" in capsys.readouterr().err
    assert main(["train", "-c", str(RECIPE), "policy_loss=gspoo", "--dry-run"]) == 2
    assert "Closest match: 'gspo'" in capsys.readouterr().err


def test_lora_run_then_eval_of_the_adapter_checkpoint_and_the_merged_model(tiny_model_dir, tmp_path, capsys):
    import json

    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]
    (data / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (data / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:2]))
    out = tmp_path / "run"
    assert main(["train", "-c", str(RECIPE), f"model={tiny_model_dir}", f"dataset={data}", f"output_dir={out}",
                 "use_peft=true", "lora_r=4", "eval_before_train=false"]) == 0
    assert (out / "checkpoint-1" / "adapter_config.json").is_file()  # checkpoints hold the adapter
    assert (out / "final" / "config.json").is_file() and (out / "final" / "adapter").is_dir()
    capsys.readouterr()
    for ckpt in ("checkpoint-1", "final"):
        assert main(["eval", "-c", str(out / "config.yaml"), "--checkpoint", str(out / ckpt), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["num_prompts"] == 2


# ---- CLI traps (issue 11) -----------------------------------------------------------------------------------
def test_help_config_shows_each_default(capsys):
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    for line in ("num_generations (default: 8):", "reward_funcs (default: [accuracy]):", "model (default: null):",
                 "apply_chat_template (default: auto):", "truncation (default: left):", "bf16 (default: false):"):
        assert line in out, line


def test_overrides_may_stand_anywhere_and_resume_never_takes_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "max_steps=7", "-c", str(RECIPE), "--dry-run"]) == 0  # before -c
    assert yaml.safe_load(capsys.readouterr().out)["max_steps"] == 7
    seen = {}
    monkeypatch.setattr("grouprl.cmd.train.run", lambda args: seen.update(vars(args)) or 0)
    assert main(["train", "-c", str(RECIPE), "--resume", "max_steps=8"]) == 0
    assert seen["resume"] is True and seen["overrides"] == ["max_steps=8"]  # latest checkpoint, max_steps 8
    assert main(["train", "seed=3", "--resume", "out/checkpoint-4", "-c", str(RECIPE), "max_steps=8"]) == 0
    assert seen["resume"] == "out/checkpoint-4" and seen["overrides"] == ["seed=3", "max_steps=8"]


@pytest.mark.parametrize("args, fragment", [
    (["--limit", "0"], "--limit 0 must be >= 1"),
    (["--limit", "-3"], "--limit -3 must be >= 1"),
    (["--temperature", "0.7", "-n", "4", "--k", "0"], "--k 0: pass@k needs 1 <= k <= the samples per prompt (4)"),
    (["--temperature", "0.7", "-n", "4", "--k", "1", "8"], "--k 8: pass@k needs 1 <= k <= the samples per prompt (4)"),
    (["--checkpoint", "./outputs/defualt/final"], "--checkpoint='./outputs/defualt/final': no such folder"),
    (["--checkpoint", "outputs/defualt/final"], "--checkpoint='outputs/defualt/final': no such folder"),
    (["--checkpoint", "outputs/run"], "--checkpoint='outputs/run' is a grouprl run folder, not a model. Fix: use "
                                      "outputs/run/final or outputs/run/checkpoint-3."),
    (["--checkpoint", "outputs"], "--checkpoint='outputs' is a folder without config.json, so it is not a saved model"),
])
def test_eval_arguments_that_cannot_work_are_errors(tmp_path, monkeypatch, capsys, args, fragment):
    monkeypatch.chdir(tmp_path)
    for sub in ("outputs/run/final", "outputs/run/checkpoint-3"):
        (tmp_path / sub).mkdir(parents=True)
    assert main(["eval", "-c", str(RECIPE), "dataset=builtin:arithmetic", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment in err and err.count("\n") == 1, err


def test_a_reward_plug_in_in_the_current_folder_is_found(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    (tmp_path / "my_cwd_rewards.py").write_text("def score(completion, *, answer=None, **kw):\n    return 1.0\n")
    assert main(["train", "-c", str(RECIPE), "reward_funcs=my_cwd_rewards:score", "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["reward_funcs"] == ["my_cwd_rewards:score"]
    assert main(["train", "-c", str(RECIPE), "reward_funcs=no_such_module_xyz:score", "--dry-run"]) == 2
    assert "no_such_module_xyz" in capsys.readouterr().err
