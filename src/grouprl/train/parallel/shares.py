"""What each rank gets: its contiguous share of the global prompt order (:class:`RankStream`), and, on
ranks > 0, a logger that writes nothing (:class:`NullLogger`)."""

from __future__ import annotations

from typing import Any


class RankStream:
    """Rank ``r``'s contiguous slice of each global batch of a ``PromptStream``; the state is global."""

    def __init__(self, stream: Any, rank: int, world: int) -> None:
        self.stream, self.rank, self.world = stream, rank, world

    def next(self) -> list[int]:
        idx = self.stream.next()
        share = len(idx) // self.world
        return idx[self.rank * share:(self.rank + 1) * share]

    @property
    def last_ordinals(self) -> list[int]:
        """The global ordinals of this rank's share of the last batch (``data/stream.py``)."""
        ords = self.stream.last_ordinals
        share = len(ords) // self.world
        return ords[self.rank * share:(self.rank + 1) * share]

    @property
    def drawn(self) -> int:
        return self.stream.drawn

    def position(self, ordinal: int) -> dict[str, int]:
        return self.stream.position(ordinal)

    def seek(self, ordinal: int) -> None:
        self.stream.seek(ordinal)

    @property
    def epoch(self) -> int:
        return self.stream.epoch

    def state(self) -> dict[str, int]:
        return self.stream.state()

    def load_state(self, state: dict[str, int]) -> None:
        self.stream.load_state(state)


class NullLogger:
    """The logger of ranks > 0: only rank 0 writes metrics, samples, TensorBoard and the progress bar."""

    metrics_path = samples_path = tb_dir = None

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass

    advance = log_samples = close = log
