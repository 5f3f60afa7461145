"""A run with no reward signal says so, then stops.

A reward function that has nothing to compare against returns ``None`` ("no opinion"): ``accuracy`` on a row
without an ``answer``, ``code`` on a row without tests. If that is every row, every advantage is 0, the loss
is 0, and the run would "succeed" while learning nothing. Two checks:

* :func:`missing_reward_columns`, before the model loads: each built-in reward named in ``reward_funcs`` is
  checked against the dataset's columns (table :data:`READS`): a column absent from the data, or null in
  every row, is reported as one warning line per reward function.
* :class:`RewardWatch`, in the loop: if none of the first ``max_rounds_without_reward`` generation rounds gave
  any sample a reward (every total unknown, or every function returned only ``None``), the run stops with a
  RewardError naming the functions and the columns they read. Once a round has a reward, it never stops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grouprl.errors import RewardError

# the columns a reference answer may come in (grouprl.rewards.adapters.ANSWER_ALIASES: TRL / verl names)
_ANSWER = ("answer", "ground_truth", "solution")
# built-in reward name -> the dataset columns it reads (any one of them is enough)
READS: dict[str, tuple[str, ...]] = {
    "accuracy": _ANSWER,
    "math": _ANSWER,
    "exact": _ANSWER,
    "robust": _ANSWER,
    "countdown": ("target", *_ANSWER),
    "code": ("tests", "test", "test_list"),
}


def _column_values(rows: Any, column: str) -> list | None:
    """The column's values (None when the data has no such column)."""
    names = getattr(rows, "column_names", None)
    if names is not None:
        return list(rows[column]) if column in names else None
    rows = list(rows)
    if not rows or not any(column in r for r in rows):
        return None
    return [r.get(column) for r in rows]


def missing_reward_columns(reward_funcs: Any, rows: Any) -> list[str]:
    """One line per named built-in reward whose columns are absent or null in every row of ``rows``."""
    names = [f for f in (reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs])
             if isinstance(f, str)]
    if rows is None:
        return []
    lines = []
    for name in names:
        columns = READS.get(name)
        if not columns:
            continue
        values = {c: _column_values(rows, c) for c in columns}
        if any(v is not None and any(x is not None for x in v) for v in values.values()):
            continue
        state = "null in every row" if any(v is not None for v in values.values()) else "not in the dataset"
        want = " / ".join(f"`{c}`" for c in columns)
        lines.append(f"reward function {name!r} reads the column {want}, which is {state}: it will return None "
                     f"(no reward) for every sample, so the run has no learning signal. Fix: add the column "
                     f"to the data, or choose a reward that needs no reference answer.")
    return lines


def warn_missing_reward_columns(reward_funcs: Any, rows: Any) -> list[str]:
    """Print :func:`missing_reward_columns` as warnings (stderr); returns the lines."""
    import sys

    lines = missing_reward_columns(reward_funcs, rows)
    for line in lines:
        print(f"grouprl: warning: {line}", file=sys.stderr)
    return lines


class RewardWatch:
    """Stop a run whose first ``limit`` generation rounds gave no sample a reward (``limit`` 0: never)."""

    def __init__(self, names: Sequence[str], limit: int) -> None:
        self.names, self.limit, self.seen, self.rounds = list(names), int(limit or 0), False, 0

    def check(self, metrics: dict[str, Any]) -> None:
        if self.seen or self.limit <= 0:
            return
        none = [n for n in self.names if metrics.get(f"rewards/{n}/frac_none", 0.0) >= 1.0]
        # no reward function at all: an environment gives the reward, and frac_unknown says whether it did
        if metrics.get("reward/frac_unknown", 0.0) < 1.0 and (not self.names or len(none) < len(self.names)):
            self.seen = True
            return
        self.rounds += 1
        if self.rounds == 1:
            import sys

            print(f"grouprl: warning: no sample of the first round has a reward ({self._who(none)}); the run "
                  f"stops if this lasts {self.limit} rounds (max_rounds_without_reward)", file=sys.stderr)
        if self.rounds >= self.limit:
            raise RewardError(f"no sample has had a reward in the first {self.rounds} generation rounds: "
                              f"{self._who(none)}. Nothing can be learned from all-None rewards. Fix: give the "
                              f"data the column the reward reads, or change reward_funcs "
                              f"(max_rounds_without_reward=0 disables this check).")

    def _who(self, none: list[str]) -> str:
        parts = []
        for name in none or self.names:
            columns = READS.get(name)
            read = f", which reads the column {' / '.join(repr(c) for c in columns)}" if columns else ""
            parts.append(f"reward function {name!r} returned None for every sample{read}")
        return "; ".join(parts)
