"""``grouprl serve``: an OpenAI-compatible chat endpoint over a local Hugging Face causal LM.

It deploys a trained agent for the official ``openai`` client (streaming, ``n``, ``stop``, seeds,
log-probs, tool calls parsed as in the rollouts; docs/SERVING.md) and lets an LLM judge
(``grouprl.rewards.judge``) be a local model, so a whole run works offline. Simultaneous requests
decode in one batch (:mod:`grouprl.serve.engine`); for large models and high throughput use vLLM's
``vllm serve``. ``response_format`` is honoured by constrained decoding (:mod:`grouprl.serve.grammar`,
:mod:`grouprl.serve.constrained`), so a judge's reply always parses. See :mod:`grouprl.serve.server`.
"""

from __future__ import annotations

from grouprl.serve.server import ChatServer, make_server

__all__ = ["ChatServer", "make_server"]
