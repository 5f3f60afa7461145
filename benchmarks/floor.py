"""Know the floor: grouprl's time per phase as a multiple of the same work done by plain PyTorch.

For one model and the GRPO workload of ``vs_trl.py`` (G=8, 16 completions per optimizer step, every
completion exactly ``max_new_tokens`` long), a child process with nothing but the model measures:

- ``generate``: a KV-cache decode of 16 sequences x T tokens, greedy, the EOS never stopping it early. Two
  candidates, the faster one is the floor: a minimal hand loop over the HF model (``past_key_values``,
  ``logits_to_keep=1`` so only the last position goes through the LM head) and ``model.generate`` with
  ``cache_implementation="static"`` (a pre-allocated cache);
- ``policy_fwd_bwd``: one forward+backward computing the GRPO-shaped loss ``-mean(A * logp)`` over exactly
  the non-padding tokens, with log-probs only at the completion positions (``logits_to_keep=T+1``). Two
  candidates, the faster one is the floor: one batch of all 16 sequences (the prompts of this workload
  all have the same length, so the batch has no padding; ``pad_tokens`` in the JSON says so) and a
  per-sequence loop;
- ``ref_logp``: the same forward under ``torch.inference_mode`` (no grad).

Each phase is timed ``--repeats`` times after one warm-up (median); the floor child and the grouprl run
alternate ``--repeats`` times and the medians over them are reported.

A second child runs grouprl's trainer exactly as ``vs_trl.py`` does (``_grouprl_side.run_grouprl``) and
reads its own timers (``time/generate``, ``time/policy_fwd_bwd``, ``time/ref_forward``, median steady
step). The JSON gives, per size, both in seconds and ``ratio`` = grouprl / floor.

    OMP_NUM_THREADS=1 python benchmarks/floor.py --sizes tiny,small --repeats 3 \\
        --out benchmarks/results/floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402  (SIZES, make_model: the presets shared with vs_trl.py and scaling.py)
    GRPO,
    SIZES,
    Workload,
    emit_json,
    make_dataset_rows,
    make_model,
    run_child,
    workload_dict,
)

SCRIPT = Path(__file__).resolve()
PHASES = ("generate", "policy_fwd_bwd", "ref_logp")
WITHIN = 1.3  # the target: each phase within 1.3x of its floor


def prompt_batch(tok: Any, w: Workload) -> tuple[Any, Any]:
    """The 16 prompt rows of one step (B prompts, each G times), chat-templated, left-padded."""
    rows = make_dataset_rows(w.num_prompts, w.seed)[: w.prompts_per_step]
    texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    texts = [t for t in texts for _ in range(w.num_generations)]
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _decode_rest(model: Any, past: Any, token: Any, mask: Any, last: Any, steps: int) -> list:
    """``steps`` more greedy tokens after ``token``, one forward each through the KV cache ``past``."""
    import torch

    tokens = []
    for _ in range(steps):
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        last = last + 1
        out = model(input_ids=token, attention_mask=mask, position_ids=last, past_key_values=past,
                    use_cache=True, logits_to_keep=1)
        past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
    return tokens


def decode_loop(model: Any, ids: Any, mask: Any, steps: int) -> Any:
    """Greedy KV-cache decode of exactly ``steps`` tokens; returns ``[N, P + steps]`` token ids."""
    import torch

    with torch.inference_mode():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        past, tokens = out.past_key_values, [out.logits[:, -1].argmax(-1, keepdim=True)]
        last = pos[:, -1:]
        tokens += _decode_rest(model, past, tokens[0], mask, last, steps - 1)
    return torch.cat([ids, *tokens], dim=1)


def decode_shared_prefix(model: Any, ids: Any, mask: Any, steps: int, group: int) -> Any:
    """:func:`decode_loop`, but each distinct prompt is prefilled once and its cache repeated ``group`` times."""
    import torch

    with torch.inference_mode():
        uids, umask = ids[::group], mask[::group]
        pos = (umask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=uids, attention_mask=umask, position_ids=pos, use_cache=True, logits_to_keep=1)
        past = out.past_key_values
        past.batch_repeat_interleave(group)
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True).repeat_interleave(group, 0)]
        last = pos[:, -1:].repeat_interleave(group, 0)
        tokens += _decode_rest(model, past, tokens[0], mask, last, steps - 1)
    return torch.cat([ids, *tokens], dim=1)


def decode_static(model: Any, ids: Any, mask: Any, steps: int) -> Any:
    """``model.generate`` with a pre-allocated static cache, greedy, exactly ``steps`` new tokens."""
    return model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=steps,
                          min_new_tokens=steps, cache_implementation="static")


def completion_logp(model: Any, seq: Any, steps: int) -> Any:
    """Log-probs ``[N, steps]`` of the last ``steps`` tokens of ``seq``; LM head only at those positions."""
    import torch

    logits = model(input_ids=seq, logits_to_keep=steps + 1).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, seq[:, -steps:, None]).squeeze(-1)


def fwd_bwd(model: Any, seqs: list[Any], adv: Any, steps: int) -> float:
    """``-mean(A * logp)`` over every completion token of ``seqs`` (a list of batches), then backward."""
    total = sum(s.shape[0] for s in seqs) * steps
    loss_sum, row = 0.0, 0
    for s in seqs:
        lp = completion_logp(model, s, steps)
        loss = -(adv[row:row + s.shape[0], None] * lp).sum() / total
        loss.backward()
        loss_sum += float(loss.detach())
        row += s.shape[0]
    model.zero_grad(set_to_none=True)
    return loss_sum


def measure_floor(model_dir: str, w: Workload, repeats: int, threads: int = 1) -> dict[str, Any]:
    """Plain-PyTorch seconds for each phase of one optimizer step of ``w`` (median of ``repeats``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    torch.manual_seed(w.seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.generation_config.eos_token_id = None  # never stop early: exactly T tokens
    ids, mask = prompt_batch(tok, w)
    T = w.max_new_tokens
    seq = decode_loop(model, ids, mask, T)
    pad_tokens = int((mask == 0).sum())
    adv = torch.randn(seq.shape[0])
    cands: dict[str, dict[str, float]] = {"generate": {}, "policy_fwd_bwd": {}, "ref_logp": {}}
    cands["generate"]["hand_loop"] = _median_time(lambda: decode_loop(model, ids, mask, T), repeats)
    G = w.num_generations
    cands["generate"]["hand_loop_shared_prefix"] = _median_time(
        lambda: decode_shared_prefix(model, ids, mask, T, G), repeats)
    try:
        cands["generate"]["static_generate"] = _median_time(lambda: decode_static(model, ids, mask, T), repeats)
    except Exception as exc:  # noqa: BLE001 - report why the candidate is missing, keep the other
        cands["generate"]["static_generate_error"] = repr(exc)[:200]
    # exactly the non-padding tokens: a batch when no row is padded, and a per-sequence loop either way
    keep = torch.cat([mask.bool(), mask.new_ones(mask.shape[0], T).bool()], dim=1)
    singles = [seq[i:i + 1][:, keep[i]] for i in range(seq.shape[0])]
    model.train()
    if pad_tokens == 0:
        cands["policy_fwd_bwd"]["batch"] = _median_time(lambda: fwd_bwd(model, [seq], adv, T), repeats)
    cands["policy_fwd_bwd"]["per_sequence"] = _median_time(lambda: fwd_bwd(model, singles, adv, T), repeats)
    model.eval()

    def ref(batches):
        with torch.inference_mode():
            return [completion_logp(model, s, T) for s in batches]

    if pad_tokens == 0:
        cands["ref_logp"]["batch"] = _median_time(lambda: ref([seq]), repeats)
    cands["ref_logp"]["per_sequence"] = _median_time(lambda: ref(singles), repeats)
    floor = {k: min(v for v in c.values() if isinstance(v, float)) for k, c in cands.items()}
    return {"floor_s": floor, "candidates_s": cands, "sequences": int(seq.shape[0]), "prompt_width": int(ids.shape[1]),
            "completion_tokens": T, "pad_tokens": pad_tokens,
            "parameters": sum(p.numel() for p in model.parameters()), "vocab": model.config.vocab_size}


def worker(lib: str, spec: dict[str, Any]) -> None:
    """Child-process entry: the floor or grouprl on one workload; writes the result JSON."""
    w = Workload(**spec["workload"])
    if lib == "floor":
        out = measure_floor(spec["model_dir"], w, spec["repeats"], w.threads)
    else:
        from _grouprl_side import run_grouprl

        out = run_grouprl(w, spec["model_dir"], spec["work_dir"])
    Path(spec["result_path"]).write_text(json.dumps(out))


def compare(floor: dict[str, Any], grouprl_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per phase: floor seconds, grouprl seconds (median over runs of the median steady step), ratio."""
    ok = [r for r in grouprl_runs if r.get("ok")]
    out: dict[str, Any] = {"phases": {}}
    for phase in PHASES:
        f = floor["floor_s"][phase]
        g = statistics.median(r["breakdown_s_per_step"][phase] for r in ok) if ok else None
        ratio = g / f if g is not None and f > 0 else None
        out["phases"][phase] = {"floor_s": f, "grouprl_s": g, "ratio": ratio,
                                "within_1_3x": None if ratio is None else ratio <= WITHIN}
    if not ok:
        out["grouprl_errors"] = [r.get("log_tail", "")[-1500:] for r in grouprl_runs]
    return out


def run_size(name: str, repeats: int, steps: int, threads: int, tmp: Path, log=print) -> dict[str, Any]:
    size = SIZES[name]
    hidden, layers, tokens, vocab = size.hidden, size.layers, size.tokens, size.vocab
    model_dir = str(make_model(tmp / name, hidden, layers, vocab))
    w = replace(GRPO, max_new_tokens=tokens, steps=steps, warmup_steps=1, threads=threads)
    spec = {"workload": workload_dict(w), "model_dir": model_dir, "repeats": repeats}
    floors, runs = [], []
    for i in range(repeats):  # interleaved, so that a spike of load on the shared machine hits both sides
        log(f"[floor] {name}: plain PyTorch {i + 1}/{repeats}, then grouprl")
        floors.append(run_child(SCRIPT, "floor", spec))
        runs.append(run_child(SCRIPT, "grouprl", spec))
    ok = [f for f in floors if f.get("ok")]
    if not ok:
        return {"ok": False, "error": floors[0].get("log_tail", "")[-1500:]}
    floor = {**ok[0], "floor_s": {k: statistics.median(f["floor_s"][k] for f in ok) for k in PHASES},
             "floor_s_all": [f["floor_s"] for f in ok]}
    res = compare(floor, runs)
    res.update(ok=all(r.get("ok") for r in runs), model={"hidden_size": hidden, "num_layers": layers,
               "vocab": floor["vocab"], "parameters": floor["parameters"]},
               max_new_tokens=tokens, floor_detail={k: v for k, v in floor.items() if k not in ("ok", "lib")},
               grouprl_steps_per_s=[r.get("steps_per_s") for r in runs])
    return res


def markdown(result: dict[str, Any]) -> str:
    lines = ["| size | params | phase | floor ms | grouprl ms | grouprl / floor | within 1.3x |",
             "|---|---|---|---|---|---|---|"]
    for name, r in result["sizes"].items():
        if "phases" not in r:
            lines.append(f"| {name} | | failed | | | | |")
            continue
        for phase, p in r["phases"].items():
            g = "n/a" if p["grouprl_s"] is None else f"{1000 * p['grouprl_s']:.1f}"
            ratio = "n/a" if p["ratio"] is None else f"{p['ratio']:.2f}x"
            lines.append(f"| {name} | {r['model']['parameters'] / 1e6:.2f}M | {phase} | {1000 * p['floor_s']:.1f} "
                         f"| {g} | {ratio} | {p['within_1_3x']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", choices=("floor", "grouprl"), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default="tiny,small", help="comma list of: " + ", ".join(SIZES))
    p.add_argument("--repeats", type=int, default=3, help="timed repeats of each floor phase and grouprl runs")
    p.add_argument("--steps", type=int, default=4, help="grouprl optimizer steps per run (first is warm-up)")
    p.add_argument("--threads", type=int, default=1, help="torch threads in each child")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--markdown", type=Path, default=None, help="print the table of a saved JSON result and exit")
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, json.loads(args.spec))
        return 0
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        p.error(f"--sizes: unknown {unknown}; choose from {list(SIZES)}")
    result: dict[str, Any] = {"load_average_before": os.getloadavg(), "threads": args.threads,
                              "repeats": args.repeats, "steps": args.steps, "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="grouprl-floor-") as tmp:
        for name in sizes:
            result["sizes"][name] = run_size(name, args.repeats, args.steps, args.threads, Path(tmp),
                                             log=lambda m: print(m, file=sys.stderr))
    result["load_average_after"] = os.getloadavg()
    emit_json(result, args.out)
    print(markdown(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
