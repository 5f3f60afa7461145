"""``GRPOConfig``: every knob of a GRPO / GSPO run, typed, documented and checked before a model loads.

A field's docstring (the string literal under it) is its documentation: ``grouprl train --help-config``
and the docs read them from here. Defaults live only in this dataclass.

* ``algorithm`` is a preset: it fills the algorithm fields the user left unset (``None``) -- never one the
  user set. ``gspo`` = sequence-level ratio with clip 3e-4/4e-4 and no KL (arXiv:2507.18071);
  ``dapo`` = clip-higher 0.2/0.28, token-mean loss, dynamic sampling, masked truncations (arXiv:2503.14476);
  ``dr_grpo`` = mean-centred advantage and a constant length normaliser (arXiv:2503.20783).
* TRL's names are accepted as aliases: ``beta`` -> ``kl_coef``, ``max_completion_length`` -> ``max_new_tokens``.
* Batch arithmetic (TRL's convention): ``per_device_train_batch_size`` completions per micro-batch,
  ``gradient_accumulation_steps`` micro-batches per optimizer step, and one generation round produces
  ``per_device_train_batch_size * steps_per_generation`` completions, i.e. that number divided by
  ``num_generations`` prompts.

This module imports no torch, so validating a recipe is instant.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from grouprl.errors import ConfigError, did_you_mean

# algorithm preset -> defaults for the fields a user left as None.
ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    "grpo": dict(policy_loss="grpo", advantage="grpo", loss_aggregation="seq_mean_token_mean",
                 epsilon=0.2, epsilon_high=0.2, kl_coef=0.0, dynamic_sampling="none",
                 mask_truncated_completions=False),
    "gspo": dict(policy_loss="gspo", advantage="grpo", loss_aggregation="seq_mean_token_mean",
                 epsilon=3e-4, epsilon_high=4e-4, kl_coef=0.0, dynamic_sampling="none",
                 mask_truncated_completions=False),
    "dr_grpo": dict(policy_loss="grpo", advantage="dr_grpo", loss_aggregation="seq_mean_token_sum_norm",
                    epsilon=0.2, epsilon_high=0.2, kl_coef=0.0, dynamic_sampling="none",
                    mask_truncated_completions=False),
    "dapo": dict(policy_loss="grpo", advantage="grpo", loss_aggregation="token_mean",
                 epsilon=0.2, epsilon_high=0.28, kl_coef=0.0, dynamic_sampling="resample",
                 mask_truncated_completions=True),
    "rloo": dict(policy_loss="grpo", advantage="rloo", loss_aggregation="token_mean",
                 epsilon=0.2, epsilon_high=0.2, kl_coef=0.0, dynamic_sampling="none",
                 mask_truncated_completions=False),
}
# importance_sampling_level (TRL's switch between GRPO and GSPO) -> policy loss, when the loss is unset.
IMPORTANCE_LEVELS = {"token": "grpo", "sequence": "gspo", "sequence_token": "gspo_token"}
ALIASES = {"beta": "kl_coef", "max_completion_length": "max_new_tokens"}
CHOICES = {
    "scale_rewards": ("group", "batch", "none"),
    "dynamic_sampling": ("none", "drop", "resample"),
    "lr_scheduler_type": ("cosine", "linear", "constant"),
    "save_strategy": ("steps", "epoch", "no"),
    "device": ("auto", "cpu", "cuda", "mps"),
    "missing_reward": ("exclude", "zero"),
}
REPORT_TARGETS = ("none", "tensorboard", "wandb", "jsonl", "all")


@dataclass
class GRPOConfig:
    """Configuration of one GRPO-family run (see the module docstring for the conventions)."""

    # ---- where things come from and go -------------------------------------------------------
    output_dir: str = "outputs/grouprl"
    """Directory for checkpoints, ``metrics.jsonl``, ``samples.jsonl`` and TensorBoard logs."""
    overwrite_output_dir: bool = False
    """A fresh (non-resume) run into an output_dir that holds an earlier run's checkpoints or final model is
    an error unless this is true; when true, the earlier run's checkpoint-*/, final/, metrics.jsonl,
    samples.jsonl and TensorBoard events are deleted at start so nothing of it mixes with the new run.
    Ignored when resuming (``--resume`` / resume_from_checkpoint)."""
    model: str | None = None
    """Hub id, local path or ``builtin:<name>``; not needed when a loaded model is passed to the trainer."""
    dataset: str | None = None
    """A .jsonl/.json/.parquet/.csv file, a directory, a hub name, or ``builtin:<task>``."""
    dataset_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments for ``builtin:`` tasks (``load_task``) or ``datasets.load_dataset``."""
    train_split: str = "train"
    """Split used for training."""
    eval_split: str | None = "test"
    """Held-out split for evaluation (``None`` = no evaluation)."""
    prompt_column: str = "prompt"
    """Column holding the prompt: plain text, or chat messages (the chat template is applied)."""
    system_prompt: str | None = None
    """Optional system message prepended to every prompt (chat models)."""
    max_train_samples: int | None = None
    """Use at most this many training rows (``None`` = all)."""
    max_eval_samples: int | None = None
    """Use at most this many held-out rows (``None`` = all)."""

    # ---- rewards ----------------------------------------------------------------------------
    reward_funcs: list = field(default_factory=lambda: ["accuracy"])
    """Reward names from the registry, or ``pkg.mod:fn`` naming a PER-SAMPLE function
    ``fn(completion, *, answer=None, **columns) -> float | None``. Python callers may also pass TRL-style
    batch callables ``fn(completions, prompts, **columns) -> list`` to the trainer."""
    reward_weights: list | None = None
    """One weight per reward function (``None`` = all 1.0); the total reward is the weighted sum."""
    reward_kwargs: dict = field(default_factory=dict)
    """Per-reward keyword arguments, e.g. ``{accuracy: {task_type: math}}``."""
    missing_reward: str = "exclude"
    """What a ``None`` reward ("no opinion") means. ``exclude``: a completion whose total reward is unknown (any
    reward function returned None for it) takes no part in its group's statistics, gets advantage 0 and no
    loss. ``zero``: None counts as 0."""
    eval_reward: str = "accuracy"
    """Reward whose mean on the held-out split is reported as accuracy."""
    sandbox: dict = field(default_factory=dict)
    """Code sandbox settings (``grouprl.sandbox.SandboxConfig``: isolation auto|strict|basic, timeout,
    test_timeout, workers, budget, memory_mb, nproc, hide_paths). Applied at start-up, before any model loads,
    whenever this is set or a ``code`` reward is used, so an isolation level the machine cannot give fails
    at once."""

    # ---- algorithm ----------------------------------------------------------------------------
    algorithm: str | None = None
    """Preset filling unset algorithm fields: grpo, gspo, dr_grpo, dapo, rloo (``None`` = grpo, or gspo when
    importance_sampling_level is ``sequence``)."""
    policy_loss: str | None = None
    """POLICY_LOSSES name (grpo, gspo, gspo_token, cispo...); ``None`` = from the preset."""
    importance_sampling_level: str | None = None
    """TRL's switch: ``token`` (GRPO) or ``sequence`` (GSPO); sets ``policy_loss`` when that is unset."""
    advantage: str | None = None
    """ADVANTAGES name (grpo, dr_grpo, rloo); ``None`` = from the preset."""
    loss_aggregation: str | None = None
    """AGGREGATIONS name (token_mean, seq_mean_token_mean, seq_mean_token_sum_norm)."""
    epsilon: float | None = None
    """Lower clip range of the ratio (1 - epsilon)."""
    epsilon_high: float | None = None
    """Upper clip range (1 + epsilon_high); > epsilon is DAPO's clip-higher. ``None`` = preset or epsilon."""
    loss_kwargs: dict = field(default_factory=dict)
    """Extra hyper-parameters for the policy loss (e.g. ``dual_clip: 3.0``)."""
    advantage_kwargs: dict = field(default_factory=dict)
    """Extra hyper-parameters for the advantage estimator (e.g. ``std: unbiased``)."""
    scale_rewards: str = "group"
    """Advantage scaling: divide by the group std (``group``), the batch std (``batch``) or not (``none``)."""
    kl_coef: float | None = None
    """beta: weight of the KL(pi_theta || pi_ref) penalty; 0 = no reference model at all. Alias: ``beta``."""
    kl_estimator: str = "k3"
    """KL_ESTIMATORS name (k1, k2, k3)."""
    num_iterations: int = 1
    """mu: optimisation passes over each generation batch (> 1 needs old log-probs)."""
    steps_per_generation: int | None = None
    """Micro-batches per generation round (``None`` = gradient_accumulation_steps)."""
    dynamic_sampling: str | None = None
    """Groups whose rewards all agree give no signal: ``none``, ``drop`` them, or ``resample`` (DAPO)."""
    max_resample_rounds: int = 3
    """With dynamic_sampling=resample: extra generation rounds tried to fill the batch."""
    mask_truncated_completions: bool | None = None
    """Exclude completions that hit max_new_tokens without EOS from the loss."""

    # ---- batch and optimisation ---------------------------------------------------------------
    num_generations: int = 8
    """G: completions sampled per prompt."""
    per_device_train_batch_size: int = 8
    """Completions per micro-batch (forward/backward)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step."""
    num_train_epochs: float = 1.0
    """Passes over the training prompts (ignored when max_steps > 0)."""
    max_steps: int = -1
    """Optimizer steps to run (> 0 overrides num_train_epochs)."""
    learning_rate: float = 1e-6
    """AdamW peak learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.99
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    lr_scheduler_type: str = "cosine"
    """Schedule after warm-up: cosine, linear or constant."""
    warmup_ratio: float = 0.0
    """Fraction of the optimizer steps used for linear warm-up."""
    warmup_steps: int = 0
    """Warm-up steps (overrides warmup_ratio when > 0)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 = no clipping; the norm is still logged)."""
    max_consecutive_skips: int = 5
    """An optimizer step whose loss or gradient norm is not finite is skipped (its gradients dropped, counted
    in ``skipped_steps``); after this many consecutive skips the run stops with an error."""
    seed: int = 42
    """Seed for data order, sampling and initialisation."""
    torch_num_threads: int | None = None
    """CPU threads for torch (``torch.set_num_threads``, applied at start-up before the model loads);
    ``None`` = leave torch's default (which follows OMP_NUM_THREADS; the Makefile's ``run`` target sets
    OMP_NUM_THREADS=1). Pin it in a recipe for repeatable runs: same seed + same threads -> same run."""

    # ---- generation ---------------------------------------------------------------------------
    max_new_tokens: int = 256
    """Maximum completion length in tokens. Alias: ``max_completion_length``."""
    max_prompt_length: int | None = 512
    """Prompts longer than this are cut from the left (``None`` = no limit)."""
    temperature: float = 1.0
    """Sampling temperature for rollouts; log-probs are taken under the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (< 1 truncates the rollout distribution; the loss still uses the full
    softmax, as TRL does, so rollouts become slightly off-policy)."""
    top_k: int = 0
    """Top-k sampling (0 = off; the same caveat as top_p)."""
    rollout_backend: str = "transformers"
    """Generation backend: ``transformers`` (generate with a KV cache) or a plug-in ``package.module:Class``."""
    lean_sampler: bool | None = None
    """Use grouprl's lean KV-cache sampler (Llama / Qwen2 architectures) instead of ``model.generate`` for
    rollouts with the transformers backend. ``None`` = on for CPU (its fast path, tested to sample exactly
    what ``generate`` samples), off on CUDA/MPS; ``true`` / ``false`` force it."""

    # ---- evaluation ---------------------------------------------------------------------------
    eval_steps: int = 0
    """Evaluate every N optimizer steps (0 = only before and after training)."""
    eval_before_train: bool = True
    """Evaluate the starting model on the held-out split."""
    eval_temperature: float = 0.0
    """Decoding for evaluation: 0 = greedy, > 0 = sampling."""
    eval_num_samples: int = 1
    """Samples per held-out prompt (pass@k uses these; needs eval_temperature > 0 when > 1)."""
    eval_batch_size: int = 32
    """Prompts per generate call during evaluation."""
    eval_max_new_tokens: int | None = None
    """Completion length for evaluation (``None`` = max_new_tokens)."""

    # ---- precision, device, memory ----------------------------------------------------------------
    bf16: bool = False
    """bf16 autocast where the device supports it (fp32 with one warning elsewhere)."""
    device: str = "auto"
    """auto, cpu, cuda or mps."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    use_peft: bool = False
    """Train a LoRA adapter instead of all weights; the reference is the base with the adapter off."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA alpha."""
    lora_dropout: float = 0.0
    """LoRA dropout."""
    lora_target_modules: Any = "all-linear"
    """LoRA target modules (a list of names or ``all-linear``)."""

    # ---- logging and checkpoints ----------------------------------------------------------------
    logging_steps: int = 1
    """Log metrics every N optimizer steps."""
    report_to: Any = "none"
    """Extra sinks besides metrics.jsonl: ``tensorboard``, ``wandb``, a list of them, ``all`` (every installed
    one) or ``none``. A sink named explicitly must be installed (checked before the model loads)."""
    run_name: str | None = None
    """Name for TensorBoard / W&B (``None`` = output_dir's name)."""
    log_completions_steps: int = 10
    """Write prompt, completion and each reward to samples.jsonl every N steps (0 = never)."""
    num_completions_to_log: int = 8
    """Completions written per samples.jsonl record."""
    progress_bar: bool = True
    """Show a rich progress bar with live reward, KL and clip fraction."""
    save_strategy: str = "steps"
    """``steps`` (every save_steps), ``epoch`` or ``no``; a final model is always saved."""
    save_steps: int = 500
    """Checkpoint every N optimizer steps."""
    save_total_limit: int | None = None
    """Keep at most this many checkpoints (oldest removed first)."""
    resume_from_checkpoint: Any = None
    """A checkpoint directory, or ``true`` for the latest one in output_dir."""

    # ---- TRL aliases (resolved into the fields above) -------------------------------------------
    beta: float | None = None
    """Alias of kl_coef (TRL's name)."""
    max_completion_length: int | None = None
    """Alias of max_new_tokens (TRL's name)."""

    def __post_init__(self) -> None:
        self._resolve_aliases()
        self._apply_preset()
        self.validate()

    # ------------------------------------------------------------------------------------------
    def _resolve_aliases(self) -> None:
        if isinstance(self.scale_rewards, bool):  # TRL's older boolean form
            self.scale_rewards = "group" if self.scale_rewards else "none"
        defaults = {f.name: f.default for f in fields(self)}
        for alias, target in ALIASES.items():
            value = getattr(self, alias)
            if value is None:
                continue
            current = getattr(self, target)
            if current is not None and current != defaults[target] and current != value:
                raise ConfigError(
                    f"{alias}={value!r} and {target}={current!r} disagree: {alias} is TRL's name for {target}; "
                    f"set only one of them."
                )
            setattr(self, target, value)
            setattr(self, alias, None)

    def _apply_preset(self) -> None:
        if self.algorithm is None:
            self.algorithm = "gspo" if self.importance_sampling_level == "sequence" else "grpo"
        if self.algorithm not in ALGORITHM_PRESETS:
            raise ConfigError(
                f"algorithm={self.algorithm!r} is not a known preset.{did_you_mean(self.algorithm, ALGORITHM_PRESETS)} "
                f"Known: {', '.join(ALGORITHM_PRESETS)}. Any combination can be built by setting policy_loss, "
                f"advantage and loss_aggregation directly."
            )
        if self.importance_sampling_level is not None:
            level = self.importance_sampling_level
            if level not in IMPORTANCE_LEVELS:
                raise ConfigError(
                    f"importance_sampling_level={level!r} must be one of {', '.join(IMPORTANCE_LEVELS)}."
                )
            if self.policy_loss is None:
                self.policy_loss = IMPORTANCE_LEVELS[level]
        preset = ALGORITHM_PRESETS[self.algorithm]
        # A user epsilon without epsilon_high keeps the preset's clip-higher gap (0 for symmetric presets).
        if self.epsilon is not None and self.epsilon_high is None:
            self.epsilon_high = self.epsilon + (preset["epsilon_high"] - preset["epsilon"])
        for name, value in preset.items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    # ------------------------------------------------------------------------------------------
    @property
    def effective_steps_per_generation(self) -> int:
        return self.steps_per_generation or self.gradient_accumulation_steps

    @property
    def generation_batch_size(self) -> int:
        """Completions per generation round = per_device_train_batch_size * steps_per_generation."""
        return self.per_device_train_batch_size * self.effective_steps_per_generation

    @property
    def prompts_per_generation(self) -> int:
        return self.generation_batch_size // self.num_generations

    @property
    def needs_old_logp(self) -> bool:
        """Old log-probs differ from the current ones only when the policy moves between uses."""
        return self.num_iterations > 1 or self.effective_steps_per_generation > self.gradient_accumulation_steps

    @property
    def report_targets(self) -> list[str]:
        targets = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to or [])
        if "all" in targets:  # as in transformers: every installed integration
            import importlib.util

            return ["tensorboard"] + (["wandb"] if importlib.util.find_spec("wandb") is not None else [])
        return [t for t in targets if t not in ("none", "jsonl")]

    # ------------------------------------------------------------------------------------------
    def validate(self) -> None:
        """Check values and batch arithmetic; raises ConfigError naming the field, value and fix."""
        _positive_ints(self, "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
                       "num_iterations", "max_new_tokens", "logging_steps", "eval_batch_size",
                       "eval_num_samples", "save_steps", "num_completions_to_log", "max_consecutive_skips")
        for name, choices in CHOICES.items():
            if getattr(self, name) not in choices:
                value = getattr(self, name)
                raise ConfigError(
                    f"{name}={value!r} must be one of {', '.join(map(repr, choices))}."
                    + did_you_mean(str(value), choices)
                )
        for target in [self.report_to] if isinstance(self.report_to, str) else list(self.report_to or []):
            if target not in REPORT_TARGETS:
                raise ConfigError(f"report_to={target!r} must be among {', '.join(REPORT_TARGETS)}."
                                  + did_you_mean(str(target), REPORT_TARGETS))
        G = self.num_generations
        if G < 2:
            raise ConfigError(f"num_generations={G}: GRPO compares completions within a group, so it needs "
                              f"at least 2 (8 is a good start).")
        if self.steps_per_generation is not None and self.steps_per_generation < 1:
            raise ConfigError(f"steps_per_generation={self.steps_per_generation} must be >= 1 (or null).")
        spg, ga = self.effective_steps_per_generation, self.gradient_accumulation_steps
        if spg % ga:
            raise ConfigError(
                f"steps_per_generation {spg} is not a multiple of gradient_accumulation_steps {ga}: each "
                f"generation round must hold whole optimizer steps. Fix: set steps_per_generation to a "
                f"multiple of {ga}."
            )
        gen = self.generation_batch_size
        if gen % G:
            lo, hi = (gen // G) * G, (gen // G + 1) * G
            raise ConfigError(
                f"generation batch {gen} (= per_device_train_batch_size {self.per_device_train_batch_size} x "
                f"steps_per_generation {spg}) is not divisible by num_generations {G}. Fix: change "
                f"per_device_train_batch_size, gradient_accumulation_steps or steps_per_generation so the "
                f"product is a multiple of {G} (e.g. {hi}{f' or {lo}' if lo else ''}), or change num_generations."
            )
        _range(self, "learning_rate", 0.0, None, open_low=True)
        _range(self, "warmup_ratio", 0.0, 1.0, open_high=True)
        _range(self, "temperature", 0.0, None, open_low=True,
               fix="sampling needs a positive temperature (0.6-1.0 typical); greedy rollouts all agree")
        _range(self, "top_p", 0.0, 1.0, open_low=True)
        _range(self, "eval_temperature", 0.0, None)
        _range(self, "max_grad_norm", 0.0, None)
        _range(self, "kl_coef", 0.0, None)
        _range(self, "epsilon", 0.0, None)
        _range(self, "lora_dropout", 0.0, 1.0, open_high=True)
        if self.epsilon_high is not None and self.epsilon is not None and self.epsilon_high < self.epsilon:
            raise ConfigError(f"epsilon_high={self.epsilon_high} is below epsilon={self.epsilon}; clip-higher "
                              f"needs epsilon_high >= epsilon.")
        if self.num_train_epochs <= 0 and self.max_steps <= 0:
            raise ConfigError(f"num_train_epochs={self.num_train_epochs} and max_steps={self.max_steps}: set "
                              f"num_train_epochs > 0 or max_steps > 0.")
        if self.eval_num_samples > 1 and self.eval_temperature == 0:
            raise ConfigError(f"eval_num_samples={self.eval_num_samples} with eval_temperature=0 gives identical "
                              f"greedy samples. Fix: set eval_temperature > 0 (e.g. 0.7) for pass@k.")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ConfigError(
                f"reward_weights has {len(self.reward_weights)} entries but reward_funcs has "
                f"{len(self.reward_funcs)}: give one weight per reward function."
            )
        if self.rollout_backend != "transformers" and ":" not in self.rollout_backend:
            raise ConfigError(f"rollout_backend={self.rollout_backend!r}: use 'transformers' or a plug-in "
                              f"'package.module:Class' implementing grouprl.rollout.base.Backend.")
        if self.torch_num_threads is not None and (isinstance(self.torch_num_threads, bool)
                                                   or not isinstance(self.torch_num_threads, int)
                                                   or self.torch_num_threads < 1):
            raise ConfigError(f"torch_num_threads={self.torch_num_threads!r} must be a whole number >= 1 "
                              f"(or null to leave torch's default).")
        if self.top_k < 0:
            raise ConfigError(f"top_k={self.top_k} must be >= 0 (0 = off).")
        _check_sandbox_keys(self.sandbox)

    def check_names(self) -> None:
        """Check registry names and their keyword arguments, and that the report_to sinks are installed
        (imports grouprl.algo, still no model)."""
        from grouprl.builtins import load_builtins
        from grouprl.registry import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES

        load_builtins()
        if "wandb" in self.report_targets:
            import importlib.util

            if importlib.util.find_spec("wandb") is None:
                raise ConfigError(f"report_to={self.report_to!r} includes wandb, which is not installed. Fix: "
                                  f"pip install 'grouprl[wandb]' (or wandb), or drop wandb from report_to.")
        POLICY_LOSSES.check_kwargs(self.policy_loss, self.loss_hparams(), where="policy_loss / loss_kwargs")
        ADVANTAGES.check_kwargs(self.advantage, dict(self.advantage_kwargs), where="advantage_kwargs")
        AGGREGATIONS.get(self.loss_aggregation)
        KL_ESTIMATORS.get(self.kl_estimator)

    def check_reward_kwargs(self, reward_funcs: Any = None) -> None:
        """Every ``reward_kwargs`` key names a reward in use (``reward_funcs`` or ``eval_reward``): options for a
        misspelt or unused reward would otherwise be ignored without a word."""
        funcs = self.reward_funcs if reward_funcs is None else reward_funcs
        used = [r for r in (funcs if isinstance(funcs, (list, tuple)) else [funcs]) if isinstance(r, str)]
        used.append(self.eval_reward)
        for key in self.reward_kwargs:
            if key not in used:
                raise ConfigError(f"reward_kwargs has options for {key!r}, which is not among the rewards in use "
                                  f"({', '.join(dict.fromkeys(used))}).{did_you_mean(str(key), used)} Fix: use the "
                                  f"reward's name as given in reward_funcs or eval_reward, or add it there.")

    def configure_sandbox(self) -> Any:
        """Apply the ``sandbox`` section (``grouprl.sandbox.configure``) when it is set or a ``code`` reward is
        used; raises ConfigError / SandboxUnavailable now if the isolation level cannot be had. Returns the
        SandboxConfig, or ``None`` when no sandbox is involved."""
        names = [r for r in self.reward_funcs if isinstance(r, str)] + [self.eval_reward]
        code_task = any(isinstance(kw, dict) and kw.get("task_type") == "code" for kw in self.reward_kwargs.values())
        if not (self.sandbox or "code" in names or code_task):
            return None
        from grouprl.sandbox.config import configure

        return configure(dict(self.sandbox))

    def loss_hparams(self) -> dict[str, Any]:
        """Keyword arguments for the policy loss: the clip range plus loss_kwargs."""
        return {"eps_low": self.epsilon, "eps_high": self.epsilon_high, **self.loss_kwargs}

    # ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ALIASES}

    def to_yaml(self, path: str | Path) -> None:
        import yaml

        Path(path).write_text(yaml.safe_dump(_plain(self.to_dict()), sort_keys=False))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GRPOConfig:
        known = {f.name: f for f in fields(cls)}
        kwargs = {}
        for key, value in data.items():
            if key not in known:
                raise ConfigError(f"unknown config key {key!r}.{did_you_mean(key, known)} "
                                  f"See `grouprl train --help-config` for every field.")
            kwargs[key] = _coerce(known[key], value)
        return cls(**kwargs)

    @classmethod
    def from_yaml(cls, path: str | Path | None, overrides: list[str] | None = None) -> GRPOConfig:
        """Load a YAML recipe (may be ``None``) and apply ``key=value`` overrides (dotted keys nest)."""
        import yaml

        data: dict[str, Any] = {}
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise ConfigError(f"recipe {str(path)!r} does not exist.")
            try:
                data = yaml.safe_load(p.read_text()) or {}
            except yaml.YAMLError as e:
                raise ConfigError(f"recipe {str(path)!r} is not valid YAML: {e}") from e
            if not isinstance(data, dict):
                raise ConfigError(f"recipe {str(path)!r} must be a mapping of field: value.")
        for item in overrides or []:
            apply_override(data, item)
        return cls.from_dict(data)

    @classmethod
    def field_docs(cls) -> dict[str, str]:
        """field name -> docstring, read from the source (the single source of --help and docs)."""
        tree = ast.parse(inspect.getsource(cls))
        body = tree.body[0].body  # type: ignore[attr-defined]
        docs: dict[str, str] = {}
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                docs[node.target.id] = str(nxt.value.value)  # type: ignore[attr-defined]
        return docs


def _checked_init(init):
    """Wrap the dataclass ``__init__`` so a misspelt keyword is a ConfigError with a did-you-mean."""
    import functools

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        known = {f.name for f in fields(GRPOConfig)}
        for key in kwargs:
            if key not in known:
                raise ConfigError(f"unknown config key {key!r}.{did_you_mean(key, known)} "
                                  f"See `grouprl train --help-config` for every field.")
        init(self, *args, **kwargs)

    return wrapper


GRPOConfig.__init__ = _checked_init(GRPOConfig.__init__)  # type: ignore[method-assign]


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply ``a.b=value`` to nested ``data``; the value is parsed as YAML (``1e-6`` is a number)."""
    import yaml

    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like key=value (e.g. learning_rate=1e-6).")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part!r} is not a mapping.")
    node[parts[-1]] = value


def _plain(value: Any) -> Any:
    """YAML-safe copy: callables (Python-API reward functions) become their names."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return getattr(value, "__name__", repr(value))


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    """Make YAML strings like ``5e-6`` (YAML 1.1 reads them as text) into the field's type."""
    kind = str(f.type)
    if isinstance(value, str) and value.lower() in ("null", "none", "~") and "None" in kind:
        return None
    try:
        if isinstance(value, str) and kind.startswith("float"):
            return float(value)
        if isinstance(value, str) and kind.startswith("int"):
            return int(value)
        if isinstance(value, float) and kind.startswith("int") and value.is_integer():
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool) and kind.startswith("float"):
            return float(value)
    except ValueError as e:
        raise ConfigError(f"{f.name}={value!r} is not a valid {kind.split(' ')[0]}.") from e
    if kind.startswith("bool") and not isinstance(value, bool) and not (value is None and "None" in kind):
        raise ConfigError(f"{f.name}={value!r} must be true or false.")
    if kind.startswith("list") and isinstance(value, str):
        return [value]
    return value


