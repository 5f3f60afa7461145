"""The agent path of the loop: multi-turn tool rollouts when ``tools`` or an ``environment`` is configured.

``build_agent`` resolves the recipe's names (``tools: [pkg.mod:fn]``, ``environment: calculator``) and the
Python objects given to ``GRPOTrainer(tools=..., environment_factory=...)`` once, at start-up, before the
model loads. ``agent_rollout`` runs :class:`grouprl.rollout.multiturn.MultiTurnRollout` on the run's engine
and returns a :class:`grouprl.rollout.base.Rollout` whose ``loss_mask`` is 0 on tool tokens, so the loss,
the KL, the entropy, the token counts and the length metrics see model tokens only. ``reward_inputs`` is
what reward functions receive for trajectories (docs/AGENTS.md, "How rewards see trajectories").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grouprl.config.agent import uses_tools
from grouprl.errors import ConfigError


@dataclass
class Agent:
    """What the loop needs to run agent rollouts (built once per run)."""

    env_factory: Any  # () -> ToolEnv, one per trajectory
    max_turns: int
    max_tool_failures: int | None
    tool_timeout_s: float
    trajectory_timeout_s: float
    chat_template: str | None = None
    lean_sampler: bool | None = None  # as the recipe's lean_sampler: None = the lean sampler on CPU
    max_concurrent_tools: int = 16
    schedule: str = "per_trajectory"  # agent_schedule
    env_classes: tuple = ()  # the environment classes (several for a {name: Cls} factory); () for plain tools
    multi_env: bool = False  # a {name: Cls} factory: rows pick the class by their `environment` column

    @property
    def owns_prompt(self) -> bool:
        """TRL: with one environment class and no dataset, ``reset()`` returns each rollout's prompt."""
        return bool(self.env_classes) and not self.multi_env

    @property
    def owns_reward(self) -> bool:
        """An environment class scores its own episodes (``get_reward``, or a conversational ``step``)."""
        from grouprl.envs.base import is_conversational

        return any(callable(getattr(c, "get_reward", None)) or is_conversational(c) for c in self.env_classes)
    output_cap: Any = None  # grouprl.envs.base.OutputCap of every tool result; its tokenizer is set at rollout

    def params(self, max_new_tokens: int) -> Any:
        from grouprl.rollout.multiturn import MultiTurnParams

        return MultiTurnParams(max_turns=self.max_turns, max_new_tokens=max_new_tokens,
                               max_tool_failures=self.max_tool_failures, tool_timeout_s=self.tool_timeout_s,
                               trajectory_timeout_s=self.trajectory_timeout_s,
                               max_concurrent_tools=self.max_concurrent_tools, schedule=self.schedule)

    def tool_schemas(self) -> list[dict]:
        """The schemas the model is shown (of a fresh environment; a ``{name: Cls}`` factory shows none)."""
        env = self.env_factory()
        try:
            return list(env.tools)
        finally:
            env.close()

    def check_template(self, tokenizer: Any) -> None:
        """ConfigError unless the chat template is prefix-preserving with these tools (grouprl.rollout.chat)."""
        from grouprl.rollout.chat import check_prefix_preserving

        report = check_prefix_preserving(tokenizer, self.tool_schemas() or None, chat_template=self.chat_template)
        if not report.ok:
            raise ConfigError(f"the chat template cannot drive multi-turn tool rollouts: {report.reason}")

    def first_prompt_lengths(self, tokenizer: Any, prompts: Any, system_prompt: str | None) -> list[int]:
        """Token counts of each row's first prompt as the rollout renders it: the chat messages (system prompt
        first, ``rollout_rows``) with this run's tool schemas and chat template, and the generation prompt
        (``grouprl.rollout.chat.prompt_ids``). An environment's ``reset`` observation, appended at run time, is
        not counted: it is not known before the environment runs."""
        from grouprl.rollout.chat import load_chat_template, prompt_ids

        tools, template = self.tool_schemas() or None, load_chat_template(self.chat_template)
        rows = rollout_rows([{"prompt": p} for p in prompts], "prompt", system_prompt)
        return [len(prompt_ids(tokenizer, r["prompt"], tools, chat_template=template)) for r in rows]


