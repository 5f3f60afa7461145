"""``grouprl serve``: a small OpenAI-compatible chat endpoint over a local Hugging Face causal LM.

It exists so that an LLM judge (``grouprl.rewards.judge``) can be a local model and a whole run works
offline; it is not a production inference server (one request generates at a time -- use vLLM's
``vllm serve`` for throughput). It honours OpenAI's ``response_format`` by constrained decoding
(:mod:`grouprl.serve.grammar`, :mod:`grouprl.serve.constrained`), so a judge's reply always parses.
See :mod:`grouprl.serve.server`.
"""

from __future__ import annotations

from grouprl.serve.server import ChatServer, make_server

__all__ = ["ChatServer", "make_server"]
