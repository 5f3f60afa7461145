"""Score completions with several reward functions: weighted sum, one column per function, loud errors.

Reward functions have TRL's signature ``fn(completions, prompts=..., **columns) -> list[float | None]``;
registry names are turned into such functions by ``grouprl.rewards.make_reward_func``. ``None`` means
"no opinion" (e.g. the ground truth could not be parsed, a sandbox failed). With ``missing="exclude"``
(the default) a sample whose total is unknown -- any function returned None for it -- gets a NaN total:
the advantage estimators leave it out of its group's statistics and give it advantage 0, and the trainer
gives it no loss. With ``missing="zero"`` a None counts as 0. A function that raises, returns the wrong
number of values, or returns NaN / a non-number stops the run with a RewardError naming the function and
the sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from grouprl.errors import ConfigError, RewardError


def resolve_reward_funcs(funcs: Any, reward_kwargs: dict | None = None, *, allow_empty: bool = False) -> list[Callable]:
    """Names (registry or ``pkg.mod:fn``) and callables -> a list of TRL-style batch callables (``allow_empty``:
    an environment gives the reward, so no function is needed)."""
    reward_kwargs = reward_kwargs or {}
    items = funcs if isinstance(funcs, (list, tuple)) else [funcs]
    if not items and not allow_empty:
        raise ConfigError("reward_funcs is empty: give at least one reward name or function.")
    from grouprl.rewards import make_reward_func

    out = []
    for item in items:
        if callable(item):  # either form: per-sample fn(completion, ...) or TRL batch fn(completions, ...)
            out.append(make_reward_func(awaited(item)))
        elif isinstance(item, str):
            from grouprl.registry import REWARDS

            fn, options = REWARDS.get(item), dict(reward_kwargs.get(item, {}))
            out.append(make_reward_func(awaited(fn), **options) if awaited(fn) is not fn else
                       make_reward_func(item, **options))
        else:
            raise ConfigError(f"reward_funcs entry {item!r} is neither a reward name nor a callable.")
    return out


def reward_name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


class RewardScorer:
    """``score(prompts, completions, columns) -> (total [N], components [N][F])`` with NaN for None."""

    def __init__(self, funcs: Sequence[Callable], weights: Sequence[float] | None = None,
                 missing: str = "exclude") -> None:
        if missing not in ("exclude", "zero"):
            raise ConfigError(f"missing_reward={missing!r} must be 'exclude' or 'zero'.")
        self.missing = missing
        self.funcs = list(funcs)
        self.names = _unique([reward_name(f) for f in self.funcs])
        if weights is not None and len(weights) != len(self.funcs):
            raise ConfigError(f"reward_weights has {len(weights)} entries but there are {len(self.funcs)} reward "
                              f"functions ({', '.join(self.names)}): give one weight per function.")
        self.weights = [float(w) for w in (weights if weights is not None else [1.0] * len(self.funcs))]
        self.last_metrics: dict[str, float] = {}

    def score(self, prompts: list[Any], completions: list[Any], columns: dict[str, list],
              trainer_state: Any = None, completion_ids: list[list[int]] | None = None):
        """Call every function with TRL's keywords: ``prompts``, ``completions``, ``completion_ids`` (the
        sampled token ids of each completion, EOS included, padding excluded), ``trainer_state`` (TRL's:
        ``global_step``, ``max_steps``; lets scheduled rewards see progress) and the dataset columns."""
        n = len(completions)
        components = [[math.nan] * len(self.funcs) for _ in range(n)]
        extra: dict[str, Any] = {"trainer_state": trainer_state} if trainer_state is not None else {}
        # TRL's `log_metric(name, value)`: a reward may log its own numbers (e.g. judge/agreement), which the
        # round's metrics then carry
        self.last_metrics = {}
        extra["log_metric"] = lambda key, value: self.last_metrics.__setitem__(str(key), float(value))
        if completion_ids is not None:
            extra["completion_ids"] = completion_ids
        for j, (fn, name) in enumerate(zip(self.funcs, self.names)):
            values = self._call(fn, name, prompts, completions, {**columns, **extra})
            for i, value in enumerate(values):
                components[i][j] = self._check_value(value, name, i, completions[i])
        return [self.total(row) for row in components], components

    def total(self, row: list[float]) -> float:
        """Weighted sum of one sample's components (NaN = None): NaN if any is None under 'exclude'."""
        if self.missing == "exclude" and any(math.isnan(v) for v in row):
            return math.nan
        return sum(w * (0.0 if math.isnan(v) else v) for w, v in zip(self.weights, row))

    @staticmethod
    def _call(fn: Callable, name: str, prompts: list, completions: list, columns: dict[str, list]) -> list:
        try:
            values = fn(completions=completions, prompts=prompts, **columns)
        except RewardError:
            raise
        except Exception as e:
            culprit = _find_failing_sample(fn, prompts, completions, columns)
            where = f" on sample {culprit} (completion {_short(completions[culprit])})" if culprit is not None else ""
            raise RewardError(f"reward function {name!r} raised {type(e).__name__}: {e}{where}. "
                              f"Return None for samples it cannot judge instead of raising.") from e
        if values is None or not hasattr(values, "__len__"):
            raise RewardError(f"reward function {name!r} returned {type(values).__name__}, expected a list of "
                              f"{len(completions)} floats (one per completion).")
        values = list(values)
        if len(values) != len(completions):
            raise RewardError(f"reward function {name!r} returned {len(values)} values for {len(completions)} "
                              f"completions: it must return exactly one value (or None) per completion.")
        return values

    @staticmethod
    def _check_value(value: Any, name: str, i: int, completion: Any) -> float:
        if value is None:
            return math.nan
        if isinstance(value, (str, bytes)):
            raise RewardError(f"reward function {name!r} returned {value!r} for sample {i} (completion "
                              f"{_short(completion)}): a {type(value).__name__}, not a score; expected a float or "
                              f"None. Fix: return float(...) of it; text is never read as a number silently.")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise RewardError(f"reward function {name!r} returned {value!r} for sample {i} "
                              f"(completion {_short(completion)}): expected a float or None.") from None
        if math.isnan(number) or math.isinf(number):
            raise RewardError(f"reward function {name!r} returned {number} for sample {i} (completion "
                              f"{_short(completion)}). Return None for 'no opinion'; NaN/inf are treated as bugs.")
        return number


def awaited(fn: Callable) -> Callable:
    """``fn`` itself, or, for an ``async def`` reward (a coroutine function, or an object whose ``__call__`` is
    one), a plain function with the same signature that runs it to completion (:func:`_run`)."""
    import functools
    import inspect

    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)):
        return fn

    @functools.wraps(fn)
    def run_to_completion(*args: Any, **kwargs: Any) -> Any:
        return _run(fn(*args, **kwargs))

    return run_to_completion


def _run(awaitable: Any) -> Any:
    """Await in a fresh event loop (in a helper thread when this one already runs a loop)."""
    import asyncio

    async def main() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()


def _find_failing_sample(fn, prompts, completions, columns) -> int | None:
    """Re-run a failing function one sample at a time to name the sample that breaks it."""
    for i in range(len(completions)):
        try:
            fn(completions=[completions[i]], prompts=[prompts[i]],
               **{k: [v[i]] if isinstance(v, list) else v for k, v in columns.items()})
        except Exception:
            return i
    return None


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out


def _short(value: Any, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."
