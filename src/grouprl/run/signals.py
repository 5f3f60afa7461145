"""Ctrl-C without losing the run: on SIGINT / SIGTERM the loop finishes the optimizer step it is in, writes a
checkpoint, and stops with :class:`RunInterrupted`; a second signal stops at once (``KeyboardInterrupt``).

The handlers are installed only for the life of the loop and only from the main thread (Python delivers
signals there; elsewhere nothing is installed and the default behaviour stays), and the previous handlers
are put back afterwards, so a program that calls ``GRPOTrainer.train()`` keeps its own handlers.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any

SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s is not None)


class RunInterrupted(KeyboardInterrupt):
    """The run stopped on a signal after saving ``checkpoint`` at ``step``; ``exit_code`` = 128 + signal."""

    def __init__(self, signum: int, step: int, checkpoint: Any) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + int(signum)
        name = signal.Signals(signum).name
        super().__init__(f"{name}: stopped after step {step}; checkpoint saved in {checkpoint}")


class GracefulStop:
    """``with GracefulStop() as stop:`` (or ``install()`` / ``restore()``) ``... if stop.requested: save;
    raise stop.interrupted(step, path)``."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> GracefulStop:
        """Put this object's handler on SIGINT and SIGTERM (main thread only), remembering the previous ones."""
        if threading.current_thread() is threading.main_thread() and not self._previous:
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        """Put the previous handlers back (idempotent)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    __enter__ = install

    def __exit__(self, *exc: Any) -> None:
        self.restore()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:  # the second signal: stop now, without a checkpoint
            self.restore()
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopped at once, nothing saved")
        self.requested = signum
        print(f"\ngrouprl: {signal.Signals(signum).name} received: finishing the current optimizer step, then "
              f"saving a checkpoint (press Ctrl-C again to stop at once, without saving)", file=sys.stderr,
              flush=True)

    def interrupted(self, step: int, checkpoint: Any) -> RunInterrupted:
        return RunInterrupted(self.requested or signal.SIGINT, step, checkpoint)
