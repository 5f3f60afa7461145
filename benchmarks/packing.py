"""CPU time of the log-prob passes with padded rows vs packed rows (``padding_free``).

One micro-batch on ``floor.py``'s models (random weights, fp32, one thread):

- ``small``: hidden 256, 4 layers, the tiny tokenizer's vocabulary, T = 128;
- ``medium``: hidden 512, 2 layers, vocabulary 32768, T = 256.

Three workloads per size:

- ``fixed_8``: 8 rows (the micro-batch of ``vs_trl.py``: 2 prompts x G = 8 per step, 2 micro-batches), every
  prompt 26 tokens, every completion exactly T (``vs_trl.py``'s workload: no padding);
- ``ragged_8``: 8 rows, prompts of 16-26 tokens, completion lengths uniform in [T/4, T] (as real runs have:
  sampled completions end at EOS);
- ``ragged_32``: the same with 32 rows (a larger micro-batch: more sequences short enough to share a row).

For each, in one child process per size, the two paths alternate ``--repeats`` times after a warm-up:
``padded`` (``padding_free=false``: the micro-batch trimmed to its widest prompt + widest completion, the
chunked LM head) and ``packed`` (``padding_free=true``: real tokens end to end in rows of 1-2x the longest
sequence, ``grouprl.train.engine.packing``; ``auto_packs`` says whether ``padding_free=auto`` would pack). Phases: ``policy_fwd_bwd`` (log-probs + entropy, backward of
``-mean(A * logp)``) and ``ref_logp`` (no gradient). Time = median process CPU time. ``slots`` = token
positions the decoder computes (rows x width).

``--default-recipe`` times instead real ragged data: the 128-row micro-batch of optimizer step 10 of
``recipes/default.yaml`` (seed 0; token ids in ``results/default_recipe_microbatch.json``) on that recipe's
model (``builtin:arithmetic``: Qwen2, hidden 128, 3 layers, vocabulary 400).

    OMP_NUM_THREADS=1 python benchmarks/packing.py --default-recipe --out benchmarks/results/packing_default_recipe.json The log-prob sums of both paths are printed as a check.

    OMP_NUM_THREADS=1 python benchmarks/packing.py --out benchmarks/results/packing.json
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

from _common import child_env, emit_json  # noqa: E402

SCRIPT = Path(__file__).resolve()
SIZES = {"small": (256, 4, 128, None), "medium": (512, 2, 256, 32768)}


WORKLOADS = {"fixed_8": ("fixed", 8), "ragged_8": ("ragged", 8), "ragged_32": ("ragged", 32)}


def _batch(torch, workload: str, rows: int, T: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    P = 26
    if workload == "fixed":
        p_len, c_len = torch.full((rows,), P), torch.full((rows,), T)
    else:
        p_len = torch.randint(16, P + 1, (rows,), generator=g)
        c_len = torch.randint(T // 4, T + 1, (rows,), generator=g)
    p_mask = (torch.arange(P)[None] >= P - p_len[:, None]).long()
    c_mask = (torch.arange(T)[None] < c_len[:, None]).long()
    return (torch.randint(3, min(vocab, 373), (rows, P), generator=g) * p_mask, p_mask,
            torch.randint(3, vocab, (rows, T), generator=g) * c_mask, c_mask)


def worker(spec: dict) -> dict:
    import torch

    from grouprl.builtin.tiny import build_tiny_model, build_tokenizer
    from grouprl.train.engine.logp import AUTO_PACK_RATIO, completion_logps, trim_padding
    from grouprl.train.engine.packing import pack, row_cost

    torch.set_num_threads(1)
    hidden, layers, T, vocab = SIZES[spec["size"]]
    torch.manual_seed(0)
    model = build_tiny_model(build_tokenizer(), hidden_size=hidden, num_layers=layers)
    if vocab:
        model.resize_token_embeddings(vocab)
    model.train()
    vocab = model.config.vocab_size
    out = {"params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 2)}
    for name in spec["workloads"]:
        workload, rows = WORKLOADS[name]
        batch = _batch(torch, workload, rows, T, vocab)
        adv = torch.randn(rows, 1, generator=torch.Generator().manual_seed(1))
        trimmed = trim_padding(*batch)
        packed = pack(*trimmed, hidden_size=hidden)
        width = trimmed[0].shape[1] + trimmed[2].shape[1]
        res = {"rows": rows, "real_tokens": int(batch[1].sum() + batch[3].sum()), "padded_slots": rows * width,
               "packed_slots": packed.slots, "packed_rows": len(packed.rows_of),
               "packed_width": packed.input_ids.shape[1], "longest": int((batch[1].sum(1) + batch[3].sum(1)).max()),
               "auto_packs": packed.cost <= AUTO_PACK_RATIO * row_cost(rows, width, hidden)}

        res.update(_measure(torch, completion_logps, model, batch, adv, spec["repeats"]))
        out[name] = res
        print(f"{spec['size']} {name}: {res}", file=sys.stderr, flush=True)
    return out


def default_recipe_case(repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from grouprl.models import resolve_model_path
    from grouprl.train.engine.logp import AUTO_PACK_RATIO, completion_logps, trim_padding
    from grouprl.train.engine.packing import pack, row_cost

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("builtin:arithmetic"), dtype=torch.float32)
    model.train()
    rows = json.loads((SCRIPT.parent / "results" / "default_recipe_microbatch.json").read_text())["rows"]
    P, T = max(len(r["prompt"]) for r in rows), max(len(r["completion"]) for r in rows)
    p_ids, c_ids = torch.zeros(len(rows), P, dtype=torch.long), torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):  # prompts left-padded, completions right-padded, as the trainer lays them out
        p_ids[i, P - len(r["prompt"]):] = torch.tensor(r["prompt"])
        c_ids[i, :len(r["completion"])] = torch.tensor(r["completion"])
    p_mask = torch.zeros_like(p_ids)
    c_mask = torch.zeros_like(c_ids)
    for i, r in enumerate(rows):
        p_mask[i, P - len(r["prompt"]):] = 1
        c_mask[i, :len(r["completion"])] = 1
    batch = (p_ids, p_mask, c_ids, c_mask)
    hidden = model.config.hidden_size
    packed = pack(*trim_padding(*batch), hidden_size=hidden)
    res = {"rows": len(rows), "real_tokens": int(p_mask.sum() + c_mask.sum()), "padded_slots": len(rows) * (P + T),
           "packed_slots": packed.slots, "packed_rows": len(packed.rows_of), "packed_width": packed.input_ids.shape[1],
           "longest": int((p_mask.sum(1) + c_mask.sum(1)).max()),
           "auto_packs": packed.cost <= AUTO_PACK_RATIO * row_cost(len(rows), P + T, hidden)}
    adv = torch.randn(len(rows), 1, generator=torch.Generator().manual_seed(1))
    res.update(_measure(torch, completion_logps, model, batch, adv, repeats))
    return res


def _measure(torch, completion_logps, model, batch, adv, repeats: int) -> dict:
    """Median CPU seconds of both phases, padded vs packed, alternating after one warm-up of each."""
    mask = batch[3].float()

    def fwd_bwd(pf):
        logp, _ = completion_logps(model, *batch, 1.0, with_entropy=True, padding_free=pf)
        (-(adv * logp * mask).sum() / mask.sum()).backward()
        model.zero_grad(set_to_none=True)
        return float(logp.detach().double().sum())

    def ref(pf):
        with torch.no_grad():
            return float(completion_logps(model, *batch, 1.0, padding_free=pf)[0].double().sum())

    res = {}
    for phase, fn in (("policy_fwd_bwd", fwd_bwd), ("ref_logp", ref)):
        times = {"padded": [], "packed": []}
        for mode in times:  # warm-up (and the packing probe)
            res[f"{phase}_{mode}_logp_sum"] = fn(mode == "packed")
        for _ in range(repeats):
            for mode in times:
                start = time.process_time()
                fn(mode == "packed")
                times[mode].append(time.process_time() - start)
        for mode, ts in times.items():
            res[f"{phase}_{mode}_cpu_s"] = round(statistics.median(ts), 3)
        res[f"{phase}_speedup"] = round(res[f"{phase}_padded_cpu_s"] / res[f"{phase}_packed_cpu_s"], 3)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="small,medium")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per child before it is stopped")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker")
    ap.add_argument("--default-recipe", action="store_true", help="time the default recipe's saved micro-batch")
    args = ap.parse_args(argv)
    if args.default_recipe:
        emit_json({"default_recipe": default_recipe_case(args.repeats), "clock": "cpu", "threads": 1,
                   "repeats": args.repeats}, args.out)
        return 0
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    results, load_start = {}, os.getloadavg()
    for size in args.sizes.split(","):
        spec = {"size": size, "workloads": args.workloads.split(","), "repeats": args.repeats}
        proc = subprocess.run([sys.executable, str(SCRIPT), "--worker", json.dumps(spec)], capture_output=True,
                              text=True, timeout=args.timeout, env=child_env(1), check=False)
        sys.stderr.write(proc.stderr[-4000:])
        if proc.returncode != 0:
            raise SystemExit(f"packing: {size} failed:\n{proc.stderr[-3000:]}")
        results[size] = json.loads(proc.stdout.strip().splitlines()[-1])
    emit_json({"workloads": {k: WORKLOADS[k] for k in args.workloads.split(",")}, "repeats": args.repeats, "clock": "cpu", "threads": 1, "sizes": results,
               "loadavg_start": load_start, "loadavg_end": os.getloadavg()}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
