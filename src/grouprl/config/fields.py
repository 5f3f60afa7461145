"""The ``GRPOConfig`` dataclass: every field of a run with its documentation.

The fields are declared in ``fields_run.py``, ``fields_sampling.py`` and ``fields_engine.py`` (one
dataclass each, which ``GRPOConfig`` inherits in order). A field's docstring (the string literal under it)
is its documentation: ``grouprl train --help-config``
and the docs read them from here (:meth:`GRPOConfig.field_docs`). Defaults live only in this dataclass.
Building a config resolves the TRL aliases and the ``algorithm`` preset (:mod:`grouprl.config.presets`) and
validates it (:mod:`grouprl.config.validate`); which fields the user set is remembered
(:attr:`GRPOConfig.explicit_fields`), so a preset or an alias never overrides one of them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from grouprl.config import agent, io, presets, validate
from grouprl.config.fields_engine import EngineAndLogFields
from grouprl.config.fields_run import RunFields
from grouprl.config.fields_sampling import SamplingFields
from grouprl.errors import ConfigError, did_you_mean


@dataclass
class GRPOConfig(EngineAndLogFields, SamplingFields, RunFields):
    """Configuration of one GRPO-family run (see the module docstring for the conventions). The fields
    are declared in three parts, in this order: :class:`RunFields`, :class:`SamplingFields`,
    :class:`EngineAndLogFields` (dataclass inheritance keeps the order: bases last-to-first)."""

    def __post_init__(self) -> None:
        presets.resolve_aliases(self)
        presets.apply_preset(self)
        self.validate()

    # ------------------------------------------------------------------------------------------
    @property
    def explicit_fields(self) -> frozenset[str]:
        """Names of the fields the user set (a keyword given with a value other than ``None``)."""
        return self.__dict__.get("_explicit", frozenset())

    @property
    def effective_steps_per_generation(self) -> int:
        return self.steps_per_generation or self.gradient_accumulation_steps

    @property
    def generation_batch_size(self) -> int:
        """Completions per generation round = per_device_train_batch_size * steps_per_generation."""
        return self.per_device_train_batch_size * self.effective_steps_per_generation

    @property
    def prompts_per_generation(self) -> int:
        return self.generation_batch_size // self.num_generations

    @property
    def needs_old_logp(self) -> bool:
        """Old log-probs differ from the current ones only when the policy moves between uses."""
        return self.num_iterations > 1 or self.effective_steps_per_generation > self.gradient_accumulation_steps

    @property
    def report_targets(self) -> list[str]:
        targets = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to or [])
        if "all" in targets:  # as in transformers: every installed integration
            import importlib.util

            return ["tensorboard"] + (["wandb"] if importlib.util.find_spec("wandb") is not None else [])
        return [t for t in targets if t not in ("none", "jsonl")]

    # ------------------------------------------------------------------------------------------
    def validate(self) -> None:
        """Check types, values and batch arithmetic; raises ConfigError naming the field, value and fix."""
        validate.validate(self)
        agent.check_agent_fields(self)

    def check_names(self) -> None:
        """Check registry names, the hyper-parameters each chosen function can honour, and that the report_to
        sinks are installed (imports grouprl.algo, still no model)."""
        validate.check_names(self)

    def check_reward_kwargs(self, reward_funcs: Any = None) -> None:
        """Every ``reward_kwargs`` key names a reward in use (``reward_funcs`` or ``eval_reward``)."""
        validate.check_reward_kwargs(self, reward_funcs)

    def resolved(self) -> dict[str, Any]:
        """The functions and hyper-parameters training calls (see :func:`grouprl.config.presets.resolved`)."""
        return presets.resolved(self)

    def loss_hparams(self) -> dict[str, Any]:
        """Keyword arguments for the policy loss: only those its function declares, its own defaults otherwise."""
        return presets.resolved(self)["loss_hparams"]

    def advantage_hparams(self) -> dict[str, Any]:
        """Keyword arguments for the advantage estimator (``scale`` from scale_rewards when it takes one)."""
        return presets.resolved(self)["advantage_hparams"]

    # ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in presets.ALIASES}

    def to_yaml(self, path: str | Path) -> None:
        io.write_yaml(self.to_dict(), path)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GRPOConfig:
        return cls(**io.coerce_all(cls, data))

    @classmethod
    def from_yaml(cls, path: str | Path | None, overrides: list[str] | None = None) -> GRPOConfig:
        """Load a YAML recipe (may be ``None``) and apply ``key=value`` overrides (dotted keys nest)."""
        return cls.from_dict(io.read_yaml(path, overrides))

    @classmethod
    def field_defaults(cls) -> dict[str, str]:
        """field name -> its default as YAML writes it (``null``, ``true``, ``[accuracy]``, ``{}``)."""
        import yaml

        out = {}
        for f in fields(cls):
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out[f.name] = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()
        return out

    @classmethod
    def field_docs(cls) -> dict[str, str]:
        """field name -> docstring, read from the source (the single source of --help and docs)."""
        docs: dict[str, str] = {}
        for part in reversed([c for c in cls.__mro__ if dataclasses.is_dataclass(c)]):  # the fields' order
            body = ast.parse(inspect.getsource(part)).body[0].body  # type: ignore[attr-defined]
            for node, nxt in zip(body, body[1:]):
                if (isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr)
                        and isinstance(nxt.value, ast.Constant)):
                    docs[node.target.id] = str(nxt.value.value)  # type: ignore[attr-defined]
        return docs


def _checked_init(init):
    """Wrap the dataclass ``__init__``: a misspelt keyword is a ConfigError with a did-you-mean, and the
    fields the caller set are remembered (presets and aliases never override them)."""

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        names = [f.name for f in fields(GRPOConfig)]
        for key in kwargs:
            if key not in names:
                raise ConfigError(f"unknown config key {key!r}.{did_you_mean(key, names)} "
                                  f"See `grouprl train --help-config` for every field.")
        given = dict(zip(names, args)) | kwargs
        self.__dict__["_explicit"] = frozenset(k for k, v in given.items() if v is not None)
        init(self, *args, **kwargs)

    return wrapper


GRPOConfig.__init__ = _checked_init(GRPOConfig.__init__)  # type: ignore[method-assign]
