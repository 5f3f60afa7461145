"""PPO tests reuse the trainer tests' helpers (tests/train/train_helpers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))

import pytest  # noqa: E402
from train_helpers import TRAIN_ROWS  # noqa: E402


@pytest.fixture
def train_rows():
    return [dict(r) for r in TRAIN_ROWS]
