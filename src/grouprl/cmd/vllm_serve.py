"""``grouprl vllm-serve MODEL``: a vLLM engine behind a small HTTP API, for ``vllm_mode: server``.

Run it on the inference GPUs (``CUDA_VISIBLE_DEVICES=1 grouprl vllm-serve MODEL --port 8000``) and point the
trainer at it (``rollout_backend: vllm``, ``vllm_mode: server``, ``vllm_server_url: http://HOST:8000``).
Routes (JSON unless said otherwise):

- ``GET /health`` -> ``{"status": "ok", "model": ..., "dtype": ...}``
- ``POST /generate`` ``{"prompt_ids": [[int]], "n": int, "params": SamplingParams fields, "eos_ids": [int]}``
  -> ``{"completions": [[{"token_ids": [int], "logprobs": [float]}]]}``: token ids in, ids and the sampled
  tokens' log-probs out (no text). With ``"max_new_tokens": [int]`` (one budget per prompt, ``n`` = 1; the
  multi-turn rollout's ready turns) each completion also carries ``"finish_reason"`` (``stop`` / ``length``).
- ``POST /update_weights`` (body: safetensors bytes of ``{name: tensor}``) -> ``{"loaded": count}``: the
  tensors go to the engine's own ``model.load_weights``.
- ``POST /reset_prefix_cache`` -> ``{}``.

No authentication: anyone who reaches the port can replace the weights, so it listens on 127.0.0.1 unless
``--host`` says otherwise; expose it only on a trusted network. One request at a time (a plain
``HTTPServer``: the engine is not re-entrant); one GPU per server
(``tensor_parallel_size`` 1). Weights travel over HTTP: simple and firewall-friendly, bounded by the
network (1 GB of bf16 weights is about 8 s at 1 Gbit/s; not measured here); NCCL transfer (vLLM's weight-transfer API) is not implemented here.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("vllm-serve", help="serve a model with vLLM for training with vllm_mode: server")
    p.add_argument("model", help="hub id, local folder or builtin:<name> (the same model the trainer starts from)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all "
                   "interfaces: there is no authentication, use a trusted network)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of the GPU's memory vLLM may take (default 0.9: the GPU is the server's)")
    p.add_argument("--dtype", default="auto", help="vLLM dtype (default auto: the checkpoint's)")
    p.add_argument("--max-model-len", type=int, default=None, help="longest prompt + completion (default: the model's)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (slower, starts faster)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from grouprl.models import resolve_model_path
    from grouprl.rollout.vllm_backend import engine_kwargs_for, require_vllm

    vllm = require_vllm()
    path = resolve_model_path(args.model)
    extra: dict[str, Any] = {"dtype": args.dtype, "enforce_eager": args.enforce_eager}
    llm = vllm.LLM(**engine_kwargs_for(path, gpu_memory_utilization=args.gpu_memory_utilization, sleep=False,
                                       max_model_len=args.max_model_len, sampling_seed=0, extra=extra))
    server = make_server(llm, vllm, args.host, args.port, model=path)
    print(f"grouprl vllm-serve: {path} on http://{args.host}:{server.server_port} (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _routes(llm: Any, vllm: Any, model: str) -> dict:
    """``(method, path) -> fn(body) -> reply`` of the server, over ``llm``."""
    from grouprl.rollout.base import SamplingParams
    from grouprl.rollout.vllm_backend import engine_generate, load_weights_into
    from grouprl.rollout.vllm_engine import engine_generate_each

    dtype = _engine_dtype(llm)

    def generate(body: bytes) -> dict:
        req = json.loads(body)
        params = SamplingParams(**req["params"])
        if req.get("max_new_tokens") is not None:  # one budget per prompt (multi-turn: one turn per request)
            rows = engine_generate_each(llm, vllm, req["prompt_ids"], [int(b) for b in req["max_new_tokens"]], params,
                                        req["eos_ids"])
            return {"completions": [[row] for row in rows]}
        return {"completions": engine_generate(llm, vllm, req["prompt_ids"], int(req["n"]), params, req["eos_ids"])}

    def update_weights(body: bytes) -> dict:
        from safetensors.torch import load

        tensors = load(body)
        load_weights_into(llm, tensors.items())
        return {"loaded": len(tensors)}

    def reset_prefix_cache(body: bytes) -> dict:
        llm.reset_prefix_cache()
        return {}

    routes = {("GET", "/health"): lambda body: {"status": "ok", "model": model, "dtype": dtype},
              ("POST", "/generate"): generate, ("POST", "/update_weights"): update_weights,
              ("POST", "/reset_prefix_cache"): reset_prefix_cache}
    return routes


def make_server(llm: Any, vllm: Any, host: str, port: int, *, model: str = ""):
    """An ``http.server.HTTPServer`` answering the routes above with ``llm`` (port 0 = any free port)."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    routes = _routes(llm, vllm, model)

    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            route = routes.get((method, self.path.rstrip("/") or "/"))
            if route is None:
                return self._answer(404, {"error": f"no route {method} {self.path}; routes: "
                                                   f"{', '.join(f'{m} {p}' for m, p in routes)}"})
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                self._answer(200, route(body))
            except Exception as e:  # the trainer gets the engine's error text instead of a dropped connection
                self._answer(500, {"error": f"{type(e).__name__}: {e}"})

        def _answer(self, code: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # one line per request would drown the server's own output

    return HTTPServer((host, port), Handler)


def _engine_dtype(llm: Any) -> str:
    """The engine's weight dtype ("bfloat16", ...): the trainer casts the weights it pushes to it."""
    try:
        return str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    except AttributeError:
        return "float32"
