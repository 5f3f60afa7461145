"""Compatibility alias of :mod:`grouprl.builtin.tiny` for callers not yet updated; deleted at merge.

The alias is the same module object, so ``monkeypatch.setattr(grouprl.tiny, ...)`` still patches the real one.
"""

import sys

from grouprl.builtin import tiny

sys.modules[__name__] = tiny
