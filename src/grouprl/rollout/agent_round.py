"""One multi-turn round on any engine, as the :class:`grouprl.rollout.base.Rollout` the trainer consumes.

``loss_mask`` is 0 on tool tokens, so the loss, the KL, the entropy, the token counts and the length
metrics see model tokens only. ``rollout_logp`` carries the engine's log-prob of each sampled token (0 on
tool tokens and padding) when the engine samples with its own copy of the weights (vLLM, a plug-in), so
the sampler/trainer mismatch correction (``grouprl.algo.correction``) applies to multi-turn trajectories
as to single-turn ones; the transformers engine samples with the trainer's weights and reports none.
"""

from __future__ import annotations

from typing import Any

from grouprl.rollout.base import Rollout
from grouprl.rollout.engine import Engine, EngineBackend, TransformersEngine
from grouprl.rollout.multiturn import MultiTurnParams, MultiTurnRollout
from grouprl.rollout.trajectory import stack_trajectories


def engine_for(backend: Any, model: Any, tokenizer: Any, *, lean: bool | None = None) -> Engine:
    """The token engine behind a run's backend: the plug-in engine itself, vLLM's token engine, or the
    transformers engine over ``model`` (``backend`` None or the built-in transformers backend)."""
    if isinstance(backend, EngineBackend):
        return backend.engine
    if isinstance(backend, Engine):
        return backend
    from grouprl.rollout.hf import TransformersBackend
    from grouprl.rollout.vllm_backend import VLLMBackend

    if isinstance(backend, VLLMBackend):
        from grouprl.rollout.chat import stop_token_ids
        from grouprl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(backend, backend.eos_ids + stop_token_ids(tokenizer))

    if backend is None or isinstance(backend, TransformersBackend):
        return TransformersEngine(model, tokenizer, lean=lean)
    from grouprl.errors import ConfigError

    raise ConfigError(f"rollout_backend {type(backend).__module__}:{type(backend).__name__} is a text-level "
                      f"backend (generate(prompts, n, params)); multi-turn rollouts need token ids in and out. "
                      f"Fix: subclass grouprl.rollout.engine.Engine (docs/EXTENDING.md, 'A rollout engine').")


def agent_round(engine: Engine, tokenizer: Any, rows: list[dict], n: int, sampling: Any, params: MultiTurnParams, *,
                env_factory: Any, chat_template: str | None = None, device: Any = "cpu") -> Rollout:
    """``n`` trajectories per row (rows already in chat messages), stacked on ``device``. The round's
    :class:`grouprl.rollout.schedule.RoundStats` is ``rollout.stats``."""
    runner = MultiTurnRollout(tokenizer, engine, params, env_factory=env_factory, chat_template=chat_template)
    trajs = runner.run(rows, n, sampling)
    if engine.trainer_is_sampler:
        for t in trajs:  # the trainer's own log-probs: nothing to correct
            t.rollout_logp = None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    b = stack_trajectories(trajs, pad, device)
    if b.rollout_logp is None and not engine.trainer_is_sampler and any(t.rollout_logp is not None for t in trajs):
        raise ValueError(f"{type(engine).__name__} reported log-probs for some turns and not others; an engine "
                         f"returns Generation.logprobs for every request or for none")
    prompts = [tokenizer.decode(t.prompt_ids) for t in trajs]
    rollout = Rollout(b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask, b.truncated,
                      [t.completion for t in trajs], prompts, loss_mask=b.loss_mask, trajectories=trajs,
                      rollout_logp=b.rollout_logp)
    rollout.stats = runner.last_stats
    return rollout
