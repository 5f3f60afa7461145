"""Multi-turn tool rollouts: generate -> parse tool calls -> run them -> append the results -> generate.

All ``B x G`` trajectories advance together: each turn is one batched ``generate_fn`` call over the
trajectories still running, then the tool calls of that turn run in a thread pool (the calls of one
trajectory in order, trajectories concurrently), each under a timeout. A trajectory ends when

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
+ :func:`grouprl.rollout.chat.tool_turn_ids`. Tool calls are parsed by the same parser as the
``tool_call`` reward (:func:`grouprl.rewards.tool_call.parse_tool_blocks`); a malformed call, an unknown
tool, arguments that fail the tool's JSON schema, an exception or a timeout becomes an ``error: ...``
tool message that the model sees, is counted, and never stops the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from typing import Any

from grouprl.envs.base import BadArgumentsError, ClassToolEnv, ToolEnv, call_with_timeout, validate_arguments
from grouprl.rewards.tool_call import parse_tool_blocks
from grouprl.rollout.chat import load_chat_template, prompt_ids, stop_token_ids, tool_turn_ids
from grouprl.rollout.trajectory import END_REASONS, Trajectory, public_state

GenerateFn = Callable[[list[list[int]], "list[int] | int", Any], list[list[int]]]
CallToolFn = Callable[[Any, str, dict, float], "tuple[str, str | None]"]
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
    max_workers: int = 16
    """Threads that run tool calls (trajectories concurrently, the calls of one trajectory in order)."""

    def validate(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"MultiTurnParams.{name}={getattr(self, name)} must be >= 1")
        for name in ("tool_timeout_s", "trajectory_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"MultiTurnParams.{name}={getattr(self, name)} must be > 0 seconds")
        if self.max_tool_failures is not None and self.max_tool_failures < 1:
            raise ValueError(f"MultiTurnParams.max_tool_failures={self.max_tool_failures} must be >= 1 or None")


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
    failures: int = 0
    done: bool = False


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


class MultiTurnRollout:
    """Runs multi-turn tool rollouts with any generation backend.

    ``generate_fn(prompt_id_lists, max_new_tokens, params) -> sampled id lists`` (each including the
    end-of-turn token when one was sampled; see :func:`hf_generate_fn`). ``env_factory()`` builds one
    environment per trajectory (the ToolEnv contract, or a TRL-style class); ``None`` = no tools.
    ``chat_template``: a Jinja string or ``.jinja`` path replacing the tokenizer's (must be prefix-preserving).
    ``call_tool`` runs one call under a timeout (default :func:`grouprl.envs.base.call_with_timeout`).
    """

    def __init__(self, tokenizer: Any, generate_fn: GenerateFn, params: MultiTurnParams | None = None, *,
                 env_factory: Callable[[], Any] | None = None, chat_template: str | None = None,
                 call_tool: CallToolFn = call_with_timeout) -> None:
        self.tokenizer, self.generate_fn = tokenizer, generate_fn
        self.params = params or MultiTurnParams()
        self.params.validate()
        self.env_factory, self.call_tool = env_factory, call_tool
        self.chat_template = load_chat_template(chat_template)  # a Jinja string or a .jinja file
        self.stop_ids = set(stop_token_ids(tokenizer))

    def _start(self, row: dict, group: int) -> _Live:
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
        return _Live(Trajectory(prompt_ids=ids, messages=messages, group=group), env, tools, time.monotonic())

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

    def _model_turn(self, live: _Live, sampled: list[int]) -> list | None:
        """Append one model turn; the parsed tool blocks when the trajectory goes on, else ``None``."""
        traj = live.traj
        traj.append(sampled, sampled=True)
        traj.num_turns += 1
        text = self.tokenizer.decode(sampled, skip_special_tokens=True)
        traj.messages.append({"role": "assistant", "content": text})
        blocks = parse_tool_blocks(text)
        if not sampled or sampled[-1] not in self.stop_ids:
            self._finish(live, "max_tokens")
        elif not blocks and getattr(live.env, "conversational", False):
            self._env_turn(live, text)
        elif not blocks:
            self._finish(live, "answered")
        elif traj.num_turns >= self.params.max_turns:
            self._finish(live, "max_turns")
        else:
            return blocks
        return None

    def _env_turn(self, live: _Live, text: str) -> None:
        """A conversational environment answers a turn without a tool call: its observation is appended as
        the next user turn (token-exact, loss mask 0, like a tool turn), or the trajectory ends."""
        from grouprl.envs.conversational import step_with_timeout

        p, traj = self.params, live.traj
        remaining = p.trajectory_timeout_s - (time.monotonic() - live.start)
        out, error = step_with_timeout(live.env, text, max(0.0, min(p.tool_timeout_s, remaining)))
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

    def _wait(self, live: _Live, blocks: list, job: Any) -> list[dict]:
        """The records of one trajectory's calls; all ``timeout`` when a custom ``call_tool`` overran its bound."""
        p = self.params
        bound = max(0.0, p.trajectory_timeout_s - (time.monotonic() - live.start)) + p.tool_timeout_s + 1.0
        try:
            return job.result(timeout=bound)
        except FutureTimeout:
            return [{**(call or {"name": None, "arguments": None}), "error": "timeout",
                     "result": f"error: the tool calls did not return within {bound:.1f} s"} for call, _ in blocks]

    def run(self, rows: list[dict], group_size: int = 1, params: Any = None) -> list[Trajectory]:
        """``len(rows) * group_size`` trajectories, rows ``i*G .. i*G+G-1`` of prompt ``i`` (``group = i``).

        ``params`` (e.g. :class:`grouprl.rollout.base.SamplingParams`) is passed to ``generate_fn`` as is.
        """
        p, lives = self.params, []
        pool = ThreadPoolExecutor(max_workers=p.max_workers, thread_name_prefix="grouprl-tools")
        try:
            lives.extend(self._start(row, i) for i, row in enumerate(rows) for _ in range(group_size))
            for _ in range(p.max_turns):
                for live in lives:
                    if not live.done and time.monotonic() - live.start > p.trajectory_timeout_s:
                        self._finish(live, "timeout")
                active = [live for live in lives if not live.done]
                if not active:
                    break
                budgets = [p.max_new_tokens - len(live.traj.completion_ids) for live in active]
                outs = self.generate_fn([live.traj.prompt_ids + live.traj.completion_ids for live in active],
                                        budgets, params)
                if len(outs) != len(active):
                    raise ValueError(f"multi-turn rollout: generate_fn returned {len(outs)} rows for "
                                     f"{len(active)} prompts; it must return one id list per prompt")
                pending = [(live, self._model_turn(live, list(out)[:b])) for live, out, b in zip(active, outs, budgets)]
                pending = [(live, blocks) for live, blocks in pending if blocks is not None]
                jobs = [pool.submit(_run_calls, live, blocks, p, self.call_tool) for live, blocks in pending]
                for (live, blocks), job in zip(pending, jobs):
                    self._tool_turn(live, self._wait(live, blocks, job))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            for live in lives:
                if not live.done:  # an exception escaped (e.g. TemplateError): still close every env
                    live.done = True
                    if live.env is not None:
                        live.env.close()
        return [live.traj for live in lives]


