"""A code-repair warm start's first edit after ``view()``, sampled at T=1 on held-out files: how often its
``old=`` text is the file's expression (the copy) and its ``new=`` operator the one the name asks for (the
policy), per function name. Prints JSON::

    python benchmarks/code_repair_first_edit.py ~/.cache/grouprl/warmstart/code_repair-5ba0bb2229ab --files 100 --samples 4
"""

from __future__ import annotations

import argparse
import collections
import json
import re


def first_edits(path: str, files: int, samples: int, seed: int = 0) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grouprl.builtin.agent_demos import _render
    from grouprl.builtin.code_demos import demo_env_class, repair_tools
    from grouprl.data.tasks import generate_rows

    torch.manual_seed(seed)
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    tools, env = repair_tools(), demo_env_class()()
    stats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in generate_rows("code_repair", "test", n=files, seed=0):
        env.reset(work=row["work"], code=row["code"], tests=row["tests"])
        messages = [*row["prompt"], {"role": "assistant", "content": "<tool_call>view()</tool_call>"},
                    {"role": "tool", "name": "view", "content": env.view()}]
        ids = tok(_render(tok, messages, tools, True), return_tensors="pt", add_special_tokens=False).input_ids
        with torch.no_grad():
            out = model.generate(ids.repeat(samples, 1), do_sample=True, temperature=1.0, max_new_tokens=40,
                                 pad_token_id=tok.pad_token_id)
        w = row["work"]
        st = stats[w["name"]]
        for seq in out:
            text = tok.decode(seq[ids.shape[1]:], skip_special_tokens=True)
            m = re.search(r'edit\(old="([^"]*)", new="([^"]*)"\)', text)
            st["samples"] += 1
            if not m:
                continue
            old, new = m.groups()
            st["old_copied"] += old == f"{w['args'][0]} {w['bug']} {w['args'][1]}"
            parts = new.split()
            st["right_operator"] += len(parts) == 3 and parts[1] == w["op"]
    total = sum(stats.values(), collections.Counter())
    rate = lambda c, k: round(c[k] / max(1, c["samples"]), 3)  # noqa: E731
    return {"model": path, "files": files, "samples_per_file": samples,
            "old_copied": rate(total, "old_copied"), "right_operator": rate(total, "right_operator"),
            "per_name": {n: {"samples": c["samples"], "old_copied": rate(c, "old_copied"),
                             "right_operator": rate(c, "right_operator")} for n, c in sorted(stats.items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="warm-start folders (save_pretrained)")
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    result = [first_edits(m, args.files, args.samples) for m in args.models]
    text = json.dumps(result, indent=1)
    if args.out:
        open(args.out, "w").write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
