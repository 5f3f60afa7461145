"""Adapters: any reward as a TRL ``reward_funcs`` callable, or as a verl ``compute_score``.

TRL 1.16's ``GRPOTrainer`` calls each reward function as::

    reward_func(prompts=prompts, completions=completions, completion_ids=completion_ids,
                trainer_state=state, log_extra=..., log_metric=..., **dataset_columns)

where each dataset column is a list with one value per completion, completions are strings or, for
conversational data, lists of messages (``[{"role": "assistant", "content": ...}]``), and ``None``
results become NaN. ``make_reward_func`` returns exactly that kind of callable (a picklable object whose
``__name__`` is the reward's name). The dataset column ``answer`` (or its aliases ``ground_truth``,
``solution``) becomes the per-sample ``answer=``; the other columns are passed by name. Training
progress (``trainer_state.global_step / max_steps``) is passed as ``progress=`` to rewards that take it,
so a ``WeightSchedule`` works under TRL.

Two forms of reward function are accepted everywhere (a Python callable, a REWARDS name, a
``pkg.mod:fn`` plug-in); :func:`reward_form` decides by one rule:

1. ``@batch_reward`` / ``@sample_reward`` on the function say it explicitly;
2. else a parameter named ``completions`` or ``completion_ids`` (TRL's ``completions_ids`` spelling too) means
   the **batch** form, TRL's ``fn(prompts, completions, completion_ids, **kwargs) -> list[float | None]``
   (dataset columns come as lists); so TRL's ``get_soft_overlong_punishment(...)`` and
   ``get_repetition_penalty_reward(...)``, whose callables take ``completion_ids, **kwargs``, are batch rewards;
3. else a first positional parameter (not ``prompts``) means the **per-sample** form,
   ``fn(completion, *, answer=None, **meta) -> float | None``;
4. anything else (``fn(**kwargs)``, ``fn(*args)``, ``fn(prompts, responses)``) is a ConfigError that
   shows both forms.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable
from typing import Any

from grouprl.errors import ConfigError, GroupRLError, RewardError, did_you_mean
from grouprl.registry import REWARDS

BATCH, SAMPLE = "batch", "sample"
FORMS = (
    "A reward function takes one of two forms: per-sample `fn(completion, *, answer=None, **meta) -> float | None` "
    "(its first parameter is the completion text), or batch, TRL's `fn(prompts, completions, **kwargs) -> list` "
    "(it has a parameter named `completions` or `completion_ids`; dataset columns come as lists). Mark a function whose signature "
    "says neither with @grouprl.rewards.batch_reward or @grouprl.rewards.sample_reward."
)
ANSWER_ALIASES = ("answer", "ground_truth", "solution")
_TRAINER_KWARGS = frozenset({"trainer_state", "log_extra", "log_metric", "environments", "completion_ids"})
# a parameter with one of these names makes a function a batch reward (TRL's keywords, one list per batch)
BATCH_PARAMS = ("completions", "completion_ids", "completions_ids")


def completion_text(completion: Any) -> str:
    """A completion as text: strings as they are; chat messages joined from the assistant turns, with
    ``reasoning_content`` as a think block and structured ``tool_calls`` as ``<tool_call>{json}</tool_call>``
    (tool and user turns are left out: their text is not the policy's)."""
    if isinstance(completion, str):
        return completion
    if completion is None:
        return ""
    messages = [completion] if isinstance(completion, dict) else completion
    if not isinstance(messages, (list, tuple)):
        return str(completion)
    parts: list[str] = []
    for m in messages:
        if not isinstance(m, dict):
            parts.append(str(m))
            continue
        if m.get("role", "assistant") != "assistant":
            continue
        if m.get("reasoning_content"):
            parts.append(f"<think>{m['reasoning_content']}</think>")
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
        if content:
            parts.append(str(content))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else {}
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    pass
            parts.append(
                "<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": args}) + "</tool_call>"
            )
    return "\n".join(parts)


def _progress(state: Any) -> float | None:
    step, total = getattr(state, "global_step", None), getattr(state, "max_steps", None)
    if isinstance(step, (int, float)) and isinstance(total, (int, float)) and total > 0:
        return min(1.0, max(0.0, step / total))
    return None


