"""GPU check of the rollout backends: 3 GRPO steps with transformers, vLLM colocate and (2 GPUs) vLLM server.

    python benchmarks/gpu_check.py [--steps 3] [--out benchmarks/results/gpu_check.json]

Builds, locally and with random weights (nothing is downloaded), a Qwen2-architecture model of about 0.5B
parameters (Qwen2.5-0.5B's layer shape: hidden 896, 14 heads / 2 KV heads, MLP 4864; 30 layers; a byte-level
BPE tokenizer with a 32k vocabulary trained here on synthetic text), then runs in separate child processes:

- ``raw_vllm``: ``vllm.LLM.generate`` on the same prompt ids with the backend's SamplingParams, G samples
  each (the ceiling for rollouts);
- ``transformers``: ``GRPOTrainer`` with ``rollout_backend: transformers``;
- ``vllm_colocate``: ``rollout_backend: vllm``, ``vllm_mode: colocate`` (engine on the trainer's GPU);
- ``vllm_server`` (only with >= 2 GPUs): ``grouprl vllm-serve`` on GPU 1, the trainer on GPU 0;
- ``agent_colocate`` / ``agent_server`` (server: >= 2 GPUs): one multi-turn round (``environment:
  calculator``, ``max_turns`` 2) of the ``builtin:calculator`` model -- the agent recipe's, warm-started to
  call the calculator, built here by its short SFT -- on the vLLM token engine (colocate: continuous
  batching). Checks that every model segment of every trajectory is exactly the ids the engine returned
  for that prompt (prompt = the previous ids, nothing re-tokenized), that the loss mask is 1 exactly on
  them, and reports the engine/trainer log-prob gap on model tokens and the engine's tokens/s.

and prints one JSON object: rollout tokens/s of each (completion tokens / generation seconds), each
run's mean step time, peak GPU memory (the trainer's torch allocations, and the device's used memory after
the run), and the mismatch metrics (``mismatch/*``) of the vLLM runs. On a machine without a CUDA GPU it
prints ``{"status": "skipped", ...}`` and exits 0. vLLM runs are skipped (with the reason) when vllm is not
installed. The figures describe throughput and plumbing only: a random model writes random text.
``tests/vllm_engine/test_gpu_check.py`` runs each child's measuring code on CPU (tiny model, fake vllm module).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
G, PROMPTS_PER_STEP, MAX_NEW_TOKENS = 8, 8, 256


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print("GPU_CHECK_RESULT " + json.dumps(run_child(args.child, Path(args.model_dir), args.steps, args.url)))
        return 0
    import torch

    if not torch.cuda.is_available():
        result = {"status": "skipped", "reason": "no CUDA GPU on this machine (torch.cuda.is_available() is False); "
                  "run benchmarks/gpu_check.py on a machine with one (and `pip install 'grouprl[vllm]'`)."}
        print("gpu_check: " + result["reason"], file=sys.stderr)
        print(json.dumps(result, indent=2))
        return 0
    import importlib.util

    has_vllm = importlib.util.find_spec("vllm") is not None
    gpus = torch.cuda.device_count()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, params = build_model(Path(tmp) / "qwen2-0.5b-random")
        result = {"status": "ok", "gpu": torch.cuda.get_device_name(0), "gpus": gpus, "parameters": params,
                  "steps": args.steps, "num_generations": G, "prompts_per_step": PROMPTS_PER_STEP,
                  "max_new_tokens": MAX_NEW_TOKENS, "runs": {}}
        plan = [("transformers", "0", None)]
        if has_vllm:
            plan = [("raw_vllm", "0", None), *plan, ("vllm_colocate", "0", None)]
            plan.append(("agent_colocate", "0", None))
            if gpus >= 2:
                plan += [("vllm_server", "0", "server"), ("agent_server", "0", "server")]
            else:
                for name in ("vllm_server", "agent_server"):
                    result["runs"][name] = {"skipped": f"needs 2 GPUs, this machine has {gpus}"}
        else:
            for name in ("raw_vllm", "vllm_colocate", "vllm_server", "agent_colocate", "agent_server"):
                result["runs"][name] = {"skipped": "vllm is not installed (pip install 'grouprl[vllm]')"}
        for name, device, server in plan:
            if name.startswith("agent") and not server:
                result["runs"][name] = child(name, agent_model(), args.steps, device)
            elif server:
                result["runs"][name] = with_server(model_dir, args.steps, name)
            else:
                result["runs"][name] = child(name, model_dir, args.steps, device)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


# ---- the model ---------------------------------------------------------------------------------------
def build_model(path: Path) -> tuple[Path, int]:
    """A random Qwen2 of ~0.5B parameters and a 32k BPE tokenizer, saved as bf16 to ``path``."""
    import torch

    from grouprl.builtin.tiny import build_tiny_model, build_tokenizer, save_tiny

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(60000)]
    corpus = [" ".join(words[i:i + 40]) for i in range(0, len(words), 40)] + [f"What is {a} + {b}?" for a in range(50)
                                                                                for b in range(50)]
    tok = build_tokenizer(corpus, vocab_size=32000)
    model = build_tiny_model(tok, "qwen2", hidden_size=896, num_layers=30, num_heads=14, num_kv_heads=2,
                             intermediate_size=4864, max_position_embeddings=4096)
    params = sum(p.numel() for p in model.parameters())
    save_tiny(path, tok, model.to(torch.bfloat16))
    return path, params


def rows(n: int) -> list[dict]:
    rng = random.Random(1)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        out.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)})
    return out


def digit_reward(completions, **kwargs):
    """Fraction of digits (chat prompts give completions as ``[{"role": "assistant", "content": ...}]``)."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


