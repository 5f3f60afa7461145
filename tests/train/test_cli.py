"""`grouprl train` options that load no model: --help-config, --dry-run, and errors before loading."""

from __future__ import annotations

from pathlib import Path

import yaml

from grouprl.cli import main

RECIPE = Path(__file__).parent / "recipes" / "tiny_grpo.yaml"


def test_help_config_lists_every_field_with_its_doc(capsys):
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "num_generations:\n    G: completions sampled per prompt." in out
    assert "kl_coef:\n" in out and "beta:\n    Alias of kl_coef" in out


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
