"""Peak memory and time of the log-prob passes: ``[N, T, V]`` logits vs the chunked LM head.

The model is ``floor.py``'s medium size (hidden 512, 2 layers, vocabulary 32768, 24.65M parameters, random
weights, fp32); the batch is 16 sequences of a 26-token prompt and T completion tokens (all real, no
padding: the worst case for memory). For each mode and pass a fresh child process builds the model and
the batch, runs the pass once (memory, and warm-up), then times ``--repeats`` more:

- ``policy_fwd_bwd``: ``completion_logps`` + the backward of ``-mean(A * logp)`` (the training pass);
- ``ref_logp``: ``completion_logps`` under ``torch.no_grad`` (reference / old-log-prob pass).

Modes: ``logits_to_keep`` (``logits_chunk_size=0``: the model returns logits of the completion positions,
``[16, T+1, V]``, then the chunked ``selective_log_softmax``) and ``chunk<k>`` (the decoder to its last
hidden state, ``k`` positions at a time through the LM head in the forward and the backward,
``grouprl.algo.lmhead``). Memory is the child's peak RSS (``ru_maxrss``) minus its RSS just before the
first measured pass (model, batch and imports excluded): what the pass itself adds at its peak. Time is
the median wall time (``_s``) and process CPU time (``_cpu_s``, one thread: less disturbed by other load).

    OMP_NUM_THREADS=1 python benchmarks/logits_memory.py --out benchmarks/results/logits_memory.json

``--padding`` measures the padding trimming instead: floor.py's small model (hidden 256, 4 layers), one
micro-batch of 64 rows whose prompts are at most 30 tokens in a round padded to 60, and whose completions
are at most 16 tokens in a round padded to 32; CPU time of fwd + bwd, untrimmed plain path vs trimmed.

    OMP_NUM_THREADS=1 python benchmarks/logits_memory.py --padding --out benchmarks/results/padding_trim.json
"""

from __future__ import annotations