# ---- children ------------------------------------------------------------------------------------------
def child(name: str, model_dir: Path, steps: int, device: str, url: str | None = None) -> dict:
    env = os.environ | {"CUDA_VISIBLE_DEVICES": device, "HF_HUB_OFFLINE": "1",
                        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, __file__, "--child", name, "--model-dir", str(model_dir), "--steps", str(steps)]
    try:
        proc = subprocess.run(cmd + (["--url", url] if url else []), env=env, capture_output=True, text=True,
                              timeout=3600)
    except subprocess.TimeoutExpired:
        return {"error": f"{name} did not finish within 3600 s"}
    for line in proc.stdout.splitlines():
        if line.startswith("GPU_CHECK_RESULT "):
            return json.loads(line.removeprefix("GPU_CHECK_RESULT "))
    return {"error": f"{name} exited {proc.returncode}", "stderr_tail": proc.stderr[-3000:]}


def agent_model() -> Path:
    from grouprl.models import resolve_model_path

    return Path(resolve_model_path("builtin:calculator"))


def with_server(model_dir: Path, steps: int, name: str) -> dict:
    if name.startswith("agent"):
        model_dir = agent_model()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = os.environ | {"CUDA_VISIBLE_DEVICES": "1",
                        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-c", "import sys; from grouprl.cli import main; sys.exit(main())", "vllm-serve",
           str(model_dir), "--port", str(port), "--gpu-memory-utilization", "0.5"]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:  # the trainer's client waits for /health itself (vllm_server_timeout)
        return child(name, model_dir, steps, "0", url=f"http://127.0.0.1:{port}")
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


def run_child(name: str, model_dir: Path, steps: int, url: str | None) -> dict:
    if name == "raw_vllm":
        return raw_vllm(model_dir)
    if name.startswith("agent"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gpu_check_agent import agent_round_check

        return {**agent_round_check(model_dir, url if name == "agent_server" else None, G), **_memory()}
    from grouprl import GRPOConfig, GRPOTrainer

    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out, max_steps=steps, num_generations=G, per_device_train_batch_size=G * PROMPTS_PER_STEP // 2,
            gradient_accumulation_steps=2, max_new_tokens=MAX_NEW_TOKENS, max_prompt_length=64, learning_rate=1e-6,
            bf16=True, gradient_checkpointing=True, eval_split=None, save_strategy="no", progress_bar=False,
            rollout_backend="transformers" if name == "transformers" else "vllm",
            vllm_mode="server" if name == "vllm_server" else "colocate", vllm_server_url=url or "http://127.0.0.1:8000",
            vllm_server_timeout=900.0, max_rounds_without_reward=0)
        trainer = GRPOTrainer(model=str(model_dir), config=cfg, train_dataset=rows(64), reward_funcs=digit_reward)
        start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start
        with open(f"{out}/metrics.jsonl") as f:
            recs = [r for r in map(json.loads, f) if "reward" in r]
    n = G * PROMPTS_PER_STEP
    tokens = sum(r["completions/mean_length"] * n for r in recs)
    gen_s = sum(r["time/generate"] for r in recs)
    out = {"rollout_tokens_per_s": tokens / gen_s if gen_s else None, "generate_s": gen_s,
           "step_time_s": [r["time/step"] for r in recs], "wall_s": wall, **_memory()}
    for key in ("mismatch/logp_abs_diff", "mismatch/is_weight_mean", "mismatch/is_weight_max", "mismatch/masked_frac"):
        if key in recs[0]:
            out[key] = [r[key] for r in recs]
    return out


def raw_vllm(model_dir: Path) -> dict:
    """``vllm.LLM.generate`` on the trainer's prompts: G samples of MAX_NEW_TOKENS tokens at temperature 1."""
    from types import SimpleNamespace

    import vllm
    from transformers import AutoTokenizer, GenerationConfig

    from grouprl.data.load import render_prompt
    from grouprl.rollout.base import SamplingParams
    from grouprl.rollout.hf import eos_token_ids
    from grouprl.rollout.vllm_backend import vllm_sampling_params

    tok = AutoTokenizer.from_pretrained(model_dir)  # the prompt ids the trainer's backends send
    prompts = [tok(render_prompt(r["prompt"], tok, None), add_special_tokens=False)["input_ids"] for r in rows(64)]
    llm = vllm.LLM(model=str(model_dir), gpu_memory_utilization=0.5, max_model_len=64 + MAX_NEW_TOKENS, seed=0)
    eos = eos_token_ids(SimpleNamespace(generation_config=GenerationConfig.from_pretrained(model_dir)), tok)
    sp = vllm_sampling_params(vllm, SamplingParams(MAX_NEW_TOKENS, temperature=1.0), G, eos)  # the backend's settings
    batch = [{"prompt_token_ids": ids} for ids in prompts[:PROMPTS_PER_STEP]]
    llm.generate(batch, sp, use_tqdm=False)  # warm-up (CUDA graphs, caches)
    start = time.perf_counter()
    outs = llm.generate(batch, sp, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return {"rollout_tokens_per_s": tokens / seconds, "generate_s": seconds, "completion_tokens": tokens, **_memory()}


def _memory() -> dict:
    """Peak torch allocations of this process and the device's used memory now (GiB); {} without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"peak_torch_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "device_used_gib_after": (total - free) / 2**30}


if __name__ == "__main__":
    sys.exit(main())
