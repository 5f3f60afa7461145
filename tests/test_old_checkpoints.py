"""Checkpoints written before ``train/`` was split into algorithms/ engine/ parallel/ checkpoint/ still resume.

tests/fixtures/old_checkpoints/ holds checkpoint-1 of a GRPO, a PPO and a DPO run written by that code
(``make.py`` there): the GRPO and PPO states pickle the unfinished round under the old module paths
(``grouprl.train.algorithms.rounds.Round``, ``grouprl.train.engine.step.MicroBatch``, ``grouprl.train.algorithms.ppo.PPORound`` /
``ValueTargets``). Resuming trains step 2 to the numbers the old code computed from the same checkpoint
(``expected.json``, written by the old code too; timings left out).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "old_checkpoints"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text()) if (FIXTURES / "expected.json").is_file() else {}
sys.path.insert(0, str(FIXTURES))
from make import ROWS, char_reward, common  # noqa: E402

CONFIGS = {
    "grpo": dict(num_generations=2, per_device_train_batch_size=4, gradient_accumulation_steps=1,
                 steps_per_generation=2),
    "ppo": dict(algorithm="ppo", num_generations=1, per_device_train_batch_size=2, gradient_accumulation_steps=1,
                steps_per_generation=2),
    "dpo": dict(algorithm="dpo", per_device_train_batch_size=2, gradient_accumulation_steps=1),
}


def numbers(record: dict) -> dict:
    """The metrics of a step that do not depend on the clock."""
    return {k: v for k, v in record.items() if isinstance(v, (int, float)) and not k.startswith("time/")
            and k not in ("tokens_per_s", "samples_per_s", "timestamp", "elapsed")}


def resume(name: str, tmp_path: Path) -> dict:
    out = tmp_path.resolve() / name
    shutil.copytree(FIXTURES / name / "checkpoint-1", out / "checkpoint-1")
    model = str(FIXTURES / "model")
    if name == "dpo":
        from grouprl.train.algorithms.dpo_run import run_dpo

        here = os.getcwd()
        os.chdir(FIXTURES)  # the DPO config names its model and pairs relative to the fixture folder
        try:
            run_dpo(common(out, model="model", dataset="pairs", resume_from_checkpoint=str(out / "checkpoint-1"),
                           **CONFIGS[name]))
        finally:
            os.chdir(here)
    else:
        from grouprl import GRPOTrainer

        cfg = common(out, resume_from_checkpoint=str(out / "checkpoint-1"), **CONFIGS[name])
        GRPOTrainer(model=model, config=cfg, train_dataset=ROWS, reward_funcs=char_reward).train()
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (step2,) = [r for r in lines if r.get("step") == 2 and "eval/tag" not in r]
    return numbers(step2)


@pytest.mark.parametrize("name", ["grpo", "ppo", "dpo"])
def test_an_old_checkpoint_resumes_to_the_old_numbers(name, tmp_path):
    got = resume(name, tmp_path)
    assert got == pytest.approx(EXPECTED[name], rel=1e-6, abs=1e-7)
    assert set(got) == set(EXPECTED[name])


if __name__ == "__main__":  # write expected.json (with the code that wrote the checkpoints)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = {name: resume(name, Path(tmp)) for name in CONFIGS}
    (FIXTURES / "expected.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
