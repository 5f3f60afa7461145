"""benchmarks/gpu_check.py on a machine without a CUDA GPU: a clear message and a clean exit, no model built."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def test_gpu_check_exits_cleanly_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the check would run for real")
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", "1"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "skipped" and "no CUDA GPU" in result["reason"]
    assert "no CUDA GPU on this machine" in proc.stderr
