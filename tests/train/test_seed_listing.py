"""A TRL-style GRPO quick-start script (seed/listing_3_5.py) runs as written with `from grouprl import GRPOConfig, GRPOTrainer`."""

from __future__ import annotations

import warnings
from pathlib import Path

import datasets

from grouprl.train.engine.precision import cpu_has_fast_bf16

LISTING = Path(__file__).parent / "seed" / "listing_3_5.py"


def test_seed_listing_runs(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = LISTING.read_text()
    # small sizes for a CPU test: 2 prompts x 1 epoch, 16 new tokens; everything else as written
    small = (source.replace("max_new_tokens=512", "max_new_tokens=16")
             .replace("num_train_epochs=2", "num_train_epochs=1")
             .replace('"./checkpoints/', f'"{tmp_path}/checkpoints/'))
    assert small.count(str(tmp_path)) == 2
    namespace = {
        "model": AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        "tokenizer": AutoTokenizer.from_pretrained(tiny_model_dir),
        "train_dataset": datasets.Dataset.from_list([
            {"prompt": "Use <think> then call a tool: <tool_call>"},
            {"prompt": "What is the area of a circle of radius 5?"},
        ]),
    }
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(small, str(LISTING), "exec"), namespace)
    bf16 = [w for w in caught if "bf16" in str(w.message)]
    if cpu_has_fast_bf16():  # bf16=True as written: autocast on a CPU with AVX512-BF16 / AMX-BF16, no warning
        assert bf16 == []
    else:  # elsewhere one clear warning, then fp32
        assert len(bf16) == 1 and "fp32" in str(bf16[0].message)
    out = capsys.readouterr().out
    assert "✅ GRPO 训练完成！" in out
    assert "re-evaluate:  set `dataset` and `eval_split` in" in out  # the data came from Python, not the recipe
    trainer = namespace["trainer"]
    # G=8, 1 completion per micro-batch x 8 micro-batches = 1 prompt per optimizer step; 2 prompts, 1 epoch
    assert trainer.result["global_step"] == 2
    assert trainer.config.kl_coef == 0.01 and trainer.config.max_grad_norm == 0.5
    assert (tmp_path / "checkpoints" / "grpo-final" / "config.json").is_file()
    assert list((tmp_path / "checkpoints" / "grpo" / "tensorboard").glob("events.out.tfevents.*"))
