"""Does a built-in warm start's SFT see the token ids its saved checkpoint gives a rollout?

transformers' ``AutoTokenizer`` gives a ``qwen2`` checkpoint ``Qwen2Tokenizer`` whatever its tokenizer_config.json
names, and that class brings its own pre-tokenizer. For every built-in (:data:`grouprl.builtin.warmstart.WARMSTARTS`)
this encodes all of its SFT demonstrations with the tokenizer the build trains (``warmstart.built_tokenizer``)
and with the one that loads from the checkpoint (``grouprl.builtin.tiny.loaded_tokenizer``, what the build now
trains on) and counts the rows whose ids differ. No model is trained; prints JSON::

    python benchmarks/warmstart_tokenizer.py --out benchmarks/results/warmstart_tokenizer.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def check(name: str) -> dict:
    from grouprl.builtin import warmstart as w
    from grouprl.builtin.tiny import loaded_tokenizer

    spec, t0 = w.WARMSTARTS[name], time.perf_counter()
    tok = w.built_tokenizer(spec)
    loaded = loaded_tokenizer(tok, w._tiny_model(spec, tok, spec.seed))
    a, b = w.sft_encoded(spec, tok)[0], w.sft_encoded(spec, loaded)[0]
    return {"rows": len(a), "rows_whose_ids_differ": sum(x != y for x, y in zip(a, b)),
            "built_class": type(tok).__name__, "loaded_class": type(loaded).__name__,
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    from grouprl.builtin.warmstart import WARMSTARTS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", default=list(WARMSTARTS), choices=list(WARMSTARTS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    result = {name: check(name) for name in args.only}
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
