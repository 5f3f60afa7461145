"""bf16 on this CPU: speed and log-prob error of a bf16 reference forward and of bf16 autocast generation.

Models: ``floor.py``'s sizes (``small``: hidden 256, 4 layers, the tiny tokenizer's 373 tokens;
``medium``: hidden 512, 2 layers, vocabulary 32768), random weights; also ``tiny`` (hidden 64, 2 layers, T = 64)
and ``recipe`` (the default recipe's shape: hidden 128, 3 layers, T = 32, 128 sequences). Batch: 16 sequences
(128 for ``recipe``) of a 26-token prompt and T completion tokens (small T = 128, medium T = 256). In one process per size, after a warm-up, the
median process CPU time (one thread) of ``--repeats``:

- ``ref_fp32_s`` / ``ref_bf16_s``: the reference pass (``batched_logps``: trimmed, chunked LM head, no grad)
  with fp32 weights and with a bf16 copy of the weights (``ref_dtype: bfloat16``); ``logp_abs_err_*``:
  |bf16 - fp32| of the log-probs (fp32 out in both), max and mean over the tokens, and of the k3 KL the
  loss would see between the fp32 policy and each reference (``kl_*``: the bf16 error as a KL offset);
- ``train_fp32_s`` / ``train_autocast_bf16_s``: the policy's training pass (``completion_logps`` with the
  chunked head, then backward) in fp32 and under CPU bf16 autocast (``bf16: true``), fp32 weights in both;
  ``train_logp_abs_err_*`` and ``train_grad_rel_err`` (norm of the gradient difference / norm of the fp32
  gradient) of the autocast pass against fp32;
- ``gen_fp32_s`` / ``gen_autocast_bf16_s``: ``model.generate`` of 16 x 32 new tokens (greedy, EOS off) in
  fp32 and under ``torch.autocast("cpu", dtype=torch.bfloat16)``; ``gen_same_tokens``: the fraction of
  generated tokens the two agree on.

``cpu_bf16``: whether ``lscpu`` lists ``avx512_bf16`` / ``amx_bf16``.

    OMP_NUM_THREADS=1 python benchmarks/bf16_cpu.py --out benchmarks/results/bf16_cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit_json  # noqa: E402

SCRIPT = Path(__file__).resolve()
# hidden, layers, completion tokens T, vocabulary (None = the tiny tokenizer's 373), sequences N
SIZES = {"tiny": (64, 2, 64, None, 16), "recipe": (128, 3, 32, None, 128), "small": (256, 4, 128, None, 16),
         "medium": (512, 2, 256, 32768, 16)}


def _median_s(fn, repeats: int) -> float:
    """Median process CPU time of ``repeats`` calls after one warm-up (one thread: CPU time is what the
    pass costs; wall time on a shared machine mostly measures the other processes)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return round(statistics.median(times), 4)


