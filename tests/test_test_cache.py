"""The suite builds into its own cache (.cache/grouprl-test of the checkout), never the user's ~/.cache/grouprl."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from grouprl.builtin.warmstart import default_cache_dir

ROOT = Path(__file__).resolve().parents[1]
TEST_CACHE = Path(os.environ.get("GROUPRL_TEST_CACHE") or ROOT / ".cache" / "grouprl-test")  # tests/conftest.py


def test_the_suite_uses_its_own_cache_folder():
    assert os.environ["GROUPRL_CACHE"] == str(TEST_CACHE)
    assert default_cache_dir() == TEST_CACHE
    if "GROUPRL_TEST_CACHE" not in os.environ:
        assert TEST_CACHE == ROOT / ".cache" / "grouprl-test"
        assert Path.home() / ".cache" / "grouprl" not in (TEST_CACHE, *TEST_CACHE.parents)


def test_the_cache_folder_is_ignored_by_git():
    out = subprocess.run(["git", "check-ignore", "-q", str(ROOT / ".cache" / "grouprl-test" / "x")], cwd=ROOT)
    assert out.returncode == 0


def test_a_subprocess_of_a_test_inherits_it():
    code = "from grouprl.builtin.warmstart import default_cache_dir; print(default_cache_dir())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(TEST_CACHE)
