"""One small registry per extension point: name -> function.

A new loss, advantage estimator, aggregation, KL estimator or reward is one decorated function::

    @POLICY_LOSSES.register("grpo")
    def grpo_loss(logp, old_logp, adv, mask, *, eps_low=0.2, eps_high=0.2): ...

Callers never branch on a name: they ``get`` the function and call it. Unknown names and unknown
keyword arguments fail at start-up (``get`` / ``check_kwargs``), before any model is loaded.
Out-of-tree plug-ins are referred to as ``"package.module:function"``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from grouprl.errors import ConfigError, UnknownNameError, closest, did_you_mean

Fn = Callable[..., Any]


class Registry:
    """A named table of functions that share one signature (``signature`` documents it)."""

    def __init__(self, kind: str, signature: str = "") -> None:
        self.kind = kind
        self.signature = signature
        self._fns: dict[str, Fn] = {}

    def register(self, name: str, fn: Fn | None = None):
        """Register ``fn`` under ``name``; usable as ``@reg.register("name")`` or a plain call."""

        def deco(f: Fn) -> Fn:
            if name in self._fns and self._fns[name] is not f:
                raise ValueError(f"{self.kind}: {name!r} is already registered to {self._fns[name]!r}")
            self._fns[name] = f
            return f

        return deco(fn) if fn is not None else deco

    def get(self, name: str) -> Fn:
        """The function registered as ``name``, or a ``"pkg.mod:fn"`` plug-in; else a helpful error."""
        if name in self._fns:
            return self._fns[name]
        if ":" in name:
            return self.resolve(name)
        known = ", ".join(sorted(self._fns)) or "(none)"
        match = closest(name, self._fns)
        hint = f" Closest match: {match[0]!r}." if match else ""
        raise UnknownNameError(
            f"unknown {self.kind} {name!r}. Known: {known}.{hint} "
            f"A plug-in can be given as 'package.module:function'."
        )

    def resolve(self, spec: str) -> Fn:
        """Import ``"package.module:function"`` and return the function (not registered)."""
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr:
            raise UnknownNameError(f"{self.kind} plug-in {spec!r} must look like 'package.module:function'")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise UnknownNameError(f"{self.kind} plug-in {spec!r}: cannot import {module_name!r} ({e})") from e
        except Exception as e:  # a SyntaxError, or anything the module raised while it ran
            from grouprl.errors import import_failure

            raise UnknownNameError(import_failure(f"{self.kind} plug-in", spec, module_name, e)) from e
        obj: Any = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise UnknownNameError(
                    f"{self.kind} plug-in {spec!r}: {module_name!r} has no attribute {attr!r}."
                    + did_you_mean(part, dir(obj))
                )
            obj = getattr(obj, part)
        if not callable(obj):
            raise UnknownNameError(f"{self.kind} plug-in {spec!r} is not callable")
        return obj

    def check_kwargs(self, name: str, kwargs: Mapping[str, Any], *, where: str = "") -> None:
        """Fail early if ``kwargs`` are not keyword arguments that ``name``'s function accepts."""
        fn = self.get(name)
        params = inspect.signature(fn).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return
        accepted = [
            p.name
            for p in params.values()
            if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
        for key in kwargs:
            if key not in accepted:
                loc = f" (in {where})" if where else ""
                raise ConfigError(
                    f"{self.kind} {name!r} takes no argument {key!r}{loc}.{did_you_mean(key, accepted)} "
                    f"It accepts: {', '.join(accepted)}."
                )

    def describe(self, name: str) -> str:
        """First line of the function's docstring."""
        doc = inspect.getdoc(self.get(name)) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    def names(self) -> list[str]:
        return sorted(self._fns)

    def items(self) -> list[tuple[str, Fn]]:
        return sorted(self._fns.items())

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._fns)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


# One registry per extension point (shapes: B prompts, G group size, N = B*G, T completion tokens).
ADVANTAGES = Registry("advantage estimator", "fn(rewards [B,G], **hp) -> adv [B,G]")
POLICY_LOSSES = Registry(
    "policy loss", "fn(logp [N,T], old_logp [N,T], adv [N] or [N,T], mask [N,T], **hp) -> (per_token [N,T], metrics)"
)
AGGREGATIONS = Registry("loss aggregation", "fn(per_token [N,T], mask [N,T], **norm) -> scalar")
KL_ESTIMATORS = Registry("KL estimator", "fn(logp [N,T], ref_logp [N,T]) -> [N,T]")
REWARDS = Registry("reward", "fn(completion: str, *, answer=None, **meta) -> float | None")
ALGORITHMS = Registry(
    "algorithm", "Algorithm(train=fn(cfg, model, tokenizer, train_rows, eval_rows, reward_funcs, eval_reward_fn, "
    "*, resume, agent) -> summary) or Algorithm(run=fn(cfg, resume))"
)
PREFERENCE_LOSSES = Registry(
    "preference loss", "fn(chosen_logp [N], rejected_logp [N], ref_chosen_logp [N], ref_rejected_logp [N], **hp) "
    "-> (loss [N], metrics)"
)
MODEL_SOURCES = Registry("model source", "fn(name: '<prefix>:<name>', cache_dir=None) -> local folder")
ENVIRONMENTS = Registry(
    "environment", "Cls() with reset(**row) -> str | None, public methods = tools, optional get_reward()"
)

ALL_REGISTRIES: dict[str, Registry] = {
    "advantages": ADVANTAGES,
    "policy_losses": POLICY_LOSSES,
    "aggregations": AGGREGATIONS,
    "kl_estimators": KL_ESTIMATORS,
    "rewards": REWARDS,
    "environments": ENVIRONMENTS,
    "preference_losses": PREFERENCE_LOSSES,
}