def _check_sandbox_keys(section: Any) -> None:
    """The ``sandbox`` section names SandboxConfig fields (grouprl.sandbox.config imports no torch)."""
    if not isinstance(section, dict):
        raise ConfigError(f"sandbox={section!r} must be a mapping, e.g. {{isolation: strict, timeout: 10}}.")
    from grouprl.sandbox.config import SandboxConfig

    known = [f.name for f in fields(SandboxConfig)]
    for key in section:
        if key not in known:
            raise ConfigError(f"sandbox.{key} is not a sandbox setting.{did_you_mean(str(key), known)} "
                              f"Known: {', '.join(known)}.")


def _positive_ints(cfg: GRPOConfig, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name}={value!r} must be a positive integer.")


def _range(cfg: GRPOConfig, name: str, low: float | None, high: float | None, *, open_low: bool = False,
           open_high: bool = False, fix: str = "") -> None:
    value = getattr(cfg, name)
    if value is None:
        return
    bad = not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value)
    bad = bad or (low is not None and (value <= low if open_low else value < low))
    bad = bad or (high is not None and (value >= high if open_high else value > high))
    if bad:
        lo = "" if low is None else f"{'>' if open_low else '>='} {low}"
        hi = "" if high is None else f"{'<' if open_high else '<='} {high}"
        rng = " and ".join(x for x in (lo, hi) if x)
        raise ConfigError(f"{name}={value!r} must be {rng}.{' Fix: ' + fix + '.' if fix else ''}")
