"""One start-up path (docs/DESIGN.md, "One start-up path"): ``grouprl train`` and the trainer it builds run
each check once -- registry names, the sandbox level, what N processes cannot run, the run folder's
decision -- and take the run lock once (the trainer's own ``run_lock`` re-enters it, no second flock)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from grouprl.cli import main

RECIPE = Path(__file__).parent / "recipes" / "tiny_grpo.yaml"


def test_grouprl_train_runs_each_start_up_check_once(tiny_model_dir, tmp_path, monkeypatch):
    import grouprl.sandbox.config as sandbox_config
    from grouprl.config import GRPOConfig
    from grouprl.run import lock, output_dir
    from grouprl.train.parallel import ranks

    calls: Counter = Counter()

    def counted(owner, name):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    counted(GRPOConfig, "check_names")
    counted(sandbox_config, "configure_for_run")
    counted(ranks, "check_config")
    counted(output_dir, "decide_resume")
    counted(lock, "_try_lock")
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]
    (data / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert main(["train", "-c", str(RECIPE), f"model={tiny_model_dir}", f"dataset={data}", "eval_split=null",
                 f"output_dir={tmp_path / 'run'}", "max_steps=1", "save_strategy=no"]) == 0
    assert calls == {"check_names": 1, "configure_for_run": 1, "check_config": 1, "decide_resume": 1, "_try_lock": 1}
