"""Process-wide sandbox settings: the ``sandbox:`` section of a training config.

The trainer calls :func:`configure` once at start-up with the config's ``sandbox`` section; it
checks the isolation level right away (so a machine that cannot give ``strict`` fails before any model
is loaded, with the message saying what to install), and the ``code`` reward then uses these settings
whenever it is not given its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

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


def configure(cfg: SandboxConfig | dict | None = None, **overrides) -> SandboxConfig:
    """Set the process-wide sandbox settings and check the isolation level now; returns them."""
    global _CURRENT
    from grouprl.sandbox.capabilities import resolve_isolation

    base = cfg if isinstance(cfg, SandboxConfig) else SandboxConfig()
    values = dict(cfg) if isinstance(cfg, dict) else {}
    values.update(overrides)
    names = [f.name for f in dataclasses.fields(SandboxConfig)]
    for key in values:
        if key not in names:
            raise ConfigError(f"sandbox.{key} is not a sandbox setting.{did_you_mean(key, names)} "
                              f"Known: {', '.join(names)}.")
    new = dataclasses.replace(base, **values)
    if new.timeout <= 0:
        raise ConfigError(f"sandbox.timeout={new.timeout} must be > 0 seconds")
    resolve_isolation(new.isolation)
    _CURRENT = new
    return new


def current() -> SandboxConfig:
    """The settings last given to :func:`configure` (defaults if never called)."""
    return _CURRENT
