"""Per-token log-probs of completions, the memory-lean way (docs/DESIGN.md, "Layout": train/engine/).

Memory and padding: every forward first drops the columns that are padding in every row of its
micro-batch (:func:`trim_padding`). For causal LMs whose logits are a plain linear map of the last hidden
state (Llama, Qwen2/3, Mistral, ...) the decoder runs to that hidden state and only the real completion
tokens go through the LM head, ``logits_chunk_size`` positions at a time in the forward and the backward
(:mod:`grouprl.algo.lmhead`): the ``[N, T, V]`` logits never exist (the backward reuses each chunk's softmax,
kept from the forward up to ``lmhead.KEEP_SOFTMAX_BYTES`` per call, and recomputes the rest). Other models
are asked for the logits of the completion positions only (``logits_to_keep = T + 1``) and take the chunked
``selective_log_softmax``. With ``padding_free`` (the config field) the decoder runs instead on the
micro-batch's sequences packed end to end into fewer rows (:mod:`grouprl.train.engine.packing`), so padding
is not computed either. ``plain=True`` is the straightforward path (full logits, full ``log_softmax``) kept
for equivalence tests.

Shapes: N sequences in the micro-batch, P prompt tokens (left-padded), T completion tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from grouprl.algo.lmhead import linear_log_softmax
from grouprl.algo.ops import entropy_from_logits, selective_log_softmax
from grouprl.train.engine import packing

DEFAULT_LOGITS_CHUNK = 1024  # positions per chunk through the LM head (benchmarks/logits_memory.py)
# Causal LMs whose logits are exactly ``lm_head(decoder(...).last_hidden_state)``: no soft-capping (Gemma 2/3),
# no logit scaling (Granite, Cohere). Any other model takes the logits_to_keep path.
PLAIN_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "olmo2", "gemma"})


def lm_head_parts(model: Any) -> tuple[Any, torch.Tensor, torch.Tensor | None] | None:
    """``(decoder, weight [V,H], bias [V] or None)`` of a causal LM whose logits are a plain linear map of
    the decoder's last hidden state (its final norm included), or None where that is not known to hold:
    an architecture outside :data:`PLAIN_HEAD_MODELS`, a subclass with its own ``forward``, an LM head that
    is not an ``nn.Linear`` (LoRA on the head), sharded weights (FSDP), which only the model's own forward
    gathers, or forward hooks or an instance-level ``forward`` (a wrapper) on the model or its head, which
    calling the decoder directly would skip."""
    base = model.get_base_model() if hasattr(model, "get_base_model") and hasattr(model, "peft_config") else model
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODELS or type(base).__name__.startswith("FSDP"):
        return None
    if not getattr(type(base).forward, "__module__", "").startswith("transformers."):
        return None
    head, decoder = base.get_output_embeddings(), getattr(base, "model", None)
    if type(head) is not torch.nn.Linear or decoder is None or hasattr(head.weight, "placements"):
        return None
    if any(m._forward_hooks or m._forward_pre_hooks or "forward" in vars(m) for m in {model, base, head}):
        return None
    return decoder, head.weight, head.bias


def trim_padding(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                 completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop the prompt columns that are padding in every row (left) and the completion columns that are
    padding in every row (right); at least one prompt column stays (it predicts the first completion token).

    Position ids follow the attention mask and padded keys are masked out, so the remaining positions
    score exactly as before; the model simply computes nothing for the dropped columns.
    """
    real = prompt_mask.bool().any(dim=0).nonzero()
    first = int(real[0]) if len(real) else prompt_ids.shape[1] - 1
    used = completion_mask.bool().any(dim=0).nonzero()
    width = int(used[-1]) + 1 if len(used) else 0
    return prompt_ids[:, first:], prompt_mask[:, first:], completion_ids[:, :width], completion_mask[:, :width]


def completion_logps(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                     completion_ids: torch.Tensor, completion_mask: torch.Tensor, temperature: float = 1.0,
                     *, with_entropy: bool = False, plain: bool = False, chunk_size: int = DEFAULT_LOGITS_CHUNK,
                     padding_free: bool | str = False):
    """log pi(y_t | x, y_<t) for every completion token: ``[N,T]`` (and the entropy ``[N,T]`` if asked).

    Logits are divided by ``temperature`` in fp32 (whatever the compute dtype) so the log-probs are those of
    the sampling distribution. Position ids follow the attention mask, as in ``generate`` with left padding.

    Unless ``plain``: all-padding columns are trimmed first (:func:`trim_padding`), and where the model's
    LM head is a plain linear map (:func:`lm_head_parts`) and ``chunk_size > 0``, the decoder's last hidden
    state at the real completion tokens goes through the head ``chunk_size`` positions at a time
    (:func:`grouprl.algo.lmhead.linear_log_softmax`): no ``[N,T,V]`` logits in the forward or the backward,
    and none computed for padding. Padding positions then hold 0 (log-prob and entropy); on the other paths
    only the trimmed columns do. Callers weight every position by a mask, so no value at padding is used.

    ``padding_free`` (the config field of the same name; on the chunked-head path only): ``True`` packs the
    sequences' real tokens into rows with per-sequence position ids (:mod:`grouprl.train.engine.packing`) where
    the model passes the packing probe; ``"auto"`` does so only where the packed rows' estimated cost
    (:func:`grouprl.train.engine.packing.row_cost`) is at most :data:`AUTO_PACK_RATIO` of the trimmed batch's;
    ``False`` never. The result is the same ``[N, T]``.
    """
    T = completion_ids.shape[1]
    if not plain:
        prompt_ids, prompt_mask, completion_ids, completion_mask = trim_padding(
            prompt_ids, prompt_mask, completion_ids, completion_mask)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention = torch.cat([prompt_mask, completion_mask], dim=1)
    position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
    width = completion_ids.shape[1]
    head = None if plain or chunk_size <= 0 else lm_head_parts(model)
    if plain:
        logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                       use_cache=False).logits
        logits = logits[:, -T - 1:-1].float() / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    elif head is not None:
        hidden = _packed_hidden(model, head, prompt_ids, prompt_mask, completion_ids, completion_mask, padding_free)
        if hidden is None:
            hidden = head[0](input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                             use_cache=False).last_hidden_state[:, -width - 1:-1][completion_mask.bool()]
        return _chunked_head(head, hidden, completion_ids, completion_mask, temperature, chunk_size,
                             with_entropy, T)
    else:
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                    logits_to_keep=width + 1, use_cache=False)
        logits = out.logits[:, :-1].float() / temperature  # fp32: a bf16 division rounds every logit
        logp = _pad_right(selective_log_softmax(logits, completion_ids), T)
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        entropy = entropy_from_logits(logits.detach())
    return logp, entropy if plain else _pad_right(entropy, T)


