"""Shared helper for the sandbox tests: the leftover-process check."""

from __future__ import annotations

import psutil
import pytest

from grouprl.sandbox.runner import LEASED_UIDS


def sandbox_pids(uids: set[int]) -> list[int]:
    """Processes of this test's sandboxes: under one of ``uids``, or descendants of this process."""
    out = [c.pid for c in psutil.Process().children(recursive=True)]
    for p in psutil.process_iter(["uids"]):
        ids = p.info["uids"]
        if ids is not None and {ids.real, ids.effective} & uids:
            out.append(p.pid)
    return out


@pytest.fixture
def no_leftovers():
    """Fails the test if a process of its sandboxes outlives the job (scans the whole process table)."""
    before = len(LEASED_UIDS)
    yield
    left = sandbox_pids(set(list(LEASED_UIDS)[before:]))
    assert left == [], f"processes left behind: {left}"
