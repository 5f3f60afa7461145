"""Compatibility alias of :mod:`grouprl.builtin.warmstart` for callers not yet updated; deleted at merge.

The alias is the same module object, so ``monkeypatch.setattr(grouprl.warmstart, ...)`` still patches the real one.
"""

import sys

from grouprl.builtin import warmstart

sys.modules[__name__] = warmstart
