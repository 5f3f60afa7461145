"""Multi-turn tool rollouts: generate -> parse tool calls -> run them -> append the results -> generate.

Each trajectory is a small state machine. After each model turn, :meth:`MultiTurnRollout.next_action`
decides what comes next -- run the turn's tool calls, or end -- and the scheduler
(:mod:`grouprl.rollout.schedule`) carries it out: by default per trajectory (a trajectory's next model
turn is submitted as soon as its own tools returned; the engine batches whatever is ready), or in
lockstep (every turn waits for the slowest trajectory: ``schedule="lockstep"``). Tool calls run in a
pool of ``max_concurrent_tools`` threads (the calls of one trajectory in order, trajectories
concurrently), each under its timeout. A trajectory ends when

- the model answers without a ``<tool_call>`` block (``answered``); with a conversational environment
  (:mod:`grouprl.envs.conversational`) that turn goes to the environment instead, whose reply is the next
  user turn, until it says it is done (``env_done``) or its step fails (``env_error``),
- it has had ``max_turns`` model turns and still calls a tool (``max_turns``; those calls are not run),
- a model turn hits the token budget, or the next tool turn would not fit (``max_tokens``),
- its failed tool calls reach ``max_tool_failures`` (``tool_error_budget``),
- it has run longer than ``trajectory_timeout_s`` (``timeout``).

``max_new_tokens`` bounds the WHOLE completion, model and tool tokens together (as TRL's
``max_completion_length``). A tool turn that would leave no room for another model token is rolled back,
as TRL does: the trajectory ends with ``max_tokens``, its calls stay in ``tool_calls`` (they ran), but
their tokens and messages are not appended -- no model turn would follow them, so they would only take
budget and never carry gradient. The same holds when the failure budget or the timeout ends a trajectory
after its tools ran.

Tokens are never re-derived from text (DESIGN.md): the next prompt is the previous ids + the sampled ids
+ :func:`grouprl.rollout.chat.tool_turn_ids`; the engine's log-prob of each sampled token is kept beside
it (``Trajectory.rollout_logp``, 0.0 on tool tokens). Tool calls are parsed by the same parser as the
``tool_call`` reward (:func:`grouprl.rewards.tool_call.parse_tool_blocks`); a malformed call, an unknown
tool, arguments that fail the tool's JSON schema, an exception or a timeout becomes an ``error: ...``
tool message that the model sees, is counted, and never stops the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from grouprl.envs.base import BadArgumentsError, ClassToolEnv, ToolEnv, call_with_timeout, validate_arguments
from grouprl.rewards.tool_call import parse_tool_blocks
from grouprl.rollout.chat import load_chat_template, prompt_ids, stop_token_ids, tool_turn_ids
from grouprl.rollout.engine import Engine, FunctionEngine, Generation, TransformersEngine
from grouprl.rollout.trajectory import Trajectory, public_state
from grouprl.rollout.trajectory import multiturn_metrics as multiturn_metrics  # re-exported: its old home

GenerateFn = Callable[[list[list[int]], "list[int] | int", Any], list[list[int]]]
CallToolFn = Callable[[Any, str, dict, float], "tuple[str, str | None]"]
SCHEDULES = ("per_trajectory", "lockstep")
log = logging.getLogger("grouprl")


@dataclass
class MultiTurnParams:
    """Limits of one multi-turn rollout (every wait is bounded)."""

    max_turns: int = 4
    """Model turns per trajectory (generate calls); a call in the last turn ends it with ``max_turns``."""
    max_new_tokens: int = 512
    """Budget of the whole completion: model tokens + tool-turn tokens."""
    max_tool_failures: int | None = 3
    """Failed calls after which a trajectory ends with ``tool_error_budget``; ``None`` = no limit."""
    tool_timeout_s: float = 10.0
    """Wall-clock limit of one tool call; a late call returns an error message to the model."""
    trajectory_timeout_s: float = 600.0
    """Wall-clock limit of one trajectory, checked before each turn and after its tools ran."""
    max_concurrent_tools: int = 16
    """Tool calls running at once (trajectories concurrently, the calls of one trajectory in order)."""
    schedule: str = "per_trajectory"
    """``per_trajectory``: a trajectory's next turn goes to the engine when its own tools returned;
    ``lockstep``: each turn waits for every trajectory's tools (the same batches for the same seed)."""
    batch_wait_s: float = 0.05
    """Per-trajectory schedule, batch engines: how long an idle engine waits for trajectories whose tools
    are still running before it generates for the ready ones (continuous engines never wait)."""

    def validate(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_concurrent_tools"):
            if getattr(self, name) < 1:
                raise ValueError(f"MultiTurnParams.{name}={getattr(self, name)} must be >= 1")
        for name in ("tool_timeout_s", "trajectory_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"MultiTurnParams.{name}={getattr(self, name)} must be > 0 seconds")
        if self.max_tool_failures is not None and self.max_tool_failures < 1:
            raise ValueError(f"MultiTurnParams.max_tool_failures={self.max_tool_failures} must be >= 1 or None")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"MultiTurnParams.schedule={self.schedule!r} must be one of {', '.join(SCHEDULES)}")
        if not self.batch_wait_s >= 0:
            raise ValueError(f"MultiTurnParams.batch_wait_s={self.batch_wait_s} must be >= 0 seconds")


def as_tool_env(obj: Any) -> Any:
    """``obj`` when it follows the ToolEnv contract (``tools`` + ``call``), else a TRL-style environment
    object seen through :class:`grouprl.envs.base.ClassToolEnv` (``reset(**row)``, public methods as tools,
    optional ``get_reward``)."""
    return obj if hasattr(obj, "call") and hasattr(obj, "tools") else ClassToolEnv(obj)


def _env_object(env: Any) -> Any:
    """The user's environment object behind ``env`` (``ToolEnv.instance``), or ``env`` itself."""
    instance = getattr(env, "instance", None)
    if instance is not None:
        return instance
    return object() if isinstance(env, ToolEnv) else env  # plain tools=: no state of their own


@dataclass
class _Live:
    traj: Trajectory
    env: Any
    tools: list[dict]
    start: float
    index: int = 0  # row of the trajectory in the round (ready batches are ordered by it)
    failures: int = 0
    done: bool = False


@dataclass
class Action:
    """What a trajectory does after a model turn (``MultiTurnRollout.next_action``): ``kind`` names the job
    the scheduler runs off the engine thread (``tools``: the parsed ``blocks``, in order; ``env``: a
    conversational environment answers ``text``)."""

    kind: str
    blocks: list = field(default_factory=list)
    text: str = ""  # ``env``: the model's free-text turn, for a conversational environment's ``step``


def _first_messages(row: dict, observation: str | None) -> list[dict]:
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and prompt:
        messages = [dict(m) for m in prompt]
    else:
        raise ValueError(f"multi-turn rollout: row['prompt'] must be a string or a list of messages, got {prompt!r}")
    if observation:  # what env.reset returned is appended to the last user message (is it, when that is empty)
        last = next(i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == "user")
        content = messages[last]["content"]
        messages[last] = {**messages[last], "content": f"{content}\n\n{observation}" if content else observation}
    return messages


def _schemas(tools: list[dict]) -> dict[str, dict]:
    out = {}
    for t in tools:
        fn = t.get("function", t)
        out[fn["name"]] = fn.get("parameters") or {"type": "object"}
    return out


def _run_calls(live: _Live, blocks: list, cfg: MultiTurnParams, call_tool: CallToolFn) -> list[dict]:
    """Run the parsed calls of one turn in order; one ``{name, arguments, result, error}`` per block."""
    schemas, records = _schemas(live.tools), []
    for call, reason in blocks:
        remaining = cfg.trajectory_timeout_s - (time.monotonic() - live.start)
        if call is None:
            rec = {"name": None, "arguments": None, "result": f"error: malformed tool call: {reason}", "error": "malformed"}
        elif call["name"] not in schemas:
            known = ", ".join(sorted(schemas)) or "none"
            rec = {**call, "result": f"error: unknown tool {call['name']!r}; available tools: {known}",
                   "error": "unknown_tool"}
        elif remaining <= 0:
            rec = {**call, "result": "error: the trajectory ran out of time", "error": "timeout"}
        else:
            try:  # the envs' own check (the ToolEnv contract checks again inside call; a custom env may not)
                validate_arguments(call["name"], schemas[call["name"]], call["arguments"])
                result, error = call_tool(live.env, call["name"], call["arguments"], min(cfg.tool_timeout_s, remaining))
            except BadArgumentsError as e:
                result, error = f"error: {e}", "bad_arguments"
            rec = {**call, "result": result, "error": error}
        records.append(rec)
    return records


def as_engine(engine_or_fn: Any, tokenizer: Any) -> Engine:
    """An :class:`Engine` as is; a plain ``generate_fn(prompt_id_lists, budgets, params) -> id lists``
    wrapped (finish reason from the tokenizer's end-of-turn tokens, no log-probs)."""
    if isinstance(engine_or_fn, Engine):
        return engine_or_fn
    if not callable(engine_or_fn):
        raise TypeError(f"multi-turn rollout: expected a grouprl.rollout.engine.Engine or a generate_fn, got "
                        f"{type(engine_or_fn).__name__}")
    return FunctionEngine(engine_or_fn, stop_token_ids(tokenizer))


class MultiTurnRollout:
    """Runs multi-turn tool rollouts on any token engine.

    ``engine``: a :class:`grouprl.rollout.engine.Engine` (``generate(prompt_ids, max_new_tokens, sampling)
    -> Generation``s), or a plain ``generate_fn(prompt_id_lists, max_new_tokens, params) -> sampled id lists``
    (each including the end-of-turn token when one was sampled). ``env_factory()`` builds one environment
    per trajectory (the ToolEnv contract, or a TRL-style class); ``None`` = no tools. ``chat_template``: a
    Jinja string or ``.jinja`` path replacing the tokenizer's (must be prefix-preserving). ``call_tool``
    runs one call under a timeout (default :func:`grouprl.envs.base.call_with_timeout`). After ``run``,
    ``last_stats`` holds the round's :class:`grouprl.rollout.schedule.RoundStats`.
    """

    def __init__(self, tokenizer: Any, engine: Any, params: MultiTurnParams | None = None, *,
                 env_factory: Callable[[], Any] | None = None, chat_template: str | None = None,
                 call_tool: CallToolFn = call_with_timeout) -> None:
        self.tokenizer, self.engine = tokenizer, as_engine(engine, tokenizer)
        self.params = params or MultiTurnParams()
        self.params.validate()
        self.env_factory, self.call_tool = env_factory, call_tool
        self.chat_template = load_chat_template(chat_template)  # a Jinja string or a .jinja file
        self.stop_ids = set(stop_token_ids(tokenizer))
        self.last_stats: Any = None
        # what a job kind runs in the tool pool, and how its result is appended (one entry per Action.kind)
        self.jobs: dict[str, tuple[Callable, Callable]] = {"tools": (self._run_tools, self._tool_turn),
                                                           "env": (self._run_env, self._env_turn)}

    def _start(self, row: dict, group: int, index: int = 0) -> _Live:
        env = as_tool_env(self.env_factory()) if self.env_factory is not None else None
        try:
            observation = env.reset(row) if env is not None else None
            tools = list(getattr(env, "tools", None) or [])
            messages = _first_messages(row, observation)
            ids = prompt_ids(self.tokenizer, messages, tools or None, chat_template=self.chat_template)
        except BaseException:
            if env is not None:
                env.close()
            raise
        traj = Trajectory(prompt_ids=ids, messages=messages, group=group, rollout_logp=[])
        return _Live(traj, env, tools, time.monotonic(), index)

    def _finish(self, live: _Live, reason: str) -> None:
        live.done, live.traj.end_reason = True, reason
        if live.env is not None:
            try:
                live.traj.env_reward = live.env.reward()
            except Exception as e:  # a broken reward scores this trajectory None (unscored), never the run
                log.warning("multi-turn rollout: %s.reward() raised %s: %s; env_reward=None",
                            type(live.env).__name__, type(e).__name__, e)
            finally:  # the counters as the reward left them (e.g. code repair's passed / total)
                live.traj.env_state = public_state(_env_object(live.env))
                live.traj.environment = getattr(live.env, "instance", None)  # TRL's `environments=` for rewards
                live.env.close()
        live.traj.completion = self.tokenizer.decode(live.traj.completion_ids, skip_special_tokens=True)

    # ---- the state machine: request -> model turn -> next_action -> job -> apply -> request ... ---------
    def ready(self, live: _Live) -> bool:
        """Whether ``live`` goes on to a model turn (a trajectory over its time limit ends ``timeout``)."""
        if not live.done and time.monotonic() - live.start > self.params.trajectory_timeout_s:
            self._finish(live, "timeout")
        return not live.done

    def request(self, live: _Live) -> tuple[list[int], int]:
        """The next model turn's prompt ids and token budget."""
        traj = live.traj
        return traj.prompt_ids + traj.completion_ids, self.params.max_new_tokens - len(traj.completion_ids)

    def next_action(self, live: _Live, gen: Generation) -> Action | None:
        """Append one model turn, then decide what comes next: an :class:`Action` (``tools``: run the turn's
        calls; ``env``: a conversational environment answers the turn), or ``None`` when the trajectory ended
        (``max_tokens``, ``answered``, ``max_turns``).

        The one place a trajectory's next step is chosen: another kind of step (an environment answering a
        free-text turn with a user message, say) is an ``Action`` kind returned here, with its job and its
        append function registered in ``self.jobs``; the schedulers run any kind the same way."""
        traj, budget = live.traj, self.params.max_new_tokens - len(live.traj.completion_ids)
        sampled = list(gen.token_ids)[:budget]
        traj.append(sampled, sampled=True, logp=None if gen.logprobs is None else list(gen.logprobs)[:len(sampled)])
        traj.num_turns += 1
        text = self.tokenizer.decode(sampled, skip_special_tokens=True)
        traj.messages.append({"role": "assistant", "content": text})
        blocks = parse_tool_blocks(text)
        if not sampled or sampled[-1] not in self.stop_ids:
            self._finish(live, "max_tokens")
        elif not blocks and getattr(live.env, "conversational", False):
            return Action("env", text=text)
        elif not blocks:
            self._finish(live, "answered")
        elif traj.num_turns >= self.params.max_turns:
            self._finish(live, "max_turns")
        else:
            return Action("tools", blocks)
        return None

    def run_job(self, live: _Live, action: Action) -> Any:
        """Carry out ``action`` (in the tool pool, off the engine thread)."""
        return self.jobs[action.kind][0](live, action)

    def apply(self, live: _Live, action: Action, result: Any) -> None:
        """Append what the job returned (or end the trajectory); ``ready`` then says whether it goes on."""
        self.jobs[action.kind][1](live, result)

    def _run_tools(self, live: _Live, action: Action) -> list[dict]:
        return _run_calls(live, action.blocks, self.params, self.call_tool)

    def _run_env(self, live: _Live, action: Action) -> tuple:
        """A conversational environment's ``step`` on the turn's free text (in the tool pool, under the
        tool timeout and what is left of the trajectory's): ``(result, error)``."""
        from grouprl.envs.conversational import step_with_timeout

        p = self.params
        remaining = p.trajectory_timeout_s - (time.monotonic() - live.start)
        return step_with_timeout(live.env, action.text, max(0.0, min(p.tool_timeout_s, remaining)))

    def _env_turn(self, live: _Live, result: Any) -> None:
        """Append the environment's observation as the next user turn (token-exact, loss mask 0, like a tool
        turn), or end the trajectory (``env_done``, ``env_error``, ``max_turns``, ``max_tokens``)."""
        p, traj = self.params, live.traj
        out, error = result if isinstance(result, tuple) else (None, "step did not return within its bound")
        if error is not None:
            log.warning("multi-turn rollout: %s %s; the trajectory ends with env_error",
                        type(_env_object(live.env)).__name__, error)
            return self._finish(live, "env_error")
        observation, _, done = out
        if done:
            return self._finish(live, "env_done")
        if traj.num_turns >= p.max_turns:
            return self._finish(live, "max_turns")
        user = [{"role": "user", "content": observation or ""}]
        ids = tool_turn_ids(self.tokenizer, traj.messages, user, live.tools or None, chat_template=self.chat_template)
        if len(traj.completion_ids) + len(ids) >= p.max_new_tokens:
            return self._finish(live, "max_tokens")  # rolled back, as a tool turn that would not fit
        traj.append(ids, sampled=False)
        traj.messages.extend(user)

    def _tool_turn(self, live: _Live, records: list[dict]) -> None:
        """Record the calls, then append the tool turn or end the trajectory (see the module docstring)."""
        p, traj = self.params, live.traj
        traj.tool_calls.extend(records)
        live.failures += sum(r["error"] is not None for r in records)
        if time.monotonic() - live.start > p.trajectory_timeout_s:
            return self._finish(live, "timeout")
        if p.max_tool_failures is not None and live.failures >= p.max_tool_failures:
            return self._finish(live, "tool_error_budget")
        tool_messages = [{"role": "tool", "name": r["name"] or "invalid", "content": r["result"]} for r in records]
        ids = tool_turn_ids(self.tokenizer, traj.messages, tool_messages, live.tools or None,
                            chat_template=self.chat_template)
        if len(traj.completion_ids) + len(ids) >= p.max_new_tokens:
            return self._finish(live, "max_tokens")  # rolled back: no room for another model token
        traj.append(ids, sampled=False)
        traj.messages.extend(tool_messages)

    def job_bound(self, live: _Live) -> float:
        """Seconds a job of ``live`` may take before its calls are reported ``timeout`` (a custom
        ``call_tool`` that overran its own bound)."""
        p = self.params
        return max(0.0, p.trajectory_timeout_s - (time.monotonic() - live.start)) + p.tool_timeout_s + 1.0

    def overran(self, action: Action, bound: float) -> list[dict]:
        return [{**(call or {"name": None, "arguments": None}), "error": "timeout",
                 "result": f"error: the tool calls did not return within {bound:.1f} s"} for call, _ in action.blocks]

    def run(self, rows: list[dict], group_size: int = 1, params: Any = None) -> list[Trajectory]:
        """``len(rows) * group_size`` trajectories, rows ``i*G .. i*G+G-1`` of prompt ``i`` (``group = i``).

        ``params`` (e.g. :class:`grouprl.rollout.base.SamplingParams`) is passed to the engine as is.
        """
        from grouprl.rollout.schedule import run_lockstep, run_per_trajectory

        p, lives = self.params, []
        pool = ThreadPoolExecutor(max_workers=p.max_concurrent_tools, thread_name_prefix="grouprl-tools")
        try:
            for i, row in enumerate(rows):
                lives.extend(self._start(row, i, len(lives)) for _ in range(group_size))
            with self.engine.session():
                scheduler = run_lockstep if p.schedule == "lockstep" else run_per_trajectory
                self.last_stats = scheduler(self, lives, params, pool)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            for live in lives:
                if not live.done:  # an exception escaped (e.g. TemplateError): still close every env
                    live.done = True
                    if live.env is not None:
                        live.env.close()
        return [live.traj for live in lives]


def hf_generate_fn(model: Any, tokenizer: Any, stop_ids: list[int] | None = None, *,
                   lean: bool | None = False) -> GenerateFn:
    """A ``generate_fn`` (sampled id lists) over :class:`grouprl.rollout.engine.TransformersEngine`: one
    left-padded batched call with a KV cache, each row cut at its own budget and after its first stop token.
    ``lean``: the lean CPU sampler where it supports the model; ``None`` = on the CPU only."""
    engine = TransformersEngine(model, tokenizer, lean=lean, stop_ids=stop_ids)

    def generate(prompt_id_lists: list[list[int]], max_new_tokens: list[int] | int, params: Any) -> list[list[int]]:
        return [g.token_ids for g in engine.generate(prompt_id_lists, max_new_tokens, params)]

    return generate
