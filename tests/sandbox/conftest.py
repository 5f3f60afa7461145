"""Fixtures of the sandbox tests: the isolation levels (the leftover-process check is in tests/conftest.py)."""

from __future__ import annotations

import pytest

from grouprl.sandbox import detect

LEVELS = [
    pytest.param("strict", marks=pytest.mark.skipif(not detect().strict, reason="bubblewrap not available")),
    pytest.param("basic", marks=pytest.mark.skipif(detect().basic_python is None, reason="basic not available")),
]


@pytest.fixture(params=LEVELS)
def level(request):
    """Each isolation level this machine can give (tests taking it run once per level)."""
    return request.param
