"""Prompt order: a shuffled pass over the training rows, epoch after epoch, resumable exactly."""

from __future__ import annotations

import torch


class PromptStream:
    """Shuffled prompts, epoch after epoch; ``state()`` / ``load_state()`` give the exact data position.

    Epoch ``e`` is ``torch.randperm(num_rows)`` seeded with ``seed + e``; a batch that would run past the end
    of an epoch starts the next one (the last ``num_rows % batch`` rows of an epoch are skipped).
    """

    def __init__(self, num_rows: int, batch: int, seed: int) -> None:
        self.num_rows, self.batch, self.seed = num_rows, batch, seed
        self.epoch, self.pos = 0, 0

    def _order(self) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_rows, generator=gen).tolist()

    def next(self) -> list[int]:
        if self.pos + self.batch > self.num_rows:
            self.epoch, self.pos = self.epoch + 1, 0
        idx = self._order()[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return idx

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
