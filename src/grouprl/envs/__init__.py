"""Tools and environments for multi-turn rollouts (TRL's ``tools=`` / ``environment_factory=`` contract).

``make_env_factory(tools=[fn, ...])`` or ``make_env_factory(environment_factory=Cls)`` gives a callable
that builds one :class:`ToolEnv` per trajectory; ``call_with_timeout`` runs one tool call under a
deadline. Built-in environments, registered in ``grouprl.registry.ENVIRONMENTS``: ``calculator``,
``python`` (code repair in the sandbox), ``search`` (BM25 over a small corpus, with citations) and
``guess_number`` (a conversational game: :mod:`grouprl.envs.conversational`). Adapters:
``textarena:<GameId>`` (:mod:`grouprl.envs.textarena`), ``openenv:...`` (:mod:`grouprl.envs.openenv`).
"""

from grouprl.envs.base import (
    ERROR_KINDS,
    BadArgumentsError,
    ClassToolEnv,
    ToolEnv,
    ToolError,
    UnknownToolError,
    call_with_timeout,
    make_env_factory,
    tool_schema,
)
from grouprl.envs.calculator import CalculatorEnv, calculator, evaluate
from grouprl.envs.code_repair import CodeRepairEnv
from grouprl.envs.conversational import StepError, check_step_result, step_with_timeout
from grouprl.envs.guess_number import GuessNumberEnv
from grouprl.envs.resolve import resolve_environment, resolve_tools
from grouprl.envs.search import BM25, SearchEnv, citations_valid, cited_ids

__all__ = [
    "BM25", "ERROR_KINDS", "BadArgumentsError", "CalculatorEnv", "ClassToolEnv", "CodeRepairEnv", "GuessNumberEnv",
    "SearchEnv", "StepError", "check_step_result", "step_with_timeout",
    "ToolEnv", "ToolError", "UnknownToolError", "calculator", "call_with_timeout", "citations_valid",
    "cited_ids", "evaluate", "make_env_factory", "resolve_environment", "resolve_tools", "tool_schema",
]
