"""Shared fixtures of the sandbox tests: the isolation levels and the leftover-process check."""

from __future__ import annotations

import contextlib

import psutil
import pytest

from grouprl.sandbox import detect
from grouprl.sandbox.runner import LEASED_UIDS

LEVELS = [
    pytest.param("strict", marks=pytest.mark.skipif(not detect().strict, reason="bubblewrap not available")),
    pytest.param("basic", marks=pytest.mark.skipif(detect().basic_python is None, reason="basic not available")),
]


@pytest.fixture(params=LEVELS)
def level(request):
    """Each isolation level this machine can give (tests taking it run once per level)."""
    return request.param


def _children() -> set[tuple[int, float]]:
    """(pid, start time) of every descendant of this process (the pair survives pid reuse)."""
    out = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            out.add((child.pid, child.create_time()))
    return out


def sandbox_pids(uids: set[int], existing: set[tuple[int, float]] = frozenset()) -> list[int]:
    """Processes of this test's sandboxes: under one of ``uids``, or descendants of this process that
    were not already running in ``existing`` (long-lived helpers such as the math reward's worker)."""
    out = sorted(pid for pid, started in _children() - set(existing))
    for p in psutil.process_iter(["uids"]):
        ids = p.info["uids"]
        if ids is not None and {ids.real, ids.effective} & uids:
            out.append(p.pid)
    return out


@pytest.fixture
def leftover_scan():
    """The scan ``no_leftovers`` uses, as ``(snapshot_of_children, sandbox_pids)``, for testing the check."""
    return _children, sandbox_pids


@pytest.fixture
def no_leftovers():
    """Fails the test if a process of its sandboxes outlives the job (scans the whole process table)."""
    before, existing = len(LEASED_UIDS), _children()
    yield
    left = sandbox_pids(set(list(LEASED_UIDS)[before:]), existing)
    assert left == [], f"processes left behind: {left}"
