"""Process-wide sandbox settings: the ``sandbox:`` section of a training config.

The trainer calls :func:`configure` once at start-up with the config's ``sandbox`` section; it
checks the isolation level right away (so a machine that cannot give ``strict`` fails before any model
is loaded, with the message saying what to install), and the ``code`` reward then uses these settings
whenever it is not given its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from grouprl.errors import ConfigError, did_you_mean


@dataclass
class SandboxConfig:
    """Settings of the code sandbox (YAML: ``sandbox: {isolation: strict, timeout: 10, ...}``)."""

    isolation: str = "auto"
    """auto | strict | basic. auto = strict, never a silent fallback; basic must be asked for by name."""
    timeout: float = 10.0
    """Wall-clock budget of one (completion, tests) job, in seconds."""
    test_timeout: float | None = None
    """Budget of one test within a job (None: the job's budget)."""
    workers: int | None = None
    """Jobs run in parallel by the batch reward (None: one per available core)."""
    budget: float | None = None
    """Budget of a whole batch of jobs, in seconds (None: unbounded)."""
    memory_mb: int = 1024
    """Address-space limit of the program's process, MiB."""
    nproc: int = 64
    """Process limit of the job's uid."""
    hide_paths: list[str] = dataclasses.field(default_factory=list)
    """Paths the program must not see under strict (e.g. the directory holding the expected outputs)."""


_CURRENT = SandboxConfig()


def check_section(section: Any) -> None:
    """Check a run config's ``sandbox:`` section without applying it: a mapping of SandboxConfig fields.
    Raises ConfigError naming the key or value and the fix."""
    if not isinstance(section, dict):
        raise ConfigError(f"sandbox={section!r} must be a mapping, e.g. {{isolation: strict, timeout: 10}}.")
    names = [f.name for f in dataclasses.fields(SandboxConfig)]
    for key in section:
        if key not in names:
            raise ConfigError(f"sandbox.{key} is not a sandbox setting.{did_you_mean(str(key), names)} "
                              f"Known: {', '.join(names)}.")
    timeout = section.get("timeout", SandboxConfig.timeout)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"sandbox.timeout={timeout!r} must be > 0 seconds (a number).")


def configure(cfg: SandboxConfig | dict | None = None, **overrides) -> SandboxConfig:
    """Set the process-wide sandbox settings and check the isolation level now; returns them."""
    global _CURRENT
    from grouprl.sandbox.capabilities import resolve_isolation

    base = cfg if isinstance(cfg, SandboxConfig) else SandboxConfig()
    values = dict(cfg) if isinstance(cfg, dict) else {}
    values.update(overrides)
    check_section(values)
    new = dataclasses.replace(base, **values)
    if new.timeout <= 0:
        raise ConfigError(f"sandbox.timeout={new.timeout} must be > 0 seconds")
    resolve_isolation(new.isolation)
    _CURRENT = new
    return new


def configure_for_run(run: Any) -> SandboxConfig | None:
    """Start-up step of a training or evaluation run (``run``: a GRPOConfig): check its ``sandbox`` section,
    and apply it (:func:`configure`) when it is set or a ``code`` reward is used, so an isolation level this
    machine cannot give fails now, before any model loads (ConfigError / SandboxUnavailable). Returns the
    SandboxConfig, or ``None`` when no sandbox is involved."""
    check_section(run.sandbox)
    funcs = run.reward_funcs if isinstance(run.reward_funcs, (list, tuple)) else [run.reward_funcs]
    names = [r for r in funcs if isinstance(r, str)] + [run.eval_reward]
    code_task = any(isinstance(kw, dict) and kw.get("task_type") == "code" for kw in run.reward_kwargs.values())
    if not (run.sandbox or "code" in names or code_task):
        return None
    return configure(dict(run.sandbox))


def current() -> SandboxConfig:
    """The settings last given to :func:`configure` (defaults if never called)."""
    return _CURRENT
