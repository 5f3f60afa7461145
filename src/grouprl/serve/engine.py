"""The batching decode loop behind ``grouprl serve``: every request in flight advances one token per step.

One thread owns the model. Requests (``Job``: a prompt, ``n`` choices, one ``Sampling``) wait in a queue;
at every step the loop admits the waiting ones that fit in ``max_batch`` rows, prefills them as one
left-padded batch, and merges their KV cache into the running one (each layer's keys and values are
left-padded to a common length and concatenated along the batch; padded slots are masked out, and
positions are counted per row, so a row computes what it would compute alone). Then one forward pass
decodes one token for every row. Rows that finish -- or whose client went away (``Job.cancel``) -- leave
the batch at once (``batch_select_indices``) and the columns no row needs any more are trimmed, so their
slots and compute go to the next request. This is iteration-level scheduling (Orca, OSDI'22; vLLM's
continuous batching, arXiv:2309.06180) without paged memory: a cache is a plain ``DynamicCache``.
Models whose cache layers are not plain full-attention ``DynamicLayer``s (sliding windows) are not
merged: new requests then wait until the running batch drains.

Each row picks its own token: greedy at ``temperature=0``, else a draw from ``softmax(logits / T)``
restricted to the ``top_p`` nucleus with the row's own ``torch.Generator`` (seeded from ``seed`` + the
choice index, so the same seed gives the same reply), or constrained by a JSON grammar
(:mod:`grouprl.serve.constrained`). Log-probs are those of the model's own distribution (temperature
1, before ``top_p`` and any constraint), as vLLM reports them. Every wait is bounded: a job waits at
most ``queue_timeout_s`` to be admitted, and a row decodes at most ``max_new_tokens`` tokens or until
its deadline (``finish_reason="length"`` either way).
"""

from __future__ import annotations

import inspect
import logging
import queue
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from grouprl.serve.constrained import TokenTexts, pick_constrained
from grouprl.serve.grammar import Grammar

log = logging.getLogger("grouprl.serve")


@dataclass
class Sampling:
    """What one request asks of every one of its choices."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    grammar: Grammar | None = None
    ban: str | None = None  # text the reply may never contain (tool_choice "none" bans the tool-call tag)
    hold: str | None = None  # while streaming, text from here on is held back (a tool-call block)
    end_after: str | None = None  # the reply ends right after this text (parallel_tool_calls=false)
    max_time_s: float = 60.0


@dataclass
class Row:
    """One choice being decoded."""

    job: Job
    index: int
    gen: torch.Generator
    ids: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0  # characters of text already streamed
    logprobs: list[dict] = field(default_factory=list)
    lp_emitted: int = 0
    finish: str | None = None


class Job:
    """One request: its events arrive in ``events`` as ``("delta", index, text, logprobs)``,
    ``("done", index, Row)`` and finally ``("end", None)``, or ``("error", status, message)``."""

    def __init__(self, prompt_ids: list[int], n: int, sampling: Sampling, *, stream: bool = False) -> None:
        self.prompt_ids, self.n, self.sampling, self.stream = list(prompt_ids), int(n), sampling, stream
        self.events: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        self.submitted = time.monotonic()
        self.deadline = 0.0
        self.rows: list[Row] = []
        self._open = 0

    def cancel(self) -> None:
        """The client went away: the job's rows leave the batch at the next step."""
        self.cancelled.set()


def _held(text: str, s: Sampling) -> int:
    """How much of ``text`` may be streamed before the row finishes: never a partial character, a possible
    start of a stop string, or anything from the tool-call tag on (the server sends the rest at the end,
    once the reply's content and tool calls are known)."""
    end = len(text)
    if s.hold is not None:
        at = text.find(s.hold)
        if at >= 0:
            return at
    for word in [*s.stop, *([s.hold] if s.hold else [])]:
        for k in range(min(len(word) - 1, len(text)), 0, -1):
            if text.endswith(word[:k]):
                end = min(end, len(text) - k)
                break
    while end and text[end - 1] == "\ufffd":
        end -= 1
    return end


