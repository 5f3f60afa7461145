"""``--resume`` with a changed config: refuse what would change the run's meaning, apply and record the rest.

A checkpoint stores the config it was trained with (``trainer_state.json["config"]``; older checkpoints: the
``config.yaml`` next to them). On resume every field is compared with the config given now:

* a field in :data:`SAFE` may change: the new value is used from the resumed step on, and the change is
  appended to ``<output_dir>/config_changes.jsonl`` (``{"step", "time", "changes": {field: [old, new]}}``);
  ``config.yaml`` is rewritten with the config now in effect (never one that is not);
* any other field -- :data:`UNSAFE` names the usual ones and why -- stops the resume with a ConfigError
  listing each changed field with its old and new value and the fix. A field in neither table counts as
  unsafe: a change nobody has shown to be harmless is refused.

| may change on resume (SAFE)                                    | refused (UNSAFE)                                 |
| -------------------------------------------------------------- | ------------------------------------------------ |
| max_steps, num_train_epochs (a decaying schedule is recomputed | model, dataset(_kwargs), train_split, prompt     |
|   over the new total)                                          |   column / system prompt, max_train_samples      |
| learning_rate (set on the restored optimizer and scheduler)    | seed (prompt order and sampling stream)          |
| logging, eval_*, save_*, report_to, run_name, progress_bar,    | num_generations and all batch arithmetic         |
|   log_completions_steps, num_completions_to_log                | algorithm / loss / advantage / aggregation / KL  |
| output_dir, resume_from_checkpoint, overwrite_output_dir       | reward functions, weights, kwargs, sandbox       |
| device, torch_num_threads, gradient_checkpointing,             | max_new_tokens, max_prompt_length, sampling      |
|   lean_sampler                                                 | optimizer hyper-parameters and schedule type     |
| max_consecutive_skips, max_rounds_without_reward               | LoRA settings, bf16                              |
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from grouprl.errors import ConfigError

_LOGGING = "logging, evaluation or checkpointing only: the trained model is unchanged"
SAFE: dict[str, str] = {
    "max_steps": "the run gets longer or shorter; a decaying lr schedule is recomputed over the new total",
    "num_train_epochs": "as max_steps",
    "learning_rate": "set on the restored optimizer and scheduler (param-group lr and base_lrs scaled)",
    **{name: _LOGGING for name in (
        "logging_steps", "eval_steps", "eval_before_train", "eval_temperature", "eval_num_samples",
        "eval_batch_size", "eval_max_new_tokens", "eval_split", "eval_reward", "max_eval_samples", "save_strategy",
        "save_steps", "save_total_limit", "report_to", "run_name", "log_completions_steps",
        "num_completions_to_log", "progress_bar", "review_window", "reward_changelog")},
    "output_dir": "where the resumed run writes",
    "resume_from_checkpoint": "which checkpoint to continue from",
    "overwrite_output_dir": "only read by fresh runs",
    "device": "the same computation on other hardware",
    "torch_num_threads": "the same computation with other parallelism",
    "gradient_checkpointing": "the same gradients, less memory",
    "logits_chunk_size": "the same log-probs and gradients, another chunking of the LM head",
    "padding_free": "the same log-probs and gradients, sequences packed into rows instead of padded",
    "lean_sampler": "the same sampling distribution, another implementation",
    **dict.fromkeys(("vllm_server_url", "vllm_server_timeout", "vllm_gpu_memory_utilization", "vllm_sleep"),
                    "where and how the vLLM engine runs: the same sampling distribution"),
    "max_consecutive_skips": "a safety stop",
    "max_rounds_without_reward": "a safety stop",
    "async_timeout_s": "a safety stop: the bound on a wait for the rollout worker",
}
_DATA, _BATCH, _OBJ = "other data: another run", "batch arithmetic: round size, data position, saved round", \
    "the objective being optimised"
UNSAFE: dict[str, str] = {
    **dict.fromkeys(("model", "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "bf16"),
                    "the model or the parameters being trained"),
    **dict.fromkeys(("dataset", "dataset_kwargs", "train_split", "prompt_column", "system_prompt",
                     "max_train_samples"), _DATA),
    "seed": "the prompt order and the sampling stream",
    **dict.fromkeys(("num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
                     "steps_per_generation", "num_iterations"), _BATCH),
    **dict.fromkeys(("algorithm", "policy_loss", "importance_sampling_level", "advantage", "loss_aggregation",
                     "epsilon", "epsilon_high", "loss_kwargs", "advantage_kwargs", "scale_rewards", "kl_coef",
                     "kl_estimator", "dynamic_sampling", "max_resample_rounds", "mask_truncated_completions"), _OBJ),
    **dict.fromkeys(("reward_funcs", "reward_weights", "reward_kwargs", "missing_reward", "sandbox"), "the reward"),
    **dict.fromkeys(("max_new_tokens", "max_prompt_length", "temperature", "top_p", "top_k", "rollout_backend"),
                    "the sampling distribution"),
    **dict.fromkeys(("weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "lr_scheduler_type",
                     "warmup_ratio", "warmup_steps", "max_grad_norm"), "the optimizer state and schedule"),
}
CHANGES_FILE = "config_changes.jsonl"


def _plain(value: Any) -> Any:
    """JSON-comparable form: callables by ``module:qualname``, tuples as lists, other objects as str."""
    if callable(value) and not isinstance(value, type):
        return f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', type(value).__name__)}"
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def config_record(cfg: Any) -> dict[str, Any]:
    """The config as a checkpoint stores it (JSON-safe)."""
    return _plain(cfg.to_dict())


def saved_config(checkpoint: Path) -> dict[str, Any] | None:
    """The config ``checkpoint`` was trained with, or None when it records none."""
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        state = {}
    if isinstance(state.get("config"), dict):
        return state["config"]
    path = checkpoint.parent / "config.yaml"
    if path.is_file():
        import yaml

        data = yaml.safe_load(path.read_text())
        return _plain(data) if isinstance(data, dict) else None
    return None


def compare(saved: dict[str, Any], cfg: Any) -> tuple[dict[str, list], dict[str, list]]:
    """(safe changes, unsafe changes), each ``field -> [old, new]``; fields the saved config lacks are skipped."""
    now = config_record(cfg)
    safe, unsafe = {}, {}
    for name, new in now.items():
        if name not in saved or saved[name] == new:
            continue
        (safe if name in SAFE else unsafe)[name] = [saved[name], new]
    return safe, unsafe


def check_resume_config(cfg: Any, checkpoint: Path | None) -> dict[str, list]:
    """The safe changes (to apply and record); ConfigError listing the unsafe ones."""
    saved = saved_config(checkpoint) if checkpoint is not None else None
    if saved is None:
        return {}
    safe, unsafe = compare(saved, cfg)
    if unsafe:
        lines = "; ".join(f"{k}: {v[0]!r} -> {v[1]!r} ({UNSAFE.get(k, 'not known to be safe mid-run')})"
                          for k, v in unsafe.items())
        raise ConfigError(f"cannot resume from {str(checkpoint)!r} with a changed config: {lines}. Fix: put the "
                          f"saved value(s) back (see {str(checkpoint / 'trainer_state.json')}), or start a new run in "
                          f"another output_dir. Fields that may change on resume: {', '.join(sorted(SAFE))}.")
    return safe


def record_changes(output_dir: str | Path, checkpoint: Path, changes: dict[str, list]) -> None:
    """Append what changed, at which step, to ``<output_dir>/config_changes.jsonl``."""
    if not changes:
        return
    try:
        step = json.loads((checkpoint / "trainer_state.json").read_text()).get("step")
    except (OSError, ValueError):
        step = None
    entry = {"step": step, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "checkpoint": str(checkpoint),
             "changes": changes}
    with open(Path(output_dir) / CHANGES_FILE, "a") as f:
        f.write(json.dumps(entry) + "\n")