class RewardFunc:
    """A per-sample reward lifted to TRL's batch signature (see the module docstring)."""

    def __init__(self, fn: Callable, name: str, kwargs: dict[str, Any]) -> None:
        self.fn, self.__name__, self.kwargs = fn, name, kwargs
        params = inspect.signature(fn).parameters.values()
        self._var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self._accepted = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
        self._takes_progress = "progress" in self._accepted

    def __repr__(self) -> str:
        return f"RewardFunc({self.__name__!r}, {self.kwargs!r})"

    def _sample_kwargs(self, i: int, n: int, prompts, columns: dict[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {}
        for key, value in columns.items():
            meta[key] = value[i] if isinstance(value, (list, tuple)) and len(value) == n else value
        answer = next((meta.pop(a) for a in ANSWER_ALIASES if a in meta), None)
        for a in ANSWER_ALIASES:
            meta.pop(a, None)
        meta["answer"] = answer
        if prompts is not None and "prompt" not in meta:
            meta["prompt"] = (
                prompts[i] if isinstance(prompts, (list, tuple)) and len(prompts) == n else prompts
            )
        meta.update(self.kwargs)
        if self._var_kw:
            return meta
        return {k: v for k, v in meta.items() if k in self._accepted}

    def __call__(self, completions, prompts=None, **columns) -> list[float | None]:
        progress = _progress(columns.get("trainer_state"))
        columns = {k: v for k, v in columns.items() if k not in _TRAINER_KWARGS}
        if self._takes_progress and progress is not None and "progress" not in self.kwargs:
            columns["progress"] = progress
        n = len(completions)
        if getattr(self.fn, "batch", None) is not None:
            return self._call_batch(completions, prompts, columns)
        out: list[float | None] = []
        for i, completion in enumerate(completions):
            kw = self._sample_kwargs(i, n, prompts, columns)
            try:
                score = self.fn(completion_text(completion), **kw)
            except GroupRLError:
                raise
            except Exception as e:
                raise RewardError(
                    f"reward {self.__name__!r} raised on sample {i}: {type(e).__name__}: {e}"
                ) from e
            out.append(as_score(score, self.__name__, i))
        return out

    def _call_batch(self, completions, prompts, columns: dict[str, Any]) -> list[float | None]:
        """Score the whole batch in one call of ``fn.batch`` (e.g. the code reward's parallel sandbox pool).

        Per-sample values go as lists, one entry per completion; the fixed options stay scalars."""
        n = len(completions)
        rows = [self._sample_kwargs(i, n, prompts, columns) for i in range(n)]
        keys = {k for row in rows for k in row if k not in self.kwargs}
        per_sample = {k: [row.get(k) for row in rows] for k in keys}
        try:
            scores = self.fn.batch([completion_text(c) for c in completions], **per_sample, **self.kwargs)
        except GroupRLError:
            raise
        except Exception as e:
            raise RewardError(f"reward {self.__name__!r} raised on a batch of {n}: {type(e).__name__}: {e}") from e
        if len(scores) != n:
            raise RewardError(f"reward {self.__name__!r}: batch returned {len(scores)} scores for {n} completions")
        return [as_score(s, self.__name__, i) for i, s in enumerate(scores)]


def batch_reward(fn: Callable) -> Callable:
    """Mark ``fn`` as a batch reward, TRL's ``fn(prompts, completions, **kwargs) -> list``."""
    fn.reward_form = BATCH
    return fn


def sample_reward(fn: Callable) -> Callable:
    """Mark ``fn`` as a per-sample reward, ``fn(completion, *, answer=None, **meta) -> float | None``."""
    fn.reward_form = SAMPLE
    return fn


def as_score(value: Any, name: str, i: int) -> float | None:
    """A reward's value as a float (None stays None); text is refused, never read as a number silently.
    (NaN and inf are checked where the scores are combined: :class:`grouprl.train.score.RewardScorer`.)"""
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise RewardError(f"reward {name!r} returned {value!r} for sample {i}: a {type(value).__name__}, not a score; "
                          f"expected a float or None. Fix: return float(...) of it.")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RewardError(f"reward {name!r} returned {value!r} ({type(value).__name__}) for sample {i}: expected a "
                          f"float or None.") from None


def reward_form(fn: Callable, name: str | None = None) -> str:
    """``"batch"`` or ``"sample"`` by the rule in the module docstring; ConfigError when it cannot tell.

    >>> reward_form(lambda prompts, completions, **kw: [1.0] * len(completions)), reward_form(lambda completion: 1.0)
    ('batch', 'sample')
    """
    marked = getattr(fn, "reward_form", None)
    if marked in (BATCH, SAMPLE):
        return marked
    name = name or getattr(fn, "__name__", type(fn).__name__)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"reward {name!r}: cannot read its signature ({e}). {FORMS}") from e
    params = list(sig.parameters.values())
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if any(p.name in BATCH_PARAMS for p in named):
        return BATCH
    positional = [p for p in named if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if positional and positional[0].name not in ("prompts", "prompt"):
        return SAMPLE
    raise ConfigError(f"reward {name!r} has the signature {name}{sig}, which is neither form. {FORMS}")


class BatchRewardFunc:
    """A batch reward (TRL's signature) with fixed options and checked output (see the module docstring)."""

    def __init__(self, fn: Callable, name: str, kwargs: dict[str, Any]) -> None:
        self.fn, self.__name__, self.kwargs = fn, name, kwargs
        params = inspect.signature(fn).parameters.values()
        self._var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self._accepted = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}

    def __repr__(self) -> str:
        return f"BatchRewardFunc({self.__name__!r}, {self.kwargs!r})"

    def __call__(self, completions, prompts=None, **columns) -> list[float | None]:
        kw = {"prompts": prompts, "completions": completions, **columns, **self.kwargs}
        if "completion_ids" in kw and "completions_ids" in self._accepted:  # TRL's docs spell it both ways
            kw["completions_ids"] = kw["completion_ids"]
        if not self._var_kw:
            kw = {k: v for k, v in kw.items() if k in self._accepted}
        n = len(completions)
        try:
            scores = self.fn(**kw)
        except GroupRLError:
            raise
        except Exception as e:
            raise RewardError(f"reward {self.__name__!r} raised on a batch of {n}: {type(e).__name__}: {e}") from e
        if isinstance(scores, (str, bytes)) or not hasattr(scores, "__len__") or len(scores) != n:
            got = f"{len(scores)} scores" if hasattr(scores, "__len__") else repr(scores)
            raise RewardError(
                f"reward {self.__name__!r} is a batch reward (it has a `completions` parameter) and must return one "
                f"score per completion: got {got} for {n}. {FORMS}"
            )
        return [as_score(s, self.__name__, i) for i, s in enumerate(scores)]


def as_sample_reward(fn: Callable, name: str | None = None) -> Callable:
    """A per-sample view ``f(completion, *, answer=None, **meta) -> float | None`` of a reward of either
    form (for tools that score one completion at a time, such as ``grouprl reward``)."""
    if reward_form(fn, name) == SAMPLE:
        return fn

    def one(completion, *, answer=None, **meta):
        columns = {k: [v] for k, v in meta.items() if k != "prompt"}
        return BatchRewardFunc(fn, name or getattr(fn, "__name__", "reward"), {})(
            [completion], prompts=[meta.get("prompt")], answer=[answer], **columns
        )[0]

    one.__name__ = name or getattr(fn, "__name__", "reward")
    return one


def _resolve(target: Callable | str) -> Callable:
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)
    return target


