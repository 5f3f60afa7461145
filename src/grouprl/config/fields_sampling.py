"""The fields of sampling: generation, agents (tools and environments), evaluation, precision and device
(part of :class:`grouprl.config.GRPOConfig`; a docstring under each field is its documentation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SamplingFields:
    """Generation, agents, evaluation, precision, device and memory."""

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
