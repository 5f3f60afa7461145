"""examples/agent_tools.py (the worked example of docs/AGENTS.md) runs, with tiny settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_worked_example_runs(tmp_path, tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "agent_tools.py"), "--model", str(tiny_model_dir),
                          "--steps", "1", "--max-new-tokens", "16", "--output-dir", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["turns/mean"] >= 1 and summary["tokens/model"] > 0 and "tools/calls_per_traj" in summary
    config = (tmp_path / "out" / "config.yaml").read_text()
    assert "__main__:multiply" in config  # the tool is recorded by its import path
