"""Multi-dimensional reward: ``R = sum_k w_k R_k`` with ``R_k`` in [0, 1] and ``sum_k w_k = 1``.

``AgentRewardFunction(config)(completion, ground_truth, task_type)`` returns every dimension and the
weighted total, e.g. on the worked example (circle area, think block + calculator call)::

    {'accuracy': 1.0, 'format': 0.8, 'efficiency': 1.0, 'safety': 1.0, 'total': 0.96}

(0.5 * 1.0 + 0.2 * 0.8 + 0.15 * 1.0 + 0.15 * 1.0 = 0.96.)

No ground truth gives accuracy a neutral 0.5; a ground truth that cannot be parsed makes
accuracy ``None`` and then the total is ``None`` too (skip the sample rather than score it 0).

``WeightSchedule`` moves the weights over training progress in [0, 1]: a curriculum with a higher
format weight in the first 20 % of steps and a rising accuracy weight later
(``format_first_schedule`` builds exactly that from any config).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from grouprl.errors import ConfigError, did_you_mean
from grouprl.registry import REWARDS
from grouprl.rewards._limit import time_limited
from grouprl.rewards.accuracy import accuracy_reward
from grouprl.rewards.efficiency import efficiency_reward
from grouprl.rewards.format import format_reward
from grouprl.rewards.safety import safety_reward

DIMENSIONS = ("accuracy", "format", "efficiency", "safety")


@dataclass(frozen=True)
class RewardConfig:
    """Weights of the four dimensions (non-negative, summing to 1) and the per-task options."""

    accuracy_weight: float = 0.50
    """Task correctness: the core dimension."""
    format_weight: float = 0.20
    """Agent format (think block, tool-call syntax)."""
    efficiency_weight: float = 0.15
    """Few steps, bounded length, no repetition."""
    safety_weight: float = 0.15
    """No dangerous actions, no leaked secrets."""
    task_type: str = "math"
    """Default ``accuracy_reward`` task type: math, code, tool_call or exact."""
    expected_steps: int = 3
    """Tool calls allowed before ``efficiency_reward`` starts to subtract."""
    max_tokens: int = 512
    """Length (words, or tokens with a tokenizer) before ``efficiency_reward`` starts to subtract."""
    tolerance: float = 1e-2
    """Relative numeric tolerance of math answers."""
    neutral_accuracy: float = 0.5
    """Accuracy used when a sample has no ground truth at all (a neutral score)."""

    def __post_init__(self) -> None:
        validate_weights(self)

    def weights(self) -> dict[str, float]:
        """``{"accuracy": w, "format": w, "efficiency": w, "safety": w}``."""
        return {d: float(getattr(self, f"{d}_weight")) for d in DIMENSIONS}


def validate_weights(config) -> None:
    """Raise ``ConfigError`` naming every weight unless all are finite, >= 0 and sum to 1 within 1e-6."""
    weights = {f"{d}_weight": getattr(config, f"{d}_weight") for d in DIMENSIONS}
    listing = ", ".join(f"{k}={v!r}" for k, v in weights.items())
    try:
        values = [float(v) for v in weights.values()]
    except (TypeError, ValueError) as e:
        raise ConfigError(f"reward weights must be numbers: {listing}") from e
    bad = [k for k, v in zip(weights, values) if not math.isfinite(v) or v < 0]
    if bad:
        raise ConfigError(
            f"reward weights must be finite and non-negative; {', '.join(bad)} is not ({listing})."
        )
    total = sum(values)
    if abs(total - 1.0) > 1e-6:
        raise ConfigError(
            f"reward weights must sum to 1 within 1e-6, but {listing} sum to {total:.6g}. "
            f"Rescale them (divide each by {total:.6g}) or adjust one of them."
        )


math_reward_config = RewardConfig(0.60, 0.15, 0.15, 0.10, task_type="math", expected_steps=3, max_tokens=400)
"""Math reasoning: correctness first; 1 % relative tolerance; <= 3 steps, <= 400 tokens."""
code_reward_config = RewardConfig(0.50, 0.10, 0.25, 0.15, task_type="code", expected_steps=3, max_tokens=1024)
"""Code generation/repair: k/n tests passed; efficiency matters more (<= 3 edits)."""
retrieval_reward_config = RewardConfig(0.40, 0.20, 0.20, 0.20, task_type="exact", expected_steps=3)
"""Retrieval/QA: a rule-based normalised exact match (no LLM judge)."""

TEMPLATES = {
    "default": RewardConfig(),
    "math": math_reward_config,
    "code": code_reward_config,
    "retrieval": retrieval_reward_config,
}


@dataclass(frozen=True)
class WeightSchedule:
    """Weights as a function of training progress ``p`` in [0, 1]: ``early`` up to ``warmup``, then a
    linear blend to ``late`` over the next ``ramp`` of training (a blend of two weight vectors that
    each sum to 1 also sums to 1)."""

    early: RewardConfig
    late: RewardConfig
    warmup: float = 0.2
    ramp: float = 0.3

    def at(self, progress: float) -> RewardConfig:
        """The config to use at ``progress`` (clamped to [0, 1])."""
        p = min(1.0, max(0.0, float(progress)))
        t = 1.0 if self.ramp <= 0 else (p - self.warmup) / self.ramp
        t = min(1.0, max(0.0, t))
        mixed = {
            f"{d}_weight": (1 - t) * getattr(self.early, f"{d}_weight")
            + t * getattr(self.late, f"{d}_weight")
            for d in DIMENSIONS
        }
        return dataclasses.replace(self.late, **mixed)


def format_first_schedule(config: RewardConfig, boost: float = 0.2, warmup: float = 0.2, ramp: float = 0.3):
    """A schedule that moves ``boost`` of weight from accuracy to format early, then back to ``config``."""
    b = min(boost, config.accuracy_weight)
    early = dataclasses.replace(
        config, accuracy_weight=config.accuracy_weight - b, format_weight=config.format_weight + b
    )
    return WeightSchedule(early=early, late=config, warmup=warmup, ramp=ramp)


class AgentRewardFunction:
    """The multi-dimensional reward: each dimension scored independently, plus the weighted total.

    ``schedule`` (optional) overrides the weights by training progress, passed as ``progress=``.
    ``*_kwargs`` go to the dimension's function (e.g. ``format_kwargs={"direct_answer_credit": True}``).
    """

    def __init__(
        self,
        config: RewardConfig | None = None,
        *,
        schedule: WeightSchedule | None = None,
        accuracy_kwargs: dict | None = None,
        format_kwargs: dict | None = None,
        efficiency_kwargs: dict | None = None,
        safety_kwargs: dict | None = None,
    ) -> None:
        self.config = config if config is not None else RewardConfig()
        self._validate_weights()
        self.schedule = schedule
        self.kwargs = {
            "accuracy": dict(accuracy_kwargs or {}),
            "format": dict(format_kwargs or {}),
            "efficiency": dict(efficiency_kwargs or {}),
            "safety": dict(safety_kwargs or {}),
        }

    def _validate_weights(self) -> None:
        validate_weights(self.config)

    def weights_at(self, progress: float | None) -> dict[str, float]:
        """The weights in use at ``progress`` (the config's when there is no schedule or progress)."""
        if self.schedule is None or progress is None:
            return self.config.weights()
        return self.schedule.at(progress).weights()

    def __call__(
        self,
        completion: str,
        ground_truth=None,
        task_type: str | None = None,
        *,
        progress: float | None = None,
        **meta,
    ) -> dict[str, float | None]:
        """``{"accuracy", "format", "efficiency", "safety", "total"}``; extra keywords go to accuracy."""
        cfg = self.config
        scores: dict[str, float | None] = {}
        if ground_truth is None or (isinstance(ground_truth, str) and not ground_truth.strip()):
            scores["accuracy"] = cfg.neutral_accuracy
        else:
            kw = {"tolerance": cfg.tolerance, **self.kwargs["accuracy"], **meta}
            scores["accuracy"] = accuracy_reward(completion, ground_truth, task_type or cfg.task_type, **kw)
        scores["format"] = format_reward(completion, **self.kwargs["format"])
        eff = {
            "expected_steps": cfg.expected_steps,
            "max_tokens": cfg.max_tokens,
            **self.kwargs["efficiency"],
        }
        scores["efficiency"] = efficiency_reward(completion, **eff)
        scores["safety"] = safety_reward(completion, **self.kwargs["safety"])
        weights = self.weights_at(progress)
        if scores["accuracy"] is None:
            scores["total"] = None
        else:
            scores["total"] = sum(weights[d] * scores[d] for d in DIMENSIONS)
        return scores


def _scores_code(args: tuple, kwargs: dict) -> bool:
    """The call runs code tests (in their own sandbox, with their own limits): keep it in-process."""
    config = kwargs.get("config", "default")
    task = kwargs.get("task_type") or getattr(TEMPLATES.get(config) if isinstance(config, str) else config,
                                             "task_type", None)
    return task == "code"


@REWARDS.register("composite")
@time_limited(in_process=_scores_code)
def composite_reward(
    completion: str,
    *,
    answer=None,
    config: RewardConfig | str = "default",
    schedule: WeightSchedule | str | None = None,
    task_type: str | None = None,
    progress: float | None = None,
    **meta,
) -> float | None:
    """Weighted total of accuracy, format, efficiency and safety (AgentRewardFunction's "total").

    ``config``: a RewardConfig or a template name: "default", "math", "code" or "retrieval".
    ``schedule``: a WeightSchedule, or "format_first" for ``format_first_schedule(config)``; it is
    applied at ``progress`` (the TRL adapter passes ``global_step / max_steps``).

    Worked example: accuracy 1.0 (78.54 from the reasoning), format 0.8, efficiency 1.0, safety 1.0;
    default weights 0.5 * 1 + 0.2 * 0.8 + 0.15 + 0.15 = 0.96, "math" weights 0.6 + 0.15 * 0.8 + 0.15 + 0.1:

    >>> c = "<think>The area is pi r^2 = 25 pi, about 78.54</think><tool_call>calc(x='25*pi')</tool_call>"
    >>> round(composite_reward(c, answer="78.54"), 6), round(composite_reward(c, answer="78.54", config="math"), 6)
    (0.96, 0.97)
    """
    if isinstance(config, str):
        if config not in TEMPLATES:
            raise ConfigError(
                f"composite reward: unknown config {config!r}; use one of {', '.join(TEMPLATES)}."
                + did_you_mean(config, TEMPLATES)
            )
        config = TEMPLATES[config]
    if isinstance(schedule, str):
        if schedule != "format_first":
            raise ConfigError(
                f"composite reward: unknown schedule {schedule!r}; use 'format_first' or a WeightSchedule."
            )
        schedule = format_first_schedule(config)
    agent = AgentRewardFunction(config, schedule=schedule)
    return agent(completion, answer, task_type, progress=progress, **meta)["total"]


composite_reward.passes_options_to = (accuracy_reward,)  # other options go to accuracy_reward
