"""The program server: the ONLY process that runs the model's code (stdlib only; run as a script).

It loads the program into a module namespace and answers the judge's requests over two pipes
(argv[1] = fd to read requests, argv[2] = fd to write replies), one JSON line each:
``load`` (run the module), ``get`` (what is this global?) and ``call`` (call a global with plain-data
arguments). It never sees a test or an expected value: those stay in the judge. Whatever the program
does to this process -- rebinding builtins, exiting, forging output -- it can only change the plain
values it hands back, or make the judge see it die.
"""

import json
import os
import sys

from grouprl.sandbox._wire import MAX_LINE, WireError, decode, dumps, encode  # sandbox:inline


def _exc(e):
    name = type(e).__name__ if isinstance(type(e).__name__, str) else "Exception"
    try:
        msg = str(e)[:2000]
    except BaseException:  # a hostile __str__
        msg = "<unprintable>"
    return {"exc": name, "msg": msg}


def _serve(rin, wout):
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    while True:
        line = rin.readline(MAX_LINE)
        if not line:
            return
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "load":
                ns["__name__"] = req.get("module", "__main__")
                exec(compile(req["code"], "<solution>", "exec"), ns)
                reply = {"ok": True}
            elif op == "get":
                name = req["name"]
                if name not in ns:
                    reply = {"missing": True}
                elif callable(ns[name]):
                    reply = {"callable": True}
                else:
                    reply = {"v": encode(ns[name])}
            elif op == "call":
                if req["name"] not in ns:
                    raise NameError("name {!r} is not defined by the program".format(req["name"]))
                fn = ns[req["name"]]
                args = [decode(a) for a in req["args"]]
                kwargs = {k: decode(v) for k, v in req["kwargs"].items()}
                reply = {"v": encode(fn(*args, **kwargs))}
            else:
                reply = {"exc": "ProtocolError", "msg": f"unknown op {op!r}"}
        except WireError as e:
            reply = {"exc": "TypeError", "msg": str(e)}
        except BaseException as e:  # SystemExit, KeyboardInterrupt ... are the program's failures
            reply = _exc(e)
        try:
            data = dumps(reply)
        except (ValueError, RecursionError) as e:
            data = dumps({"exc": "ValueError", "msg": f"return value cannot be sent: {e}"})
        wout.write(data)
        wout.flush()


if __name__ == "__main__":
    _serve(os.fdopen(int(sys.argv[1]), "rb"), os.fdopen(int(sys.argv[2]), "wb"))
