"""The ``GRPOConfig`` dataclass: every field of a run with its documentation.

A field's docstring (the string literal under it) is its documentation: ``grouprl train --help-config``
and the docs read them from here (:meth:`GRPOConfig.field_docs`). Defaults live only in this dataclass.
Building a config resolves the TRL aliases and the ``algorithm`` preset (:mod:`grouprl.config.presets`) and
validates it (:mod:`grouprl.config.validate`); which fields the user set is remembered
(:attr:`GRPOConfig.explicit_fields`), so a preset or an alias never overrides one of them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from grouprl.config import agent, io, presets, validate
from grouprl.errors import ConfigError, did_you_mean


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
    """Preset: grpo (arXiv:2402.03300), gspo (arXiv:2507.18071), dr_grpo (arXiv:2503.20783), dapo
    (arXiv:2503.14476), rloo (arXiv:2402.14740), ppo (arXiv:1707.06347: a critic and GAE instead of groups;
    the fields under "PPO (critic)") or dpo (offline preference pairs, arXiv:2305.18290: the ``dpo_*`` fields;
    no sampler, rewards or policy loss); ``None`` = grpo. A preset fills only the algorithm fields
    the user left unset, and its clip range (epsilon, epsilon_high) applies only while its own policy_loss
    is used: choose another loss and that loss gets its own defaults. ``grouprl list`` shows each preset."""
    policy_loss: str | None = None
    """POLICY_LOSSES name (grpo, gspo, gspo_token, cispo) or a plug-in ``pkg.mod:fn``; ``None`` = from
    importance_sampling_level, else the preset's."""
    importance_sampling_level: str | None = None
    """TRL's switch between ratio levels: ``token`` = policy_loss grpo (arXiv:2402.03300), ``sequence`` =
    gspo (arXiv:2507.18071, Eq. 5), ``sequence_token`` = gspo_token (Eq. 13). Setting it and a different
    policy_loss is an error."""
    advantage: str | None = None
    """ADVANTAGES name (grpo, dr_grpo, rloo) or a plug-in; ``None`` = from the preset."""
    loss_aggregation: str | None = None
    """AGGREGATIONS name (token_mean, seq_mean_token_mean, seq_mean_token_sum_norm); ``None`` = the preset's."""
    epsilon: float | None = None
    """Lower clip range of the importance ratio: clip(ratio, 1 - epsilon, 1 + epsilon_high) (PPO,
    arXiv:1707.06347, Eq. 7); 0 <= epsilon < 1. ``None`` = the preset's (when its loss is used) or the loss's
    own default (grpo 0.2, gspo 3e-4, cispo 1.0 = no lower bound). Setting it for a loss without a clip range
    is an error. Set alone, epsilon_high follows it (keeping the preset's clip-higher gap)."""
    epsilon_high: float | None = None
    """Upper clip range (1 + epsilon_high), 0 <= epsilon_high <= 10; > epsilon is DAPO's clip-higher
    (arXiv:2503.14476, Eq. 8: 0.28). ``None`` = the preset's, epsilon's, or the loss's own default."""
    loss_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments of the policy loss function (e.g. ``dual_clip: 3.0`` for grpo,
    arXiv:1912.09729); each must be a parameter the function declares."""
    advantage_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments of the advantage estimator (e.g. ``std: unbiased`` for grpo); each must be a
    parameter the estimator declares."""
    scale_rewards: str = "group"
    """Advantage scaling, passed as ``scale`` to estimators that take one (grpo): divide by the group std
    (``group``, arXiv:2402.03300), the batch std (``batch``, arXiv:2508.08221) or not (``none``, as Dr. GRPO,
    arXiv:2503.20783). Set to anything but ``none`` with an estimator that takes no ``scale`` (dr_grpo, rloo)
    it is an error; so is setting it and a different ``advantage_kwargs.scale``. TRL's true/false mean
    group/none."""
    kl_coef: float | None = None
    """beta: weight of the KL(pi_theta || pi_ref) penalty; 0 = no reference model at all. Alias: ``beta``."""
    kl_estimator: str = "k3_st"
    """KL_ESTIMATORS name for the per-token KL penalty (Schulman 2020, "Approximating KL Divergence").
    ``k3_st`` (default): k3's value with k2's gradient (straight-through), i.e. the gradient of
    KL(pi_theta || pi_ref) that the objective of arXiv:2402.03300 Eq. 3 penalises, with a bounded per-token
    weight. ``k3``: GRPO's estimator (Eq. 4); as a loss its expected gradient is that of KL(pi_ref ||
    pi_theta) -- keep it to reproduce DeepSeekMath exactly. ``k2``: the right gradient, a biased value.
    ``k1`` as a loss term has zero expected gradient, so with kl_coef > 0 it warns. docs/ALGORITHMS.md
    derives each."""
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

    # ---- PPO (critic) ---------------------------------------------------------------------------
    critic_model: str | None = None
    """``algorithm: ppo`` only. Where the critic (value model) comes from: a hub id, local path or
    ``builtin:<name>`` of a causal LM or of a saved critic, loaded as ``AutoModelForTokenClassification``
    with one label (the backbone plus a scalar head). ``None`` = a copy of the policy's backbone with a
    zero-initialised head, so every value starts at 0."""
    critic_learning_rate: float | None = None
    """AdamW learning rate of the critic (its own optimizer; the policy's schedule, warm-up and betas);
    ``None`` = learning_rate."""
    vf_coef: float = 0.1
    """c1 of PPO's L = L_clip + c1 L_value (arXiv:1707.06347, Eq. 9): the weight of the clipped value loss.
    The critic has its own optimizer, so this scales the critic's gradient before clipping (with AdamW it
    matters mostly through max_grad_norm)."""
    cliprange_value: float | None = 0.2
    """Value clipping: the loss is 0.5 max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2) with V_old the
    critic's value at rollout ("37 implementation details of PPO", detail 9); ``None`` = 0.5 (V - R)^2."""
    gamma: float = 1.0
    """GAE discount per token (arXiv:1506.02438, Eq. 16); 1.0 (undiscounted) is usual for language models,
    whose reward comes once at the end."""
    lam: float = 0.95
    """GAE lambda (arXiv:1506.02438, Eq. 16): 0 = one-step TD (leans on the critic), 1 = Monte Carlo return
    minus the value (no bias from the critic, more variance)."""
    whiten_advantages: bool = True
    """Whiten the round's token advantages (subtract the mean, divide by the std over every real token of
    the round), as PPO implementations do; the returns the critic regresses on are not whitened."""
    kl_mode: str = "reward"
    """How kl_coef enters PPO. ``reward``: a per-token reward r_t = -kl_coef * KL_t (the kl_estimator's value
    between the rollout policy and the reference), plus the sequence reward at its last token (InstructGPT,
    arXiv:2203.02155, Eq. 2); GAE then spreads both. ``loss``: kl_coef * KL as a loss term next to the
    clipped surrogate, as GRPO does (arXiv:2402.03300, Eq. 3)."""

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
    """Generation backend: ``transformers`` (generate with a KV cache), ``vllm`` (an engine with its own copy of
    the weights; the ``vllm_*`` fields, docs/VLLM.md) or a plug-in ``package.module:Class``."""
    lean_sampler: bool | None = None
    """Use grouprl's lean KV-cache sampler (Llama / Qwen2 architectures) instead of ``model.generate`` for
    rollouts with the transformers backend. ``None`` = on for CPU (its fast path, tested to sample exactly
    what ``generate`` samples), off on CUDA/MPS; ``true`` / ``false`` force it."""
    rollout_dtype: str = "auto"
    """Precision of the lean sampler (transformers backend, single-turn GRPO-family loop): ``bfloat16`` = it
    samples from a bf16 copy of the weights made once per generation round (bf16 KV cache, fp32 logits), as
    vLLM / verl sample in bf16 while training in fp32; rollouts are then off-policy by precision, so the
    sampler's log-probs become rollout_logp and rollout_correction (auto = tis) applies.
    ``auto`` = ``bfloat16`` when ``bf16`` autocast runs on a CPU (AVX512-BF16 / AMX-BF16) and the lean sampler
    can run here, else ``float32`` (the trainer's own weights; on a GPU ``bf16`` autocasts generation
    instead); benchmarks/README.md has the measurements."""

    # ---- agents: tools and environments -------------------------------------------------------
    tools: list = field(default_factory=list)
    """Tool functions the model may call, as ``["package.module:function", ...]`` (type hints and a Google-style
    docstring on each: the schema shown to the model comes from ``transformers.utils.get_json_schema``).
    With tools or an environment, rollouts are multi-turn (docs/AGENTS.md)."""
    environment: str | None = None
    """A TRL-style environment class, built once per rollout: a built-in name (``calculator``, ``python``,
    ``search``; ``grouprl list environments``) or ``package.module:ClassName``. Its public methods are the
    tools, ``reset(**row)`` starts a rollout and an optional ``get_reward()`` is added to the reward."""
    max_turns: int = 4
    """Model turns per rollout (generate calls) with tools; a tool call in the last turn ends it (``max_turns``).
    ``max_new_tokens`` bounds the whole trajectory, model and tool tokens together."""
    max_tool_failures: int | None = 3
    """Failed tool calls (malformed, unknown tool, bad arguments, exception, timeout) after which a rollout
    ends (``tool_error_budget``); ``null`` = no limit."""
    tool_timeout_s: float = 10.0
    """Wall-clock limit of one tool call in seconds; a late call returns an error message to the model."""
    max_tool_output_bytes: int | None = 16384
    """The most bytes (UTF-8) of one tool result the model reads; a longer result is cut, with a note, and the
    call counts as failed (``output_too_long``). ``null`` = no limit."""
    max_tool_output_tokens: int | None = 1024
    """The most tokens of one tool result (after the byte cap), cut in the same way. ``null`` = no limit."""
    trajectory_timeout_s: float = 300.0
    """Wall-clock limit of one multi-turn rollout in seconds (``timeout``)."""
    chat_template: str | None = None
    """A ``.jinja`` file (or a Jinja string) replacing the tokenizer's chat template for multi-turn rollouts;
    it must be prefix-preserving (``grouprl check-template`` tells)."""
    max_concurrent_tools: int = 16
    """Tool calls running at once in a multi-turn round (one trajectory's calls run in order; trajectories
    concurrently), each under ``tool_timeout_s``."""
    agent_schedule: str = "per_trajectory"
    """``per_trajectory``: a rollout's next model turn goes to the engine as soon as its own tool calls
    returned (the engine batches whatever is ready); ``lockstep``: every turn waits for the slowest rollout's
    tools (the same engine batches run to run). docs/AGENTS.md, "Scheduling and determinism"."""
    chat_template_kwargs: dict = field(default_factory=dict)
    """Extra variables for the chat template at every rendering (TRL's ``chat_template_kwargs``), e.g.
    ``{enable_thinking: false}`` for Qwen3; passed to ``tokenizer.apply_chat_template``."""

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
    """bf16 mixed precision: fp32 master weights, optimizer and loss; the model's matmuls in bf16 under
    ``torch.autocast``. On a CUDA GPU with bf16 support: every pass. On a CPU with AVX512-BF16 or AMX-BF16:
    the training, old-log-prob and reference passes (fwd+bwd 1.26x faster at hidden 128, 1.59x at 256-512; 0.6x,
    slower, at hidden 64), while generation samples from a bf16 weight copy (``rollout_dtype: auto``) instead of
    autocast. Elsewhere fp32, with one warning. benchmarks/README.md ("bf16 on both sides") has the numbers."""
    device: str = "auto"
    """auto, cpu, cuda or mps."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    logits_chunk_size: int = 1024
    """Positions per chunk through the LM head when computing log-probs (Llama, Qwen2/3, Mistral and other
    models whose logits are a plain linear map of the last hidden state): the ``[N, T, V]`` logits never
    exist, in the forward or the backward (the backward reuses the forward's per-chunk softmax up to 512 MiB
    per micro-batch, then recomputes). 0 = ask the model for the logits of the completion positions."""
    padding_free: Any = "auto"
    """Padding-free log-prob passes (training, reference, old log-probs): each micro-batch's sequences -- the
    real prompt tokens, then the real completion tokens -- are packed end to end into rows of 1-2x its
    longest sequence, with position ids restarting per sequence, so little compute goes to padding; the
    log-probs, entropy and gradients are those of the padded batch up to summation order. ``true`` packs
    every micro-batch, ``false`` never, ``auto`` packs a micro-batch when its estimated cost (token
    positions, attention's share added) is at most 95% of the padded batch's: ragged completions in large
    enough micro-batches (1.1-1.5x faster passes on a CPU), not fixed-length ones (nothing to remove). Needs
    the chunked LM head (logits_chunk_size > 0, Llama / Qwen2-style models) and a model whose attention
    honours packed position ids (checked once by a probe; otherwise the padded path is used).
    benchmarks/README.md has the measurements."""
    ref_dtype: str = "auto"
    """Storage and compute dtype of the frozen reference model (full fine-tuning with kl_coef > 0; a LoRA
    reference shares the policy's weights): ``float32``, ``bfloat16`` (half the memory; log-probs still
    returned in fp32), or ``auto``: bfloat16 when bf16 autocast is in effect (``bf16`` on a CUDA device with
    bf16 support or a CPU with AVX512-BF16 / AMX-BF16), else float32. On a CPU with AVX512-BF16 ``bfloat16``
    made the reference forward 1.7-2.1x faster, with log-probs within ~1e-2 of fp32 (benchmarks/README.md)."""
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

    # ---- vLLM rollouts (rollout_backend: vllm; docs/VLLM.md) ------------------------------------
    vllm_mode: str = "colocate"
    """``colocate``: a vLLM engine inside the training process, on the trainer's GPU; it sleeps while the
    trainer computes and gets the new weights in memory once per generation round. ``server``: a separate
    ``grouprl vllm-serve MODEL`` process on other GPUs; token ids and weights travel over HTTP to
    vllm_server_url (the trainer then needs no vllm package)."""
    vllm_server_url: str = "http://127.0.0.1:8000"
    """Address of the ``grouprl vllm-serve`` server (vllm_mode=server)."""
    vllm_server_timeout: float = 300.0
    """Seconds to wait for the server at start-up and for any one request (a generation, a weight push);
    past it the run stops with an error naming the server address."""
    vllm_gpu_memory_utilization: float = 0.3
    """Fraction of the GPU's memory the colocated engine may take for its weights and KV cache (the trainer
    needs the rest); 0 < value <= 1."""
    vllm_sleep: bool = True
    """Colocate: free the engine's GPU memory while the trainer computes (vLLM sleep mode level 1: KV cache
    dropped, weights offloaded to CPU memory), wake it to take new weights and generate."""
    vllm_max_model_len: int | None = None
    """Longest prompt + completion the engine reserves KV cache for (``None`` = max_prompt_length + the
    larger of max_new_tokens and eval_max_new_tokens)."""
    vllm_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments for ``vllm.LLM`` in colocate mode, e.g. ``{enforce_eager: true}``."""
    rollout_correction: str = "auto"
    """Correction for the sampler/trainer mismatch (an engine's log-probs differ from the trainer's for
    the same weights): ``tis`` = token-level truncated importance sampling, weight min(exp(old_logp -
    rollout_logp), rollout_is_cap) on each token's loss (Yao et al. 2025); ``mask`` = drop sequences whose
    geometric-mean ratio leaves rollout_mask_band; ``none``; ``auto`` = ``tis`` whenever the backend
    reports its own log-probs (vLLM, or rollout_dtype=bfloat16), nothing for the transformers backend in
    fp32 (it samples with the trainer's weights). Logged as mismatch/logp_abs_diff, mismatch/is_weight_mean, mismatch/is_weight_max,
    mismatch/masked_frac."""
    rollout_is_cap: float = 2.0
    """Upper bound of the truncated importance weight (rollout_correction=tis); > 0."""
    rollout_mask_band: list = field(default_factory=lambda: [0.99, 1.01])
    """[low, high] band of the per-sequence geometric-mean ratio exp(mean_t(old_logp - rollout_logp)) kept
    by rollout_correction=mask; 0 < low <= 1 <= high."""
    gspo_use_engine_logp: bool = False
    """Sequence-level losses (gspo, gspo_token): use the engine's log-probs as old_logp, so the ratio is
    pi_theta / pi_engine and corrects the mismatch itself (no separate weight, rollout_correction auto
    becomes none, and the trainer's old-log-prob forward is skipped). Sequence ratios tolerate per-token precision noise (arXiv 2507.18071, on RL infrastructure), but
    the clip range then spends part of its width on the mismatch: see docs/VLLM.md."""

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
    """A checkpoint directory; ``true`` for the latest one in output_dir (none yet: a fresh run); ``auto``:
    resume an unfinished run in output_dir (checkpoints, no complete final/), else start afresh."""
    review_window: int = 100
    """Steps per sample-review window of the run report (``report.html`` in output_dir, rewritten at each
    evaluation and checkpoint): the 20 highest- and 20 lowest-reward completions of each window."""
    reward_changelog: list = field(default_factory=list)
    """Why the rewards of this recipe are what they are: a list of ``{reason, expected_effect, step}`` entries
    (``step`` optional) that the run report shows next to the measured effect."""

    # ---- DPO (``algorithm: dpo``; grouprl.train.algorithms.dpo) -------------------------------------------
    dpo_loss: str = "sigmoid"
    """Preference loss of ``algorithm: dpo``: ``sigmoid`` = DPO, -log sigmoid(beta * h) on the summed
    completion log-probs (Rafailov et al., arXiv:2305.18290, Eq. 7); ``ipo`` = (h - 1/(2 beta))^2 on the
    per-token mean log-probs (Azar et al., arXiv:2310.12036, Eq. 17), h = log-ratio margin of chosen over
    rejected against the reference (the starting model)."""
    dpo_beta: float = 0.1
    """beta of DPO / tau of IPO (> 0): the implicit reward is beta * log(pi / pi_ref); smaller = further from
    the reference."""
    dpo_label_smoothing: float = 0.0
    """cDPO's eps in [0, 0.5): the fraction of pairs assumed mislabelled (``dpo_loss: sigmoid`` only)."""

    # ---- TRL aliases (resolved into the fields above) -------------------------------------------
    beta: float | None = None
    """Alias of kl_coef (TRL's name)."""
    max_completion_length: int | None = None
    """Alias of max_new_tokens (TRL's name)."""

    # ---- run safety ------------------------------------------------------------------------------
    max_rounds_without_reward: int = 3
    """Stop with an error naming the reward functions if none of the first N generation rounds gave any
    sample a reward (every function returned None: e.g. no ``answer`` column for ``accuracy``, no ``tests``
    for ``code``). 0 disables the check."""

    # ---- prompts and checks -----------------------------------------------------------------------
    truncation: str = "left"
    """A prompt longer than max_prompt_length tokens: ``left`` cuts it from the left (keeping the end, where
    the question usually is) and warns once with the count of cut prompts; ``error`` stops at start-up naming
    the first row that is too long."""
    apply_chat_template: str = "auto"
    """When the tokenizer's chat template renders a prompt. ``auto``: chat-message prompts (a list of
    ``{role, content}``) always, plain-text prompts only when system_prompt is set (then they become a user
    message after the system message); a plain-text prompt without system_prompt is fed as written, as
    pretrained base models expect. ``always``: plain text too, as one user message (needs a tokenizer with a
    chat template). ``never``: no template; the message contents (system_prompt first) are joined by new
    lines. Without a chat template, ``auto`` joins the contents in the same way."""


    def __post_init__(self) -> None:
        presets.resolve_aliases(self)
        presets.apply_preset(self)
        self.validate()

    # ------------------------------------------------------------------------------------------
    @property
    def explicit_fields(self) -> frozenset[str]:
        """Names of the fields the user set (a keyword given with a value other than ``None``)."""
        return self.__dict__.get("_explicit", frozenset())

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
        """Check types, values and batch arithmetic; raises ConfigError naming the field, value and fix."""
        validate.validate(self)
        agent.check_agent_fields(self)

    def check_names(self) -> None:
        """Check registry names, the hyper-parameters each chosen function can honour, and that the report_to
        sinks are installed (imports grouprl.algo, still no model)."""
        validate.check_names(self)

    def check_reward_kwargs(self, reward_funcs: Any = None) -> None:
        """Every ``reward_kwargs`` key names a reward in use (``reward_funcs`` or ``eval_reward``)."""
        validate.check_reward_kwargs(self, reward_funcs)

    def resolved(self) -> dict[str, Any]:
        """The functions and hyper-parameters training calls (see :func:`grouprl.config.presets.resolved`)."""
        return presets.resolved(self)

    def loss_hparams(self) -> dict[str, Any]:
        """Keyword arguments for the policy loss: only those its function declares, its own defaults otherwise."""
        return presets.resolved(self)["loss_hparams"]

    def advantage_hparams(self) -> dict[str, Any]:
        """Keyword arguments for the advantage estimator (``scale`` from scale_rewards when it takes one)."""
        return presets.resolved(self)["advantage_hparams"]

    # ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in presets.ALIASES}

    def to_yaml(self, path: str | Path) -> None:
        io.write_yaml(self.to_dict(), path)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GRPOConfig:
        return cls(**io.coerce_all(cls, data))

    @classmethod
    def from_yaml(cls, path: str | Path | None, overrides: list[str] | None = None) -> GRPOConfig:
        """Load a YAML recipe (may be ``None``) and apply ``key=value`` overrides (dotted keys nest)."""
        return cls.from_dict(io.read_yaml(path, overrides))

    @classmethod
    def field_defaults(cls) -> dict[str, str]:
        """field name -> its default as YAML writes it (``null``, ``true``, ``[accuracy]``, ``{}``)."""
        import yaml

        out = {}
        for f in fields(cls):
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out[f.name] = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()
        return out

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
    """Wrap the dataclass ``__init__``: a misspelt keyword is a ConfigError with a did-you-mean, and the
    fields the caller set are remembered (presets and aliases never override them)."""

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        names = [f.name for f in fields(GRPOConfig)]
        for key in kwargs:
            if key not in names:
                raise ConfigError(f"unknown config key {key!r}.{did_you_mean(key, names)} "
                                  f"See `grouprl train --help-config` for every field.")
        given = dict(zip(names, args)) | kwargs
        self.__dict__["_explicit"] = frozenset(k for k, v in given.items() if v is not None)
        init(self, *args, **kwargs)

    return wrapper


GRPOConfig.__init__ = _checked_init(GRPOConfig.__init__)  # type: ignore[method-assign]