def worker(spec: dict) -> dict:
    import copy

    import torch

    from grouprl.builtin.tiny import build_tiny_model, build_tokenizer
    from grouprl.train.engine.step import MicroBatch, batched_logps

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    hidden, layers, T, vocab, N = SIZES[spec["size"]]
    model = build_tiny_model(build_tokenizer(), hidden_size=hidden, num_layers=layers)
    if vocab:
        model.resize_token_embeddings(vocab)
    model.eval()
    V = model.config.vocab_size
    P = 26
    g = torch.Generator().manual_seed(1)
    prompt, completion = torch.randint(3, min(V, 373), (N, P), generator=g), torch.randint(3, V, (N, T), generator=g)
    mb = MicroBatch(prompt, torch.ones(N, P, dtype=torch.long), completion, torch.ones(N, T, dtype=torch.long),
                    torch.ones(N, T, dtype=torch.long), torch.zeros(N))
    ref16 = copy.deepcopy(model).to(torch.bfloat16)
    out: dict = {"size": spec["size"], "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 2)}
    none = contextlib.nullcontext
    out["ref_fp32_s"] = _median_s(lambda: batched_logps(model, [mb], 1.0, none), spec["repeats"])
    out["ref_bf16_s"] = _median_s(lambda: batched_logps(ref16, [mb], 1.0, none), spec["repeats"])
    (lp32,), (lp16,) = batched_logps(model, [mb], 1.0, none), batched_logps(ref16, [mb], 1.0, none)
    err = (lp16 - lp32).abs()
    out.update(logp_dtype_bf16_ref=str(lp16.dtype), logp_abs_err_max=float(err.max()), logp_abs_err_mean=float(err.mean()),
               logp_mean=float(lp32.mean()))
    d = lp32 - lp16  # k3(policy = fp32, ref = bf16 copy of the same weights): the KL offset bf16 storage adds
    out["kl_k3_offset_mean"] = float((torch.exp(-d) + d - 1).mean())
    out.update(_train_pass(model, mb, spec["repeats"]))
    ids = prompt[:, :P]
    gen = {"max_new_tokens": 32, "do_sample": False, "min_new_tokens": 32, "pad_token_id": 0}

    def generate(ctx):
        with torch.inference_mode(), ctx():
            return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen)

    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    out["gen_fp32_s"] = _median_s(lambda: generate(none), spec["repeats"])
    out["gen_autocast_bf16_s"] = _median_s(lambda: generate(autocast), spec["repeats"])
    a, b = generate(none)[:, P:], generate(autocast)[:, P:]
    out["gen_same_tokens"] = float((a == b).float().mean())
    out["ref_bf16_speedup"] = round(out["ref_fp32_s"] / out["ref_bf16_s"], 3)
    out["gen_bf16_speedup"] = round(out["gen_fp32_s"] / out["gen_autocast_bf16_s"], 3)
    return out


def _train_pass(model, mb, repeats: int) -> dict:
    """The policy's training pass (``completion_logps`` with the chunked head, ``sum().backward()``) in fp32
    and under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (``bf16: true``), fp32 master weights in
    both; the log-prob error and the gradient's relative error of the autocast pass against fp32."""
    import torch

    from grouprl.train.engine.step import completion_logps

    model.train()

    def run(ctx):
        model.zero_grad(set_to_none=True)
        with ctx():
            logp, _ = completion_logps(model, mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                       mb.completion_mask, with_entropy=True)
        logp.sum().backward()
        return logp.detach()

    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    none = contextlib.nullcontext
    out = {"train_fp32_s": _median_s(lambda: run(none), repeats),
           "train_autocast_bf16_s": _median_s(lambda: run(autocast), repeats)}
    lp32 = run(none)
    g32 = torch.cat([p.grad.flatten() for p in model.parameters()])
    lp16 = run(autocast)
    g16 = torch.cat([p.grad.flatten() for p in model.parameters()])
    err = (lp16 - lp32).abs()
    out.update(train_logp_dtype=str(lp16.dtype), train_logp_abs_err_max=float(err.max()),
               train_logp_abs_err_mean=float(err.mean()),
               train_grad_rel_err=float((g16 - g32).norm() / g32.norm()),
               train_grad_dtypes=sorted({str(p.grad.dtype) for p in model.parameters()}),
               train_bf16_speedup=round(out["train_fp32_s"] / out["train_autocast_bf16_s"], 3))
    model.eval()
    return out


def _cpu_flags() -> list[str]:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [f for f in ("avx512_bf16", "amx_bf16") if f in text]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="small,medium")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per child before it is stopped")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    import torch

    result = {"cpu_bf16": _cpu_flags(), "torch": torch.__version__, "threads": args.threads,
              "repeats": args.repeats, "loadavg_start": os.getloadavg(), "sizes": {}}
    for size in args.sizes.split(","):
        spec = {"size": size, "repeats": args.repeats, "threads": args.threads}
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        proc = subprocess.run([sys.executable, str(SCRIPT), "--worker", json.dumps(spec)], capture_output=True,
                              text=True, timeout=args.timeout, env=env, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"bf16_cpu: size {size} failed:\n{proc.stderr[-3000:]}")
        result["sizes"][size] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{size}: {result['sizes'][size]}", file=sys.stderr)
    result["loadavg_end"] = os.getloadavg()
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
