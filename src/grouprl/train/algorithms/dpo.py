"""DPO and IPO: offline training on preference pairs (Rafailov et al. arXiv:2305.18290; Azar et al.
arXiv:2310.12036), with the same checkpoints, logging and held-out evaluation as the GRPO loop.

    setup:    pairs (prompt, chosen, rejected) checked, tokenised        (grouprl.data.prefs)
    ref_logp: pi_start(chosen), pi_start(rejected), ONCE, before the first update; kept with the pairs
              (and in every checkpoint), so no reference model is held during training
    for step:
        pairs  = next per_device_train_batch_size x gradient_accumulation_steps pairs (shuffled, resumable)
        for each micro-batch:
            logp  = pi(chosen), pi(rejected)     [n]: summed token log-probs (sigmoid) / token means (ipo)
            loss  = dpo_loss(logp_c, logp_r, ref_c, ref_r).sum() / pairs of the step      (algo.losses)
        clip, AdamW step, schedule; log; evaluate; checkpoint

Metrics (TRL's names): ``rewards/chosen`` and ``rewards/rejected`` = beta * (logp - ref_logp), the implicit
reward (arXiv:2305.18290, Sec. 5); ``rewards/margins`` = their difference; ``rewards/accuracies`` = the
fraction of pairs whose chosen reward is higher; ``logps/chosen``, ``logps/rejected``; ``loss``.
Log-probs are those of the model itself (temperature 1), in fp32. Text completions get the tokenizer's EOS
appended (the model must learn to stop); chat completions end as the chat template ends them.
Several processes (``accelerate launch``, ``train.parallel.ranks``): the pair order is global and each rank takes its
contiguous share of every global batch of ``per_device_train_batch_size x gradient_accumulation_steps x N``
pairs; each loss is normalised by the pairs of the whole global step, so the gradients are SUMMED over ranks
(``Ranks.sum_gradients``) and every rank takes the same step, exactly one process on the global batch. The
reference log-probs are computed once, each rank for its share of the pairs, then gathered. Rank 0 alone
logs, evaluates and writes checkpoints. Simplification: pairs are re-tokenised from their text (as TRL
does). What ``grouprl train`` does around this loop (checks, data, model, final model) is in
:mod:`grouprl.train.algorithms.dpo_run`.
"""

from __future__ import annotations

import math
import time
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from grouprl.algo.ops import masked_sum
from grouprl.data.load import render_prompt
from grouprl.data.prefs import check_pref_rows
from grouprl.data.stream import PromptStream
from grouprl.errors import DataError
from grouprl.registry import PREFERENCE_LOSSES
from grouprl.run import reporting
from grouprl.run.resume_config import config_record
from grouprl.run.signals import GracefulStop
from grouprl.train import checkpoint as ckpt
from grouprl.train.algorithms.shared import evaluate_and_log, open_logger, resume_path, should_save, summary
from grouprl.train.checkpoint.unpickle import moved_from
from grouprl.train.engine.model import (
    autocast_factory,
    build_optimizer,
    enable_checkpointing,
    upcast_trainable,
)
from grouprl.train.engine.step import SkipGuard, accumulate_and_step, completion_logps
from grouprl.train.parallel import ranks as dist


def preference_loss(cfg: Any):
    """``(loss fn, its hyper-parameters, averaged)``: the PREFERENCE_LOSSES entry ``dpo_loss`` names, the
    config values it declares (beta; label_smoothing for cDPO), and whether it takes token-averaged log-probs
    (the function's ``averaged_logps``; IPO, arXiv:2310.12036, Sec. 5.2) instead of sums."""
    import inspect

    fn = PREFERENCE_LOSSES.get(cfg.dpo_loss)
    offered = {"beta": cfg.dpo_beta, "label_smoothing": cfg.dpo_label_smoothing}
    params = inspect.signature(fn).parameters
    return fn, {k: v for k, v in offered.items() if k in params}, bool(getattr(fn, "averaged_logps", False))


