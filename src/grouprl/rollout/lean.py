"""A lean sampler for Llama / Qwen2-family decoders: one preallocated KV cache, ~15 tensor ops per layer.

``transformers.generate`` spends most of a small model's decode step outside the matmuls: building the
4D attention mask, the cache object, logits processors and stopping criteria, module dispatch. This path
computes exactly the same function with the model's own parameters (so nothing needs syncing after an
optimizer step) and leaves everything else out:

- the G copies of a prompt are prefilled once and their keys/values repeated (prefix sharing);
- keys/values go into one ``[N, kv_heads, P + T, head_dim]`` buffer per layer, written in place;
- one query per row per step, attention as two small matmuls (query head h reads kv head h // (H/KV),
  as ``repeat_kv`` does);
- logits pass through the same steps as ``generate``'s processors (EOS masked before ``min_new_tokens``,
  temperature, top-k, top-p), then sampling draws one uniform per row and inverts the CDF of the softmax:
  the same distribution as ``torch.multinomial`` without its V exponential draws.

``dtype=torch.bfloat16`` (the ``rollout_dtype`` setting) samples from a bf16 COPY of the weights, made once
per generation round (:func:`copy_weights`, at the weight-sync point), with the KV cache in bf16 and the
final logits cast to fp32 before temperature / top-k / top-p, as vLLM / verl sample in bf16 while training
in fp32 (arXiv 2510.26788 discusses the resulting precision mismatch). The sampler is then not the
trainer's policy, so ``return_logp=True`` also returns its own log-prob of each drawn token (of the
temperature-scaled full softmax, as the trainer computes it) for the mismatch correction
(``grouprl.algo.correction``).

Anything it does not cover (other architectures, LoRA-wrapped layers, rope scaling that depends on the
sequence length, sliding windows) is reported by :func:`unsupported_reason` and the caller
uses ``generate`` instead. Shapes: P unique prompts, n samples each, N = P*n rows, L prompt width,
T = max_new_tokens.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F

ARCHITECTURES = ("qwen2", "llama")
ROPE_TYPES = ("default", "linear", "llama3")  # inv_freq fixed at init; cos/sin depend on position only


def unsupported_reason(model: Any, dtype: torch.dtype | None = None) -> str | None:
    """``None`` when :func:`lean_sample` reproduces ``model.generate`` for this model, else why not
    (with an explicit ``dtype`` autocast does not matter: the sampler runs outside it)."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) not in ARCHITECTURES:
        return f"architecture {getattr(cfg, 'model_type', None)!r} is not one of {ARCHITECTURES}"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ROPE_TYPES:
        return f"rope_type {rope.get('rope_type')!r}"
    if getattr(cfg, "use_sliding_window", False) or any(
            t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return "sliding-window attention"
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return "activation / tensor-parallel layout"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
        return "unexpected module layout"
    linear = torch.nn.Linear
    for layer in layers:
        a, m = layer.self_attn, layer.mlp
        mods = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj, model.lm_head)
        if any(type(x) is not linear for x in mods):  # LoRA or quantised layers: let generate handle them
            return "wrapped linear layers (LoRA / quantisation)"
    if dtype is None and torch.is_autocast_enabled(model.lm_head.weight.device.type):
        return "autocast is active"
    return None


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as transformers computes it (fp32 statistics, weight applied after casting back)."""
    if x.dtype == torch.float32:  # one fused op; the same formula in fp32
        return F.rms_norm(x, weight.shape, weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _cat(*ts):
    return None if ts[0] is None else torch.cat(ts, dim=0)


class _Weights:
    """The model's parameters, with q/k/v and gate/up fused (concatenated once per call); ``dtype``: a copy
    in that dtype (tied embedding / LM head weights copied once)."""

    def __init__(self, model: Any, dtype: torch.dtype | None = None) -> None:
        cfg, inner = model.config, model.model
        memo: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (source kept alive, copy)

        def cast(t):
            if t is None or dtype is None or t.dtype == dtype:
                return t
            if id(t) not in memo:
                memo[id(t)] = (t, t.detach().to(dtype))
            return memo[id(t)][1]

        self.dtype = dtype
        # keys stored transposed, [N, KV, D, P + T], for a copy: CPU bf16 matmuls copy a transposed operand
        # on every call (q @ K^T), while q @ K_t reads it as is
        self.keys_t = dtype is not None
        self.H, self.KV = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
        self.I = cfg.intermediate_size
        self.eps = cfg.rms_norm_eps
        self.embed = cast(inner.embed_tokens.weight)
        self.norm = cast(inner.norm.weight)
        self.head_w, self.head_b = cast(model.lm_head.weight), cast(model.lm_head.bias)
        self.inv_freq = inner.rotary_emb.inv_freq.float()
        self.rope_scale = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((
                cast(layer.input_layernorm.weight),
                cast(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach()),
                cast(_cat(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)),
                cast(a.o_proj.weight), cast(a.o_proj.bias),
                cast(layer.post_attention_layernorm.weight),
                cast(torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach()),
                cast(_cat(m.gate_proj.bias, m.up_proj.bias)),
                cast(m.down_proj.weight), cast(m.down_proj.bias),
                float(a.scaling),
            ))

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, sin ``[..., 1, D]`` for integer ``positions [...]`` (broadcast over heads)."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.rope_scale).to(dtype).unsqueeze(-3),
                (emb.sin() * self.rope_scale).to(dtype).unsqueeze(-3))


def _layer(w: _Weights, x, params, k_buf, v_buf, start: int, cos, sin, bias):
    """One decoder layer on ``x [R, S, hidden]`` whose keys/values go to columns ``start:start+S``."""
    w_in, w_qkv, b_qkv, w_o, b_o, w_post, w_gu, b_gu, w_down, b_down, scaling = params
    R, S, _ = x.shape
    H, KV, D = w.H, w.KV, w.D
    qkv = F.linear(_rms(x, w_in, w.eps), w_qkv, b_qkv)
    qk = _rotate(qkv[..., :(H + KV) * D].view(R, S, H + KV, D).transpose(1, 2), cos, sin)  # q and k at once
    if w.keys_t:
        k_buf[..., start:start + S] = qk[:, H:].transpose(-1, -2)
    else:
        k_buf[:, :, start:start + S] = qk[:, H:]
    v_buf[:, :, start:start + S] = qkv[..., (H + KV) * D:].view(R, S, KV, D).transpose(1, 2)
    q = qk[:, :H].reshape(R, KV, (H // KV) * S, D)  # query head h -> kv head h // (H / KV)
    keys = k_buf[..., :start + S] if w.keys_t else k_buf[:, :, :start + S].transpose(-1, -2)
    att = torch.matmul(q, keys) * scaling
    att = torch.softmax(att.view(R, KV, H // KV, S, start + S) + bias, dim=-1)
    o = torch.matmul(att.view(R, KV, (H // KV) * S, start + S), v_buf[:, :, :start + S])
    o = o.view(R, H, S, D).transpose(1, 2).reshape(R, S, H * D)
    x = x + F.linear(o, w_o, b_o)
    gu = F.linear(_rms(x, w_post, w.eps), w_gu, b_gu)
    return x + F.linear(F.silu(gu[..., :w.I]) * gu[..., w.I:], w_down, b_down)


def _logits(w: _Weights, x: torch.Tensor) -> torch.Tensor:
    return F.linear(_rms(x, w.norm, w.eps), w.head_w, w.head_b).float()


def _warp(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as transformers' logits warpers do (same order, same ties)."""
    logits = logits / temperature if temperature != 1.0 else logits
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        drop = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        drop[:, -1] = False  # keep at least the most likely token
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return logits


