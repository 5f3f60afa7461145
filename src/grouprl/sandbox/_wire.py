"""Plain-data codec shared by the judge and the program server (stdlib only; inlined into both).

Only exact built-in types cross between the program's process and the judge: None, bool, int, float,
str, bytes, complex, list, tuple, dict, set, frozenset. Anything else -- in particular an object with
its own ``__eq__`` -- is refused, so a value the judge compares is always a plain value it built
itself. JSON objects are always tagged containers, which keeps decoding unambiguous.
"""

import json

MAX_DEPTH = 200
MAX_LINE = 64 * 1024 * 1024


class WireError(TypeError):
    """A value that cannot cross the boundary (unsupported type, too deep, malformed)."""


def encode(v, depth=0):
    """Plain value -> JSON-able tree; raises WireError for anything that is not plain data."""
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH} levels")
    t = type(v)
    if v is None or t is bool or t is int or t is float or t is str:
        return v
    d = depth + 1
    if t is list:
        return {"l": [encode(x, d) for x in v]}
    if t is tuple:
        return {"t": [encode(x, d) for x in v]}
    if t is dict:
        return {"d": [[encode(k, d), encode(x, d)] for k, x in v.items()]}
    if t is set:
        return {"s": [encode(x, d) for x in v]}
    if t is frozenset:
        return {"f": [encode(x, d) for x in v]}
    if t is bytes:
        return {"b": v.hex()}
    if t is complex:
        return {"c": [v.real, v.imag]}
    raise WireError(f"unsupported value type {t.__name__} (only plain data can be returned)")


_SEQ = {"l": list, "t": tuple, "s": set, "f": frozenset}


def decode(x, depth=0):
    """Inverse of :func:`encode`; builds only exact built-in types."""
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH} levels")
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is not dict or len(x) != 1:
        raise WireError("malformed value on the wire")
    (tag, body), = x.items()
    d = depth + 1
    if tag in _SEQ and type(body) is list:
        return _SEQ[tag](decode(i, d) for i in body)
    if tag == "d" and type(body) is list:
        return {decode(k, d): decode(v, d) for k, v in body}
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "c" and type(body) is list and len(body) == 2:
        return complex(float(body[0]), float(body[1]))
    raise WireError(f"malformed value on the wire (tag {tag!r})")


def dumps(obj):
    """One message: compact JSON on one line (json never emits a raw newline)."""
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()
