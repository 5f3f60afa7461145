"""Rollouts with vLLM: token ids in, token ids and the engine's per-token log-probs out.

``rollout_backend: vllm`` samples with an engine that holds its OWN copy of the weights:

- ``vllm_mode: colocate``: a ``vllm.LLM`` in the training process, on the trainer's GPU
  (``distributed_executor_backend="external_launcher"`` keeps the engine in this process, as TRL's colocate
  mode does). With ``vllm_sleep`` the engine sleeps between generations (vLLM sleep level 1: KV cache
  dropped, weights offloaded to CPU; https://docs.vllm.ai/en/latest/features/sleep_mode/) so the trainer
  gets the GPU memory back; it wakes its weights, takes the new ones, wakes its KV cache and generates.
- ``vllm_mode: server``: a ``grouprl vllm-serve MODEL`` process (``grouprl.cmd.vllm_serve``) on other GPUs;
  this module is then only an HTTP client (no vllm package needed on the trainer's side) that sends token
  ids and receives ids and log-probs, and pushes weights as safetensors bytes.

On N processes (``accelerate launch``): in colocate mode every rank runs its own engine on its own GPU
(vLLM's ``external_launcher`` reads the launcher's ``RANK`` / ``WORLD_SIZE``, as in TRL), samples with the
seed ``sampling_seed + rank``, generates for its own share of the prompts and takes the weights once per
generation round. In server mode there is one engine for every rank, and rank 0 alone talks to it, as
TRL's server mode does: only rank 0 connects and pushes the weights (once per round), and the trainer
(``grouprl.train.algorithms.rounds.generate``) gathers every rank's prompts to rank 0, which generates them in one
request, then hands each rank its rows (``shared_engine = True`` asks for that).

Weights go in through the engine's own loader, ``model.load_weights([(name, tensor), ...])`` (the call vLLM's
model classes implement for checkpoints), once per generation round: the loop calls :meth:`VLLMBackend.
sync_weights` before each round and before each evaluation. The engine's log-probs are of the sampling
distribution after temperature (``logprobs_mode="processed_logprobs"``) and become ``Rollout.rollout_logp``;
the trainer never re-tokenizes text the engine produced (completions are decoded from the ids for the
rewards only). Written by hand here: the glue (prompt ids, tensors, sleep/wake, the HTTP protocol), not
sampling or weight loading, which are vLLM's.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

from grouprl.errors import ConfigError, GroupRLError
from grouprl.rollout.base import Rollout, SamplingParams
from grouprl.rollout.hf import completion_mask_from_ids, eos_token_ids, tokenize_left

INSTALL_HINT = "pip install 'grouprl[vllm]'"
WEIGHT_CHUNK_BYTES = 256 * 2**20  # one /update_weights request carries at most this many bytes of tensors


class EngineError(GroupRLError, RuntimeError):
    """The vLLM engine or server failed or did not answer in time."""


def require_vllm() -> Any:
    """``import vllm``, or one ConfigError naming the extra to install."""
    problem = ""
    try:
        import vllm
    except ImportError as e:
        vllm, problem = None, f"cannot be imported ({e})"
    if vllm is not None and not hasattr(vllm, "LLM"):  # a folder named vllm on sys.path, not the package
        problem = f"found at {list(getattr(vllm, '__path__', []))} is not the vLLM package"
    if problem:
        raise ConfigError(f"rollout_backend='vllm' needs the vllm package, which {problem}. Fix: "
                          f"{INSTALL_HINT} (on a machine with a CUDA GPU), or vllm_mode: server with a "
                          f"`grouprl vllm-serve MODEL` running elsewhere, or rollout_backend: transformers.")
    return vllm


def options_from(cfg: Any) -> dict[str, Any]:
    """The backend's keyword arguments, read from a GRPOConfig's ``vllm_*`` fields."""
    max_len = cfg.vllm_max_model_len
    if max_len is None and cfg.max_prompt_length is not None:  # room for training and evaluation completions
        max_len = cfg.max_prompt_length + max(cfg.max_new_tokens, cfg.eval_max_new_tokens or 0)
    return {"mode": cfg.vllm_mode, "server_url": cfg.vllm_server_url, "timeout": cfg.vllm_server_timeout,
            "gpu_memory_utilization": cfg.vllm_gpu_memory_utilization, "sleep": cfg.vllm_sleep,
            "max_model_len": max_len, "engine_kwargs": dict(cfg.vllm_kwargs), "sampling_seed": cfg.seed}


# ---- engine side: shared by the colocated engine and `grouprl vllm-serve` ----------------------------
def vllm_sampling_params(vllm: Any, params: SamplingParams, n: int, eos_ids: list[int]) -> Any:
    """The vLLM SamplingParams for ``params``: ``logprobs=0`` returns the sampled token's log-prob."""
    sample = params.temperature > 0
    return vllm.SamplingParams(
        n=n, temperature=params.temperature if sample else 0.0, top_p=params.top_p if sample else 1.0,
        top_k=params.top_k if sample and params.top_k > 0 else -1, max_tokens=params.max_new_tokens,
        min_tokens=params.min_new_tokens, logprobs=0, stop_token_ids=list(eos_ids), detokenize=False)


