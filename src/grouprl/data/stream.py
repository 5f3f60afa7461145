"""Prompt order: a shuffled pass over the training rows, epoch after epoch, resumable exactly.

Every prompt the stream hands out has an **ordinal**: its index in the run's prompt stream (the n-th prompt
drawn, from 0, dynamic-sampling redraws included). Ordinals are what a checkpoint's training frontier and
every ``samples.jsonl`` record speak in: a resume seeks the stream to the frontier, so the prompts a run
trains are the ordinals 0, 1, 2, ... each exactly once, whatever was in flight when it stopped (the
async-resume bugs of OpenRLHF #1322 and NeMo-RL #3599 are prompts that fell between a saved dataloader
cursor and the rollouts generated past it).
"""

from __future__ import annotations

import torch


class PromptStream:
    """Shuffled prompts, epoch after epoch; ``state()`` / ``load_state()`` give the exact data position.

    Epoch ``e`` is ``torch.randperm(num_rows)`` seeded with ``seed + e``; a batch that would run past the end
    of an epoch starts the next one (the last ``num_rows % batch`` rows of an epoch are skipped). An epoch
    therefore hands out ``per_epoch = (num_rows // batch) * batch`` prompts, and the position after ``n``
    prompts is a function of ``n`` alone (:meth:`position`): ``drawn`` and :meth:`seek` convert.

    >>> s = PromptStream(num_rows=5, batch=2, seed=0)
    >>> _ = s.next(), s.next(), s.next()  # 2 + 2 prompts of epoch 0 (1 row skipped), then 2 of epoch 1
    >>> s.last_ordinals, s.drawn, s.state()
    ([4, 5], 6, {'epoch': 1, 'pos': 2})
    >>> s.position(4)  # after 4 prompts: the end of epoch 0, not yet the start of epoch 1
    {'epoch': 0, 'pos': 4}
    """

    def __init__(self, num_rows: int, batch: int, seed: int) -> None:
        self.num_rows, self.batch, self.seed = num_rows, batch, seed
        self.epoch, self.pos = 0, 0
        self.last_ordinals: list[int] = []  # the ordinals of the batch the last next() returned

    def _order(self) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_rows, generator=gen).tolist()

    def next(self) -> list[int]:
        if self.pos + self.batch > self.num_rows:
            self.epoch, self.pos = self.epoch + 1, 0
        idx = self._order()[self.pos:self.pos + self.batch]
        start = self.drawn
        self.pos += self.batch
        self.last_ordinals = list(range(start, start + len(idx)))
        return idx

    @property
    def per_epoch(self) -> int:
        """Prompts one epoch hands out (the ``num_rows % batch`` left over are skipped)."""
        return (self.num_rows // self.batch) * self.batch

    @property
    def drawn(self) -> int:
        """Prompts handed out so far = the ordinal of the next prompt."""
        return self.epoch * self.per_epoch + self.pos

    def position(self, ordinal: int) -> dict[str, int]:
        """The ``state()`` of this stream after exactly ``ordinal`` prompts were drawn: an epoch's last batch
        leaves ``pos = per_epoch`` (the next ``next()`` opens the epoch after it), as drawing does."""
        if ordinal < 0:
            raise ValueError(f"a prompt ordinal counts from 0, got {ordinal}")
        if ordinal == 0 or self.per_epoch == 0:
            return {"epoch": 0, "pos": 0}
        epoch = (ordinal - 1) // self.per_epoch
        return {"epoch": epoch, "pos": ordinal - epoch * self.per_epoch}

    def seek(self, ordinal: int) -> None:
        """Go to where the stream stands after ``ordinal`` prompts (a checkpoint's training frontier)."""
        self.load_state(self.position(ordinal))

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