def _draw(logits: torch.Tensor, temperature: float, generator: torch.Generator | None, top_k: int = 0,
          top_p: float = 1.0) -> torch.Tensor:
    """One token per row from the warped softmax of ``logits``; greedy (argmax) when temperature == 0."""
    if temperature == 0:
        return logits.argmax(-1)
    cdf = torch.softmax(_warp(logits, temperature, top_k, top_p), dim=-1).cumsum_(-1)
    # u in (0, 1]: the first index with cdf >= u * total has positive probability
    u = 1.0 - torch.rand(logits.shape[0], 1, generator=generator, device=logits.device)
    return torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(1).clamp_(max=logits.shape[-1] - 1)


def copy_weights(model: Any, dtype: torch.dtype | None = None) -> _Weights:
    """The sampler's weights: views of the model's parameters, or (``dtype``) a copy in that dtype. Make a
    copy once per generation round, after the optimizer step, and pass it to :func:`lean_sample`."""
    with torch.no_grad():
        return _Weights(model, dtype)


def lean_sample(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int, *,
                max_new_tokens: int, min_new_tokens: int = 0, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0, eos_token_ids: list[int] | tuple[int, ...] = (), pad_token_id: int = 0,
                generator: torch.Generator | None = None, weights: _Weights | None = None,
                return_logp: bool = False):
    """``n`` completions of each left-padded prompt: ``completion_ids [P*n, T]``, rows grouped by prompt.

    Same distribution as ``model.generate(do_sample=True, temperature=..., top_k=..., top_p=...)`` on the
    prompts repeated ``n`` times (``temperature == 0``: greedy, identical tokens; ``top_k == 0`` is off).
    After a row's EOS the row holds ``pad_token_id``; the result is cut at the step where every row has
    finished. EOS cannot be drawn before ``min_new_tokens``. ``weights``: from :func:`copy_weights` (e.g. a
    bf16 copy); default the model's own. ``return_logp``: also ``logp [P*n, T]`` fp32, the log-prob of each
    drawn token under ``log_softmax(logits / temperature)`` (no top-k / top-p / EOS masking, as the trainer
    scores it; temperature 0 scores at 1), 0 after a row's end.
    """
    # inference_mode: less per-op bookkeeping than no_grad; the result is cloned out of it so that the
    # training forward may use it (inference tensors cannot be saved for backward)
    own_dtype = weights is not None and weights.dtype is not None  # a copy in its own dtype: no autocast
    off = torch.autocast(input_ids.device.type, enabled=False) if own_dtype else contextlib.nullcontext()
    with torch.inference_mode(), off:
        w = weights if weights is not None else _Weights(model)
        state = _prefill(w, input_ids, attention_mask, n, max_new_tokens)
        out, logp = _decode(w, state, max_new_tokens, min_new_tokens, temperature, top_k, top_p, eos_token_ids,
                            pad_token_id, generator, want_logp=return_logp)
    return (out.clone(), logp.clone()) if return_logp else out.clone()