import argparse
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
MODES = {"logits_to_keep": 0, "chunk256": 256, "chunk1024": 1024, "chunk4096": 4096}


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _peak_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(spec: dict) -> dict:
    import torch

    from grouprl.builtin.tiny import build_tiny_model, build_tokenizer
    from grouprl.train.engine.step import completion_logps

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    model = build_tiny_model(build_tokenizer(), hidden_size=512, num_layers=2)
    model.resize_token_embeddings(spec["vocab"])
    model.train()
    N, P, T = 16, 26, spec["T"]
    prompt = torch.randint(3, 373, (N, P))
    completion = torch.randint(3, spec["vocab"], (N, T))
    ones_p, ones_c = torch.ones(N, P, dtype=torch.long), torch.ones(N, T, dtype=torch.long)
    adv = torch.randn(N, 1)
    chunk = spec["chunk"]

    def fwd_bwd():
        logp, _ = completion_logps(model, prompt, ones_p, completion, ones_c, 1.0, with_entropy=True,
                                   chunk_size=chunk)
        (-(adv * logp).mean()).backward()
        model.zero_grad(set_to_none=True)
        return logp.detach()

    def ref():
        with torch.no_grad():
            return completion_logps(model, prompt, ones_p, completion, ones_c, 1.0, chunk_size=chunk)[0]

    phase, fn = spec["phase"], {"ref_logp": ref, "policy_fwd_bwd": fwd_bwd}[spec["phase"]]
    out = {"params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 2)}
    before = _rss_mib()
    first_peak = _peak_mib()
    logp = fn()  # warm-up, also the memory measurement
    out[f"{phase}_peak_extra_mib"] = round(max(0.0, _peak_mib() - max(before, first_peak)), 1)
    out["rss_before_mib"], out["peak_before_mib"] = round(before, 1), round(first_peak, 1)
    times, cpu = [], []
    for _ in range(spec["repeats"]):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    out[f"{phase}_s"] = round(statistics.median(times), 3)
    out[f"{phase}_cpu_s"] = round(statistics.median(cpu), 3)
    out[f"{phase}_logp_sum"] = float(logp.double().sum())
    return out


def padding_case(repeats: int) -> dict:
    import torch

    from grouprl.builtin.tiny import build_tiny_model, build_tokenizer
    from grouprl.train.engine.step import completion_logps

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_tiny_model(build_tokenizer(), hidden_size=256, num_layers=4).train()
    V, N, T = model.config.vocab_size, 64, 32
    g = torch.Generator().manual_seed(0)
    pm = torch.zeros(N, 60, dtype=torch.long)
    pm[:, 30:] = 1
    pm[::2, 30:36] = 0  # half the rows 24 prompt tokens, half 30; columns 0-29 padding in every row
    cm = (torch.arange(T)[None] < torch.randint(4, 17, (N, 1), generator=g)).long()  # columns 16-31 all padding
    p, c = torch.randint(3, V, (N, 60), generator=g) * pm, torch.randint(3, V, (N, T), generator=g) * cm

    def run(**kw):
        logp, _ = completion_logps(model, p, pm, c, cm, 1.0, with_entropy=True, **kw)
        (logp * cm).sum().backward()
        model.zero_grad(set_to_none=True)

    out = {"rows": N, "columns_untrimmed": 60 + T, "columns_trimmed": 30 + int(cm.any(0).sum()),
           "real_tokens": int(pm.sum() + cm.sum())}
    for name, kw in (("untrimmed_plain_cpu_s", {"plain": True}), ("trimmed_cpu_s", {})):
        run(**kw)
        times = []
        for _ in range(repeats):
            start = time.process_time()
            run(**kw)
            times.append(time.process_time() - start)
        out[name] = round(min(times), 3)
    out["speedup"] = round(out["untrimmed_plain_cpu_s"] / out["trimmed_cpu_s"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--T", type=int, default=256, help="completion tokens per sequence")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per child before it is stopped")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker")
    ap.add_argument("--padding", action="store_true", help="measure the padding trimming instead")
    args = ap.parse_args(argv)
    if args.padding:
        text = json.dumps({"padding_trim": padding_case(max(args.repeats, 3))}, indent=2)
        print(text)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
        return 0
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    results, load_start = {}, os.getloadavg()
    for mode in args.modes.split(","):
        results[mode] = {}
        for phase in ("ref_logp", "policy_fwd_bwd"):
            spec = {"chunk": MODES[mode], "phase": phase, "T": args.T, "vocab": args.vocab,
                    "repeats": args.repeats, "threads": args.threads}
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            proc = subprocess.run([sys.executable, str(SCRIPT), "--worker", json.dumps(spec)], capture_output=True,
                                  text=True, timeout=args.timeout, env=env, check=False)
            if proc.returncode != 0:
                raise SystemExit(f"logits_memory: {mode} {phase} failed:\n{proc.stderr[-3000:]}")
            part = json.loads(proc.stdout.strip().splitlines()[-1])
            part = {(k if k.startswith(phase) or k == "params_M" else f"{phase}_{k}"): v for k, v in part.items()}
            results[mode].update(part)
            print(f"{mode} {phase}: {part}", file=sys.stderr)
    base = results.get("logits_to_keep")
    if base:
        for r in results.values():
            for phase in ("policy_fwd_bwd", "ref_logp"):
                r[f"{phase}_memory_vs_logits_to_keep"] = round(
                    r[f"{phase}_peak_extra_mib"] / max(base[f"{phase}_peak_extra_mib"], 1e-9), 3)
                r[f"{phase}_time_vs_logits_to_keep"] = round(r[f"{phase}_s"] / base[f"{phase}_s"], 3)
                r[f"{phase}_cpu_time_vs_logits_to_keep"] = round(r[f"{phase}_cpu_s"] / base[f"{phase}_cpu_s"], 3)
    result = {"workload": {"N": 16, "prompt_tokens": 26, "T": args.T, "vocab": args.vocab, "hidden": 512,
                           "layers": 2, "threads": args.threads, "repeats": args.repeats,
                           "loadavg_start": load_start}, "modes": results, "loadavg_end": os.getloadavg()}
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