def engine_generate(llm: Any, vllm: Any, prompt_ids: list[list[int]], n: int, params: SamplingParams,
                    eos_ids: list[int]) -> list[list[dict]]:
    """``n`` completions per prompt: ``[[{"token_ids": [...], "logprobs": [...]}, ...], ...]`` (plain lists)."""
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids],
                           sampling_params=vllm_sampling_params(vllm, params, n, eos_ids), use_tqdm=False)
    result = []
    for out in outputs:
        rows = []
        for c in out.outputs:
            ids = [int(t) for t in c.token_ids]
            logprobs = [float(c.logprobs[t][tok].logprob) for t, tok in enumerate(ids)] if c.logprobs else None
            if logprobs is None:
                raise EngineError("the vLLM engine returned no log-probs; SamplingParams(logprobs=0) was set, so "
                                  "this vLLM version is not supported. Fix: pip install -U 'grouprl[vllm]'.")
            rows.append({"token_ids": ids, "logprobs": logprobs})
        result.append(rows)
    return result


def _driver_model(llm: Any) -> Any:
    """The in-process model of an engine created with ``external_launcher`` (None if not reachable)."""
    try:
        return llm.llm_engine.model_executor.driver_worker.model_runner.model
    except AttributeError:
        return None


def load_weights_into(llm: Any, named: Iterable[tuple[str, Any]]) -> None:
    """Hand ``(name, tensor)`` pairs to the engine's own loader (its ``model.load_weights``)."""
    model = _driver_model(llm)
    if model is not None:
        model.load_weights(weights=named)
        return
    weights = list(named)
    llm.collective_rpc(lambda worker: worker.model_runner.model.load_weights(weights=weights))


def engine_kwargs_for(model_path: str, *, gpu_memory_utilization: float, sleep: bool, max_model_len: int | None,
                      sampling_seed: int, extra: dict | None) -> dict[str, Any]:
    """``vllm.LLM`` arguments: one in-process engine (external_launcher), log-probs after temperature."""
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    kwargs = {"model": model_path, "gpu_memory_utilization": gpu_memory_utilization, "enable_sleep_mode": sleep,
              "distributed_executor_backend": "external_launcher", "seed": sampling_seed,
              "logprobs_mode": "processed_logprobs"}
    if max_model_len:
        kwargs["max_model_len"] = max_model_len
    return kwargs | dict(extra or {})