@dataclass
class Pair:
    """One tokenised preference pair, with the reference log-probs once they are computed."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    ref_chosen: float | None = None
    ref_rejected: float | None = None


# ---- tokenising ---------------------------------------------------------------------------------------
def tokenize_pairs(rows: Any, tokenizer: Any, cfg: Any) -> list[Pair]:
    """Prompt ids (cut from the left to max_prompt_length) and chosen / rejected completion ids (cut to
    max_new_tokens); a pair whose two sides tokenise the same is a DataError naming its row."""
    check_pref_rows(rows)
    out = []
    for i in range(len(rows)):
        row = rows[i]
        prompt_text = render_prompt(row["prompt"], tokenizer, cfg.system_prompt, cfg.apply_chat_template)
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        if cfg.max_prompt_length is not None and len(prompt_ids) > cfg.max_prompt_length:
            if cfg.truncation == "error":
                raise DataError(f"row {i}: the prompt is {len(prompt_ids)} tokens, above max_prompt_length="
                                f"{cfg.max_prompt_length} (truncation=error). Fix: shorten it, raise "
                                f"max_prompt_length, or set truncation=left to cut it from the left.")
            prompt_ids = prompt_ids[-cfg.max_prompt_length:]
        sides = [_completion_ids(row, side, prompt_text, tokenizer, cfg)[: cfg.max_new_tokens]
                 for side in ("chosen", "rejected")]
        if sides[0] == sides[1]:
            raise DataError(f"row {i}: chosen and rejected have the same first {cfg.max_new_tokens} tokens "
                            f"(max_new_tokens): the pair prefers nothing. Fix: raise max_new_tokens or drop the row.")
        out.append(Pair(prompt_ids, sides[0], sides[1]))
    return out


def _completion_ids(row: dict, side: str, prompt_text: str, tokenizer: Any, cfg: Any) -> list[int]:
    value, eos = row[side], [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if isinstance(value, str):
        return tokenizer(value, add_special_tokens=False)["input_ids"] + eos
    templated = cfg.apply_chat_template == "always" or (cfg.apply_chat_template == "auto" and (
        isinstance(row["prompt"], list) or cfg.system_prompt))
    if templated and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": row["prompt"]}] if isinstance(row["prompt"], str) else list(row["prompt"])
        if cfg.system_prompt and messages[0].get("role") != "system":
            messages = [{"role": "system", "content": cfg.system_prompt}] + messages
        full = tokenizer.apply_chat_template(messages + list(value), tokenize=False)
        if full.startswith(prompt_text):
            return tokenizer(full[len(prompt_text):], add_special_tokens=False)["input_ids"]
    return tokenizer("\n".join(m["content"] for m in value), add_special_tokens=False)["input_ids"] + eos


def collate(pairs: list[Pair], pad_id: int, device: Any) -> tuple[torch.Tensor, ...]:
    """``2n`` rows (chosen of every pair, then rejected): prompts left-padded, completions right-padded.
    Returns ``(prompt_ids, prompt_mask, completion_ids, completion_mask)``."""
    prompts = [p.prompt_ids for p in pairs] * 2
    completions = [p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs]
    P, T = max(map(len, prompts)), max(map(len, completions))
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    pmask = torch.zeros((len(prompts), P), dtype=torch.long)
    cids = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    cmask = torch.zeros((len(prompts), T), dtype=torch.long)
    for r, (p, c) in enumerate(zip(prompts, completions)):
        if p:
            ids[r, P - len(p):], pmask[r, P - len(p):] = torch.tensor(p), 1
        cids[r, :len(c)], cmask[r, :len(c)] = torch.tensor(c), 1
    return tuple(t.to(device) for t in (ids, pmask, cids, cmask))


def sequence_logps(model: Any, batch: tuple[torch.Tensor, ...], average: bool) -> torch.Tensor:
    """``[2n]`` completion log-probs: the sum over tokens, or the token mean when ``average`` (IPO)."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch
    logp, _ = completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, 1.0)
    mask = completion_mask.to(logp.dtype)
    total = masked_sum(logp, mask, dim=1)
    return total / mask.sum(dim=1).clamp(min=1) if average else total


