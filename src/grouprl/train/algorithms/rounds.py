"""One generation round: sample G completions per prompt, score them, dynamic sampling, advantages, and
the micro-batches (with their fixed reference / old log-probs) that the round's optimizer steps consume.

Dynamic sampling follows DAPO (arXiv:2503.14476, Sec. 3.2): groups whose rewards all agree carry no
learning signal under a group-relative advantage; ``drop`` removes them, ``resample`` draws more prompts
until the batch holds B informative groups (or ``max_resample_rounds`` runs out).

On N processes (``train.parallel.ranks``) every rank fills its own B groups and the ranks stay in lock-step: while
ANY rank is short, EVERY rank draws the next global batch of the prompt stream (so the data position is
the same everywhere and stays global in checkpoints); a rank that is already full skips generating for
its share (unless one engine serves every rank), as one process discards the informative groups beyond
B. Under ``drop`` a rank may keep fewer groups than another, or none: it then trains on nothing and still
joins every collective (its gradient counts as zero in the sum). Only when NO rank keeps a group does
every rank train on its whole batch (its advantages are all 0), as one process does.

Shapes: B prompts, G completions each, N = B*G rows, T completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from grouprl.algo.advantages import zero_std_groups as algo_zero_std_groups
from grouprl.config import GRPOConfig
from grouprl.data.load import render_prompt, reward_columns
from grouprl.data.stream import PromptStream
from grouprl.errors import ConfigError
from grouprl.rollout.base import Rollout, SamplingParams, concat_rollouts
from grouprl.train import turn_credit
from grouprl.train.agent import add_env_rewards, agent_metrics, agent_rollout, reward_inputs
from grouprl.train.checkpoint.unpickle import moved_from
from grouprl.train.engine.model import Reference
from grouprl.train.engine.precision import generation_context
from grouprl.train.engine.step import MicroBatch, batched_logps
from grouprl.train.evaluate import completions_for_rewards
from grouprl.train.metrics import Timers, round_metrics, round_samples
from grouprl.train.parallel import ranks as dist
from grouprl.train.score import RewardScorer


@dataclass
class RunContext:
    """What the round and the optimizer step need from the run (built once by ``loop.train``)."""

    cfg: GRPOConfig
    model: Any
    tokenizer: Any
    backend: Any
    scorer: RewardScorer
    advantage_fn: Any
    reference: Reference | None
    autocast: Any
    rows: Any
    step: int = 0
    total_steps: int = 0
    sampling: SamplingParams | None = None  # None: built from cfg
    agent: Any = None  # grouprl.train.agent.Agent: multi-turn tool rollouts; None = single-turn


@dataclass
class Round:
    """Everything the updates of one generation round need (saved in checkpoints taken mid-round)."""

    micro_batches: list[MicroBatch]
    metrics: dict[str, float]
    samples: list[dict] = field(default_factory=list)
    # keyword-only: a subclass's own fields (ppo.PPORound's targets) keep their places
    ordinals: list[int] | None = field(default=None, kw_only=True)  # [N] each row's prompt ordinal (data/stream.py)
    frontier: int | None = field(default=None, kw_only=True)  # prompts drawn up to and including this round's


@dataclass
class Scored:
    """One sampled batch of B prompts x G completions and its rewards."""

    rollout: Rollout
    rewards: torch.Tensor  # [B,G] total, NaN = no opinion
    components: list[list[float]]  # [N][F], NaN = that function returned None
    prompts: list[Any]
    columns: dict[str, list]
    trajectories: list | None = None  # agent runs: one Trajectory per row
    ordinals: list[int] = field(default_factory=list)  # [B]: each prompt's place in the prompt stream


@dataclass
class Sampled:
    """The generate-and-score half of one round (:func:`sample_round`): the sampled parts (the first draw,
    then dynamic sampling's redraws; ``None`` = a part this rank did not generate), the (part, group) pairs
    kept, the extra draws, what the rewards logged, and ``version``: the optimizer step of the weights that
    sampled it (``None``: the trainer's own, now), and the ordinals it drew."""

    parts: list[Scored | None]
    keep: list[tuple[int, int]]
    extra_rounds: int
    logged: dict[str, float]
    version: int | None = None
    first_ordinal: int = 0  # the global ordinal of the round's first prompt (data/stream.py)
    frontier: int = 0  # prompts drawn up to and including this round's (its redraws): its last ordinal + 1


@dataclass
class RoundBatch:
    """The groups a round trains on, after dynamic sampling (N = B*G rows, grouped)."""

    rollout: Rollout
    adv: torch.Tensor  # [N], or [N, T] per token for a turn-level estimator (train/turn_credit.py)
    rewards: torch.Tensor | None = None  # [B,G] total, NaN = no opinion
    components: list[list[float]] = field(default_factory=list)  # [N][F]
    ordinals: list[int] = field(default_factory=list)  # [N] each row's prompt ordinal


def sampling_params(cfg: GRPOConfig) -> SamplingParams:
    return SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_prompt_length)


def sample_and_score(ctx: RunContext, idx: list[int], timers: Timers) -> Scored:
    """Generate G completions for the rows ``idx`` and score them: ``rewards [B,G]``."""
    cfg, G = ctx.cfg, ctx.cfg.num_generations
    rows = [ctx.rows[int(i)] for i in idx]
    params = ctx.sampling or sampling_params(cfg)
    if ctx.agent is not None:
        return _sample_and_score_agent(ctx, rows, params, timers)
    with timers("generate"):
        texts = [render_prompt(r[cfg.prompt_column], ctx.tokenizer, cfg.system_prompt, cfg.apply_chat_template)
                 for r in rows]
        with generation_context(ctx.autocast):  # no autocast on a CPU: train/engine/precision.py
            rollout = generate(ctx.backend, texts, G, params)
    with timers("reward"):
        expanded = [r for r in rows for _ in range(G)]
        prompts = [r[cfg.prompt_column] for r in expanded]
        columns = reward_columns(expanded, cfg.prompt_column)
        completions = completions_for_rewards(rollout.completions, prompts)
        state = SimpleNamespace(global_step=ctx.step, max_steps=ctx.total_steps)
        totals, components = ctx.scorer.score(prompts, completions, columns, trainer_state=state,
                                               completion_ids=rollout.token_lists())
    rewards = torch.tensor(totals, dtype=torch.float32).view(len(rows), G)
    return Scored(rollout, rewards, components, prompts, columns)


def _sample_and_score_agent(ctx: RunContext, rows: list[dict], params: SamplingParams, timers: Timers) -> Scored:
    """Multi-turn tool rollouts on the policy model (``grouprl.train.agent``); rewards see the trajectories
    and the environment's own reward is added to the total."""
    cfg, G = ctx.cfg, ctx.cfg.num_generations
    with timers("generate"), generation_context(ctx.autocast):
        rollout = agent_rollout(ctx.agent, ctx.model, ctx.tokenizer, rows, G, params,
                                prompt_column=cfg.prompt_column, system_prompt=cfg.system_prompt, backend=ctx.backend)
    with timers("reward"):
        expanded = [r for r in rows for _ in range(G)]
        prompts = [r[cfg.prompt_column] for r in expanded]
        completions, traj_columns = reward_inputs(rollout.trajectories, prompts)
        columns = {**reward_columns(expanded, cfg.prompt_column), **traj_columns}
        state = SimpleNamespace(global_step=ctx.step, max_steps=ctx.total_steps)
        totals, components = ctx.scorer.score(prompts, completions, columns, trainer_state=state,
                                               completion_ids=rollout.token_lists())
        totals = add_env_rewards(totals, rollout.trajectories)
    rewards = torch.tensor(totals, dtype=torch.float32).view(len(rows), G)
    return Scored(rollout, rewards, components, prompts, columns, rollout.trajectories)


def generate(backend: Any, texts: list[str], n: int, params: SamplingParams) -> Rollout:
    """``backend.generate`` for this rank's prompts. A backend with ``shared_engine = True`` (a vLLM server:
    one engine for every rank) is driven by rank 0 alone, as TRL's server mode does: rank 0 gathers every
    rank's prompts, generates them in one request, and each rank takes its own rows (its prompts' groups)."""
    ranks = dist.current()
    if not (ranks.enabled and getattr(backend, "shared_engine", False)):
        return backend.generate(texts, n, params)
    shares = ranks.all_gather(list(texts))

    def on_rank_0() -> list[Rollout]:
        everything = backend.generate([t for share in shares for t in share], n, params)
        bounds = np.cumsum([0] + [len(share) * n for share in shares]).tolist()
        return [_rollout_to(everything.select(list(range(a, b))), "cpu") for a, b in zip(bounds, bounds[1:])]

    mine = dist.scatter_from_main(ranks, on_rank_0)  # CPU tensors through the object collective
    model = getattr(backend, "model", None)
    return _rollout_to(mine, next(model.parameters()).device if model is not None else "cpu")


def _rollout_to(rollout: Rollout, device: Any) -> Rollout:
    """``rollout`` with its tensors on ``device``."""
    from dataclasses import fields, replace

    return replace(rollout, **{f.name: getattr(rollout, f.name).to(device) for f in fields(rollout)
                               if isinstance(getattr(rollout, f.name), torch.Tensor)})


def zero_std_groups(rewards: torch.Tensor, advantage_hparams: dict | None = None) -> torch.Tensor:
    """[B] bool: groups without learning signal, by ``grouprl.algo.zero_std_groups`` -- the very test
    ``grpo`` uses to zero a group -- with the ``eps`` / ``std`` the advantage estimator was given."""
    hp = {k: v for k, v in (advantage_hparams or {}).items() if k in ("eps", "std")}
    return algo_zero_std_groups(rewards, **hp)


def generate_round(ctx: RunContext, stream: PromptStream, timers: Timers) -> Round:
    """Rollout, score, (dynamic sampling), advantages, and the fixed log-probs the updates need."""
    return finish_round(ctx, sample_round(ctx, stream, timers), timers)


def sample_round(ctx: RunContext, stream: PromptStream, timers: Timers) -> Sampled:
    """The generate-and-score half of a round (what the rollout worker of ``grouprl.train.pipeline`` runs):
    the next prompts, their completions and rewards, and the groups dynamic sampling keeps."""
    start = stream.drawn  # the ordinal of the round's first prompt (global over ranks)
    first = sample_and_score(ctx, stream.next(), timers)
    first.ordinals = list(stream.last_ordinals)
    logged_by_rewards = dict(ctx.scorer.last_metrics)  # what the rewards logged with log_metric (judge/agreement)
    parts, keep, extra_rounds = select_groups(ctx, stream, timers, first)
    return Sampled(parts, keep, extra_rounds, logged_by_rewards, first_ordinal=start, frontier=stream.drawn)


def finish_round(ctx: RunContext, sampled: Sampled, timers: Timers) -> Round:
    """The training half: advantages (over every rank), metrics, micro-batches with their fixed log-probs."""
    parts, keep, extra_rounds, logged_by_rewards = sampled.parts, sampled.keep, sampled.extra_rounds, sampled.logged
    first = parts[0]
    if sum(dist.current().all_gather(len(keep))) == 0:  # 'drop' removed every group of every rank: keep the
        keep = [(0, b) for b in range(first.rewards.shape[0])]  # batch (its advantages are all 0), as one process does
    batch = assemble(ctx, parts, keep)
    empty = len(batch.adv) == 0  # this rank kept no group: its advantage statistics are NaN (ignored over ranks)
    row_adv = turn_credit.row_advantages(batch.adv, batch.rollout.loss_mask)  # [N]: per token -> first turn's
    metrics = round_metrics(ctx.scorer.names, first.rewards, first.components, first.rollout,
                            row_adv if not empty else torch.zeros(1),
                            zero_std_groups(first.rewards, ctx.cfg.advantage_kwargs))
    if empty:
        metrics.update({k: float("nan") for k in metrics if k.startswith("advantage/")})
    if first.trajectories is not None:  # tools/*, turns/mean, end_reason/*, tokens/*, rewards/env/mean
        metrics.update(agent_metrics(first.trajectories))
    metrics.update(logged_by_rewards)
    for name, weight in zip(ctx.scorer.names, ctx.scorer.weights):  # each component's share of the total
        metrics[f"rewards/{name}/weighted_mean"] = weight * metrics[f"rewards/{name}/mean"]
    kept = sum(dist.current().all_gather(len(keep)))  # the global count (the same on every rank)
    zero_kept = zero_std_groups(batch.rewards, ctx.cfg.advantage_kwargs).float()
    metrics.update({"dynamic/kept_groups": float(kept), "dynamic/extra_rounds": float(extra_rounds),
                    "dynamic/frac_zero_std_kept": float(zero_kept.mean()) if len(zero_kept) else float("nan"),
                    # the global ordinals this round drew (redraws included): consecutive rounds tile 0, 1, 2, ...
                    "data/ordinal_min": sampled.first_ordinal, "data/ordinal_max": sampled.frontier - 1})
    mbs = micro_batches(ctx, batch, timers)
    samples = round_samples(ctx.scorer.names, batch.rollout, batch.rewards, batch.components, row_adv,
                            ctx.cfg.num_completions_to_log, ctx.tokenizer)
    version = ctx.step if sampled.version is None else sampled.version
    for i, row in enumerate(samples):  # which prompt, sampled by which weights (docs/ALGORITHMS.md, async)
        row.update(ordinal=batch.ordinals[i] if batch.ordinals else None, policy_version=version)
    return Round(mbs, metrics, samples, ordinals=batch.ordinals, frontier=sampled.frontier)


def select_groups(ctx: RunContext, stream: PromptStream, timers: Timers,
                  first: Scored) -> tuple[list[Scored | None], list[tuple[int, int]], int]:
    """Dynamic sampling: the sampled parts (``None``: a part this rank did not generate, being full), the
    (part, group) pairs kept, and the extra rounds drawn (the same on every rank)."""
    cfg, ranks = ctx.cfg, dist.current()
    parts: list[Scored | None] = [first]
    B = first.rewards.shape[0]
    keep = [(0, b) for b in range(B)]
    if cfg.dynamic_sampling != "none":
        keep = [(0, b) for b, zero in enumerate(zero_std_groups(first.rewards, cfg.advantage_kwargs)) if not zero]
    rounds = 0
    # a shared engine (vLLM server) generates every rank's prompts in one request: every rank takes part
    joins = ranks.enabled and getattr(ctx.backend, "shared_engine", False) and ctx.agent is None
    # DAPO (arXiv:2503.14476, Sec. 3.2): over-sample until the batch holds informative groups. Every rank
    # draws while any rank is short (lock-step on the global prompt stream); a full rank does not generate
    # (unless the engine is shared), and its extra groups fall beyond keep[:B] as on one process.
    while (cfg.dynamic_sampling == "resample" and rounds < cfg.max_resample_rounds
           and ranks.any_true(len(keep) < B)):
        rounds += 1
        idx = stream.next()
        extra = sample_and_score(ctx, idx, timers) if len(keep) < B or joins else None
        if extra is not None:
            extra.ordinals = list(stream.last_ordinals)
        parts.append(extra)
        if extra is not None:
            zero = zero_std_groups(extra.rewards, cfg.advantage_kwargs)
            keep += [(len(parts) - 1, b) for b in range(B) if not zero[b]]
    if cfg.dynamic_sampling == "resample" and len(keep) < B:  # still short: fill with uninformative groups
        keep += [(p, b) for p, s in enumerate(parts) if s is not None for b in range(B) if (p, b) not in keep][:B - len(keep)]
    return parts, keep[:B], rounds


def assemble(ctx: RunContext, parts: list[Scored], keep: list[tuple[int, int]]) -> RoundBatch:
    """The kept groups as one batch; advantages per sampled part, so ``scale='group'`` sees whole groups
    and ``scale='batch'`` the batch that was sampled."""
    G = ctx.cfg.num_generations
    # per sampled part, on the rewards of every rank (train/parallel/ranks.py: a batch std sees the global batch);
    # a part this rank did not generate joins the collective with no rows
    per_turn = turn_credit.is_turn_level(ctx.advantage_fn)  # [B,G,2]: first turn, later turns (MT-GRPO)
    if per_turn:
        part_adv = [turn_credit.part_advantage(partial(global_advantage, dist.current()), ctx.advantage_fn, s, G)
                    for s in parts]
    else:
        part_adv = [global_advantage(dist.current(), ctx.advantage_fn, s.rewards if s is not None else torch.zeros(0, G))
                    for s in parts]
    if not keep:  # this rank keeps no group (drop): it trains on nothing this round
        first = parts[0]
        return RoundBatch(first.rollout.select([]), torch.zeros(0), first.rewards[:0], [])
    rollouts, rewards, components, advs, ordinals = [], [], [], [], []
    for p, b in keep:
        s = parts[p]
        rows = list(range(b * G, (b + 1) * G))
        rollouts.append(s.rollout.select(rows))
        rewards.append(s.rewards[b])
        components.extend(s.components[r] for r in rows)
        advs.append(part_adv[p][b])
        ordinals.extend([s.ordinals[b]] * G if s.ordinals else [])
    adv = torch.stack(advs).reshape(-1, 2) if per_turn else torch.stack(advs).reshape(-1)
    rollout = concat_rollouts(rollouts, ctx.tokenizer.pad_token_id)
    if per_turn:  # one advantage per token: the first model turn's, then the later turns'
        adv = turn_credit.token_advantages(rollout.loss_mask, adv)
    adv = adv.float()
    return RoundBatch(rollout, adv, torch.stack(rewards), components, ordinals)


def micro_batches(ctx: RunContext, batch: RoundBatch, timers: Timers) -> list[MicroBatch]:
    """Split the round into ``effective_steps_per_generation`` micro-batches (each trimmed to its longest
    completion) and attach the reference / old log-probs the loss needs."""
    cfg, r = ctx.cfg, batch.rollout
    if r.rollout_logp is None and getattr(cfg, "rollout_correction", "auto") in ("tis", "mask"):  # no silent no-op
        raise ConfigError(f"rollout_correction={cfg.rollout_correction!r}, but rollout_backend="
                          f"{cfg.rollout_backend!r} reports no rollout_logp (its own log-probs). Fix: "
                          f"rollout_correction: auto, or a backend that sets Rollout.rollout_logp.")
    device = r.completion_ids.device
    loss_mask = r.completion_mask if r.loss_mask is None else r.loss_mask  # 0 on tool tokens (agent runs)
    if cfg.mask_truncated_completions:  # DAPO overlong filtering: truncated answers carry no signal
        loss_mask = loss_mask * (~r.truncated).unsqueeze(1).long()
    if batch.rewards is not None:  # unknown reward (missing_reward='exclude'): no loss, no KL, not counted
        known = ~torch.isnan(batch.rewards.reshape(-1)).to(device)
        loss_mask = loss_mask * known.unsqueeze(1).long()
    adv = batch.adv.to(device)
    chunks = [c.tolist() for c in np.array_split(np.arange(len(r)), cfg.effective_steps_per_generation)]
    mbs = []
    for c in chunks:
        i = torch.as_tensor(c, dtype=torch.long, device=device)
        T = max(int(r.completion_mask[i].sum(dim=1).max().item()) if len(c) else 1, 1)
        mbs.append(MicroBatch(r.prompt_ids[i], r.prompt_mask[i], r.completion_ids[i][:, :T],
                              r.completion_mask[i][:, :T], loss_mask[i][:, :T],
                              adv[i][:, :T] if adv.dim() == 2 else adv[i],
                              rollout_logp=None if r.rollout_logp is None else r.rollout_logp[i][:, :T].float()))
    if ctx.reference is not None:
        with timers("ref_forward"), ctx.reference.context():
            for mb, lp in zip(mbs, batched_logps(ctx.reference.model, mbs, cfg.temperature, ctx.autocast,
                                                 chunk_size=cfg.logits_chunk_size,
                                                 padding_free=cfg.padding_free)):
                mb.ref_logp = lp
    engine_old = getattr(cfg, "gspo_use_engine_logp", False) and r.rollout_logp is not None  # the engine's are old_logp
    if cfg.needs_old_logp and not engine_old:
        # With mu = 1 the first optimizer step's micro-batches are scored before any update: their old
        # log-probs are the current ones, which the loss takes as logp.detach() when old_logp is None.
        first = cfg.gradient_accumulation_steps if cfg.num_iterations == 1 else 0
        with timers("old_logp_forward"):
            moved = mbs[first:]
            for mb, lp in zip(moved, batched_logps(ctx.model, moved, cfg.temperature, ctx.autocast,
                                                   chunk_size=cfg.logits_chunk_size,
                                                   padding_free=cfg.padding_free)):
                mb.old_logp = lp
    return mbs

def global_advantage(ranks: Any, advantage_fn: Any, rewards: torch.Tensor) -> torch.Tensor:
    """Advantages of this rank's groups computed on the rewards of EVERY rank (``[B, G]`` -> ``[B, G]``):
    a group estimator may normalise over the whole batch (e.g. ``scale_rewards: batch``)."""
    if not ranks.enabled:
        return advantage_fn(rewards)
    parts = ranks.all_gather(rewards.detach().cpu())
    start = sum(p.shape[0] for p in parts[:ranks.rank])
    adv = advantage_fn(torch.cat(parts).to(rewards.device))
    return adv[start:start + rewards.shape[0]]


moved_from("grouprl.train.round", "grouprl.train.loop", to=__name__)  # checkpoints pickled its classes under the old path(s)