class ColocatedEngine:
    """A ``vllm.LLM`` in this process; sleeps (level 1) after each generation when ``sleep`` is set."""

    def __init__(self, model_path: str, *, gpu_memory_utilization: float, sleep: bool, max_model_len: int | None,
                 sampling_seed: int = 0, engine_kwargs: dict | None = None) -> None:
        self.vllm = require_vllm()
        self.sleep_between = sleep
        self.llm = self.vllm.LLM(**engine_kwargs_for(
            model_path, gpu_memory_utilization=gpu_memory_utilization, sleep=sleep, max_model_len=max_model_len,
            sampling_seed=sampling_seed, extra=engine_kwargs))
        self.asleep: set[str] = set()  # the memory tags vLLM has released ("weights", "kv_cache")
        if sleep:
            self._sleep()

    def _sleep(self) -> None:
        self.llm.sleep(level=1)  # weights to CPU (kept), KV cache dropped: the trainer gets the memory
        self.asleep = {"weights", "kv_cache"}

    def _wake(self, tags: list[str]) -> None:
        tags = [t for t in tags if t in self.asleep]  # waking an awake tag would map its memory twice
        if tags:
            _empty_cuda_cache()
            self.llm.wake_up(tags=tags)
            self.asleep -= set(tags)

    def load_weights(self, named: Iterable[tuple[str, Any]]) -> None:
        self._wake(["weights"])  # map the weight memory before writing into it (TRL issue #5142)
        load_weights_into(self.llm, named)
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def generate(self, prompt_ids: list[list[int]], n: int, params: SamplingParams, eos_ids: list[int]) -> list:
        self._wake(["weights", "kv_cache"])
        try:
            return engine_generate(self.llm, self.vllm, prompt_ids, n, params, eos_ids)
        finally:
            if self.sleep_between:
                self._sleep()


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # what the trainer freed goes back to the device before vLLM maps memory
# ---- trainer side of server mode: an HTTP client of `grouprl vllm-serve` --------------------------
class ServerEngine:
    """Client of a ``grouprl vllm-serve`` server: JSON for generation, safetensors bytes for weights.

    Every request is bounded by ``timeout`` seconds; at start-up the server gets ``timeout`` seconds to
    answer ``/health``.
    """

    def __init__(self, url: str, timeout: float) -> None:
        self.url, self.timeout = url.rstrip("/"), float(timeout)
        self.info = self._wait_ready()

    def _wait_ready(self) -> dict:
        deadline, last = time.monotonic() + self.timeout, ""
        while True:
            try:
                return self._request("GET", "/health", timeout=min(10.0, self.timeout))
            except EngineError as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise EngineError(f"no vLLM server answered at {self.url} within vllm_server_timeout="
                                  f"{self.timeout:g}s ({last}). Fix: start one with `grouprl vllm-serve MODEL "
                                  f"--port PORT` on the inference GPUs and set vllm_server_url to it.")
            time.sleep(1.0)

    def _request(self, method: str, path: str, body: bytes | None = None, *, content_type: str = "application/json",
                 timeout: float | None = None) -> dict:
        req = urllib.request.Request(self.url + path, data=body, method=method,
                                     headers={"Content-Type": content_type} if body is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:2000]
            try:
                detail = json.loads(detail).get("error", detail)
            except (ValueError, AttributeError):
                pass
            raise EngineError(f"vLLM server {self.url}{path} answered {e.code}: {detail}") from e
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            raise EngineError(f"vLLM server {self.url}{path} did not answer ({e}); timeout {timeout or self.timeout:g}s "
                              f"(vllm_server_timeout).") from e

    def load_weights(self, named: Iterable[tuple[str, Any]]) -> None:
        import torch
        from safetensors.torch import save

        dtype = getattr(torch, str(self.info.get("dtype", "float32")).removeprefix("torch."), torch.float32)
        chunk: dict[str, Any] = {}
        size = 0
        for name, tensor in named:
            chunk[name] = tensor.detach().to(dtype).contiguous().cpu()
            size += chunk[name].numel() * chunk[name].element_size()
            if size >= WEIGHT_CHUNK_BYTES:
                self._request("POST", "/update_weights", save(chunk), content_type="application/octet-stream")
                chunk, size = {}, 0
        if chunk:
            self._request("POST", "/update_weights", save(chunk), content_type="application/octet-stream")
        self._request("POST", "/reset_prefix_cache", b"{}")

    def generate(self, prompt_ids: list[list[int]], n: int, params: SamplingParams, eos_ids: list[int]) -> list:
        from dataclasses import asdict

        body = json.dumps({"prompt_ids": prompt_ids, "n": n, "params": asdict(params), "eos_ids": list(eos_ids)})
        return self._request("POST", "/generate", body.encode())["completions"]


# ---- the backend ----------------------------------------------------------------------------------
def named_weights(model: Any) -> Iterable[tuple[str, Any]]:
    """The parameters under their checkpoint names (tied weights once), as vLLM's loaders expect them."""
    for name, param in model.named_parameters():
        yield name, param.detach()


def _model_path(model: Any) -> str:
    path = getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "")
    if not path:
        raise ConfigError("vllm_mode=colocate loads the model by its path, and this model has none "
                          "(model.name_or_path is empty). Fix: save it with save_pretrained and pass the folder "
                          "as `model`.")
    return str(path)