@torch.no_grad()
def reference_logps(model: Any, pairs: list[Pair], batch_size: int, average: bool, autocast: Any,
                    pad_id: int) -> None:
    """Fill ``ref_chosen`` / ``ref_rejected`` of every pair with the log-probs of ``model`` as it is now
    (dropout off): one forward per ``batch_size`` pairs, once per run."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start:start + batch_size]
            with autocast():
                logps = sequence_logps(model, collate(chunk, pad_id, device), average).float().cpu()
            for j, pair in enumerate(chunk):
                pair.ref_chosen, pair.ref_rejected = float(logps[j]), float(logps[len(chunk) + j])
    finally:
        model.train(was_training)


def shared_reference_logps(model: Any, pairs: list[Pair], cfg: Any, autocast: Any, pad_id: int) -> None:
    """:func:`reference_logps` of every pair, each rank computing its contiguous share, then gathered."""
    ranks = dist.current()
    share = math.ceil(len(pairs) / ranks.world)
    mine = pairs[ranks.rank * share:(ranks.rank + 1) * share]
    reference_logps(model, mine, cfg.per_device_train_batch_size, preference_loss(cfg)[2], autocast, pad_id)
    gathered = ranks.all_gather([(p.ref_chosen, p.ref_rejected) for p in mine])
    for pair, (c, r) in zip(pairs, [v for part in gathered for v in part]):
        pair.ref_chosen, pair.ref_rejected = c, r


# ---- one micro-batch ----------------------------------------------------------------------------------
def pair_batch_loss(model: Any, pairs: list[Pair], step_pairs: int, cfg: Any, pad_id: int):
    """The micro-batch's DPO / IPO loss, normalised by the pairs of the WHOLE optimizer step (so the gradient
    does not depend on how the step is split), and its metric sums (also divided by the step's pairs)."""
    device = next(model.parameters()).device
    loss_fn, hp, average = preference_loss(cfg)
    logps = sequence_logps(model, collate(pairs, pad_id, device), average).float()
    n = len(pairs)
    chosen, rejected = logps[:n], logps[n:]
    ref_c = torch.tensor([p.ref_chosen for p in pairs], dtype=torch.float32, device=device)
    ref_r = torch.tensor([p.ref_rejected for p in pairs], dtype=torch.float32, device=device)
    per_pair, _ = loss_fn(chosen, rejected, ref_c, ref_r, **hp)
    loss = per_pair.sum() / step_pairs
    with torch.no_grad():
        r_c, r_r = cfg.dpo_beta * (chosen - ref_c), cfg.dpo_beta * (rejected - ref_r)
        sums = {"loss": loss.detach(), "rewards/chosen": r_c.sum(), "rewards/rejected": r_r.sum(),
                "rewards/margins": (r_c - r_r).sum(), "rewards/accuracies": (r_c > r_r).float().sum(),
                "logps/chosen": chosen.sum(), "logps/rejected": rejected.sum()}
        sums = {k: v if k == "loss" else v / step_pairs for k, v in sums.items()}
    return loss, sums


def dpo_step(model: Any, batch: list[Pair], cfg: Any, optimizer: Any, scheduler: Any, autocast: Any,
             pad_id: int) -> dict[str, float]:
    """One optimizer step over ``batch``, this rank's equal share of the global batch (gradient_accumulation_steps
    micro-batches); a non-finite loss or gradient norm on any rank skips the update (``skipped`` = 1.0), as
    the GRPO step does. Losses and metrics are normalised by the pairs of the global step."""
    ranks, mb = dist.current(), cfg.per_device_train_batch_size
    step_pairs = len(batch) * ranks.world  # the global step: every rank holds an equal share (RankStream)
    chunks = [batch[start:start + mb] for start in range(0, len(batch), mb)]
    acc, grad_norm, _, skipped, lr = accumulate_and_step(
        model, chunks, lambda chunk: pair_batch_loss(model, chunk, step_pairs, cfg, pad_id), autocast, optimizer,
        scheduler, cfg.max_grad_norm)
    if ranks.enabled:  # sums normalised by the global step: adding the ranks' gives the global value
        parts = ranks.all_gather({k: v.detach().cpu() for k, v in acc.items()})
        acc = {k: sum(part[k] for part in parts) for k in acc}
    out = {k: float(v) for k, v in acc.items()} | {"grad_norm": float(grad_norm), "lr": lr,
                                                   "skipped": float(skipped)}
    if skipped:
        out["skip_reason"] = "non-finite loss or gradient norm"
    return out


# ---- the loop ------------------------------------------------------------------------------------------
def plan_dpo_steps(cfg: Any, num_pairs: int, world: int = 1) -> tuple[int, int]:
    """(total optimizer steps, pairs per global optimizer step) on ``world`` processes."""
    per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * world
    if num_pairs < per_step:
        on = f" x {world} processes" if world > 1 else ""
        raise DataError(f"the preference data has {num_pairs} pairs but one optimizer step needs {per_step} "
                        f"(= per_device_train_batch_size {cfg.per_device_train_batch_size} x "
                        f"gradient_accumulation_steps {cfg.gradient_accumulation_steps}{on}). Fix: add pairs or "
                        f"lower either{' or the process count' if on else ''}.")
    if cfg.max_steps > 0:
        return cfg.max_steps, per_step
    return max(1, math.ceil(cfg.num_train_epochs * (num_pairs // per_step))), per_step


def train_dpo(cfg: Any, model: Any, tokenizer: Any, pair_rows: Any, eval_rows: Any = None,
              eval_reward_fn: Any = None, *, resume: Any = None) -> dict[str, Any]:
    """Run DPO / IPO on ``model`` (loaded, on its device) with the pairs ``pair_rows``; returns a summary.
    On N processes every rank calls it with the same pairs (see the module docstring)."""
    ranks = dist.current()
    autocast, pad_id, pairs, (total_steps, per_step), stream, (optimizer, scheduler) = _setup(cfg, model, tokenizer,
                                                                                              pair_rows, ranks)
    saved: dict[str, Any] = {"step": 0, "history": [], "evals": {}, "skipped_steps": 0, "ref_logp": None}
    path = resume_path(cfg, resume)
    if path is None:  # pi_ref = the model before any update
        shared_reference_logps(model, pairs, cfg, autocast, pad_id)
    else:
        saved.update(_restore(cfg, path, pairs, model, optimizer, scheduler, stream))
    ref_logp = torch.tensor([[p.ref_chosen, p.ref_rejected] for p in pairs], dtype=torch.float32)
    if cfg.gradient_checkpointing:
        enable_checkpointing(model)
    model.train()
    step, history, evals = saved["step"], saved["history"], saved["evals"]
    guard = SkipGuard(cfg.max_consecutive_skips, saved["skipped_steps"])
    logger = open_logger(cfg, total_steps, resumed=path is not None, step=step, is_main=ranks.is_main)
    run_eval = partial(evaluate_and_log, cfg, model, tokenizer, eval_rows if ranks.is_main else None, eval_reward_fn,
                       logger, evals)  # rank 0; the others wait at their next collective

    def save() -> Any:
        if not ranks.is_main:  # rank 0 writes the (replicated) weights, optimizer and data position
            return None
        state = {"data": stream.state(), "ref_logp": ref_logp, "history": history, "evals": evals,
                 "skipped_steps": guard.total, "log_bytes": ckpt.log_sizes(cfg.output_dir),
                 "config": config_record(cfg)}
        path = ckpt.save_checkpoint(cfg.output_dir, step, model, tokenizer, optimizer, scheduler, state,
                                    total_limit=cfg.save_total_limit)
        reporting.refresh(cfg.output_dir, cfg.review_window)  # the run report covers what the checkpoint does
        return path

    stop = GracefulStop().install()  # Ctrl-C / SIGTERM: finish this optimizer step, save, stop
    # leaving: every rank stops with an error at its next collective (train/parallel/ranks.py), handlers back, logs closed
    with stop, closing(logger), ranks.failures():
        if path is None and cfg.eval_before_train:
            run_eval("before", step)
        while step < total_steps:
            step = _one_step(cfg, model, pairs, stream, optimizer, scheduler, autocast, pad_id, step, guard, logger,
                             history, total_steps)
            if cfg.eval_steps and step % cfg.eval_steps == 0 and step < total_steps:
                run_eval(f"step{step}", step)
            saved_now = save() if should_save(cfg, step, len(pairs) // per_step, total_steps) else None
            if ranks.any_true(stop.requested):
                raise stop.interrupted(step, saved_now or save())
        stop.restore()
        run_eval("after", step)
        ranks.check()
    return summary(cfg, logger, step, total_steps, history, evals, num_pairs=len(pairs))


def _setup(cfg: Any, model: Any, tokenizer: Any, pair_rows: Any, ranks: Any):
    """fp32 master weights and rank 0's weights everywhere, the autocast, the pad id, the tokenised pairs,
    the step plan, this rank's share of each batch and the optimizer -- in this order (RNG draws)."""
    upcast_trainable(model)
    ranks.broadcast_parameters(model)  # rank 0's weights everywhere (e.g. a randomly initialised adapter)
    autocast = autocast_factory(cfg.bf16, next(model.parameters()).device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    pairs = tokenize_pairs(pair_rows, tokenizer, cfg)
    plan = plan_dpo_steps(cfg, len(pairs), ranks.world)
    stream = ranks.shard_stream(PromptStream(len(pairs), plan[1], cfg.seed))  # this rank's share of each batch
    return autocast, pad_id, pairs, plan, stream, build_optimizer(model, cfg, plan[0])


def _one_step(cfg: Any, model: Any, pairs: list, stream: Any, optimizer: Any, scheduler: Any, autocast: Any,
              pad_id: int, step: int, guard: SkipGuard, logger: Any, history: list, total_steps: int) -> int:
    """The next optimizer step on this rank's share of the next batch, logged; returns the new step."""
    t0 = time.perf_counter()
    batch = [pairs[i] for i in stream.next()]
    update = dpo_step(model, batch, cfg, optimizer, scheduler, autocast, pad_id)
    step += 1
    guard.check(update, step)
    metrics = {**update, "epoch": stream.epoch, "time/step": time.perf_counter() - t0}
    if step % cfg.logging_steps == 0 or step == total_steps:
        logger.log(step, metrics)
        history.append({"step": step, **{k: metrics[k] for k in ("loss", "rewards/accuracies", "rewards/margins")}})
    logger.advance(step, metrics)
    return step


def _restore(cfg: Any, path: Any, pairs: list[Pair], model: Any, optimizer: Any, scheduler: Any,
             stream: PromptStream) -> dict[str, Any]:
    """Weights, optimizer, schedule, RNG and data position from checkpoint ``path``, and the reference
    log-probs of the start saved with it (the model has moved since: they cannot be recomputed)."""
    saved = ckpt.load_checkpoint(path, model, optimizer, scheduler)
    stream.load_state(saved["data"])
    if saved["ref_logp"].shape[0] != len(pairs):
        raise DataError(f"checkpoint {str(path)!r} holds reference log-probs of {saved['ref_logp'].shape[0]} "
                        f"pairs, but the data has {len(pairs)}: resume with the data the run started with.")
    for pair, (c, r) in zip(pairs, saved["ref_logp"].tolist()):
        pair.ref_chosen, pair.ref_rejected = c, r
    if dist.current().is_main:
        ckpt.truncate_logs(cfg.output_dir, path, saved.get("log_bytes"))  # what the checkpoint covers
    ckpt.set_learning_rate(optimizer, scheduler, cfg.learning_rate)  # a changed lr (resume_config.SAFE)
    return saved


__all__ = ["preference_loss", "Pair", "collate", "pair_batch_loss", "plan_dpo_steps", "reference_logps",
           "tokenize_pairs", "train_dpo"]

moved_from("grouprl.train.dpo", to=__name__)  # checkpoints pickled its classes under the old path(s)
