"""Reading checkpoints whose pickles name modules that have since moved.

``trainer_state.pt`` pickles the unfinished generation round (``Round``, ``MicroBatch``, ``PPORound``,
``ValueTargets``) under the module path of its class when it was written. :data:`MOVED` maps the paths of
earlier layouts (docs/DESIGN.md, "Layout") to today's, so ``torch.load(..., pickle_module=unpickle)``
reads a checkpoint of any grouprl version since checkpoints held rounds. Add a line here whenever a
pickled class moves; ``tests/test_old_checkpoints.py`` resumes checkpoints written by the old layout.
"""

from __future__ import annotations

import pickle
from pickle import *  # noqa: F403 -- torch.load uses this module as its pickle_module

MOVED = {
    "grouprl.train.loop": "grouprl.train.algorithms.rounds",  # the oldest checkpoints pickled loop.Round
    "grouprl.train.round": "grouprl.train.algorithms.rounds",
    "grouprl.train.step": "grouprl.train.engine.step",
    "grouprl.train.ppo": "grouprl.train.algorithms.ppo",
    "grouprl.train.dpo": "grouprl.train.algorithms.dpo",
}
"""Module path in an old pickle -> where its classes live now."""


class Unpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that reads a moved class from its new module."""

    def find_class(self, module: str, name: str):
        return super().find_class(MOVED.get(module, module), name)


def load(file, **kwargs):
    return Unpickler(file, **kwargs).load()


def loads(data: bytes, **kwargs):
    import io

    return Unpickler(io.BytesIO(data), **kwargs).load()
