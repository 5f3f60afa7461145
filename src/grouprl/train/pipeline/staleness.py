"""Staleness accounting of the asynchronous pipeline: pure integer arithmetic, no processes.

Versions count optimizer steps: the weights after ``s`` optimizer steps are version ``s``. Round ``j``
(0-based over the whole run) is first trained when the trainer holds version ``j * R`` (``R`` = optimizer
steps per round). The trainer pushes its weights to the rollout worker at the start (version ``v0``, the
step the run starts or resumes at) and after every step ``s`` with ``s % W == 0`` (``W`` =
``weight_sync_steps``).

With bound ``k`` (``max_staleness``) the worker samples round ``j`` with exactly the weights
:func:`target_version` names: the OLDEST pushed version ``>= j * R - k``. So

* the staleness of round ``j``, ``j * R - target_version(j)``, is at most ``k`` (the bound holds by
  construction; the trainer still checks it and drops, counting, any round that breaks it -- a round
  sampled before a resume, say);
* which weights sample a round depends on ``(j, R, k, W, v0)`` only, never on timing: with its per-round
  seed (:func:`round_seed`) a regenerated round is the same round;
* the version the worker needs is pushed before the trainer needs round ``j`` when ``W <= k + 1``
  (``config.validate.check_async``): the smallest multiple of ``W`` that is ``>= j * R - k`` is at most
  ``j * R``, which the trainer reaches training rounds ``< j`` only -- so neither side waits for the other
  forever.

Steps inside one round (``steps_per_generation`` / ``num_iterations``) are the ordinary PPO mini-batch
off-policyness of the synchronous loop, corrected by the clipped ratio; staleness counts from the round's
first optimizer step (as TRL's ``max_staleness`` and AReaL's ``max_head_offpolicyness`` count it, arXiv
2505.24298, Sec. 5.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def target_version(round_index: int, steps_per_round: int, max_staleness: int, sync_steps: int,
                   start_version: int) -> int:
    """The weights that sample round ``round_index``: the oldest pushed version ``>= j * R - k``
    (pushes: ``start_version``, then every multiple of ``sync_steps`` above it)."""
    need = round_index * steps_per_round - max_staleness
    if need <= start_version:
        return start_version
    return -(-need // sync_steps) * sync_steps  # ceil(need / W) * W


def first_step(round_index: int, steps_per_round: int) -> int:
    """The trainer's version when it starts training round ``round_index``."""
    return round_index * steps_per_round


def round_seed(seed: int, round_index: int, rank: int = 0) -> int:
    """The sampling seed of round ``round_index`` on ``rank``: a fixed function of the three, so the same
    round regenerated (after a resume, or by another worker) samples the same tokens from the same weights."""
    return (seed * 1_000_003 + round_index * 7_919 + rank * 104_729) % (2 ** 31 - 1)


def pushes_at(step: int, sync_steps: int) -> bool:
    """Whether the trainer pushes its weights after optimizer step ``step``."""
    return step % sync_steps == 0


@dataclass
class StalenessLog:
    """The trainer's side: which rounds it admits, and the ``async/*`` figures of each admitted round.

    ``admit(version, trainer_version)`` is True when the round's staleness ``trainer_version - version``
    is within ``max_staleness``; otherwise the round is counted in ``dropped`` (logged as ``async/dropped``,
    cumulative over the run) and must not be trained."""

    max_staleness: int
    dropped: int = 0
    trained: int = 0
    staleness_sum: int = 0
    staleness_max: int = 0
    history: list[int] = field(default_factory=list)

    def admit(self, version: int, trainer_version: int) -> bool:
        lag = trainer_version - version
        if lag < 0:
            raise ValueError(f"a round sampled by version {version} reached the trainer at version "
                             f"{trainer_version}: the worker holds weights the trainer has not pushed")
        if lag > self.max_staleness:
            self.dropped += 1
            return False
        self.trained += 1
        self.staleness_sum += lag
        self.staleness_max = max(self.staleness_max, lag)
        self.history.append(lag)
        return True

    def metrics(self, lag: int) -> dict[str, float]:
        """The figures logged with every optimizer step of a round of staleness ``lag``: this round's
        staleness (every sample of a round has one version: its mean and max over the samples are both
        ``lag``), the running mean and max over the rounds trained so far, the rounds dropped so far."""
        return {"async/staleness_mean": float(lag), "async/staleness_max": float(lag),
                "async/staleness_run_mean": self.staleness_sum / max(self.trained, 1),
                "async/staleness_run_max": float(self.staleness_max), "async/dropped": float(self.dropped)}