def _pad_right(x: torch.Tensor, T: int) -> torch.Tensor:
    return x if x.shape[1] == T else torch.nn.functional.pad(x, (0, T - x.shape[1]))


# "auto" packs a micro-batch when the packed rows' estimated cost (grouprl.train.engine.packing.row_cost: token
# positions, attention share added) is at most this fraction of the trimmed batch's (benchmarks/README.md,
# "Padding-free packing").
AUTO_PACK_RATIO = 0.95


def _packed_hidden(model, head, prompt_ids, prompt_mask, completion_ids, completion_mask, padding_free):
    """The decoder's last hidden state at the position predicting each real completion token ``[K, H]``
    (row-major order of ``completion_mask``) from packed rows, or None to take the padded path: packing
    off, not applicable (:func:`grouprl.train.engine.packing.pack`), not paying (``auto``), or unsupported."""
    if padding_free is False:
        return None
    decoder, weight = head[0], head[1]
    hidden_size = weight.shape[1]
    packed = packing.pack(prompt_ids, prompt_mask, completion_ids, completion_mask, hidden_size=hidden_size)
    if packed is None:
        return None
    padded_cost = packing.row_cost(prompt_ids.shape[0], prompt_ids.shape[1] + completion_ids.shape[1], hidden_size)
    if padding_free == "auto" and packed.cost > AUTO_PACK_RATIO * padded_cost:
        return None
    if not packing.packing_supported(decoder, model, weight.shape[0], prompt_ids.device):
        return None
    hidden = decoder(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                     use_cache=False).last_hidden_state
    return hidden.reshape(-1, hidden.shape[-1])[packed.predict_index]


def _chunked_head(head, hidden, completion_ids, completion_mask, temperature, chunk_size, with_entropy, T):
    """Log-probs (and entropy) of the real completion tokens from the hidden states predicting them
    (``hidden [K, H]``, row-major order of ``completion_mask``) through the head, scattered to ``[N, T]``."""
    _, weight, bias = head
    real = completion_mask.bool()
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    lp, ent = linear_log_softmax(hidden, weight, completion_ids[real], bias=bias, temperature=temperature,
                                 chunk_size=chunk_size, compute_dtype=dtype, with_entropy=with_entropy)
    shape = (completion_ids.shape[0], T)
    logp = torch.zeros(shape, dtype=lp.dtype, device=lp.device).masked_scatter(_pad_right(real, T), lp)
    if not with_entropy:
        return logp, None
    return logp, torch.zeros(shape, dtype=ent.dtype, device=ent.device).masked_scatter(_pad_right(real, T), ent)


@torch.no_grad()
def batched_logps(model: Any, rows: list[Any], temperature: float, autocast: Any, *,
                  chunk_size: int = DEFAULT_LOGITS_CHUNK, padding_free: bool | str = False) -> list[torch.Tensor]:
    """log-probs of each micro-batch without gradient (reference or old policy), with dropout off; padding
    trimmed, the LM head chunked and the sequences packed as in :func:`completion_logps` (``chunk_size``,
    ``padding_free``).

    The model is put in eval mode for these forwards and back in the mode it was in afterwards.
    """
    was_training = model.training
    model.eval()
    try:
        return _logps(model, rows, temperature, autocast, chunk_size, padding_free)
    finally:
        model.train(was_training)


def _logps(model: Any, rows: list[Any], temperature: float, autocast: Any, chunk_size: int,
           padding_free: bool | str = False) -> list[torch.Tensor]:
    out = []
    for mb in rows:
        if mb.prompt_ids.shape[0] == 0:  # a micro-batch emptied by dropped groups
            out.append(torch.zeros(mb.completion_ids.shape, dtype=torch.float32, device=mb.completion_ids.device))
            continue
        with autocast():
            logp, _ = completion_logps(model, mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                       mb.completion_mask, temperature, chunk_size=chunk_size,
                                       padding_free=padding_free)
        out.append(logp.float())
    return out