def _import_name(obj: Any) -> str:
    module, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}:{qual}" if module and qual and "<" not in qual else repr(obj)


def _environment_name(env: Any) -> str:
    """The registry name of a built-in environment class, its ``spec_name`` (an adapter's class, e.g.
    ``textarena:GuessTheNumber-v0``), else ``module:Class``."""
    from grouprl.registry import ENVIRONMENTS

    if isinstance(getattr(env, "spec_name", None), str):
        return env.spec_name

    for name in ENVIRONMENTS.names():
        if ENVIRONMENTS.get(name) is env:
            return name
    return _import_name(env)


def build_agent(cfg: Any, tools: list | None = None, environment_factory: Any = None) -> Agent | None:
    """The run's :class:`Agent`, or ``None`` for single-turn runs (no tools, no environment).

    ``tools`` (Python functions) are merged with the config's ``tools`` (a function of the same name
    replaces the config's); ``environment_factory`` replaces the config's ``environment``. What is used is
    written back into ``cfg.tools`` / ``cfg.environment`` as import paths or built-in names, so the run's
    ``config.yaml`` names it. Every name is imported and every schema built here: a typo fails at start-up.
    """
    from grouprl.builtins import load_builtins
    from grouprl.envs.base import OutputCap, make_env_factory
    from grouprl.envs.resolve import resolve_environment, resolve_tools

    load_builtins()
    if tools is not None and not isinstance(tools, (list, tuple)):
        raise ConfigError(f"tools= must be a list of functions, got {type(tools).__name__}")
    fns = {getattr(f, "__name__", repr(f)): f for f in resolve_tools(list(cfg.tools))}
    fns.update({getattr(f, "__name__", repr(f)): f for f in resolve_tools(list(tools or []))})
    env = environment_factory if environment_factory is not None else cfg.environment
    env = resolve_environment(env) if env is not None else None
    if env is not None and not isinstance(env, (type, dict)) and not callable(env):
        raise ConfigError(f"environment_factory={env!r:.80} must be a class (or a zero-argument callable)")
    cfg.tools = [_import_name(f) for f in fns.values()]
    if env is not None:
        cfg.environment = (_environment_name(env) if isinstance(env, type) else
                           None if isinstance(env, dict) else _import_name(env))
    if not uses_tools(cfg) and env is None:
        return None
    from grouprl.rollout import check_agent_backend

    check_agent_backend(cfg.rollout_backend)  # a text-only plug-in cannot drive token-level turns
    cap = OutputCap(cfg.max_tool_output_bytes, cfg.max_tool_output_tokens)
    factory = make_env_factory(tools=list(fns.values()) or None, environment_factory=env, output_cap=cap)
    classes = tuple(env.values()) if isinstance(env, dict) else (env,) if env is not None else ()
    return Agent(factory, cfg.max_turns, cfg.max_tool_failures, cfg.tool_timeout_s, cfg.trajectory_timeout_s,
                 cfg.chat_template, cfg.lean_sampler, cfg.max_concurrent_tools, cfg.agent_schedule,
                 tuple(c for c in classes if isinstance(c, type)), isinstance(env, dict), cap)


def default_reward_funcs(cfg: Any, given: Any, agent: Agent | None) -> Any:
    """The reward functions to use when an environment is in play and none were given or configured.

    TRL: an environment whose class owns the reward (``get_reward``) needs no reward function, so none is
    added (``[]``); one that does not, with no reward function either, is a ConfigError -- nothing would
    give a reward. Otherwise ``given`` (``None`` = the config's ``reward_funcs``)."""
    if given is not None or "reward_funcs" in cfg.explicit_fields or agent is None or not agent.env_classes:
        return given
    if agent.owns_reward:
        return []
    names = ", ".join(c.__name__ for c in agent.env_classes)
    raise ConfigError(f"no reward source: environment {names} defines no get_reward() and no reward_funcs were "
                      f"given. Fix: pass reward_funcs=[...] (or set reward_funcs in the recipe), or give the "
                      f"environment a get_reward(self) -> float method.")


