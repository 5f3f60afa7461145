"""Train a tool-using agent with GRPO: a plain Python function as the tool, rewards that see the trajectory.

    python examples/agent_tools.py                       # builtin:arithmetic, 20 steps on CPU
    python examples/agent_tools.py --model PATH --steps 2 --output-dir runs/agent   # any local model

Without ``--output-dir`` the run goes to ``grouprl-agent_tools`` in the system's temporary folder, so the
example writes nothing into the folder it is run from.

The model may call ``multiply`` by writing ``<tool_call>multiply(a=123, b=456)</tool_call>`` (or the
Hermes JSON form); the rollout runs the call, appends the result as a tool turn and lets the model go on.
Only the model's own tokens are trained on (docs/AGENTS.md, "The mask rule").
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from grouprl import GRPOConfig, GRPOTrainer


def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


def used_the_tool(completions, tool_calls, **kwargs) -> list[float]:
    """0.2 for each trajectory whose first call to ``multiply`` succeeded (rewards see ``tool_calls``)."""
    return [0.2 if any(c["name"] == "multiply" and c["error"] is None for c in calls) else 0.0
            for calls in tool_calls]


def make_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        rows.append({"prompt": f"What is {a} * {b}? Use the multiply tool, then answer with the number.",
                     "answer": str(a * b)})
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:arithmetic")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--output-dir", default=str(Path(tempfile.gettempdir()) / "grouprl-agent_tools"))
    args = p.parse_args(argv)
    config = GRPOConfig(
        output_dir=args.output_dir, overwrite_output_dir=True, max_steps=args.steps, num_generations=4,
        per_device_train_batch_size=8, max_new_tokens=args.max_new_tokens, learning_rate=1e-5, seed=0,
        max_turns=3, tool_timeout_s=5.0, save_strategy="no", eval_split=None, progress_bar=False,
    )
    trainer = GRPOTrainer(model=args.model, config=config, train_dataset=make_rows(64),
                          reward_funcs=["accuracy", used_the_tool], tools=[multiply])
    trainer.train()
    last = [json.loads(line) for line in Path(args.output_dir, "metrics.jsonl").read_text().splitlines()][-1]
    summary = {k: last.get(k) for k in ("reward", "rewards/accuracy/mean", "tools/calls_per_traj",
                                         "tools/failure_frac", "turns/mean", "tokens/model", "tokens/tool")}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
