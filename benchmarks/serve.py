"""`grouprl serve` vs `transformers serve`: requests/s and output tokens/s at 1, 4 and 16 concurrent clients.

    python benchmarks/serve.py                          # the trained calculator agent, or the warm start
    python benchmarks/serve.py --model PATH --requests 48 --out benchmarks/results/serve.json

Both servers run as child processes on the same local model folder (``HF_HUB_OFFLINE=1``, CPU,
``OMP_NUM_THREADS=1`` each), up at the same time in this one run; each concurrency level runs on one,
then on the other, ``--repeats`` times (the median is reported, with the range). Each is driven by the official
``openai`` client: ``c`` threads share ``--requests`` chat requests (held-out ``builtin:calculator``
questions, no tools, greedy, ``max_tokens=32``). Output tokens are the ``usage.completion_tokens`` each
server reports; requests/s and tokens/s are over the wall time of the whole level. Two warm-up
requests precede each server's measurements. ``same_replies`` is the fraction of questions on which the two
servers' greedy replies are the same text (same weights, same template: it should be close to 1).

``transformers serve`` runs with its defaults (``--no-continuous-batching``: its CPU path); its
continuous batching needs paged attention, which this benchmark does not claim to measure.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEVELS = (1, 4, 16)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(base: str, proc: subprocess.Popen, timeout_s: float) -> None:
    import httpx2

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with code {proc.returncode} before it was ready")
        try:
            if httpx2.get(f"{base}/models", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"server at {base} was not ready after {timeout_s:g}s")


def start(kind: str, model: str, log: Path) -> tuple[subprocess.Popen, str, str]:
    """``(process, base URL, model name)`` of one server on a free port."""
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if kind == "grouprl":
        cmd = [sys.executable, "-m", "grouprl", "serve", model, "--port", str(port), "--device", "cpu",
               "--name", "bench", "--max-new-tokens", "64"]
        name = "bench"
    else:
        cmd = [str(Path(sys.executable).with_name("transformers")), "serve", model, "--port", str(port),
               "--host", "127.0.0.1", "--device", "cpu"]
        name = model
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}/v1"
    _wait_ready(base, proc, 300)
    return proc, base, name


def level(client, name: str, questions: list[str], clients: int, max_tokens: int) -> tuple[dict, list[str]]:
    def ask(q: str) -> tuple[str, int, float]:
        t = time.perf_counter()
        r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": q}], temperature=0,
                                           max_tokens=max_tokens)
        return r.choices[0].message.content or "", r.usage.completion_tokens, time.perf_counter() - t

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        out = list(pool.map(ask, questions))
    wall = time.perf_counter() - t0
    tokens = sum(n for _, n, _ in out)
    latencies = sorted(s for _, _, s in out)
    return ({"clients": clients, "requests": len(out), "wall_s": round(wall, 3),
             "requests_per_s": round(len(out) / wall, 2), "output_tokens_per_s": round(tokens / wall, 1),
             "output_tokens": tokens, "p50_latency_s": round(latencies[len(latencies) // 2], 3)},
            [text for text, _, _ in out])


def measure(model: str, questions: list[str], max_tokens: int, repeats: int, logs: Path) -> tuple[dict, dict]:
    """Both servers up at once; each level runs on one then the other, ``repeats`` times, so that the two
    sides of a ratio are measured seconds apart on this shared machine. Per level: the median run, and the
    range over the repeats."""
    import statistics

    import openai

    servers = {}
    try:
        for kind in ("grouprl", "transformers"):
            proc, base, name = start(kind, model, logs / f"serve_{kind}.log")
            client = openai.OpenAI(base_url=base, api_key="bench", max_retries=0, timeout=600)
            servers[kind] = (proc, client, name)
            level(client, name, questions[:2], 1, max_tokens)  # warm-up
        runs = {kind: {c: [] for c in LEVELS} for kind in servers}
        replies = {}
        for _ in range(repeats):
            for c in LEVELS:
                for kind, (_, client, name) in servers.items():
                    row, texts = level(client, name, questions, c, max_tokens)
                    runs[kind][c].append(row)
                    replies.setdefault(kind, texts)
                    print(json.dumps({"server": kind, **row}), file=sys.stderr, flush=True)
        out = {}
        for kind, by_level in runs.items():
            out[kind] = []
            for rows in by_level.values():
                rows = sorted(rows, key=lambda r: r["requests_per_s"])
                best = dict(rows[len(rows) // 2])
                for key in ("requests_per_s", "output_tokens_per_s"):
                    values = [r[key] for r in rows]
                    best[key] = round(statistics.median(values), 2)
                    best[key + "_range"] = [min(values), max(values)]
                out[kind].append(best)
        return out, replies
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def default_model() -> str:
    trained = ROOT / "outputs" / "agent_calculator" / "final"
    if trained.is_dir():
        return str(trained)
    from grouprl.builtin.warmstart import builtin_model_path

    return builtin_model_path("calculator")


def markdown(result: dict) -> str:
    lines = ["| clients | grouprl req/s (range) | transformers req/s (range) | ratio | grouprl out tok/s | "
             "transformers out tok/s | ratio |", "|---:|---:|---:|---:|---:|---:|---:|"]

    def span(row: dict, key: str) -> str:
        lo, hi = row.get(key + "_range", [row[key], row[key]])
        return f"{row[key]} ({lo}-{hi})"

    for g, t in zip(result["grouprl"], result["transformers"]):
        lines.append(f"| {g['clients']} | {span(g, 'requests_per_s')} | {span(t, 'requests_per_s')} | "
                     f"{g['requests_per_s'] / t['requests_per_s']:.2f}x | {span(g, 'output_tokens_per_s')} | "
                     f"{span(t, 'output_tokens_per_s')} | {g['output_tokens_per_s'] / t['output_tokens_per_s']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="local model folder (default: the trained calculator agent)")
    ap.add_argument("--requests", type=int, default=48, help="requests per concurrency level")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each level on each server (median reported)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--markdown", default=None, help="print the table of a saved JSON and exit")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return
    try:
        import fastapi  # noqa: F401
        import openai  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"benchmarks/serve.py needs the bench extra for `transformers serve` ({e.name} is missing): "
                         f'pip install -e ".[bench]"') from None
    from grouprl.data.tasks import load_task

    model = args.model or default_model()
    questions = [row["prompt"][0]["content"] for row in load_task("calculator", "test", n=args.requests)]
    logs = ROOT / "runs"
    logs.mkdir(exist_ok=True)
    shown = os.path.relpath(model, ROOT) if model.startswith(str(ROOT)) else model
    result = {"model": shown, "requests_per_level": args.requests, "max_tokens": args.max_tokens, "repeats": args.repeats,
              "cpu_count": os.cpu_count(), "load_average_start": os.getloadavg()[0]}
    runs, replies = measure(model, questions, args.max_tokens, args.repeats, logs)
    result.update(runs)
    same = sum(a == b for a, b in zip(replies["grouprl"], replies["transformers"]))
    result["same_replies"] = round(same / len(questions), 3)
    result["load_average_end"] = os.getloadavg()[0]
    result["ratio_output_tokens_per_s"] = {str(g["clients"]): round(g["output_tokens_per_s"] / t["output_tokens_per_s"], 2)
                                           for g, t in zip(result["grouprl"], result["transformers"])}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(markdown(result), file=sys.stderr)


if __name__ == "__main__":
    main()
