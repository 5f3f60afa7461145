"""The backend interface: what a generation backend receives and returns.

A backend implements ``generate(prompts: list[str], n: int, params: SamplingParams) -> Rollout`` and,
when it holds its own copy of the weights (vLLM), ``sync_weights(model)``: the trainer calls it once per
generation round, before generating (and before each evaluation), so the engine samples the current policy.
Completions of prompt ``i`` are rows ``i*n .. i*n+n-1`` (grouped), so rewards reshape to ``[B, G]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class SamplingParams:
    """Decoding settings; ``temperature == 0`` means greedy."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_prompt_length: int | None = None
    min_new_tokens: int = 0  # > 0 suppresses EOS until this length (fixed-length benchmarks)


@dataclass
class Rollout:
    """One batch of N = B*n completions (torch tensors on the model's device).

    prompt_ids [N,P] left-padded, prompt_mask [N,P], completion_ids [N,T] right-padded, completion_mask [N,T]
    (1 up to and including the first EOS), truncated [N] bool (no EOS within max_new_tokens),
    completions: decoded text without special tokens, prompts: the prompt text of each row.
    Multi-turn rollouts add ``loss_mask [N,T]`` (1 on model-sampled tokens, 0 on tool outputs and template
    glue; ``None`` = every completion token was sampled) and ``trajectories`` (one
    :class:`grouprl.rollout.trajectory.Trajectory` per row).
    rollout_logp [N,T]: the sampling engine's own log-prob of each sampled token (0 on padding), given by a
    backend that samples with its own copy of the weights (vLLM); ``None`` when the trainer's model sampled.
    """

    prompt_ids: Any
    prompt_mask: Any
    completion_ids: Any
    completion_mask: Any
    truncated: Any
    completions: list[str]
    prompts: list[str]
    loss_mask: Any = None
    trajectories: list | None = None
    rollout_logp: Any = None  # [N,T] fp32: the sampler's own log-prob of each sampled token (None: the trainer sampled)

    def __len__(self) -> int:
        return len(self.completions)

    def token_lists(self) -> list[list[int]]:
        """The sampled token ids of each completion, EOS included, padding excluded (TRL's ``completion_ids``)."""
        lengths = self.completion_mask.sum(dim=1).tolist()
        return [row[:int(n)].tolist() for row, n in zip(self.completion_ids.cpu(), lengths)]

    def select(self, index: list[int]) -> Rollout:
        """Rows ``index`` of every field (used to drop groups)."""
        import torch

        idx = torch.as_tensor(index, dtype=torch.long, device=self.prompt_ids.device)
        return Rollout(self.prompt_ids[idx], self.prompt_mask[idx], self.completion_ids[idx],
                       self.completion_mask[idx], self.truncated[idx],
                       [self.completions[i] for i in index], [self.prompts[i] for i in index],
                       None if self.loss_mask is None else self.loss_mask[idx],
                       None if self.trajectories is None else [self.trajectories[i] for i in index],
                       None if self.rollout_logp is None else self.rollout_logp[idx])


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Stack rollouts whose prompt/completion widths differ (prompts re-padded left, completions right;
    ``loss_mask`` right-padded with 0, carried when every part has one, as are ``trajectories``)."""
    import torch

    P = max(r.prompt_ids.shape[1] for r in parts)
    T = max(r.completion_ids.shape[1] for r in parts)

    def pad(x, width, value, left):
        extra = width - x.shape[1]
        if extra == 0:
            return x
        fill = x.new_full((x.shape[0], extra), value)
        return torch.cat([fill, x] if left else [x, fill], dim=1)

    return Rollout(
        torch.cat([pad(r.prompt_ids, P, pad_id, True) for r in parts]),
        torch.cat([pad(r.prompt_mask, P, 0, True) for r in parts]),
        torch.cat([pad(r.completion_ids, T, pad_id, False) for r in parts]),
        torch.cat([pad(r.completion_mask, T, 0, False) for r in parts]),
        torch.cat([r.truncated for r in parts]),
        [c for r in parts for c in r.completions],
        [p for r in parts for p in r.prompts],
        torch.cat([pad(r.loss_mask, T, 0, False) for r in parts]) if all(r.loss_mask is not None for r in parts)
        else None,
        [t for r in parts for t in r.trajectories] if all(r.trajectories is not None for r in parts) else None,
        _concat_rollout_logp(parts, T, pad),
    )


def _concat_rollout_logp(parts: list[Rollout], T: int, pad: Any) -> Any:
    """The parts' ``rollout_logp`` stacked (0 on padding); None when no part has one."""
    import torch

    have = [r.rollout_logp is not None for r in parts]
    if not any(have):
        return None
    if not all(have):
        raise ValueError("concat_rollouts: some parts carry rollout_logp and some do not (one backend per round)")
    return torch.cat([pad(r.rollout_logp, T, 0.0, False) for r in parts])


class Backend(Protocol):
    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> Rollout: ...

    def sync_weights(self, model: Any) -> None: ...
