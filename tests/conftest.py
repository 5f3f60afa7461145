"""Shared fixtures: a tiny offline model and tokenizer, saved and loaded like a hub model."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil
import pytest

# Keep each test worker to one thread: the suite runs in parallel on 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# The suite keeps to a cache of its own: warm starts and preference pairs it builds go to .cache/grouprl-test in
# the checkout (ignored by git; kept between runs, so a second `make test` builds nothing), never to the
# user's ~/.cache/grouprl. GROUPRL_TEST_CACHE picks another folder. Subprocesses of the tests inherit it.
TEST_CACHE = Path(os.environ.get("GROUPRL_TEST_CACHE") or Path(__file__).resolve().parents[1] / ".cache" / "grouprl-test")
os.environ["GROUPRL_CACHE"] = str(TEST_CACHE)
# torch JIT extensions (DeepSpeed CPU ops) are built into the test cache too, never ~/.cache/torch_extensions
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(TEST_CACHE / "torch_extensions"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A directory holding a random tiny Qwen2 causal LM and a locally trained tokenizer."""
    import torch

    torch.set_num_threads(1)
    from grouprl.builtin.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2")


@pytest.fixture(scope="session")
def tiny_judge_dir(tmp_path_factory):
    """``tiny_model_dir``'s model declaring 2048 positions (RoPE: no weight depends on it), for a served LLM
    judge: its prompts with fenced answers are longer than 512 tokens, and ``grouprl serve`` checks the context."""
    import torch

    torch.set_num_threads(1)
    from grouprl.builtin.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-judge"), arch="qwen2", max_position_embeddings=2048)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """Same as ``tiny_model_dir`` with a Llama architecture."""
    from grouprl.builtin.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), arch="llama")


# ---- leftover processes: a test that starts sandboxed jobs or tool processes must not leave any behind ----
def _children() -> set[tuple[int, float]]:
    """(pid, start time) of every descendant of this process (the pair survives pid reuse)."""
    out = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            out.add((child.pid, child.create_time()))
    return out


def sandbox_pids(uids: set[int], existing: set[tuple[int, float]] = frozenset()) -> list[int]:
    """Processes of this test's sandboxes: under one of ``uids``, or descendants of this process that
    were not already running in ``existing`` (long-lived helpers such as the math reward's worker)."""
    out = sorted(pid for pid, started in _children() - set(existing))
    for p in psutil.process_iter(["uids"]):
        ids = p.info["uids"]
        if ids is not None and {ids.real, ids.effective} & uids:
            out.append(p.pid)
    return out


@pytest.fixture
def leftover_scan():
    """The scan ``no_leftovers`` uses, as ``(snapshot_of_children, sandbox_pids)``, for testing the check."""
    return _children, sandbox_pids


@pytest.fixture
def no_leftovers():
    """Fails the test if a process of its sandboxes outlives the job (scans the whole process table)."""
    from grouprl.sandbox.runner import LEASED_UIDS

    before, existing = len(LEASED_UIDS), _children()
    yield
    left = sandbox_pids(set(list(LEASED_UIDS)[before:]), existing)
    assert left == [], f"processes left behind: {left}"
