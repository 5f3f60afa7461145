"""The fields of engines and bookkeeping: vLLM rollouts, logging and checkpoints, DPO, TRL aliases, run
safety, prompts (part of :class:`grouprl.config.GRPOConfig`; a docstring under each field is its documentation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineAndLogFields:
    """vLLM, logging and checkpoints, DPO, TRL aliases, run safety and prompt handling."""

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

    # ---- asynchronous training (docs/ALGORITHMS.md, "Asynchronous GRPO"; grouprl.train.pipeline) -------
    max_staleness: int = 0
    """``k``: how many optimizer steps older than the trainer's weights a round's samples may be. 0 = the
    synchronous loop (generate, then train, in one process). k >= 1: a rollout worker process with its own
    copy of the weights generates and scores the next rounds while the trainer trains; a round produced by
    the weights of optimizer step v is trained no later than step v + k (else dropped and counted as
    async/dropped). The loss corrects for the lag with the worker's own log-probs (rollout_correction; TRL
    ``max_staleness``, AReaL ``max_head_offpolicyness``, arXiv 2505.24298)."""
    weight_sync_steps: int = 1
    """With max_staleness >= 1: push the trainer's weights to the rollout worker every N optimizer steps
    (over a torch.distributed gloo group); 1 <= N <= max_staleness + 1, so a round the bound admits is
    always reachable."""
    async_timeout_s: float = 300.0
    """With max_staleness >= 1: the longest the trainer waits for the worker's next round or for the worker
    to take a weight push (its start gets at least 120 s: a new process imports torch and transformers);
    past it the run stops with an error naming the worker and the step (the worker is stopped too). > 0."""

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