def fill_prompts(ds: Any, prompt_column: str) -> Any:
    """TRL: with an environment the ``prompt`` column is optional (``reset()`` supplies it): a missing column,
    or an empty prompt, becomes one empty user message."""
    empty = [{"role": "user", "content": ""}]
    if prompt_column not in ds.column_names:
        return ds.add_column(prompt_column, [empty] * len(ds))
    prompts = ds[prompt_column]
    if not any(isinstance(p, str) and not p.strip() for p in prompts):
        return ds
    if any(not isinstance(p, str) for p in prompts):  # a mixed column cannot be stored; let check_rows name it
        return ds
    filled = [[{"role": "user", "content": p}] if p.strip() else empty for p in prompts]
    return ds.remove_columns(prompt_column).add_column(prompt_column, filled)


def placeholder_dataset(cfg: Any) -> Any:
    """TRL's placeholder when the environment owns the data: one round's prompts, each an empty user message
    (``reset()`` fills it in), cycled for ``max_steps`` steps (ConfigError when ``max_steps`` is not set)."""
    from datasets import Dataset

    if cfg.max_steps <= 0:
        raise ConfigError("no train_dataset: the environment's reset() returns each rollout's prompt, so the run "
                          "has no epochs to count. Fix: set max_steps (e.g. GRPOConfig(max_steps=100)), or pass "
                          "train_dataset=....")
    rows = max(1, cfg.prompts_per_generation)
    return Dataset.from_dict({cfg.prompt_column: [[{"role": "user", "content": ""}]] * rows})


def rollout_rows(rows: list[dict], prompt_column: str, system_prompt: str | None) -> list[dict]:
    """Dataset rows as the multi-turn rollout takes them: ``prompt`` as chat messages (system prompt first)."""
    out = []
    for row in rows:
        prompt = row[prompt_column]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if system_prompt and messages[0].get("role") != "system":
            messages = [{"role": "system", "content": system_prompt}] + messages
        out.append({**row, "prompt": messages})
    return out


def agent_rollout(agent: Agent, model: Any, tokenizer: Any, rows: list[dict], n: int, params: Any, *,
                  prompt_column: str = "prompt", system_prompt: str | None = None, backend: Any = None) -> Any:
    """``n`` multi-turn trajectories per row on the run's engine (``backend``'s token engine; ``None`` = the
    transformers engine over ``model``), as a Rollout with ``loss_mask``, ``trajectories`` and, for an engine
    with its own weights, ``rollout_logp`` (``grouprl.rollout.agent_round``)."""
    from grouprl.rollout.agent_round import agent_round, engine_for

    if agent.output_cap is not None:
        agent.output_cap.tokenizer = tokenizer  # the token cap counts the policy's tokens
    engine = engine_for(backend, model, tokenizer, lean=agent.lean_sampler)
    return agent_round(engine, tokenizer, rollout_rows(rows, prompt_column, system_prompt), n, params,
                       agent.params(params.max_new_tokens), env_factory=agent.env_factory,
                       chat_template=agent.chat_template, device=next(model.parameters()).device)


def final_answer(traj: Any) -> str:
    """The text of the last assistant turn of a trajectory (what ``accuracy`` scores)."""
    for m in reversed(traj.messages):
        if m.get("role") == "assistant":
            return m.get("content") or ""
    return ""


