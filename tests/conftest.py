"""Shared fixtures: a tiny offline model and tokenizer, saved and loaded like a hub model."""

from __future__ import annotations

import os

import pytest

# Keep each test worker to one thread: the suite runs in parallel on 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A directory holding a random tiny Qwen2 causal LM and a locally trained tokenizer."""
    import torch

    torch.set_num_threads(1)
    from grouprl.builtin.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """Same as ``tiny_model_dir`` with a Llama architecture."""
    from grouprl.builtin.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), arch="llama")
