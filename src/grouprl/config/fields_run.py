"""The fields of a run's inputs and objective: data, rewards, the algorithm, PPO's critic, batch and
optimiser (part of :class:`grouprl.config.GRPOConfig`; a docstring under each field is its documentation).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunFields:
    """Data, rewards, algorithm, critic, batch and optimisation."""

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
