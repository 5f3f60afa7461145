"""Integrity of a cached built-in model: each file's size and sha256 recorded at build time
(``grouprl_warmstart.json``), checked before a cached entry is used; entries written before the record
existed are checked by their safetensors headers. A damaged entry is named and set aside for a rebuild.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

INFO_FILE = "grouprl_warmstart.json"


def file_digests(folder: Path) -> dict[str, list]:
    """``{relative path: [size in bytes, sha256]}`` of every file of a built model (its info file aside)."""
    out = {}
    for f in sorted(folder.rglob("*")):
        if f.is_file() and f.name != INFO_FILE:
            out[str(f.relative_to(folder))] = [f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest()]
    return out


def safetensors_damage(path: Path) -> str | None:
    """Why a ``.safetensors`` file cannot be whole (its header's last tensor ends past the file), or None."""
    try:
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if 0 < n < 100 << 20 else None
        if not isinstance(header, dict):
            raise ValueError("no header")
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        return f"{path.name}: unreadable safetensors header ({type(e).__name__})"
    size = path.stat().st_size
    return None if size >= 8 + n + end else f"{path.name}: {size:,} bytes, its header needs {8 + n + end:,}"


def cache_damage(target: Path) -> str | None:
    """What is wrong with a cached build, or None: each file as the build recorded it (size and sha256;
    builds from before that record are checked by their safetensors headers)."""
    try:
        recorded = json.loads((target / INFO_FILE).read_text()).get("files")
    except (OSError, ValueError) as e:
        return f"{INFO_FILE}: {type(e).__name__}"
    if recorded:
        for rel, (size, sha) in recorded.items():
            f = target / rel
            if not f.is_file():
                return f"{rel} is missing"
            if f.stat().st_size != size or hashlib.sha256(f.read_bytes()).hexdigest() != sha:
                return f"{rel}: {f.stat().st_size:,} bytes, not the {size:,} it was built with"
        return None
    for f in target.glob("*.safetensors"):
        why = safetensors_damage(f)
        if why:
            return why
    return None if any(target.glob("*.safetensors")) or (target / "pytorch_model.bin").exists() else "no weights"


def discard(target: Path) -> None:
    """Move a damaged entry aside (atomic), then delete it; a reader that holds it open keeps its copy."""
    import tempfile

    aside = Path(tempfile.mkdtemp(prefix=f".damaged-{target.name}-", dir=target.parent))
    try:
        target.rename(aside / target.name)
    except OSError:
        pass
    shutil.rmtree(aside, ignore_errors=True)
