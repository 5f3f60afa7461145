"""Wall time per multi-turn round and the engine's busy fraction: lockstep vs per-trajectory scheduling.

Two workloads, each run with ``schedule="lockstep"`` and ``schedule="per_trajectory"`` on the same seeds
(the same tool latencies, the same scripted turns), side by side in one process:

1. **fake engine, heavy-tailed tools.** ``B x G`` trajectories of the tiny chat tokenizer; every
   trajectory makes ``--calls`` tool calls (one per model turn) and then answers. The engine is a fake
   that sleeps ``--token-ms`` per decode step (a batch engine decodes its rows together: the call takes
   ``max tokens x token-ms``, plus ``--call-ms``) -- or, ``continuous``, steps every running request one
   token per ``--token-ms`` and takes new requests between steps, as vLLM does. Each tool call sleeps a
   lognormal latency with median ``--median-ms`` and ``sigma`` (1.3: p99 = 20.5 x the median),
   drawn from a generator seeded by (round, trajectory, turn), so both schedules see the same latencies.
2. **the agent recipe on the real transformers path** (``recipes/agent_calculator.yaml``: the
   ``builtin:calculator`` model, its prompts, the calculator environment, ``max_turns`` 2, 64 tokens,
   8 prompts x G = 8), sampled at temperature 1 with the lean CPU sampler; the calculator answers in
   microseconds, so this measures what per-trajectory scheduling costs when tools are fast.

Prints one JSON object: per workload and schedule the median wall seconds per round, the engine's busy
fraction (time inside the engine / wall time), engine calls per round, and the lockstep / per-trajectory
ratio of the wall time. The schedules alternate round by round (the same machine load for both); on the
recipe it also says whether per-trajectory rounds sampled the same tokens as lockstep (same seed)::

    OMP_NUM_THREADS=1 python benchmarks/agent_rollout.py                 # both workloads
    OMP_NUM_THREADS=1 python benchmarks/agent_rollout.py --skip-recipe   # the fake engine only
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from grouprl.rollout.base import SamplingParams  # noqa: E402
from grouprl.rollout.engine import Engine, Generation  # noqa: E402
from grouprl.rollout.multiturn import MultiTurnParams, MultiTurnRollout  # noqa: E402

E = "<|im_end|>"
TOOL = {"type": "function", "function": {"name": "work", "description": "Does some work.",
                                         "parameters": {"type": "object", "properties": {}}}}


class LatencyEnv:
    """One tool, ``work``, sleeping a lognormal latency drawn from a generator seeded by (round, row, call)."""

    tools = [TOOL]

    def __init__(self, median_s: float, sigma: float, seed: int) -> None:
        self.median_s, self.sigma, self.seed, self.row, self.calls = median_s, sigma, seed, 0, 0

    def reset(self, row: dict) -> None:
        self.row = int(row["row"])
        return None

    def call(self, name: str, arguments: dict) -> str:
        rng = random.Random(hash((self.seed, self.row, self.calls)))
        self.calls += 1
        time.sleep(self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0)))
        return "done"

    def reward(self) -> None:
        return None

    def close(self) -> None:
        pass


def _script(tokenizer, calls: int, words: int):
    """Turn k < calls: a ``work()`` call after ``words`` words of reasoning; then the answer."""
    think = " ".join(["step"] * words)
    call = tokenizer.encode(f"{think} <tool_call>work()</tool_call>{E}", add_special_tokens=False)
    answer = tokenizer.encode(f"{think} done{E}", add_special_tokens=False)

    def reply(prompt_ids: list[int]) -> list[int]:
        turn = tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1
        return call if turn < calls else answer

    return reply


class BatchFake(Engine):
    """A batch engine: rows decode together, ``call_s + max_len x token_s`` per call."""

    def __init__(self, reply, token_s: float, call_s: float) -> None:
        super().__init__()
        self.reply, self.token_s, self.call_s = reply, token_s, call_s

    def generate(self, prompt_ids, max_new_tokens, sampling):
        outs = [self.reply(p) for p in prompt_ids]
        time.sleep(self.call_s + self.token_s * max(len(o) for o in outs))
        return [Generation(o, [-1.0] * len(o), "stop") for o in outs]


class ContinuousFake(Engine):
    """A continuous engine: each ``step`` decodes one token of every running request (``token_s``)."""

    continuous = True

    def __init__(self, reply, token_s: float) -> None:
        super().__init__()
        self.reply, self.token_s, self.running = reply, token_s, {}

    def add_request(self, request_id, prompt_ids, max_new_tokens, sampling):
        self.running[request_id] = [self.reply(prompt_ids), 0]

    def step(self):
        time.sleep(self.token_s)
        done = []
        for rid, state in list(self.running.items()):
            state[1] += 1
            if state[1] >= len(state[0]):
                done.append((rid, Generation(state[0], [-1.0] * len(state[0]), "stop")))
                del self.running[rid]
        return done


def fake_round(args, tokenizer, kind: str, schedule: str, r: int) -> dict:
    reply = _script(tokenizer, args.calls, args.words)
    engine = (BatchFake(reply, args.token_ms / 1e3, args.call_ms / 1e3) if kind == "batch"
              else ContinuousFake(reply, args.token_ms / 1e3))
    p = MultiTurnParams(max_turns=args.calls + 1, max_new_tokens=4096, tool_timeout_s=60, schedule=schedule,
                        max_concurrent_tools=args.prompts * args.group, batch_wait_s=args.batch_wait_ms / 1e3)
    rollout = MultiTurnRollout(tokenizer, engine, p, env_factory=lambda: LatencyEnv(args.median_ms / 1e3, args.sigma, r))
    rows = [{"prompt": f"Task {i}.", "row": i} for i in range(args.prompts * args.group)]
    trajs = rollout.run(rows, 1, SamplingParams(4096))
    assert all(t.end_reason == "answered" and len(t.tool_calls) == args.calls for t in trajs)
    s = rollout.last_stats
    return {"wall_s": s.wall_s, "busy": s.busy_fraction, "engine_calls": s.engine_calls}


def summary(rounds: list[dict]) -> dict:
    return {"wall_s_per_round": round(statistics.median(x["wall_s"] for x in rounds), 4),
            "engine_busy_fraction": round(statistics.median(x["busy"] for x in rounds), 4),
            "engine_calls_per_round": statistics.median(x["engine_calls"] for x in rounds),
            "rounds": len(rounds)}


def recipe_rounds(rounds: int) -> dict[str, list[dict]]:
    """Rounds of the agent recipe on the transformers engine (lean sampler), seeds 0..rounds-1, the two
    schedules alternating round by round (the same load on the machine for both)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grouprl.builtins import load_builtins
    from grouprl.config import GRPOConfig
    from grouprl.data.load import load_dataset_any
    from grouprl.envs.base import make_env_factory
    from grouprl.envs.resolve import resolve_environment
    from grouprl.models import resolve_model_path
    from grouprl.rollout.agent_round import agent_round
    from grouprl.rollout.engine import TransformersEngine
    from grouprl.train.agent import rollout_rows

    load_builtins()
    cfg = GRPOConfig.from_yaml(ROOT / "recipes" / "agent_calculator.yaml")
    path = resolve_model_path(cfg.model)
    model, tok = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)
    ds = load_dataset_any(cfg.dataset)
    B = cfg.per_device_train_batch_size // cfg.num_generations
    factory = make_env_factory(environment_factory=resolve_environment(cfg.environment))
    engine = TransformersEngine(model, tok, lean=True)
    out: dict[str, list[dict]] = {"lockstep": [], "per_trajectory": []}
    for r in range(rounds):
        rows = rollout_rows([dict(ds[i]) for i in range(r * B, (r + 1) * B)], cfg.prompt_column, cfg.system_prompt)
        tokens = {}
        for schedule in out:
            torch.manual_seed(r)
            p = MultiTurnParams(max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens, schedule=schedule,
                                max_tool_failures=cfg.max_tool_failures)
            rollout = agent_round(engine, tok, rows, cfg.num_generations,
                                  SamplingParams(cfg.max_new_tokens, cfg.temperature), p, env_factory=factory)
            s, trajs = rollout.stats, rollout.trajectories
            tokens[schedule] = [t.completion_ids for t in trajs]
            out[schedule].append({"wall_s": s.wall_s, "busy": s.busy_fraction, "engine_calls": s.engine_calls,
                                  "calls_per_traj": sum(len(t.tool_calls) for t in trajs) / len(trajs)})
        out["per_trajectory"][-1]["same_tokens_as_lockstep"] = tokens["lockstep"] == tokens["per_trajectory"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--calls", type=int, default=3, help="tool calls per trajectory")
    ap.add_argument("--words", type=int, default=4, help="words of reasoning before each call")
    ap.add_argument("--token-ms", type=float, default=2.0)
    ap.add_argument("--call-ms", type=float, default=5.0)
    ap.add_argument("--median-ms", type=float, default=50.0)
    ap.add_argument("--sigma", type=float, default=1.3)
    ap.add_argument("--batch-wait-ms", type=float, default=MultiTurnParams.batch_wait_s * 1e3,
                    help="per-trajectory, batch engine: the wait for trajectories still in their tools")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--recipe-rounds", type=int, default=3)
    ap.add_argument("--skip-recipe", action="store_true")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from grouprl.builtin.tiny import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = AutoTokenizer.from_pretrained(make_tiny_checkpoint(Path(tmp), arch="qwen2"))
    z99 = 2.3263
    result = {"setup": {**vars(args), "tool_p99_over_median": round(math.exp(args.sigma * z99), 2),
                        "trajectories": args.prompts * args.group}}
    for kind in ("batch", "continuous"):
        rounds: dict[str, list[dict]] = {"lockstep": [], "per_trajectory": []}
        for r in range(args.rounds):  # alternating, so both schedules see the same machine load
            for schedule in rounds:
                rounds[schedule].append(fake_round(args, tokenizer, kind, schedule, r))
        runs = {s: summary(x) for s, x in rounds.items()}
        runs["speedup_per_round"] = round(runs["lockstep"]["wall_s_per_round"] / runs["per_trajectory"]["wall_s_per_round"], 3)
        result[f"fake_{kind}_engine"] = runs
    if not args.skip_recipe:
        rounds = recipe_rounds(args.recipe_rounds)
        runs = {s: {**summary(x), "tool_calls_per_traj": round(statistics.mean(y["calls_per_traj"] for y in x), 3)}
                for s, x in rounds.items()}
        runs["per_trajectory"]["same_tokens_as_lockstep"] = all(y["same_tokens_as_lockstep"] for y in rounds["per_trajectory"])
        runs["speedup_per_round"] = round(runs["lockstep"]["wall_s_per_round"] / runs["per_trajectory"]["wall_s_per_round"], 3)
        result["agent_recipe_transformers"] = runs
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
