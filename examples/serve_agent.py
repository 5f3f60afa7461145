"""Deploy the calculator agent: `grouprl serve` it, drive it with the official `openai` client.

    python examples/serve_agent.py                        # the model recipes/agent_calculator.yaml trained
    python examples/serve_agent.py --model builtin:calculator --problems 20   # the warm start instead

What it does: starts ``grouprl serve MODEL`` as a subprocess (the deployment), then for each held-out
``builtin:calculator`` problem asks the endpoint with the calculator's tool schema -- the same prompt and
``tools`` a training rollout renders. When the reply carries ``tool_calls``, the client runs them with
the same calculator (``grouprl.envs.calculator``), appends the assistant turn and one ``tool`` message
per call, and asks again, until the model answers or ``--max-turns`` model turns are used: the
trajectory shape of training (``max_turns: 2``: call, then answer). The answer is scored with the
recipe's ``accuracy`` reward. Greedy by default (``--temperature``), so a rerun prints the same.

Where the model comes from: ``outputs/agent_calculator/final`` (what ``grouprl train -c
recipes/agent_calculator.yaml`` writes). If it is not there, the example trains a short run of that
recipe first (``--train-steps``, default 20 steps into ``outputs/serve_agent_train``) and says so; the
full 60-step recipe is what its header's curve measures. Everything runs offline on CPU.

What it leaves out: authentication, TLS, several replicas -- ``grouprl serve`` binds to loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "agent_calculator.yaml"
TRAINED = Path("outputs/agent_calculator/final")


def trained_model(steps: int) -> str:
    """The recipe's trained model; a short run of the recipe when there is none (said on stderr)."""
    if TRAINED.is_dir():
        return str(TRAINED)
    out = Path("outputs/serve_agent_train")
    if not (out / "final").is_dir():
        print(f"no trained model at {TRAINED}: training a short run of {RECIPE.name} ({steps} steps into {out}; "
              f"the full recipe is `grouprl train -c {RECIPE}`)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "grouprl", "train", "-c", str(RECIPE), f"max_steps={steps}",
                        f"output_dir={out}", "eval_steps=0", "report_to=none"], check=True)
    return str(out / "final")


def start_server(model: str, name: str, timeout_s: float = 600.0) -> tuple[subprocess.Popen, str]:
    """``grouprl serve`` on a free loopback port; its URL once it prints it (bounded by ``timeout_s``)."""
    cmd = [sys.executable, "-m", "grouprl", "serve", model, "--port", "0", "--name", name, "--device", "cpu",
           "--max-new-tokens", "64", "--parent-pid", str(os.getpid())]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True).start()
    try:
        while True:
            line = lines.get(timeout=timeout_s)
            found = re.search(r"serving .* at (http://\S+/v1)", line)
            if found:
                return proc, found.group(1)
    except queue.Empty:
        proc.kill()
        raise SystemExit(f"`{' '.join(cmd)}` printed no URL within {timeout_s:g}s") from None


def run_agent(client, model: str, row: dict, tools: list[dict], max_turns: int, temperature: float) -> dict:
    """One trajectory: model turn, tool turn, model turn... until an answer or ``max_turns``."""
    from grouprl.envs.calculator import CalculatorError, calculator

    messages = [dict(m) for m in row["prompt"]]
    for turn in range(1, max_turns + 1):
        reply = client.chat.completions.create(model=model, messages=messages, tools=tools, temperature=temperature,
                                               max_tokens=48)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
        if not message.tool_calls or turn == max_turns:
            return {"messages": messages, "answer": message.content or "", "turns": turn}
        for call in message.tool_calls:
            try:
                result = calculator(**json.loads(call.function.arguments))
            except (CalculatorError, TypeError, ValueError) as e:
                result = f"error: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    raise AssertionError("unreachable")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a model folder or builtin:<name> (default: the trained agent)")
    ap.add_argument("--train-steps", type=int, default=20, help="steps of the short run when nothing is trained")
    ap.add_argument("--problems", type=int, default=10, help="held-out problems to solve")
    ap.add_argument("--max-turns", type=int, default=2, help="model turns per problem (the recipe's max_turns)")
    ap.add_argument("--temperature", type=float, default=0.0)
    args = ap.parse_args()

    import openai

    import grouprl.builtins  # noqa: F401  (registers the calculator environment)
    from grouprl.data.tasks import load_task
    from grouprl.registry import ENVIRONMENTS
    from grouprl.rewards.accuracy import accuracy_reward
    from grouprl.rollout.multiturn import as_tool_env

    model = args.model or trained_model(args.train_steps)
    tools = as_tool_env(ENVIRONMENTS.get("calculator")()).tools  # the schema a training rollout renders
    proc, url = start_server(model, "calculator-agent")
    print(f"serving {model} at {url}", flush=True)
    try:
        client = openai.OpenAI(base_url=url, api_key="local", max_retries=0, timeout=120)
        right = calls = 0
        for row in load_task("calculator", "test", n=args.problems):
            out = run_agent(client, "calculator-agent", row, tools, args.max_turns, args.temperature)
            score = accuracy_reward(out["answer"], row["answer"])
            right += score > 0.5
            calls += sum(m["role"] == "tool" for m in out["messages"])
            shown = " | ".join(f"{m['role']}: " + (m.get("content") or json.dumps(
                [c["function"] for c in m.get("tool_calls", [])])) for m in out["messages"])
            print(f"[{'right' if score > 0.5 else 'wrong'}] {shown}", flush=True)
        print(json.dumps({"model": model, "problems": args.problems, "accuracy": right / args.problems,
                          "tool_calls_per_problem": calls / args.problems}), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