def _prefill(w: _Weights, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int, T: int) -> dict:
    """One forward over the P unique prompts; their keys/values copied n times into [N, KV, L + T, D]."""
    P, L = input_ids.shape
    dev, dtype = input_ids.device, w.embed.dtype
    mask = attention_mask.bool()
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # as generate does with left padding
    # causal and padding mask; a padded query attends to itself so that no row of the softmax is empty
    eye = torch.eye(L, dtype=torch.bool, device=dev)
    allowed = (torch.ones(L, L, dtype=torch.bool, device=dev).tril() & mask[:, None, :]) | eye
    bias = torch.zeros(P, 1, 1, L, L, device=dev, dtype=dtype)
    bias.masked_fill_(~allowed[:, None, None], float("-inf"))
    k_shape = (P, w.KV, w.D, L) if w.keys_t else (P, w.KV, L, w.D)
    k_bufs = [torch.empty(k_shape, device=dev, dtype=dtype) for _ in w.layers]
    v_bufs = [torch.empty(P, w.KV, L, w.D, device=dev, dtype=dtype) for _ in w.layers]
    cos, sin = w.rope(positions, dtype)
    x = F.embedding(input_ids, w.embed)
    for params, kb, vb in zip(w.layers, k_bufs, v_bufs):
        x = _layer(w, x, params, kb, vb, 0, cos, sin, bias)
    ks, vs = [], []
    for kb, vb in zip(k_bufs, v_bufs):
        v = torch.empty(P * n, w.KV, L + T, w.D, device=dev, dtype=dtype)
        k = torch.empty(P * n, w.KV, w.D, L + T, device=dev, dtype=dtype) if w.keys_t else torch.empty_like(v)
        v[:, :, :L] = vb.repeat_interleave(n, dim=0)
        (k[..., :L] if w.keys_t else k[:, :, :L]).copy_(kb.repeat_interleave(n, dim=0))
        ks.append(k)
        vs.append(v)
    key_bias = torch.zeros(P * n, 1, 1, 1, L + T, device=dev, dtype=dtype)
    key_bias[..., :L].masked_fill_(~mask.repeat_interleave(n, dim=0)[:, None, None, None], float("-inf"))
    next_positions = positions[:, -1:].repeat_interleave(n, dim=0) + 1 + torch.arange(T, device=dev)
    cos_all, sin_all = w.rope(next_positions, dtype)  # [N, 1, T, D]
    return {"logits": _logits(w, x[:, -1]).repeat_interleave(n, dim=0), "ks": ks, "vs": vs, "L": L,
            "key_bias": key_bias, "cos": cos_all, "sin": sin_all}


