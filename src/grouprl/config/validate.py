"""Validation of a :class:`~grouprl.config.GRPOConfig`: every message names the field, the value and the fix.

:func:`validate` runs when a config is built (no registry, no torch); :func:`check_names` runs at start-up
before any model loads and resolves the registry functions (:func:`grouprl.config.presets.resolved`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import fields
from typing import Any

from grouprl.config.algorithms import SUPPORTS, owner_of, supports_of
from grouprl.errors import ConfigError, did_you_mean

CHOICES = {
    "scale_rewards": ("group", "batch", "none"),
    "dynamic_sampling": ("none", "drop", "resample"),
    "lr_scheduler_type": ("cosine", "linear", "constant"),
    "save_strategy": ("steps", "epoch", "no"),
    "device": ("auto", "cpu", "cuda", "mps"),
    "missing_reward": ("exclude", "zero"),
    "kl_mode": ("reward", "loss"),
    "truncation": ("left", "error"),
    "apply_chat_template": ("auto", "always", "never"),
    "dpo_loss": ("sigmoid", "ipo"),
    "vllm_mode": ("colocate", "server"),
    "rollout_correction": ("auto", "tis", "mask", "none"),
    "ref_dtype": ("auto", "float32", "bfloat16"),
    "rollout_dtype": ("auto", "float32", "bfloat16"),
    "agent_schedule": ("per_trajectory", "lockstep"),
}
REPORT_TARGETS = ("none", "tensorboard", "wandb", "jsonl", "all")
_KINDS = {  # annotation -> (accepts, what to write)
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "dict": (lambda v: isinstance(v, dict), "a mapping (YAML `{name}: {{key: value}}`, override `{name}.key=value`)"),
    "list": (lambda v: isinstance(v, (list, tuple)), "a list (YAML `{name}: [a, b]`)"),
}
_warned: set[str] = set()


def validate(cfg: Any) -> None:
    """Every check that needs no registry; called when the config is built."""
    check_types(cfg)
    check_choices(cfg)
    check_batch(cfg)
    check_ranges(cfg)
    check_consistency(cfg)
    check_own_fields(cfg)
    warn_k1(cfg)


def check_types(cfg: Any) -> None:
    """Each field holds what its annotation says (``Any`` fields are checked by their own rules)."""
    for f in fields(cfg):
        kinds = [k.strip() for k in str(f.type).split("|")]
        value = getattr(cfg, f.name)
        if "Any" in kinds or (value is None and "None" in kinds):
            continue
        known = [k for k in kinds if k in _KINDS]
        if not known or any(_KINDS[k][0](value) for k in known):
            continue
        want = " or ".join(_KINDS[k][1].format(name=f.name) for k in known) + (" or null" if "None" in kinds else "")
        raise ConfigError(f"{f.name}={value!r} must be {want}; got a {type(value).__name__}.")


def check_choices(cfg: Any) -> None:
    for name, choices in CHOICES.items():
        value = getattr(cfg, name)
        if value not in choices:
            raise ConfigError(f"{name}={value!r} must be one of {', '.join(map(repr, choices))}."
                              + did_you_mean(str(value), choices))
    if not (isinstance(cfg.padding_free, bool) or cfg.padding_free == "auto"):
        raise ConfigError(f"padding_free={cfg.padding_free!r} must be auto, true or false (true = pack every "
                          f"micro-batch's sequences into rows, false = padded rows, auto = pack where it saves compute).")
    for target in [cfg.report_to] if isinstance(cfg.report_to, str) else list(cfg.report_to or []):
        if target not in REPORT_TARGETS:
            raise ConfigError(f"report_to={target!r} must be among {', '.join(REPORT_TARGETS)}."
                              + did_you_mean(str(target), REPORT_TARGETS))
    if cfg.rollout_backend not in ("transformers", "vllm") and ":" not in cfg.rollout_backend:
        raise ConfigError(f"rollout_backend={cfg.rollout_backend!r}: use 'transformers', 'vllm' or a plug-in "
                          f"'package.module:Class' implementing grouprl.rollout.base.Backend.")


def check_batch(cfg: Any) -> None:
    """Batch arithmetic (TRL's convention), with the formula in the message."""
    _positive_ints(cfg, "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
                   "num_iterations", "max_new_tokens", "logging_steps", "eval_batch_size", "eval_num_samples",
                   "save_steps", "num_completions_to_log", "max_consecutive_skips", "review_window")
    supports = supports_of(cfg.algorithm)
    if supports.offline:  # per_device_train_batch_size counts preference pairs, no groups
        return check_dpo(cfg)
    G = cfg.num_generations
    if G < 2 and supports.groups:
        raise ConfigError(f"num_generations={G}: GRPO compares completions within a group, so it needs at least "
                          f"2 (8 is a good start), as every group algorithm does (algorithm={cfg.algorithm!r}). "
                          f"algorithm: ppo needs no groups (its baseline is a critic's value) and accepts 1.")
    if cfg.steps_per_generation is not None and cfg.steps_per_generation < 1:
        raise ConfigError(f"steps_per_generation={cfg.steps_per_generation} must be >= 1 (or null).")
    spg, ga = cfg.effective_steps_per_generation, cfg.gradient_accumulation_steps
    if spg % ga:
        raise ConfigError(
            f"steps_per_generation {spg} is not a multiple of gradient_accumulation_steps {ga}: each "
            f"generation round must hold whole optimizer steps. Fix: set steps_per_generation to a multiple of {ga}."
        )
    gen = cfg.generation_batch_size
    if gen % G:
        lo, hi = (gen // G) * G, (gen // G + 1) * G
        raise ConfigError(
            f"generation batch {gen} (= per_device_train_batch_size {cfg.per_device_train_batch_size} x "
            f"steps_per_generation {spg}) is not divisible by num_generations {G}. Fix: change "
            f"per_device_train_batch_size, gradient_accumulation_steps or steps_per_generation so the "
            f"product is a multiple of {G} (e.g. {hi}{f' or {lo}' if lo else ''}), or change num_generations."
        )
    if cfg.num_train_epochs <= 0 and cfg.max_steps <= 0:
        raise ConfigError(f"num_train_epochs={cfg.num_train_epochs} and max_steps={cfg.max_steps}: set "
                          f"num_train_epochs > 0 or max_steps > 0.")


def check_dpo(cfg: Any) -> None:
    """``algorithm: dpo``: its beta and label smoothing, and a length of training."""
    _range(cfg, "dpo_beta", 0.0, None, open_low=True, fix="0.1 is usual")
    _range(cfg, "dpo_label_smoothing", 0.0, 0.5, open_high=True)
    if cfg.dpo_label_smoothing and cfg.dpo_loss != "sigmoid":
        raise ConfigError(f"dpo_label_smoothing={cfg.dpo_label_smoothing} applies to dpo_loss 'sigmoid' only "
                          f"(cDPO); dpo_loss={cfg.dpo_loss!r} has none. Fix: remove dpo_label_smoothing.")
    if cfg.num_train_epochs <= 0 and cfg.max_steps <= 0:
        raise ConfigError(f"num_train_epochs={cfg.num_train_epochs} and max_steps={cfg.max_steps}: set "
                          f"num_train_epochs > 0 or max_steps > 0.")


def check_ranges(cfg: Any) -> None:
    steps = cfg.max_steps
    if not isinstance(steps, bool) and isinstance(steps, int) and steps < -1 or steps == 0:
        raise ConfigError(f"max_steps={steps} trains nothing (0) or means nothing (< -1). Fix: max_steps >= 1 "
                          f"optimizer steps, or -1 to train num_train_epochs passes over the prompts.")
    _range(cfg, "learning_rate", 0.0, None, open_low=True)
    _range(cfg, "warmup_ratio", 0.0, 1.0, open_high=True)
    _range(cfg, "temperature", 0.0, None, open_low=True,
           fix="sampling needs a positive temperature (0.6-1.0 typical); greedy rollouts all agree")
    _range(cfg, "top_p", 0.0, 1.0, open_low=True)
    _range(cfg, "eval_temperature", 0.0, None)
    _range(cfg, "max_grad_norm", 0.0, None)
    _range(cfg, "kl_coef", 0.0, None)
    _range(cfg, "epsilon", 0.0, 1.0, open_high=True,
           fix="the lower clip bound 1 - epsilon must stay > 0 (0.2 is usual; leave it unset for the loss's "
               "own default, e.g. cispo's 1.0 = no lower bound)")
    _range(cfg, "epsilon_high", 0.0, 10.0,
           fix="the upper clip bound is 1 + epsilon_high (0.2-0.28 usual, 4e-4 for gspo)")
    _range(cfg, "lora_dropout", 0.0, 1.0, open_high=True)
    _range(cfg, "adam_beta1", 0.0, 1.0, open_high=True, fix="AdamW's betas lie in [0, 1); 0.9 is usual")
    _range(cfg, "adam_beta2", 0.0, 1.0, open_high=True, fix="AdamW's betas lie in [0, 1); 0.99 or 0.999 is usual")
    _range(cfg, "adam_epsilon", 0.0, None, open_low=True, fix="1e-8 is usual")
    _range(cfg, "weight_decay", 0.0, None, fix="0 turns weight decay off; 0.01-0.1 is usual")
    for name, meaning in (("warmup_steps", "0 = use warmup_ratio"), ("eval_steps", "0 = only before and after "
                          "training"), ("max_resample_rounds", "0 = no extra rounds"),
                          ("log_completions_steps", "0 = never"),
                          ("logits_chunk_size", "0 = logits of the completion positions, unchunked")):
        _non_negative_int(cfg, name, meaning)
    for name, meaning in (("max_prompt_length", "null = no limit beyond the model's context"),
                          ("save_total_limit", "null = keep every checkpoint"), ("lora_r", "LoRA's rank; 8-64 is usual")):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise ConfigError(f"{name}={value!r} must be >= 1 ({meaning}).")
    _range(cfg, "lora_alpha", 0.0, None, open_low=True, fix="2 x lora_r is usual")
    check_lora_targets(cfg.lora_target_modules)
    if cfg.top_k < 0:
        raise ConfigError(f"top_k={cfg.top_k} must be >= 0 (0 = off).")
    _range(cfg, "vllm_gpu_memory_utilization", 0.0, 1.0, open_low=True)
    _range(cfg, "vllm_server_timeout", 0.0, None, open_low=True)
    _range(cfg, "rollout_is_cap", 0.0, None, open_low=True, fix="2.0 is the usual truncation")
    band = cfg.rollout_mask_band
    if not (isinstance(band, (list, tuple)) and len(band) == 2 and all(_KINDS["float"][0](b) for b in band)
            and 0 < band[0] <= 1 <= band[1]):
        raise ConfigError(f"rollout_mask_band={band!r} must be [low, high] with 0 < low <= 1 <= high "
                          f"(e.g. [0.99, 1.01]).")
    if cfg.torch_num_threads is not None and cfg.torch_num_threads < 1:
        raise ConfigError(f"torch_num_threads={cfg.torch_num_threads!r} must be a whole number >= 1 "
                          f"(or null to leave torch's default).")


def _non_negative_int(cfg: Any, name: str, meaning: str) -> None:
    value = getattr(cfg, name)
    if value < 0:
        raise ConfigError(f"{name}={value!r} must be >= 0 ({meaning}).")


def check_lora_targets(value: Any) -> None:
    """``all-linear``, one module name, or a non-empty list of module names."""
    ok = isinstance(value, str) and value.strip() or (
        isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v.strip() for v in value))
    if not ok:
        raise ConfigError(f"lora_target_modules={value!r} must be 'all-linear', a module name or a non-empty list "
                          f"of module names (e.g. [q_proj, v_proj]).")


def check_consistency(cfg: Any) -> None:
    """Options that must agree with each other."""
    if cfg.epsilon_high is not None and cfg.epsilon is not None and cfg.epsilon_high < cfg.epsilon:
        raise ConfigError(f"epsilon_high={cfg.epsilon_high} is below epsilon={cfg.epsilon}; clip-higher "
                          f"needs epsilon_high >= epsilon.")
    if cfg.eval_num_samples > 1 and cfg.eval_temperature == 0:
        raise ConfigError(f"eval_num_samples={cfg.eval_num_samples} with eval_temperature=0 gives identical "
                          f"greedy samples. Fix: set eval_temperature > 0 (e.g. 0.7) for pass@k.")
    check_rollout_engine(cfg)
    check_async(cfg)
    if cfg.reward_weights is not None and len(cfg.reward_weights) != len(cfg.reward_funcs):
        raise ConfigError(f"reward_weights has {len(cfg.reward_weights)} entries but reward_funcs has "
                          f"{len(cfg.reward_funcs)}: give one weight per reward function.")


def check_own_fields(cfg: Any) -> None:
    """Fields another algorithm declares as its own (``Supports.own_fields``) are not set with this one. A
    saved config sets every field: only a value other than the default counts."""
    explicit, mine = cfg.explicit_fields, supports_of(cfg.algorithm)
    defaults = {f.name: f.default for f in fields(cfg)}
    stray: dict[str, list[str]] = {}
    for f in [f.name for f in fields(cfg) if f.name in explicit]:
        found = owner_of(f)
        if found and found[1] is not mine and f not in mine.own_fields and getattr(cfg, f) != defaults[f]:
            stray.setdefault(found[0], []).append(f)
    for owner, names in stray.items():
        raise ConfigError(f"{', '.join(names)} set with algorithm={cfg.algorithm!r}: only algorithm: {owner} "
                          f"{SUPPORTS[owner].fields_reason}, so they would be ignored. Fix: set algorithm: "
                          f"{owner}, or remove them.")
    if mine.critic:
        check_critic(cfg)


def check_critic(cfg: Any) -> None:
    """A loop with a critic (PPO): its fields in range, and no group-baseline options with it."""
    explicit = cfg.explicit_fields
    defaults = {f.name: f.default for f in fields(cfg)}
    _range(cfg, "gamma", 0.0, 1.0)
    _range(cfg, "lam", 0.0, 1.0)
    _range(cfg, "vf_coef", 0.0, None, open_low=True)
    _range(cfg, "cliprange_value", 0.0, None, open_low=True, fix="0.2 is usual; null = no value clipping")
    _range(cfg, "critic_learning_rate", 0.0, None, open_low=True)
    nominal = {"advantage": "grpo", "advantage_kwargs": {}, "scale_rewards": defaults["scale_rewards"]}
    unused = [f for f, v in nominal.items() if f in explicit and getattr(cfg, f) != v]
    if unused:
        raise ConfigError(f"{', '.join(unused)} set with algorithm: ppo: PPO's advantages come from GAE over the "
                          f"critic's values (gamma, lam, whiten_advantages), not from a group estimator. "
                          f"Fix: remove {', '.join(unused)}.")
    if cfg.dynamic_sampling != "none":
        raise ConfigError(f"dynamic_sampling={cfg.dynamic_sampling!r} with algorithm: ppo: dynamic sampling "
                          f"drops groups whose rewards all agree, which only a group baseline needs. Fix: "
                          f"dynamic_sampling: none.")
    if cfg.use_peft:
        raise ConfigError("use_peft with algorithm: ppo: the critic is a full copy of the backbone and a LoRA "
                          "critic is not implemented. Fix: use_peft: false (or use a group algorithm with LoRA).")


def check_async(cfg: Any) -> None:
    """The asynchronous-pipeline fields (grouprl.train.pipeline): ranges, and a loop that runs it."""
    _non_negative_int(cfg, "max_staleness", "0 = synchronous: generate, then train")
    _positive_ints(cfg, "weight_sync_steps")
    _range(cfg, "async_timeout_s", 0.0, None, open_low=True, fix="300 is the default; the bound on any wait "
           "for the rollout worker")
    if cfg.max_staleness == 0:
        return
    if not supports_of(cfg.algorithm).async_rollouts:
        raise ConfigError(f"max_staleness={cfg.max_staleness} with algorithm={cfg.algorithm!r}: only the "
                          f"GRPO-family loop runs a rollout worker. Fix: max_staleness: 0, or a GRPO-family "
                          f"algorithm ({', '.join(n for n, s in SUPPORTS.items() if s.async_rollouts)}).")
    if cfg.weight_sync_steps > cfg.max_staleness + 1:
        raise ConfigError(f"weight_sync_steps={cfg.weight_sync_steps} with max_staleness={cfg.max_staleness}: the "
                          f"worker would need weights newer than the last push to produce a round the bound "
                          f"admits (the run would stall). Fix: weight_sync_steps <= {cfg.max_staleness + 1}, "
                          f"or max_staleness >= {cfg.weight_sync_steps - 1}.")
    if cfg.rollout_backend == "vllm" and cfg.vllm_mode != "server":
        raise ConfigError(f"max_staleness={cfg.max_staleness} with rollout_backend='vllm' and vllm_mode="
                          f"{cfg.vllm_mode!r}: the rollout worker is a separate CPU process; it drives a vLLM "
                          f"engine only as a `grouprl vllm-serve` server. Fix: vllm_mode: server, or max_staleness: 0.")


def check_rollout_engine(cfg: Any) -> None:
    """Mismatch-correction settings that only make sense with an engine that reports its own log-probs."""
    low = getattr(cfg, "rollout_dtype", "auto") == "bfloat16"
    agent = bool(cfg.tools or cfg.environment)  # multi-turn rollouts sample through another path, in fp32
    if low and (cfg.rollout_backend != "transformers" or cfg.lean_sampler is False
                or not supports_of(cfg.algorithm).lean_bf16_rollout or agent):
        raise ConfigError(f"rollout_dtype='bfloat16' is a lean-sampler option of the single-turn GRPO-family "
                          f"loop (rollout_backend={cfg.rollout_backend!r}, lean_sampler={cfg.lean_sampler!r}, "
                          f"algorithm={cfg.algorithm!r}, tools/environment set: {agent}). Fix: rollout_dtype: "
                          f"auto, or rollout_backend: transformers with lean_sampler unset and no tools.")
    # the transformers backend in fp32 samples with the trainer's own weights: nothing to correct. With bf16 and
    # rollout_dtype auto it may sample from a bf16 copy (a bf16 CPU: train/engine/precision.py, resolved at start-up;
    # round.py refuses tis / mask then if the sampler turns out to be the trainer's own weights)
    maybe_low = getattr(cfg, "rollout_dtype", "auto") == "auto" and bool(getattr(cfg, "bf16", False))
    # the rollout worker (max_staleness >= 1) samples with its own, older copy and reports its log-probs
    own = cfg.rollout_backend == "transformers" and not low and not getattr(cfg, "max_staleness", 0)
    if own and not maybe_low and cfg.rollout_correction in ("tis", "mask"):
        raise ConfigError(f"rollout_correction={cfg.rollout_correction!r} with rollout_backend='transformers': "
                          f"that backend samples with the trainer's own weights, so there is no mismatch to "
                          f"correct. Fix: rollout_correction: auto (or none), or rollout_backend: vllm.")
    if own and cfg.gspo_use_engine_logp:
        raise ConfigError("gspo_use_engine_logp=true needs an engine's log-probs; rollout_backend='transformers' "
                          "has none. Fix: rollout_backend: vllm, or gspo_use_engine_logp: false.")
    if cfg.gspo_use_engine_logp and cfg.rollout_correction in ("tis", "mask"):
        raise ConfigError(f"gspo_use_engine_logp=true already corrects the mismatch in the ratio; "
                          f"rollout_correction={cfg.rollout_correction!r} would correct it twice. Fix: "
                          f"rollout_correction: auto (or none), or gspo_use_engine_logp: false.")
    if cfg.rollout_backend == "vllm" and cfg.use_peft:
        raise ConfigError("rollout_backend='vllm' with use_peft=true is not supported yet (the adapter would have "
                          "to be merged before each weight push). Fix: use_peft: false, or rollout_backend: "
                          "transformers.")


def warn_k1(cfg: Any) -> None:
    """k1 = log(pi/pi_ref) has expected gradient zero as a loss term (its expectation's gradient comes from
    the sampling distribution, which a per-token loss does not differentiate): warn once."""
    if cfg.kl_estimator == "k1" and cfg.kl_coef and cfg.kl_coef > 0:
        msg = (f"kl_estimator='k1' with kl_coef={cfg.kl_coef}: as a loss term k1 has zero expected gradient, so "
               f"the KL penalty does not pull the policy towards the reference. Use k3 (or k2) to penalise KL.")
        if msg not in _warned:
            _warned.add(msg)
            warnings.warn(msg, UserWarning, stacklevel=4)


def check_names(cfg: Any) -> None:
    """Registry names, the hyper-parameters each chosen function can honour, and the report_to sinks."""
    from grouprl.config.presets import resolved

    if "wandb" in cfg.report_targets:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            raise ConfigError(f"report_to={cfg.report_to!r} includes wandb, which is not installed. Fix: "
                              f"pip install 'grouprl[wandb]' (or wandb), or drop wandb from report_to.")
    if supports_of(cfg.algorithm).preset is not None:  # an offline loop calls no policy loss or advantage
        fns = resolved(cfg)
        if cfg.gspo_use_engine_logp and fns["policy_loss"] not in ("gspo", "gspo_token"):
            raise ConfigError(f"gspo_use_engine_logp=true with policy_loss={fns['policy_loss']!r}: only the "
                              f"sequence-level losses (gspo, gspo_token) tolerate the engine's token-level noise "
                              f"in their ratio. Fix: algorithm: gspo, or gspo_use_engine_logp: false.")
    if cfg.rollout_backend == "vllm" and cfg.vllm_mode == "colocate":
        import importlib.util

        spec = importlib.util.find_spec("vllm")
        if spec is None or spec.origin is None:  # origin None: a namespace folder named vllm, not the package
            raise ConfigError("rollout_backend='vllm' (vllm_mode=colocate) needs the vllm package, which is not "
                              "installed. Fix: pip install 'grouprl[vllm]' (on a machine with a CUDA GPU), or "
                              "vllm_mode: server with a `grouprl vllm-serve MODEL` running elsewhere, or "
                              "rollout_backend: transformers.")


def check_reward_kwargs(cfg: Any, reward_funcs: Any = None) -> None:
    """Every ``reward_kwargs`` key names a reward in use (``reward_funcs`` or ``eval_reward``): options for a
    misspelt or unused reward would otherwise be ignored without a word."""
    funcs = cfg.reward_funcs if reward_funcs is None else reward_funcs
    used = [r for r in (funcs if isinstance(funcs, (list, tuple)) else [funcs]) if isinstance(r, str)]
    used.append(cfg.eval_reward)
    for key in cfg.reward_kwargs:
        if key not in used:
            raise ConfigError(f"reward_kwargs has options for {key!r}, which is not among the rewards in use "
                              f"({', '.join(dict.fromkeys(used))}).{did_you_mean(str(key), used)} Fix: use the "
                              f"reward's name as given in reward_funcs or eval_reward, or add it there.")


def _positive_ints(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name}={value!r} must be a positive integer.")


def _range(cfg: Any, name: str, low: float | None, high: float | None, *, open_low: bool = False,
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
