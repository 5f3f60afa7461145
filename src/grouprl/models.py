"""Model and tokenizer loading, for training, ``grouprl eval`` and ``grouprl serve`` alike.

A model is a hub id (``org/name``), a local folder that ``save_pretrained`` wrote, or ``<prefix>:<name>`` of
a registered model source (``MODEL_SOURCES``; the demo package registers ``builtin:``). Everything is
loaded in fp32 (autocast gives bf16 compute; the trainer keeps fp32 master weights). The checks here run
before any weights load: a missing folder, a run folder given as a model, an unreachable hub.
This module sits below train/ and serve/ (docs/DESIGN.md, "Layout"): neither imports the demo models. It
imports torch only inside the functions that need it, so the torch-free run/ checks can use it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grouprl.errors import ConfigError
from grouprl.registry import MODEL_SOURCES

if TYPE_CHECKING:
    import torch

SHARDS = "distcp"
"""The folder of an FSDP checkpoint's sharded weights (grouprl.train.parallel.fsdp)."""
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def resolve_model_path(name: str) -> str:
    """``<prefix>:<name>`` of a registered model source -> a local directory; anything else unchanged.
    ``builtin:`` names are registered by the demo package, imported by name on first use (nothing in the
    library imports it statically)."""
    prefix, sep, _ = name.partition(":")
    if sep and prefix == "builtin" and prefix not in MODEL_SOURCES:
        from importlib import import_module

        import_module("grouprl.builtin")  # registers MODEL_SOURCES["builtin"]
    if sep and prefix in MODEL_SOURCES:
        return MODEL_SOURCES.get(prefix)(name)
    return name


def run_folder_hint(path: Path) -> str | None:
    """``"<dir>/final or <dir>/checkpoint-N"`` when ``path`` is a grouprl run folder, else None."""
    steps = sorted((int(m.group(1)), p) for p in path.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir())
    final = path / "final"
    if not steps and not final.is_dir():
        return None
    options = ([str(final)] if final.is_dir() else []) + ([str(steps[-1][1])] if steps else [])
    return " or ".join(options)


def looks_like_path(name: str) -> bool:
    """A name the user meant as a local folder: ``./x``, ``/x``, ``~/x``, ``a/b/c``, or ``a/b`` where ``a``
    exists here. A hub id is ``org/name`` with an ``org`` that is not a local folder."""
    if name.startswith((".", "/", "~")) or "\\" in name:
        return True
    parts = name.split("/")
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir())


def check_model_folder(name: str, what: str = "model") -> None:
    """A local ``name`` must be a saved model (config.json) or LoRA adapter (adapter_config.json)."""
    if name.startswith("builtin:"):
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
            return
        hint = run_folder_hint(path)
        if hint:
            raise ConfigError(f"{what}={name!r} is a grouprl run folder, not a model. Fix: use {hint}.")
        raise ConfigError(f"{what}={name!r} is a folder without config.json, so it is not a saved model. Fix: give "
                          f"the folder save_pretrained wrote (it holds config.json), a hub id, or builtin:<name>.")
    if path.exists():
        raise ConfigError(f"{what}={name!r} is a file, not a model folder. Fix: give the folder that holds "
                          f"config.json, a hub id, or builtin:<name>.")
    if looks_like_path(name):
        raise ConfigError(f"{what}={name!r}: no such folder (looked in {str(Path.cwd())!r}). Fix: check the path; "
                          f"a hub id looks like org/name.")


def check_model_source(name: str, what: str = "model") -> None:
    """Fail fast, before data or weights load, when ``name`` cannot be found.

    A local directory must be a saved model or adapter (a run folder gets "use <dir>/final"), and a name that
    looks like a path but is none is "no such folder" (:func:`check_model_folder`).
    A ``builtin:`` name passes. Anything else is a hub id: it passes when it is in the local cache, in offline mode (transformers then reports a cache miss itself), or when the hub answers
    one quick request; otherwise a ConfigError names the model and the fixes -- instead of ~50 s of
    silent retries and a traceback.
    """
    check_model_folder(name, what)
    if name.startswith("builtin:") or Path(name).expanduser().is_dir():
        return
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, get_session, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ConfigError(f"{what}={name!r} is neither a local directory nor a hub id ('org/name'). Fix: give "
                          f"a directory holding config.json (check the path), a hub id, or builtin:<name>.") from None
    if constants.HF_HUB_OFFLINE or isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    try:
        get_session().head(constants.ENDPOINT, timeout=5)
    except Exception as e:  # any network failure: DNS, refused, timeout, proxy, TLS
        raise ConfigError(
            f"{what}={name!r} is not a local directory and not in the local cache, and the Hugging Face Hub "
            f"({constants.ENDPOINT}) is unreachable ({type(e).__name__}: {e}). Fix: download it where there is "
            f"network (`hf download {name}`) and copy the cache or the folder here, give a local directory, "
            f"or point HF_ENDPOINT at a reachable mirror."
        ) from None


def checkpoint_hint(path: Any) -> str | None:
    """What to do with an FSDP checkpoint given where a model folder is expected (``None`` for anything else)."""
    folder = Path(str(path))
    if not (folder / SHARDS).is_dir():
        return None
    return (f"It is a checkpoint of an FSDP run: its weights are sharded in {SHARDS}/ (torch.distributed.checkpoint). "
            f"Fix: use the run's final/ folder, resume training from it, or convert it: python -m "
            f"torch.distributed.checkpoint.format_utils dcp_to_torch {folder / SHARDS} weights.pt")


def pick_device(choice: str) -> torch.device:
    import torch

    if choice == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but no CUDA device is visible. Fix: device=auto or device=cpu.")
    return torch.device(choice)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model",
                   "vocab.txt")


def load_tokenizer(source: Any, processing_class: Any = None):
    from transformers import AutoTokenizer

    folder = Path(str(source)).expanduser() if processing_class is None and source is not None else None
    if folder is not None and folder.is_dir() and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"model folder {str(source)!r} holds no tokenizer ({', '.join(TOKENIZER_FILES[:3])}, ...), "
                          f"so its prompts cannot be encoded. Fix: save the tokenizer there too "
                          f"(tokenizer.save_pretrained({str(source)!r})), or pass processing_class=tokenizer.")
    try:
        tok = processing_class if processing_class is not None else AutoTokenizer.from_pretrained(source)
    except OSError as e:
        raise ConfigError(f"the tokenizer of {source!r} could not be loaded ({e}). Give a hub id or a local "
                          f"directory with tokenizer files, or pass processing_class=tokenizer.") from e
    tok = getattr(tok, "tokenizer", tok)  # a processor wrapping a tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(model: Any, device: torch.device):
    """A hub id / local path / builtin name is loaded in fp32 (autocast gives bf16 compute)."""
    import torch
    from transformers import AutoModelForCausalLM

    if isinstance(model, str):
        path = resolve_model_path(model)
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        except OSError as e:
            raise ConfigError(f"model {model!r} could not be loaded ({e}). " + (checkpoint_hint(path) or (
                "Give a hub id, a local directory with config.json, or builtin:<name>."))) from e
    return model.to(device)
