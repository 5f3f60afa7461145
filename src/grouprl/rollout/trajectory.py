"""The record a rollout hands to training, and its stacking into padded tensors.

One :class:`Trajectory` per completion, single-turn or multi-turn alike. ``completion_ids`` holds every
token after the prompt (model turns and tool turns interleaved); ``loss_mask`` says which of them the
policy sampled (1) and which came from a tool or the chat template (0). The loss sees ``loss_mask`` and
nothing else about turns (DESIGN.md, "The record that flows").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

END_REASONS = ("answered", "max_turns", "max_tokens", "tool_error_budget", "timeout", "env_done", "env_error")


@dataclass
class Trajectory:
    """One rollout of one prompt.

    ``tool_calls``: ``{"name", "arguments", "result", "error"}`` per call in order (``error`` is ``None`` or
    a kind: ``malformed``, ``unknown_tool``, ``bad_arguments``, ``exception``, ``timeout``).
    ``end_reason``: one of :data:`END_REASONS` (``max_tokens`` = truncated by the token budget; ``env_done`` /
    ``env_error``: a conversational environment ended the episode / its step failed).
    ``messages``: the conversation as text (prompt messages, assistant turns as decoded, tool messages).
    ``group``: index of the prompt; the ``G`` rollouts of one prompt share it.
    ``env_state``: the environment object's public attributes that are plain data (numbers, strings, lists,
    dicts; e.g. ``edits``, ``iterations``, ``num_searches``, ``returned_ids``), read when the rollout ended.
    ``rollout_logp``: the sampler's log-prob of each completion token (0.0 on mask-0 tokens), when known.
    """

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_logp: list[float] | None = None
    num_turns: int = 0
    tool_calls: list[dict] = field(default_factory=list)
    end_reason: str = ""
    messages: list[dict] = field(default_factory=list)
    group: int = 0
    env_reward: float | None = None
    env_state: dict = field(default_factory=dict)  # the environment's public counters after the rollout
    completion: str = ""  # decoded completion (special tokens skipped), what the rewards score
    # the user's environment object (TRL's `environments=` for reward functions); not serialised
    environment: Any = field(default=None, repr=False, compare=False)

    def append(self, ids: list[int], sampled: bool, logp: list[float] | None = None) -> None:
        """Append ``ids`` with loss mask 1 (``sampled``) or 0 (tool output / template glue). ``logp``: the
        engine's log-prob of each sampled id; a sampled turn without them leaves ``rollout_logp`` None
        (unknown for the whole trajectory); tool tokens get 0.0."""
        self.completion_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        if self.rollout_logp is None:
            return
        if not sampled:
            self.rollout_logp.extend([0.0] * len(ids))
        elif logp is None or len(logp) != len(ids):
            self.rollout_logp = None
        else:
            self.rollout_logp.extend(float(x) for x in logp)

    def check(self) -> None:
        """Raise ValueError when the fields disagree (lengths, mask values, end reason)."""
        if len(self.loss_mask) != len(self.completion_ids):
            raise ValueError(f"Trajectory: loss_mask has {len(self.loss_mask)} entries for "
                             f"{len(self.completion_ids)} completion ids")
        if self.rollout_logp is not None and len(self.rollout_logp) != len(self.completion_ids):
            raise ValueError(f"Trajectory: rollout_logp has {len(self.rollout_logp)} entries for "
                             f"{len(self.completion_ids)} completion ids")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("Trajectory: loss_mask entries must be 0 or 1")
        if self.end_reason and self.end_reason not in END_REASONS:
            raise ValueError(f"Trajectory: end_reason={self.end_reason!r}; known: {', '.join(END_REASONS)}")

    @property
    def model_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def tool_tokens(self) -> int:
        return len(self.loss_mask) - sum(self.loss_mask)


def public_state(obj: Any) -> dict:
    """The public attributes of ``obj`` that are plain data, copied (JSON round trip; sets become sorted
    lists): what reward functions see of an environment as ``env_state``."""
    import json

    out = {}
    for key, value in vars(obj).items() if hasattr(obj, "__dict__") else ():
        if key.startswith("_") or callable(value):
            continue
        if isinstance(value, (set, frozenset)):
            value = sorted(value, key=repr)
        try:
            out[key] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            continue
    return out


@dataclass
class TrajectoryBatch:
    """Padded tensors of ``N`` trajectories (the micro-batch material of the trainer).

    ``prompt_ids, prompt_mask [N,P]`` left-padded; ``completion_ids, completion_mask, loss_mask [N,T]``
    right-padded; ``completion_mask`` is 1 on every real completion token, ``loss_mask`` only on sampled
    ones (train with ``loss_mask``; use ``completion_mask`` as the attention mask); ``truncated [N]`` is
    ``end_reason == "max_tokens"``; ``group [N]`` the prompt index; ``rollout_logp [N,T]`` or ``None``.
    """

    prompt_ids: Any
    prompt_mask: Any
    completion_ids: Any
    completion_mask: Any
    loss_mask: Any
    truncated: Any
    group: Any
    rollout_logp: Any = None

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])


def stack_trajectories(trajectories: list[Trajectory], pad_id: int, device: Any = None) -> TrajectoryBatch:
    """Stack ``trajectories`` into a :class:`TrajectoryBatch` (prompts left-padded, completions right-padded)."""
    import torch

    if not trajectories:
        raise ValueError("stack_trajectories: no trajectories to stack")
    for t in trajectories:
        t.check()
    N = len(trajectories)
    P = max(len(t.prompt_ids) for t in trajectories)
    T = max(1, max(len(t.completion_ids) for t in trajectories))
    prompt_ids = torch.full((N, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((N, P), dtype=torch.long)
    completion_ids = torch.full((N, T), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((N, T), dtype=torch.long)
    loss_mask = torch.zeros((N, T), dtype=torch.long)
    with_logp = all(t.rollout_logp is not None for t in trajectories)
    rollout_logp = torch.zeros((N, T), dtype=torch.float32) if with_logp else None
    for i, t in enumerate(trajectories):
        p, c = len(t.prompt_ids), len(t.completion_ids)
        if p:
            prompt_ids[i, P - p:] = torch.tensor(t.prompt_ids, dtype=torch.long)
            prompt_mask[i, P - p:] = 1
        if c:
            completion_ids[i, :c] = torch.tensor(t.completion_ids, dtype=torch.long)
            completion_mask[i, :c] = 1
            loss_mask[i, :c] = torch.tensor(t.loss_mask, dtype=torch.long)
            if rollout_logp is not None:
                rollout_logp[i, :c] = torch.tensor(t.rollout_logp, dtype=torch.float32)
    truncated = torch.tensor([t.end_reason == "max_tokens" for t in trajectories], dtype=torch.bool)
    group = torch.tensor([t.group for t in trajectories], dtype=torch.long)
    batch = TrajectoryBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, loss_mask, truncated, group,
                            rollout_logp)
    if device is not None:
        for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "loss_mask", "truncated",
                     "group", "rollout_logp"):
            value = getattr(batch, name)
            if value is not None:
                setattr(batch, name, value.to(device))
    return batch


def multiturn_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Batch means: ``tools/calls_per_traj``, ``tools/failure_frac`` (failed / all calls), ``turns/mean``,
    ``end_reason/<reason>`` fractions, ``tokens/model`` and ``tokens/tool`` per trajectory, and
    ``env_reward/mean`` over the trajectories whose environment gave one."""
    n = max(1, len(trajectories))
    calls = [c for t in trajectories for c in t.tool_calls]
    out = {
        "tools/calls_per_traj": len(calls) / n,
        "tools/failure_frac": sum(c["error"] is not None for c in calls) / max(1, len(calls)),
        "turns/mean": sum(t.num_turns for t in trajectories) / n,
        "tokens/model": sum(t.model_tokens for t in trajectories) / n,
        "tokens/tool": sum(t.tool_tokens for t in trajectories) / n,
    }
    for reason in END_REASONS:
        out[f"end_reason/{reason}"] = sum(t.end_reason == reason for t in trajectories) / n
    rewards = [t.env_reward for t in trajectories if t.env_reward is not None]
    if rewards:
        out["env_reward/mean"] = sum(rewards) / len(rewards)
    return out
