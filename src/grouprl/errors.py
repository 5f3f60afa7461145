"""Exceptions with messages that name what is wrong and how to fix it.

Every error a user can cause derives from ``GroupRLError`` so that the CLI can print it as one
readable line instead of a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class GroupRLError(Exception):
    """Base class of every error grouprl raises on purpose."""


class ConfigError(GroupRLError, ValueError):
    """A configuration value is wrong; the message names the field, the value and the fix."""


class DataError(GroupRLError, ValueError):
    """A dataset row or file is malformed; the message names the row and the column."""


class RewardError(GroupRLError, RuntimeError):
    """A reward function misbehaved; the message names the function and the sample."""


class SaveError(GroupRLError, OSError):
    """A checkpoint or the final model could not be written (a full disk, ...); the message says what was
    kept intact and how to go on."""


class UnknownNameError(GroupRLError, KeyError):
    """A registry lookup failed; the message lists the known names and the closest match."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


def closest(name: str, candidates: Iterable[str], n: int = 1, cutoff: float = 0.5) -> list[str]:
    """Up to ``n`` candidates closest to ``name`` (difflib ratio >= ``cutoff``)."""
    return difflib.get_close_matches(name, list(candidates), n=n, cutoff=cutoff)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` or an empty string."""
    match = closest(name, candidates)
    return f" Did you mean {match[0]!r}?" if match else ""


def import_failure(what: str, spec: str, module_name: str, e: BaseException) -> str:
    """One line for a plug-in module that failed to import: a SyntaxError names the file and line, any other
    error raised while the module ran names itself."""
    if isinstance(e, SyntaxError):
        where = f"{e.filename}:{e.lineno}" if e.filename else module_name
        return (f"{what} {spec!r}: {where}: SyntaxError: {e.msg}. Fix that line of the plug-in "
                f"(python -m py_compile {e.filename or module_name} shows it).")
    return (f"{what} {spec!r}: importing {module_name!r} raised {type(e).__name__}: {e}. Fix the plug-in module "
            f"(it runs when imported).")
