"""Rewards per second of each built-in reward on 10k synthetic completions (prints JSON).

A training step scores B*G completions (e.g. 64 x 8 = 512): a reward at 5k/s costs 0.1 s of a step
that takes seconds to minutes of generation. The mix: math answers in \\boxed{} / "Answer:" lines /
plain final text, with think blocks (some opened by the chat template), tool calls, LaTeX fractions and
wrong answers; 8 completions per prompt share a gold answer, as in GRPO groups. The code reward runs
programs in the sandbox and is benchmarked with it, not here.

``pathological`` times one call of each reward on inputs built to be slow: 20,000 unclosed
``\\boxed{``, 20,000 nested ``\\boxed{`` (and 100,000 nested braces), 20,000 unclosed ``<answer>``,
and 1 MB of digits after "Answer:". Every figure should stay far below the 5 s time limit (a
completion longer than 20,000 characters is scored in the killable worker process).

    .venv/bin/python benchmarks/rewards_throughput.py [--n 10000]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time


def make_samples(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """(completion, math gold answer, tool-call gold) triples."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 8 == 0:
            r = rng.randint(1, 50)
            kind = rng.random()
            if kind < 0.6:
                gold = f"{3.14159265 * r * r:.2f}"
            elif kind < 0.75:
                gold = f"\\frac{{{r}}}{{{r + 1}}}"
            elif kind < 0.9:
                gold = str(r * 7)
            else:  # symbolic: needs math-verify's LaTeX parser (ANTLR, tens of ms per new string)
                gold = f"{r}\\sqrt{{{rng.choice([2, 3, 5])}}}"
            tool_gold = f"calculator(expression='pi * {r}**2')"
        pred = gold if rng.random() < 0.5 else str(rng.randint(1, 9999))
        if "sqrt" in gold and rng.random() < 0.5:
            pred = f"{rng.randint(1, 50)}\\sqrt{{{rng.choice([2, 3, 5, 7])}}}"
        reasoning = " ".join(
            rng.choice(
                [
                    "First",
                    "Then",
                    "So",
                    "We",
                    "compute",
                    "the",
                    "area",
                    "radius",
                    "is",
                    "squared",
                    "times",
                    "pi",
                    "which",
                    "gives",
                    str(rng.randint(1, 99)),
                    "=",
                    "+",
                ]
            )
            for _ in range(rng.randint(20, 120))
        )
        style = rng.randrange(6)
        if style == 0:
            text = f"<think>{reasoning}</think>\nThe answer is \\boxed{{{pred}}}."
        elif style == 1:
            text = f"{reasoning}</think>\nAnswer: {pred}"
        elif style == 2:
            text = f"<think>{reasoning} {pred}</think>\n<tool_call>calculator(expression='pi * {rng.randint(1, 50)}**2')</tool_call>"
        elif style == 3:
            text = f"<think>{reasoning}</think>\nSo the result is {pred} square units."
        elif style == 4:
            text = f"{reasoning}. Therefore the answer is {pred}."
        else:
            text = (
                f"<think>{reasoning}</think>"
                + "".join(
                    f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{rng.randint(1, 9)} * pi"}}}}</tool_call>'
                    for _ in range(rng.randint(1, 4))
                )
                + f" \\boxed{{{pred}}}"
            )
        out.append((text, gold, tool_gold))
    return out


PATHOLOGICAL = {
    "unclosed_boxed_20k": "\\boxed{" * 20_000,
    "nested_boxed_20k": "\\boxed{" * 20_000 + "}" * 20_000,
    "nested_braces_100k": "{" * 100_000 + "}" * 100_000,
    "unclosed_answer_20k": "<answer>" * 20_000,
    "digits_1mb": "Answer: " + "1" * 1_000_000,
}


def time_pathological(funcs: dict) -> dict:
    """Seconds of one call of each reward on each pathological completion (the worker started first)."""
    funcs["math"]("x" * 30_000, "3", "")  # start the worker outside the timings
    out: dict = {}
    for case, text in PATHOLOGICAL.items():
        out[case] = {}
        for name, fn in funcs.items():
            start = time.perf_counter()
            fn(text, "3", "calculator(expression='1')")
            out[case][name] = round(time.perf_counter() - start, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    args = parser.parse_args()

    from grouprl.rewards import (
        accuracy_reward,
        composite_reward,
        efficiency_reward,
        exact_match_reward,
        format_reward,
        math_reward,
        robust_reward,
        safety_reward,
        tool_call_reward,
    )

    samples = make_samples(args.n)
    funcs = {
        "math": lambda c, g, t: math_reward(c, answer=g),
        "accuracy(math, strict)": lambda c, g, t: accuracy_reward(c, g, strict=True),
        "tool_call": lambda c, g, t: tool_call_reward(c, answer=t),
        "tool_call(shaped)": lambda c, g, t: tool_call_reward(c, answer=t, shaped=True),
        "exact": lambda c, g, t: exact_match_reward(c, answer=g),
        "format": lambda c, g, t: format_reward(c),
        "efficiency": lambda c, g, t: efficiency_reward(c),
        "safety": lambda c, g, t: safety_reward(c),
        "robust": lambda c, g, t: robust_reward(c, g),
        "composite": lambda c, g, t: composite_reward(c, answer=g),
    }
    from grouprl.rewards import math_answer

    results = {}
    for name, fn in funcs.items():
        math_answer._parse.cache_clear()  # each function pays its own parsing
        start, cpu_start = time.perf_counter(), time.process_time()
        scores = [fn(c, g, t) for c, g, t in samples]
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        valid = [s for s in scores if s is not None]
        results[name] = {
            "rewards_per_s": round(len(samples) / elapsed, 1),
            "seconds": round(elapsed, 3),
            # CPU time of this process: the honest cost when other jobs share the machine
            "rewards_per_cpu_s": round(len(samples) / max(cpu, 1e-9), 1),
            "mean_score": round(sum(valid) / max(len(valid), 1), 4),
            "none": len(scores) - len(valid),
        }
    print(
        json.dumps(
            {
                "samples": args.n,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "results": results,
                "pathological_seconds": time_pathological(funcs),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