class VLLMBackend:
    """``generate(prompts, n, params) -> Rollout`` (with ``rollout_logp``) and ``sync_weights(model)``.

    ``mode``: ``colocate`` (a vLLM engine here) or ``server`` (``server_url``); the other arguments are the
    ``vllm_*`` config fields (see :func:`options_from`). ``engine``: an object with ``generate`` and
    ``load_weights`` used instead of building one (tests). ``rank``: this process's rank (``None``: the
    launcher's ``RANK``, 0 alone); in server mode only rank 0 has an engine (``shared_engine``).
    """

    def __init__(self, model: Any, tokenizer: Any, *, mode: str = "colocate", server_url: str = "http://127.0.0.1:8000",
                 timeout: float = 300.0, gpu_memory_utilization: float = 0.3, sleep: bool = True,
                 max_model_len: int | None = None, engine_kwargs: dict | None = None, sampling_seed: int = 0,
                 engine: Any = None, rank: int | None = None) -> None:
        self.model, self.tokenizer = model, tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else int(rank)
        self.shared_engine = mode == "server"  # one engine for every rank: rank 0 generates for all of them
        self.weight_syncs = 0  # sync_weights calls that pushed weights (one per generation round)
        self._synced = False
        if mode not in ("colocate", "server"):
            raise ConfigError(f"vllm_mode={mode!r} must be 'colocate' or 'server'.")
        if engine is not None:
            self.engine = engine
        elif mode == "colocate":  # one engine per rank, each sampling its own stream (rank 0: the seed itself)
            self.engine = ColocatedEngine(_model_path(model), gpu_memory_utilization=gpu_memory_utilization,
                                          sleep=sleep, max_model_len=max_model_len,
                                          sampling_seed=sampling_seed + self.rank, engine_kwargs=engine_kwargs)
        else:
            self.engine = ServerEngine(server_url, timeout) if self.rank == 0 else None

    def sync_weights(self, model: Any) -> None:
        """Push ``model``'s current weights into the engine (the loop calls this once per generation round);
        in server mode on a rank > 0 there is nothing to push: rank 0 pushes the (replicated) weights."""
        self.model = model
        if self.engine is None:
            return
        self.engine.load_weights(named_weights(model))
        self.weight_syncs += 1
        self._synced = True

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> Rollout:
        import torch

        if self.engine is None:
            raise EngineError(f"rank {self.rank} has no vLLM engine: in vllm_mode=server rank 0 generates for every "
                              f"rank (grouprl.train.algorithms.rounds.generate).")
        if not self._synced:  # the engine loaded the weights on disk; the trainer's may differ (a resume)
            self.sync_weights(self.model)
        ids, mask = tokenize_left(self.tokenizer, prompts, params.max_prompt_length)
        prompt_lists = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
        results = self.engine.generate(prompt_lists, n, params, self.eos_ids)
        rows = [c for per_prompt in results for c in per_prompt]
        if len(rows) != len(prompts) * n:
            raise EngineError(f"the vLLM engine returned {len(rows)} completions for {len(prompts)} prompts x n={n}.")
        pad = self.tokenizer.pad_token_id
        T = max(1, max(len(r["token_ids"]) for r in rows))
        completion_ids = torch.full((len(rows), T), pad, dtype=torch.long)
        rollout_logp = torch.zeros((len(rows), T), dtype=torch.float32)
        for i, r in enumerate(rows):
            k = len(r["token_ids"])
            completion_ids[i, :k] = torch.tensor(r["token_ids"], dtype=torch.long)
            rollout_logp[i, :k] = torch.tensor(r["logprobs"], dtype=torch.float32)
        completion_mask, truncated = completion_mask_from_ids(completion_ids, self.eos_ids)
        completion_ids = completion_ids.masked_fill(completion_mask == 0, pad)
        rollout_logp = rollout_logp.masked_fill(completion_mask == 0, 0.0)
        lengths = completion_mask.sum(dim=1).tolist()
        texts = self.tokenizer.batch_decode([row[:int(k)].tolist() for row, k in zip(completion_ids, lengths)],
                                            skip_special_tokens=True)
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, rollout_logp = (
            x.to(device) for x in (ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0), completion_ids,
                                   completion_mask, truncated, rollout_logp))
        return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, texts,
                       [p for p in prompts for _ in range(n)], rollout_logp=rollout_logp)

