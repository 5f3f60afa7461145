"""REINFORCE with a moving-average baseline as a grouprl algorithm plug-in.

Williams 1992 (Eq. 11) in the form of Ahmadian et al., arXiv:2402.14740, Sec. 3.1: one completion y per
prompt x, adv = r(x, y) - b, loss = -adv * sum_t log pi(y_t | x, y_<t), averaged over the batch; b is an
exponential moving average of the batch-mean rewards (b <- 0.9 b + 0.1 mean r, after each step). On-policy:
one optimizer step per batch, so there is no ratio and nothing to clip. Left out: checkpoints and resume,
held-out evaluation, several processes (its declaration says one).
"""

from __future__ import annotations

from grouprl.config.algorithms import Supports
from grouprl.data.stream import PromptStream
from grouprl.rollout import make_backend
from grouprl.train.algorithms import Algorithm, register_algorithm
from grouprl.train.algorithms.rounds import RunContext, sample_and_score, sampling_params
from grouprl.train.algorithms.shared import open_logger, summary
from grouprl.train.engine.model import autocast_factory, build_optimizer
from grouprl.train.engine.step import completion_logps
from grouprl.train.metrics import Timers
from grouprl.train.score import RewardScorer


def train(cfg, model, tokenizer, train_rows, eval_rows, reward_funcs, eval_reward_fn=None, *, resume=None,
          agent=None):
    autocast = autocast_factory(cfg.bf16, model.device)
    ctx = RunContext(cfg, model, tokenizer, make_backend("transformers", model, tokenizer),
                     RewardScorer(reward_funcs, cfg.reward_weights, cfg.missing_reward), None, None, autocast,
                     train_rows, 0, cfg.max_steps, sampling_params(cfg))
    stream = PromptStream(len(train_rows), cfg.prompts_per_generation, cfg.seed)
    optimizer, scheduler = build_optimizer(model, cfg, cfg.max_steps)
    logger, history, baseline = open_logger(cfg, cfg.max_steps, resumed=False, step=0), [], 0.0
    model.train()
    for step in range(1, cfg.max_steps + 1):
        scored = sample_and_score(ctx, stream.next(), Timers())  # rewards [B, 1]: one completion per prompt
        r, out = scored.rewards[:, 0].to(model.device), scored.rollout
        with autocast():
            logp, _ = completion_logps(model, out.prompt_ids, out.prompt_mask, out.completion_ids,
                                       out.completion_mask, cfg.temperature)  # [B, T]
        adv = r - baseline  # [B]
        loss = -(adv * (logp * out.completion_mask).sum(dim=1)).mean()
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        metrics = {"reward": float(r.mean()), "baseline": baseline, "loss/policy": float(loss.detach())}
        baseline = 0.9 * baseline + 0.1 * metrics["reward"]
        logger.log(step, metrics)
        history.append({"step": step, "reward": metrics["reward"], "loss/policy": metrics["loss/policy"]})
    logger.close()
    return summary(cfg, logger, cfg.max_steps, cfg.max_steps, history, {})


register_algorithm("reinforce", Algorithm(train=train), supports=Supports(
    loop="reinforce", preset="grpo", groups=False, max_processes=1, lean_bf16_rollout=False))
