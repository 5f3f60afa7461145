"""A ``grouprl serve`` endpoint over the tiny random test model, in a thread, and the official client."""

from __future__ import annotations

import pytest
from serve_helpers import serving


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    import torch

    from grouprl.models import load_model, load_tokenizer

    torch.manual_seed(0)
    return load_model(str(tiny_model_dir), torch.device("cpu")), load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def served(tiny):
    with serving(*tiny) as out:
        yield out


@pytest.fixture()
def client(served):
    import openai

    return openai.OpenAI(base_url=served[1], api_key="unused", max_retries=0, timeout=60)

