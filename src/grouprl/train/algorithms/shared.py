"""The pieces every training loop shares, written once: the step plan's save cadence, the logger, the
checkpoint to resume from, evaluate-and-log, and the summary a loop returns (docs/DESIGN.md, "The loop").

The GRPO-family loop (``grpo``), PPO (``ppo``) and DPO (``dpo``) call these; a plug-in loop may too
(docs/EXTENDING.md, "Add an algorithm").
"""

from __future__ import annotations

from typing import Any

from grouprl.run import reporting
from grouprl.train import checkpoint as ckpt
from grouprl.train.evaluate import evaluate_model
from grouprl.train.metrics import MetricsLogger
from grouprl.train.parallel.shares import NullLogger


def should_save(cfg: Any, step: int, steps_per_epoch: int, total_steps: int) -> bool:
    """Every save_steps (or epoch), and at the last step so that a longer run can --resume from it."""
    if cfg.save_strategy == "no":
        return False
    if step == total_steps:
        return True
    return step % (cfg.save_steps if cfg.save_strategy == "steps" else steps_per_epoch) == 0


def resume_path(cfg: Any, resume: Any) -> Any:
    """The checkpoint to resume from (``resume``, else the config's ``resume_from_checkpoint``), or None."""
    return ckpt.resolve_resume(resume if resume is not None else cfg.resume_from_checkpoint, cfg.output_dir)


def open_logger(cfg: Any, total_steps: int, *, resumed: bool, step: int, is_main: bool = True) -> Any:
    """Rank 0's metrics / samples / TensorBoard logger (the other ranks log nothing)."""
    if not is_main:
        return NullLogger()
    return MetricsLogger(cfg.output_dir, cfg.report_targets, run_name=cfg.run_name, total_steps=total_steps,
                         progress=cfg.progress_bar, config=cfg.to_dict(), resume=resumed, resume_step=step)


def evaluate_and_log(cfg: Any, model: Any, tokenizer: Any, eval_rows: Any, eval_reward_fn: Any, logger: Any,
                     evals: dict, tag: str, step: int, *, backend: Any = None, agent: Any = None) -> None:
    """Held-out evaluation (``evaluate_model``: the same function as ``grouprl eval``), logged as eval/*,
    kept in ``evals[tag]``, and the run report refreshed. Nothing without rows or an eval reward."""
    if eval_rows is None or len(eval_rows) == 0 or eval_reward_fn is None:
        return
    rows = [eval_rows[i] for i in range(len(eval_rows))]
    if backend is not None:
        backend.sync_weights(model)  # an engine with its own weight copy evaluates the current policy
    result = evaluate_model(cfg, model, tokenizer, rows, eval_reward_fn, backend=backend, agent=agent)
    samples = result.pop("samples")
    evals[tag] = dict(result) | {"step": step}
    logger.log(step, {f"eval/{k}": v for k, v in result.items()} | {"eval/tag": tag})
    logger.log_samples(step, [{"eval": tag, **s} for s in samples])
    reporting.refresh(cfg.output_dir, cfg.review_window)


def summary(cfg: Any, logger: Any, step: int, total_steps: int, history: list, evals: dict,
            **extra: Any) -> dict[str, Any]:
    """What a loop returns: steps, the reward history, the evaluations, where the logs and the last
    checkpoint are (``GRPOTrainer.train`` adds the final model and the report)."""
    return {"global_step": step, "total_steps": total_steps, **extra, "history": history, "evals": evals,
            "metrics_path": str(logger.metrics_path), "samples_path": str(logger.samples_path),
            "tensorboard_dir": str(logger.tb_dir) if getattr(logger, "tb_dir", None) else None,
            "last_checkpoint": str(ckpt.latest_checkpoint(cfg.output_dir) or "")}
