"""The agent path of the loop: multi-turn tool rollouts when ``tools`` or an ``environment`` is configured.

``build_agent`` resolves the recipe's names (``tools: [pkg.mod:fn]``, ``environment: calculator``) and the
Python objects given to ``GRPOTrainer(tools=..., environment_factory=...)`` once, at start-up, before the
model loads. ``agent_rollout`` runs :class:`grouprl.rollout.multiturn.MultiTurnRollout` on the policy model
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
    output_cap: Any = None  # grouprl.envs.base.OutputCap of every tool result; its tokenizer is set at rollout

    def params(self, max_new_tokens: int) -> Any:
        from grouprl.rollout.multiturn import MultiTurnParams

        return MultiTurnParams(max_turns=self.max_turns, max_new_tokens=max_new_tokens,
                               max_tool_failures=self.max_tool_failures, tool_timeout_s=self.tool_timeout_s,
                               trajectory_timeout_s=self.trajectory_timeout_s)

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
    """The registry name of a built-in environment class, else ``module:Class``."""
    from grouprl.registry import ENVIRONMENTS

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
    if cfg.rollout_backend != "transformers":
        raise ConfigError(f"rollout_backend={cfg.rollout_backend!r} serves single-turn runs; multi-turn tool "
                          f"rollouts (tools / environment) generate with the training model. Fix: set "
                          f"rollout_backend: transformers, or drop tools and environment.")
    cap = OutputCap(cfg.max_tool_output_bytes, cfg.max_tool_output_tokens)
    factory = make_env_factory(tools=list(fns.values()) or None, environment_factory=env, output_cap=cap)
    return Agent(factory, cfg.max_turns, cfg.max_tool_failures, cfg.tool_timeout_s, cfg.trajectory_timeout_s,
                 cfg.chat_template, cfg.lean_sampler, cap)


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
                  prompt_column: str = "prompt", system_prompt: str | None = None) -> Any:
    """``n`` multi-turn trajectories per row on ``model``, as a Rollout with ``loss_mask`` and
    ``trajectories`` (prompts are the rendered first prompt, completions the decoded whole completion)."""
    from grouprl.rollout.base import Rollout
    from grouprl.rollout.multiturn import MultiTurnRollout, hf_generate_fn
    from grouprl.rollout.trajectory import stack_trajectories

    if agent.output_cap is not None:
        agent.output_cap.tokenizer = tokenizer  # the token cap counts the policy's tokens
    runner = MultiTurnRollout(tokenizer, hf_generate_fn(model, tokenizer, lean=agent.lean_sampler),
                              agent.params(params.max_new_tokens),
                              env_factory=agent.env_factory, chat_template=agent.chat_template)
    trajs = runner.run(rollout_rows(rows, prompt_column, system_prompt), n, params)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    b = stack_trajectories(trajs, pad, next(model.parameters()).device)
    prompts = [tokenizer.decode(t.prompt_ids) for t in trajs]
    return Rollout(b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask, b.truncated,
                   [t.completion for t in trajs], prompts, loss_mask=b.loss_mask, trajectories=trajs)


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
    ``tool_calls`` (``{name, arguments, result, error}`` per call), ``num_turns``, ``end_reason`` and
    ``env_state`` (the environment's public counters, e.g. ``edits``, ``iterations``, ``returned_ids``).
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
    """``multiturn_metrics`` with the environment reward logged as ``rewards/env/mean``."""
    from grouprl.rollout.multiturn import multiturn_metrics

    m = multiturn_metrics(trajectories)
    if "env_reward/mean" in m:
        m["rewards/env/mean"] = m.pop("env_reward/mean")
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
