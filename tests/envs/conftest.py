"""Fixtures of the environment tests: the leftover-process check around sandboxed tool calls."""

from __future__ import annotations

import contextlib

import psutil
import pytest

from grouprl.sandbox.runner import LEASED_UIDS


def _children() -> set[tuple[int, float]]:
    """(pid, start time) of every descendant of this process (the pair survives pid reuse)."""
    out = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            out.add((child.pid, child.create_time()))
    return out


@pytest.fixture
def no_leftovers():
    """Fails the test if a process it started (a child, or one under a sandbox uid it leased) outlives it."""
    before, existing = len(LEASED_UIDS), _children()
    yield
    uids = set(list(LEASED_UIDS)[before:])
    left = sorted(pid for pid, _ in _children() - existing)
    for p in psutil.process_iter(["uids"]):
        ids = p.info["uids"]
        if ids is not None and {ids.real, ids.effective} & uids:
            left.append(p.pid)
    assert left == [], f"processes left behind: {left}"
