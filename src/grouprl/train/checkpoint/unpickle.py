"""Reading checkpoints whose pickles name modules that have since moved.

``trainer_state.pt`` pickles the unfinished generation round (``Round``, ``MicroBatch``, ``PPORound``,
``ValueTargets``) under the module path of its class when it was written. :data:`MOVED` maps the paths of
earlier layouts (docs/DESIGN.md, "Layout") to today's, so ``torch.load(..., pickle_module=unpickle)``
reads a checkpoint of any grouprl version since checkpoints held rounds. A module whose pickled classes
moved calls :func:`moved_from` with its old paths; ``tests/test_old_checkpoints.py`` resumes checkpoints
written by the old layout.
"""

from __future__ import annotations

import pickle
from pickle import *  # noqa: F403 -- torch.load uses this module as its pickle_module

MOVED: dict[str, str] = {}
"""Module path in an old pickle -> where its classes live now (filled by :func:`moved_from`)."""


def moved_from(*old: str, to: str) -> None:
    """Declare, in the module ``to`` that now defines pickled classes, the module paths they had before.
    The declaration sits with the classes, so this module imports none of them (no import cycle)."""
    for name in old:
        MOVED[name] = to


class Unpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that reads a moved class from its new module."""

    def find_class(self, module: str, name: str):
        return super().find_class(MOVED.get(module, module), name)


def load(file, **kwargs):
    return Unpickler(file, **kwargs).load()


def loads(data: bytes, **kwargs):
    import io

    return Unpickler(io.BytesIO(data), **kwargs).load()