def accepted_options(fn: Callable) -> set[str] | None:
    """Keyword options ``fn`` understands: its named parameters (the completion excepted) plus those of
    the functions it hands its ``**meta`` to (``fn.passes_options_to``, and ``fn.extra_options``).
    ``None`` when ``fn`` takes ``**kwargs`` without saying where they go: anything is accepted."""
    params = list(inspect.signature(fn).parameters.values())
    if any(p.name in BATCH_PARAMS for p in params) or getattr(fn, "reward_form", None) == BATCH:
        options = [p for p in params if p.name not in ("prompts", *BATCH_PARAMS)]  # batch form
    else:
        options = params[1:]  # per-sample form: the completion comes first
    named = {p.name for p in options if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        return named
    targets = getattr(fn, "passes_options_to", None)
    if targets is None:
        return None
    for target in targets:
        more = accepted_options(_resolve(target))
        if more is None:
            return None
        named |= more
    return named | set(getattr(fn, "extra_options", ()))


def check_reward_options(name: str, fn: Callable, options: dict[str, Any], where: str) -> None:
    """ConfigError for an option ``fn`` would silently ignore (a typo such as ``strcit=True``)."""
    accepted = accepted_options(fn)
    if accepted is None:
        return
    for key in options:
        if key not in accepted:
            raise ConfigError(
                f"reward {name!r} takes no option {key!r} (in {where}).{did_you_mean(key, accepted)} "
                f"It accepts: {', '.join(sorted(accepted))}."
            )


def make_reward_func(name_or_callable: str | Callable, **kwargs) -> RewardFunc | BatchRewardFunc:
    """A TRL-style ``(completions, prompts=None, **columns) -> list[float | None]`` reward.

    ``name_or_callable``: a REWARDS name ("math", "format", "composite", ...), a "pkg.mod:fn" plug-in,
    or a callable, each in either form (per-sample or TRL batch; see the module docstring).
    ``kwargs`` are fixed options passed on every call (they take precedence over dataset columns of the
    same name); an option the reward would ignore is a ConfigError with a "did you mean" (see
    :func:`accepted_options`).

    >>> f = make_reward_func("math", strict=True)
    >>> f(["\\\\boxed{4}", [{"role": "assistant", "content": "Answer: 5"}]], answer=["4", "4"])
    [1.0, 0.0]
    """
    if isinstance(name_or_callable, str):
        name, where = name_or_callable, "make_reward_func / reward_kwargs"
        fn = REWARDS.get(name)
    elif callable(name_or_callable):
        fn, where = name_or_callable, "make_reward_func"
        name = getattr(fn, "__name__", type(fn).__name__)
    else:
        raise TypeError(f"make_reward_func: expected a reward name or a callable, got {name_or_callable!r}")
    form = reward_form(fn, name)
    if isinstance(fn, (RewardFunc, BatchRewardFunc)) and not kwargs:
        return fn  # already adapted
    check_reward_options(name, fn, kwargs, where=where)
    return RewardFunc(fn, name, kwargs) if form == SAMPLE else BatchRewardFunc(fn, name, kwargs)


_SOURCE_TASKS = (
    (("code", "humaneval", "mbpp", "apps", "livecodebench", "leetcode", "taco"), "code"),
    (("tool", "function_call", "bfcl", "api_bank", "toolbench"), "tool_call"),
    (("gsm8k", "math", "aime", "amc", "numina", "olympiad", "deepscaler", "dapo"), "math"),
)


def compute_score(data_source: str, solution_str: str, ground_truth, extra_info: dict | None = None) -> float:
    """verl-style reward: ``extra_info`` may name a ``reward`` (REWARDS name) or a ``task_type``; else the
    task type is guessed from ``data_source`` (default math). verl needs a float, so "no opinion" is 0.0.

    >>> compute_score("openai/gsm8k", "<think>6 * 7</think> The answer is 42.", "42")
    1.0
    """
    extra = dict(extra_info or {})
    options = dict(extra.get("reward_kwargs") or {})
    if extra.get("reward"):
        fn = REWARDS.get(str(extra["reward"]))
        check_reward_options(str(extra["reward"]), fn, options, where="extra_info['reward_kwargs']")
        score = fn(solution_str, answer=ground_truth, **options)
    else:
        source = str(data_source or "").lower()
        task = extra.get("task_type") or next(
            (t for keys, t in _SOURCE_TASKS if any(k in source for k in keys)), "math"
        )
        from grouprl.rewards.accuracy import accuracy_reward

        check_reward_options("accuracy", accuracy_reward, options, where="extra_info['reward_kwargs']")
        score = accuracy_reward(solution_str, ground_truth, task, **options)
    return 0.0 if score is None else float(score)