def multiturn_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Batch means: ``tools/calls_per_traj``, ``tools/failure_frac`` (failed / all calls), ``turns/mean``,
    ``end_reason/<reason>`` fractions, ``tokens/model`` and ``tokens/tool`` per trajectory, and
    ``env_reward/mean`` over the trajectories whose environment gave one."""
    n = max(1, len(trajectories))
    calls = [c for t in trajectories for c in t.tool_calls]
    out = {
        "tools/calls_per_traj": len(calls) / n,
        "tools/failure_frac": sum(c["error"] is not None for c in calls) / max(1, len(calls)),
        "turns/mean": sum(t.num_turns for t in trajectories) / n,
        "tokens/model": sum(t.model_tokens for t in trajectories) / n,
        "tokens/tool": sum(t.tool_tokens for t in trajectories) / n,
    }
    for reason in END_REASONS:
        out[f"end_reason/{reason}"] = sum(t.end_reason == reason for t in trajectories) / n
    rewards = [t.env_reward for t in trajectories if t.env_reward is not None]
    if rewards:
        out["env_reward/mean"] = sum(rewards) / len(rewards)
    return out


def hf_generate_fn(model: Any, tokenizer: Any, stop_ids: list[int] | None = None, *,
                   lean: bool | None = False) -> GenerateFn:
    """A ``generate_fn`` over a transformers model: one left-padded batched call with a KV cache.

    ``params`` is a :class:`grouprl.rollout.base.SamplingParams` (temperature, top_p, top_k; ``None`` =
    sampling at temperature 1); its ``max_new_tokens`` is replaced by the largest per-row budget, and each
    row is cut at its own budget and after its first stop token (the tokenizer's EOS, the model's EOS ids
    and the template's end-of-turn tokens). ``lean``: sample with :func:`grouprl.rollout.lean.lean_sample`
    (same tokens / distribution as ``model.generate``, faster on CPU) where it supports the model; ``None`` =
    on the CPU only, as ``lean_sampler`` in a recipe.
    """
    import torch

    from grouprl.rollout.base import SamplingParams
    from grouprl.rollout.hf import eos_token_ids, generation_config, use_lean_sampler
    from grouprl.rollout.lean import lean_sample, unsupported_reason

    stops = sorted(set(stop_ids) if stop_ids else set(eos_token_ids(model, tokenizer)) | set(stop_token_ids(tokenizer)))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]

    def sample(ids: Any, mask: Any, base: SamplingParams) -> list[list[int]]:
        if use_lean_sampler(lean, ids.device.type) and unsupported_reason(model) is None:
            return lean_sample(model, ids, mask, 1, max_new_tokens=base.max_new_tokens, temperature=base.temperature,
                               top_k=base.top_k, top_p=base.top_p, eos_token_ids=stops, pad_token_id=pad_id).tolist()
        cfg = generation_config(base, pad_id, stops)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
        finally:
            model.train(was_training)
        return out[:, ids.shape[1]:].tolist()

    def generate(prompt_id_lists: list[list[int]], max_new_tokens: list[int] | int, params: Any) -> list[list[int]]:
        n = len(prompt_id_lists)
        budgets = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
        width = max(len(ids) for ids in prompt_id_lists)
        device = next(model.parameters()).device
        ids = torch.full((n, width), pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, row in enumerate(prompt_id_lists):
            ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
        base = params if params is not None else SamplingParams(max_new_tokens=max(budgets))
        result = []
        for row, budget in zip(sample(ids.to(device), mask.to(device), replace(base, max_new_tokens=max(budgets))),
                               budgets):
            row = row[:budget]
            end = next((k + 1 for k, t in enumerate(row) if t in stops), len(row))
            result.append(row[:end])
        return result

    return generate