class Engine:
    """The decode loop (module docstring). ``submit(job)`` queues a request; ``close()`` stops the thread."""

    def __init__(self, model: Any, tokenizer: Any, stop_ids: list[int], *, max_batch: int = 32,
                 queue_timeout_s: float = 120.0) -> None:
        self.model, self.tokenizer, self.stop_ids = model, tokenizer, set(stop_ids)
        self.max_batch, self.queue_timeout_s = int(max_batch), float(queue_timeout_s)
        self.device = next(model.parameters()).device
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.stats = {"steps": 0, "max_batch": 0, "cancelled": 0, "admitted": 0}
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._rows: list[Row] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None
        self._logits: torch.Tensor | None = None
        self._vocab: TokenTexts | None = None
        self._mergeable: bool | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="grouprl-serve-engine")
        self._thread.start()

    # ---- the queue --------------------------------------------------------------------------------------
    def submit(self, job: Job) -> Job:
        with self._cond:
            self._waiting.append(job)
            self._cond.notify()
        return job

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=10)

    def vocab(self) -> TokenTexts:
        if self._vocab is None:
            self._vocab = TokenTexts(self.tokenizer)
        return self._vocab

    def _take(self) -> list[Job]:
        """Waiting jobs that fit in the free rows (expired and cancelled ones are answered and dropped)."""
        with self._cond:
            while not self._waiting and not self._rows and not self._stopped:
                self._cond.wait(timeout=0.5)
            if self._rows and self._mergeable is False:
                return []
            free, taken, keep = self.max_batch - len(self._rows), [], deque()
            now = time.monotonic()
            while self._waiting:
                job = self._waiting.popleft()
                if job.cancelled.is_set():
                    self.stats["cancelled"] += 1
                elif now - job.submitted > self.queue_timeout_s:
                    job.events.put(("error", 503, f"the server was busy: the request waited {self.queue_timeout_s:g}s "
                                                  f"for a free slot of the {self.max_batch} (--max-batch) rows"))
                elif job.n <= free:
                    free -= job.n
                    taken.append(job)
                else:
                    keep.append(job)
            self._waiting = keep
            return taken

    def _loop(self) -> None:
        while not self._stopped:
            try:
                jobs = self._take()
                if jobs:
                    self._admit(jobs)
                if self._rows:
                    self._step()
            except Exception as e:  # a failed forward fails the requests in flight, never the server
                log.exception("serve: the decode step failed")
                for job in {id(r.job): r.job for r in self._rows}.values():
                    job.events.put(("error", 500, f"generation failed: {type(e).__name__}: {e}"))
                self._rows, self._cache, self._mask, self._logits = [], None, None, None

    # ---- prefill and merge ------------------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1]:]
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                             **{self.cache_arg: cache}, logits_to_keep=1)
        return out.logits[:, -1].float(), getattr(out, "cache", None) or out.past_key_values

    def _admit(self, jobs: list[Job]) -> None:
        from transformers import DynamicCache

        width = max(len(j.prompt_ids) for j in jobs)
        ids = torch.full((len(jobs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for i, job in enumerate(jobs):
            ids[i, width - len(job.prompt_ids):] = torch.tensor(job.prompt_ids)
            mask[i, width - len(job.prompt_ids):] = 1
        mask = mask.to(self.device)
        logits, cache = self._forward(ids.to(self.device), mask, DynamicCache())
        self.can_merge(cache)  # decided on the first prefill: _take admits into a running batch only if True
        order = [i for i, job in enumerate(jobs) for _ in range(job.n)]
        if order != list(range(len(jobs))):
            cache.batch_select_indices(torch.tensor(order, device=self.device))
            logits, mask = logits[order], mask[order]
        rows = []
        now = time.monotonic()
        for job in jobs:
            job.deadline, job._open = now + job.sampling.max_time_s, job.n
            for k in range(job.n):
                seed = job.sampling.seed if job.sampling.seed is not None else random.getrandbits(62)
                row = Row(job, k, torch.Generator().manual_seed(int(seed) + k))
                job.rows.append(row)
                rows.append(row)
        self.stats["admitted"] += len(jobs)
        if not self._rows:
            self._rows, self._cache, self._mask, self._logits = rows, cache, mask, logits
        else:
            self._merge(rows, cache, mask, logits)
        self.stats["max_batch"] = max(self.stats["max_batch"], len(self._rows))

    def can_merge(self, cache: Any) -> bool:
        """Plain full-attention cache layers (``keys``/``values`` of shape [B, H, T, D]) can be merged."""
        if self._mergeable is None:
            layers = getattr(cache, "layers", None)
            self._mergeable = bool(layers) and all(
                type(layer).__name__ == "DynamicLayer" and getattr(layer, "keys", None) is not None for layer in layers)
        return self._mergeable

    def _merge(self, rows: list[Row], cache: Any, mask: torch.Tensor, logits: torch.Tensor) -> None:
        if not (self.can_merge(self._cache) and self.can_merge(cache)):
            raise RuntimeError("cannot merge KV caches of this model (sliding-window layers?)")
        width = max(self._mask.shape[1], mask.shape[1])

        def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
            extra = width - t.shape[dim]
            if extra == 0:
                return t
            shape = list(t.shape)
            shape[dim] = extra
            return torch.cat([t.new_zeros(shape), t], dim=dim)

        for mine, theirs in zip(self._cache.layers, cache.layers):
            mine.keys = torch.cat([pad(mine.keys, 2), pad(theirs.keys, 2)])
            mine.values = torch.cat([pad(mine.values, 2), pad(theirs.values, 2)])
        self._mask = torch.cat([pad(self._mask, 1), pad(mask, 1)])
        self._logits = torch.cat([self._logits, logits])
        self._rows += rows

    # ---- one decode step --------------------------------------------------------------------------------
    def _step(self) -> None:
        self.stats["steps"] += 1
        logits = self._logits.cpu()
        now = time.monotonic()
        tokens = []
        for i, row in enumerate(self._rows):
            if row.job.cancelled.is_set():
                row.finish = "cancelled"
                tokens.append(self.pad_id)
                continue
            token = self._pick(row, logits[i])
            tokens.append(self.pad_id if token is None else token)
            self._advance(row, token, now)
        self._emit()
        keep = [i for i, row in enumerate(self._rows) if row.finish is None]
        if len(keep) < len(self._rows):
            self._drop(keep)
        if not self._rows:
            return
        new = torch.tensor([[tokens[i]] for i in keep], device=self.device)
        self._mask = torch.cat([self._mask, self._mask.new_ones((len(keep), 1))], dim=1)
        self._logits, self._cache = self._forward(new, self._mask, self._cache)

    def _drop(self, keep: list[int]) -> None:
        self.stats["cancelled"] += len({id(r.job) for r in self._rows if r.finish == "cancelled"})
        self._rows = [self._rows[i] for i in keep]
        if not self._rows:
            self._cache, self._mask, self._logits = None, None, None
            return
        index = torch.tensor(keep, device=self.device)
        self._cache.batch_select_indices(index)
        self._mask, self._logits = self._mask[index], self._logits[index]
        used = self._mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        if start and self.can_merge(self._cache):  # columns every remaining row pads: trim them
            for layer in self._cache.layers:
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
            self._mask = self._mask[:, start:]

    def _pick(self, row: Row, logits: torch.Tensor) -> int | None:
        s = row.job.sampling
        if s.logprobs:
            row.logprobs.append({"_lp": torch.log_softmax(logits, dim=-1)})
        work = logits
        if s.temperature > 0 and s.top_p < 1.0:
            work = top_p_filter(logits / s.temperature, s.top_p) * s.temperature
        if s.grammar is not None:
            return pick_constrained(work, s.grammar, row.text, self.vocab(), s.temperature, row.gen,
                                    budget=s.max_new_tokens - len(row.ids) - 1)
        work = work.clone()
        for _ in range(16):
            if s.temperature > 0:
                token = int(torch.multinomial(torch.softmax(work / s.temperature, dim=-1), 1, generator=row.gen))
            else:
                token = int(torch.argmax(work))
            if s.ban is None or token in self.stop_ids or s.ban not in self._decode(row.ids + [token]):
                return token
            work[token] = -float("inf")
        return None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _advance(self, row: Row, token: int | None, now: float) -> None:
        s = row.job.sampling
        if token is None:  # no token the constraint allows
            row.finish = "stop"
            return
        if token in self.stop_ids and s.grammar is None:
            row.finish = "stop"
            self._logprob(row, token)
            return
        row.ids.append(token)
        self._logprob(row, token)
        before = len(row.text)
        row.text = self._decode(row.ids)
        for word in s.stop:
            at = row.text.find(word, max(0, before - len(word)))
            if at >= 0:
                row.text, row.finish = row.text[:at], "stop"
        if row.finish is None and s.end_after is not None and s.end_after in row.text:
            row.text = row.text[:row.text.index(s.end_after) + len(s.end_after)]
            row.finish = "stop"
        if row.finish is None and s.grammar is not None and s.grammar.complete(row.text):
            row.finish = "stop"
        if row.finish is None and (len(row.ids) >= s.max_new_tokens or now > row.job.deadline):
            row.finish = "length"

    def _logprob(self, row: Row, token: int) -> None:
        s = row.job.sampling
        if not s.logprobs:
            return
        lp = row.logprobs[-1].pop("_lp")
        row.logprobs[-1] = self._entry(token, float(lp[token]))
        if s.top_logprobs:
            values, ids = torch.topk(lp, min(s.top_logprobs, lp.numel()))
            row.logprobs[-1]["top_logprobs"] = [self._entry(int(t), float(v)) for v, t in zip(values, ids)]

    def _entry(self, token: int, logprob: float) -> dict:
        piece = self.tokenizer.decode([token])
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8")), "top_logprobs": []}

    def _emit(self) -> None:
        for row in self._rows:
            job = row.job
            if row.finish == "cancelled":
                continue
            if row.logprobs and "_lp" in row.logprobs[-1]:  # a pick that produced no token
                row.logprobs.pop()
            if job.stream and row.finish is None:
                upto = _held(row.text, job.sampling)
                if upto > row.emitted:
                    job.events.put(("delta", row.index, row.text[row.emitted:upto], row.logprobs[row.lp_emitted:]))
                    row.emitted, row.lp_emitted = upto, len(row.logprobs)
            if row.finish is not None:
                job.events.put(("done", row.index, row))
                job._open -= 1
                if job._open == 0:
                    job.events.put(("end", None))


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """``logits`` with every token outside the smallest set of probability >= ``top_p`` set to -inf
    (nucleus sampling, Holtzman et al., arXiv:1904.09751); the most probable token always stays."""
    order = torch.argsort(logits, descending=True)
    probs = torch.softmax(logits[order], dim=-1)
    outside = (probs.cumsum(-1) - probs) >= top_p
    out = logits.clone()
    out[order[outside]] = -float("inf")
    return out
