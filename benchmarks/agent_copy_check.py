"""Teacher-forced copy accuracy of a calculator agent: per digit position, is the argmax the right digit?

The context is the correct demonstration (question, call with the right expression, the tool's reply,
the answer); the 15 digit positions are the 9 of the expression in the call and the 6 of the answer.
Prints JSON ``{"positions": {k: accuracy}, "n": problems}`` for ``MODEL_DIR`` (a warm start or a trained
``final/``)::

    python benchmarks/agent_copy_check.py ~/.cache/grouprl/warmstart/calculator-<hash> [--n 60]
"""

from __future__ import annotations

import argparse
import json


def copy_accuracy(path: str, n: int = 60) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grouprl.builtin.agent_demos import CALCULATOR_TOOLS, conversation_ids, tool_conversation
    from grouprl.data.tasks import generate_rows

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    right: dict[int, list[int]] = {}
    for row in generate_rows("calculator", "test", n=n, seed=0):
        ids, mask = conversation_ids(tok, tool_conversation(row, call=True), CALCULATOR_TOOLS)
        with torch.no_grad():
            pred = model(torch.tensor([ids])).logits[0].argmax(-1)
        k = 0
        for t in range(1, len(ids)):
            if mask[t] and tok.decode([ids[t]]).strip().isdigit():
                right.setdefault(k, []).append(int(pred[t - 1] == ids[t]))
                k += 1
    return {"positions": {k: round(sum(v) / len(v), 3) for k, v in right.items()}, "n": n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--n", type=int, default=60)
    args = ap.parse_args(argv)
    print(json.dumps(copy_accuracy(args.model_dir, args.n)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
