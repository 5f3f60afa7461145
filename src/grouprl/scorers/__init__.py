"""Learned rewards that run a model in-process: ``reward_model`` (a sequence-classification reward model).

They live outside ``grouprl.rewards`` because they need torch, which the pure-Python reward library never
imports; the registration below imports nothing heavy, and torch is loaded on the first call.
"""

from __future__ import annotations

from typing import Any

from grouprl.registry import REWARDS
from grouprl.rewards.adapters import batch_reward


@REWARDS.register("reward_model")
@batch_reward
def reward_model_reward(prompts, completions, *, path: str | None = None, device: str = "cpu",
                        dtype: str = "float32", batch_size: int = 8, max_length: int = 1024,
                        normalize: bool = False, clip: float | None = None,
                        label_index: int | None = None) -> list[float | None]:
    """Score the prompt and completion with a local Hugging Face sequence-classification reward model.

    ``path``: a directory (or hub id) holding an ``AutoModelForSequenceClassification`` and its tokenizer;
    the chat template is applied to ``[user: prompt, assistant: completion]`` when the tokenizer has one.
    ``device`` / ``dtype``: where the reward model runs (its own, not the policy's). The score is the
    single logit (``num_labels == 1``, the Bradley-Terry head of Ouyang et al., arXiv:2203.02155 §3.5) or
    the logit at ``label_index``. ``normalize``: subtract the running mean and divide by the running
    standard deviation of every score seen so far (Welford); ``clip``: then clamp to ``[-clip, clip]``.

    Example (recipe)::

        reward_funcs: [reward_model]
        reward_kwargs: {reward_model: {path: runs/rm, normalize: true, clip: 5.0}}

    Normalisation by hand: after raw scores 1 and 3 the running mean is 2 and the standard deviation 1, so
    they become -1 and 1 (examples/reward_model.py trains a model and scores with it).

    >>> from grouprl.scorers.reward_model import RunningStats
    >>> stats = RunningStats(); stats.update([1.0, 3.0]); (stats.mean, stats.std)
    (2.0, 1.0)
    """
    from grouprl.scorers.reward_model import get_scorer

    scorer = get_scorer(path, device=device, dtype=dtype, batch_size=batch_size, max_length=max_length,
                        label_index=label_index)
    n = len(completions)
    prompt_list: list[Any] = (list(prompts) if isinstance(prompts, (list, tuple)) and len(prompts) == n
                              else [prompts] * n)
    return scorer.reward(prompt_list, list(completions), normalize=normalize, clip=clip)


__all__ = ["reward_model_reward"]