def reward_inputs(trajectories: list, prompts: list) -> tuple[list, dict[str, list]]:
    """``(completions, trajectory columns)`` for the reward functions, one entry per trajectory.

    ``completions``: the final answer (last assistant turn; TRL's ``[{"role": "assistant", ...}]`` for chat
    prompts). Columns: ``messages`` (the whole conversation), ``model_turns`` (the text of each model turn),
    ``tool_calls`` (``{name, arguments, result, error}`` per call), ``num_turns``, ``end_reason``,
    ``env_state`` (the environment's public counters, e.g. ``edits``, ``iterations``, ``returned_ids``) and,
    as TRL passes them, ``environments`` (the environment object of each rollout) when there are any.
    """
    completions = [[{"role": "assistant", "content": final_answer(t)}] if isinstance(p, list) else final_answer(t)
                   for t, p in zip(trajectories, prompts)]
    columns = {
        "messages": [t.messages for t in trajectories],
        "model_turns": [_model_turns(t) for t in trajectories],
        "tool_calls": [t.tool_calls for t in trajectories],
        "num_turns": [t.num_turns for t in trajectories],
        "end_reason": [t.end_reason for t in trajectories],
        "env_state": [t.env_state for t in trajectories],
    }
    if any(t.environment is not None for t in trajectories):
        columns["environments"] = [t.environment for t in trajectories]
    return completions, columns


def _model_turns(traj: Any) -> list[str]:
    """The assistant messages the model wrote (the last ``num_turns`` assistant messages)."""
    turns = [m.get("content") or "" for m in traj.messages if m.get("role") == "assistant"]
    return turns[len(turns) - traj.num_turns:] if traj.num_turns else []


def add_env_rewards(totals: list[float], trajectories: list) -> list[float]:
    """TRL's rule: the environment's ``get_reward()`` is added to the weighted sum of the reward functions
    (``reward_weights`` do not apply to it); a trajectory without one adds nothing. A value that is not a
    finite number (:class:`grouprl.envs.base.BadEnvReward`) stops the run with the line that names it."""
    from grouprl.errors import RewardError

    for traj in trajectories:
        if traj.env_reward is not None and traj.env_reward != traj.env_reward:
            raise RewardError(getattr(traj.env_reward, "why", "the environment's get_reward() returned nan: return "
                                                              "a finite float or None."))
    return [t + (traj.env_reward or 0.0) for t, traj in zip(totals, trajectories)]


def agent_metrics(trajectories: list) -> dict[str, float]:
    """``multiturn_metrics`` with the environment reward logged as TRL names it, after the environment's class:
    ``rewards/<Class>/mean`` and ``/std`` over the rollouts of that class that gave one; and ``env/<counter>``,
    the mean of each number in ``env_state`` over the rollouts that have it (``env/edits``, ``env/iterations``
    of the python environment, ``env/num_searches`` of search)."""
    import statistics

    from grouprl.rollout.multiturn import multiturn_metrics

    m = multiturn_metrics(trajectories)
    m.pop("env_reward/mean", None)
    by_class: dict[str, list[float]] = {}
    for t in trajectories:
        if t.env_reward is not None:
            name = type(t.environment).__name__ if t.environment is not None else "env"
            by_class.setdefault(name, []).append(float(t.env_reward))
    for name, values in by_class.items():
        m[f"rewards/{name}/mean"], m[f"rewards/{name}/std"] = statistics.fmean(values), statistics.pstdev(values)
    counters: dict[str, list[float]] = {}
    for t in trajectories:
        for key, value in (t.env_state or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                counters.setdefault(key, []).append(float(value))
    m.update({f"env/{key}": statistics.fmean(values) for key, values in counters.items()})
    return m


def trajectory_record(traj: Any, tokenizer: Any = None) -> dict[str, Any]:
    """A trajectory as one samples.jsonl entry: the conversation, the calls with their results, how it ended,
    and the completion's ids with their per-token text and loss mask (a report greys the 0s: tool tokens)."""
    record = {"messages": traj.messages, "tool_calls": traj.tool_calls, "num_turns": traj.num_turns,
              "end_reason": traj.end_reason, "env_reward": traj.env_reward, "env_state": traj.env_state,
              "completion_ids": list(traj.completion_ids), "loss_mask": list(traj.loss_mask)}
    if tokenizer is not None:
        record["tokens"] = [tokenizer.decode([t]) for t in traj.completion_ids]
    return record