def _decode(w: _Weights, state: dict, T: int, min_new_tokens: int, temperature: float, top_k: int,
            top_p: float, eos_token_ids, pad_token_id: int, generator, want_logp: bool = False,
            forced: torch.Tensor | None = None):
    """Draw a token per row (``forced [N, T]``: take these instead), then run one position through every
    layer; T times or until all rows end. Returns ``(tokens [N, t], logp [N, t] or None)``."""
    logits, ks, vs, L = state["logits"], state["ks"], state["vs"], state["L"]
    N, dev = logits.shape[0], logits.device
    eos = torch.tensor(list(eos_token_ids), dtype=torch.long, device=dev)
    finished = torch.zeros(N, dtype=torch.bool, device=dev)
    out = torch.full((N, T), pad_token_id, dtype=torch.long, device=dev)
    logp = torch.zeros((N, T), dtype=torch.float32, device=dev) if want_logp else None
    for t in range(T):
        scaled = logits / temperature if want_logp and temperature not in (0, 1.0) else logits
        lse = torch.logsumexp(scaled, dim=-1) if want_logp else None  # before the EOS mask: the trainer's softmax
        if t < min_new_tokens and eos.numel():
            logits = logits.index_fill(1, eos, float("-inf"))
        token = _draw(logits, temperature, generator, top_k, top_p) if forced is None else forced[:, t]
        if want_logp:
            row_logp = scaled.gather(1, token[:, None]).squeeze(1) - lse
            logp[:, t] = row_logp.masked_fill(finished, 0.0)
        if t > 0 and t >= min_new_tokens:
            token = token.masked_fill(finished, pad_token_id)
        out[:, t] = token
        if eos.numel() and t + 1 >= min_new_tokens:
            finished |= torch.isin(token, eos)
            if bool(finished.all()):
                return out[:, :t + 1], None if logp is None else logp[:, :t + 1]
        if t == T - 1:
            break
        x = F.embedding(token, w.embed).unsqueeze(1)  # [N, 1, hidden]
        cos, sin = state["cos"][:, :, t:t + 1], state["sin"][:, :, t:t + 1]
        for params, k, v in zip(w.layers, ks, vs):
            x = _layer(w, x, params, k, v, L + t, cos, sin, state["key_bias"][..., :L + t + 1])
        logits = _logits(w, x[:, -1])
    return out, logp
