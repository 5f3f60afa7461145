"""Which copy a calculator warm start has not learned: its copy gate split into the call and the answer.

Builds ``builtin:calculator`` with ``--seed`` (a temporary directory, never the cache) and at every gate check
scores, on the gate's 64 unseen problems, the two halves of the demonstrated tool use apart: the call (the
expression copied from the question into ``calculator(expression="...")``) and the answer (the tool's reply
copied into ``Answer: N``), each exact at every trained token under teacher forcing (= greedy decoding), with
the commonest first wrong token of each half and one problem's teacher-forced prediction::

    OMP_NUM_THREADS=1 python benchmarks/copy_gate_parts.py --seed 2 --cap 2000 --stop 800 \\
        --out benchmarks/results/copy_gate_parts_seed2.json

``--cap`` is the SFT's ``sft_steps`` (the cosine schedule's length: another schedule than the 5,000-step
built-in, so the run is a diagnosis of the same settings, not the cached build); ``--stop`` ends it after that
check. No restart rule (``gate_restart_after=0``): it shows one initialisation.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path


class _Stop(Exception):
    pass


def parts_gate(spec, tok, log: list, out: Path | None, stop: int):
    """A gate ``score(model)`` (the real one's score) that also logs the call / answer halves at each check."""
    import torch

    from grouprl.builtin import agent_demos as demos

    score, rows = demos.copy_gate(spec, tok), demos.gate_rows(spec)
    encoded = [demos.conversation_ids(tok, demos.tool_conversation(r, call=True), demos.TOOLS[spec.environment])
               for r in rows]

    def wrapped(model) -> float:
        step, s = (len(log) + 1) * spec.gate_every, score(model)
        ok, fails = {"call": 0, "answer": 0}, {}
        model.eval()
        with torch.no_grad():
            for r, (ids, mask) in enumerate(encoded):
                pred = model(input_ids=torch.tensor([ids])).logits[0, :-1].argmax(-1).tolist()
                first = mask.index(1)
                reply = first + mask[first:].index(0)  # the call turn ends where the tool's reply (mask 0) starts
                halves = {"call": range(first + 1, reply), "answer": [j for j in range(reply, len(ids)) if mask[j]]}
                for half, positions in halves.items():
                    bad = [j for j in positions if pred[j - 1] != ids[j]]
                    ok[half] += not bad
                    if bad:
                        key = f"{half}: {tok.decode([ids[bad[0]]])!r} -> {tok.decode([pred[bad[0] - 1]])!r}"
                        fails[key] = fails.get(key, 0) + 1
                if r == 0:
                    example = {"target": tok.decode(ids[first:]), "teacher_forced": "".join(
                        tok.decode([pred[j - 1]]) if mask[j] else "_" for j in range(first, len(ids)))}
        model.train()
        log.append({"step": step, "gate": s, "call_ok": ok["call"] / len(rows), "answer_ok": ok["answer"] / len(rows),
                    "first_errors": sorted(fails.items(), key=lambda kv: -kv[1])[:8], "example": example})
        print(json.dumps({k: log[-1][k] for k in ("step", "gate", "call_ok", "answer_ok")}), file=sys.stderr, flush=True)
        if out is not None:
            out.write_text(json.dumps(log, indent=1) + "\n")
        if stop and step >= stop:
            raise _Stop
        return s

    return wrapped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--cap", type=int, default=2000, help="sft_steps of the diagnosis build")
    ap.add_argument("--stop", type=int, default=0, help="stop after the check at this step (0: run to the gate/cap)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from grouprl.builtin import agent_demos
    from grouprl.builtin.warmstart import WARMSTARTS, build_warmstart

    spec = replace(WARMSTARTS["calculator"], seed=args.seed, sft_steps=args.cap, gate_restart_after=0)
    log: list = []
    out = Path(args.out) if args.out else None
    real = agent_demos.demo_gate
    agent_demos.demo_gate = lambda spec, tok: parts_gate(spec, tok, log, out, args.stop)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            build_warmstart(spec, Path(tmp) / "model")
    except _Stop:
        pass
    finally:
        agent_demos.demo_gate = real
    print(json.dumps(log[-1] if log else {}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
