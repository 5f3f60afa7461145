"""``grouprl serve MODEL_OR_PATH [--port 8000] [--host 127.0.0.1]``: an OpenAI-compatible chat endpoint
over a local model -- a trained agent for the official ``openai`` client (docs/SERVING.md), or a judge
for the ``judge`` reward that needs no network::

    grouprl serve builtin:judge --name judge --port 8000 &
    # recipe: reward_kwargs: {judge: {base_url: "http://127.0.0.1:8000/v1", model: judge}}

Requests must name the served model (``--name``, default MODEL); any other name is a 404.
"""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a local model as an OpenAI-compatible /v1/chat/completions endpoint")
    p.add_argument("model", help="local directory, hub id or builtin:<name>")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (0 picks a free one; the URL is printed)")
    p.add_argument("--name", default=None, help="model name reported by /v1/models (default: MODEL)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--max-new-tokens", type=int, default=256, help="cap on tokens generated per request")
    p.add_argument("--max-time", type=float, default=60.0, help="cap on seconds of generation per request")
    p.add_argument("--max-batch", type=int, default=32,
                   help="rows decoded together (a request with n choices takes n); more requests wait for a free row")
    p.add_argument("--queue-timeout", type=float, default=120.0,
                   help="seconds a request may wait for a free row before HTTP 503")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger requests get HTTP 413")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a client may stall mid-request")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="stop when this process exits (a run that started its own judge: judge.serve)")
    p.set_defaults(func=run)


def check_before_loading(model: str, host: str, port: int) -> None:
    """The two mistakes that would otherwise show only after the model has loaded (or after a minute of hub
    retries): a port another process holds, and a model path that does not exist."""
    import errno
    import socket

    from grouprl.errors import ConfigError
    from grouprl.models import check_model_folder

    check_model_folder(model)  # './nope': "no such folder" now, not 51 s of hub lookups
    if port:
        probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no clash
        try:
            probe.bind((host, port))
        except OSError as e:
            busy = e.errno == errno.EADDRINUSE
            raise ConfigError(f"cannot serve on {host}:{port}: " + (
                "the port is in use by another process. Fix: --port N with a free port, or --port 0 to pick one"
                if busy else f"{e.strerror}. Fix: --host 127.0.0.1 (loopback) or an address of this machine")) from e
        finally:
            probe.close()


def run(args: argparse.Namespace) -> int:
    import sys

    from grouprl.errors import ConfigError
    from grouprl.serve.server import load_chat_server, make_server

    if args.max_batch < 1 or args.queue_timeout <= 0 or args.max_new_tokens < 1 or args.max_time <= 0:
        raise ConfigError(f"serve: --max-batch={args.max_batch}, --queue-timeout={args.queue_timeout:g}, --max-new-tokens="
                          f"{args.max_new_tokens} and --max-time={args.max_time:g} must all be positive.")
    check_before_loading(args.model, args.host, args.port)
    chat = load_chat_server(args.model, device=args.device, name=args.name, max_new_tokens=args.max_new_tokens,
                            max_time_s=args.max_time, max_batch=args.max_batch,
                            queue_timeout_s=args.queue_timeout)
    server = make_server(chat, args.host, args.port, max_body_bytes=args.max_body_bytes,
                         socket_timeout_s=args.timeout)
    host, port = server.server_address[:2]
    if args.parent_pid:
        import threading

        threading.Thread(target=_watch_parent, args=(args.parent_pid, server), daemon=True).start()
    print(f"serving {chat.name} at http://{host}:{port}/v1 (POST /v1/chat/completions); Ctrl-C stops",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        chat.close()
    return 0


def _watch_parent(pid: int, server, poll_s: float = 1.0) -> None:
    """Shut the server down once process ``pid`` is gone (checked every ``poll_s`` seconds)."""
    import time

    while process_alive(pid):
        time.sleep(poll_s)
    server.shutdown()


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` is running. A zombie (dead, not yet reaped: its own parent has not waited,
    or PID 1 of a container that reaps nothing) answers ``kill(pid, 0)`` like a live process, so on Linux
    its state in ``/proc/<pid>/stat`` is read too."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no procfs (macOS): kill(pid, 0) is all there is
    return state not in (b"Z", b"X")
