"""Local tokenizers with the special tokens of real chat-template families, and scripted policies/envs.

``char_tokenizer`` maps every byte to one token (a BPE with no merges) and each special / added token
to one id, so the expected ids and masks of a rendered conversation can be counted by hand.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"


def template(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def char_tokenizer(special: list[str], added: list[str], *, eos: str, pad: str, bos: str | None = None,
                   chat_template: str | None = None):
    """A byte-per-token tokenizer; ``special`` tokens are special, ``added`` ones are kept when decoding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(special)
    tok.add_tokens(added)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad, bos_token=bos,
                                   unk_token=None, chat_template=chat_template, padding_side="left")


TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def chatml_tokenizer(chat_template: str | None = None):
    """Qwen2.5-like: <|im_start|>, <|im_end|> (EOS), tool tags as added tokens."""
    return char_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], TOOL_TAGS, eos="<|im_end|>",
                          pad="<|endoftext|>", chat_template=chat_template or template("chatml_tools.jinja"))


def llama3_tokenizer():
    """Llama-3-like: <|begin_of_text|> BOS, header tokens, <|eot_id|> EOS."""
    special = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|finetune_right_pad_id|>"]
    return char_tokenizer(special, TOOL_TAGS, eos="<|eot_id|>", pad="<|finetune_right_pad_id|>",
                          bos="<|begin_of_text|>", chat_template=template("llama3_tools.jinja"))


F_TOOL = {"type": "function", "function": {"name": "f", "description": "Returns 7.",
                                           "parameters": {"type": "object", "properties": {}}}}


def scripted_generate(tokenizer, scripts: list[list[str]], calls: list | None = None):
    """A ``generate_fn`` answering trajectory ``j`` at its turn ``k`` with ``scripts[j][k]``.

    ``j`` is the index of the trajectory's first prompt among the distinct first prompts (copies of one
    prompt share a script; later prompts are matched by their initial prefix). The turn ``k`` of a prompt is
    the number of distinct prompts answered before that are a proper prefix of it (its own earlier turns),
    so the script does not depend on which trajectories share an engine call (per-trajectory scheduling).
    Texts are tokenized as the model's own sampled ids (an end-of-turn token written in the text is one
    sampled id). Each call's ``(prompts, budgets)`` is appended to ``calls``.
    """
    state: dict = {"initial": None, "answered": set()}

    def generate(prompts, budgets, params):
        if calls is not None:
            calls.append(([list(p) for p in prompts], budgets))
        if state["initial"] is None:  # distinct first prompts, in order: script j belongs to the j-th
            state["initial"] = []
            for p in prompts:
                if list(p) not in state["initial"]:
                    state["initial"].append(list(p))
        out = []
        for prompt in prompts:
            j = next((i for i, init in enumerate(state["initial"]) if list(prompt[:len(init)]) == init), None)
            if j is None:  # a first prompt given in a later call (an engine taking one request at a time)
                j = len(state["initial"])
                state["initial"].append(list(prompt))
            k = sum(len(a) < len(prompt) and tuple(prompt[:len(a)]) == a for a in state["answered"])
            script = scripts[j] if len(scripts) > 1 else scripts[0]
            out.append(tokenizer.encode(script[min(k, len(script) - 1)], add_special_tokens=False))
        state["answered"].update(tuple(p) for p in prompts)
        return out

    return generate


class FakeEnv:
    """The ToolEnv contract with misbehaving tools: ``f`` -> "7", ``boom`` raises, ``slow`` sleeps."""

    tools = [
        F_TOOL,
        {"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]}}},
        {"type": "function", "function": {"name": "boom", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "slow", "parameters": {"type": "object"}}},
    ]
    instances: list[FakeEnv] = []

    def __init__(self, slow_s: float = 5.0, reward: float | None = None) -> None:
        self.slow_s, self._reward = slow_s, reward
        self.closed = threading.Event()
        self.calls: list[tuple[str, dict]] = []
        FakeEnv.instances.append(self)

    def reset(self, row: dict) -> str | None:
        return row.get("observation")

    def call(self, name: str, arguments: dict) -> str:
        self.calls.append((name, arguments))
        if name == "f":
            return "7"
        if name == "add":
            return str(arguments["a"] + arguments["b"])
        if name == "boom":
            raise RuntimeError("kaput")
        if name == "slow":
            self.closed.wait(self.slow_s)  # returns as soon as the environment is closed
            return "late"
        raise KeyError(name)

    def reward(self) -> float | None:
        return self._reward

    def close(self) -> None:
        self.closed.set()


def wait_for_threads(prefix: str = "grouprl-tool", timeout_s: float = 5.0) -> list[str]:
    """Names of threads starting with ``prefix`` still alive after waiting up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [t.name for t in threading.enumerate() if t.name.startswith(prefix)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)
