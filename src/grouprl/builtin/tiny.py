"""Tiny, offline causal LMs and tokenizers: real transformers architectures with random weights.

Nothing here downloads anything. Tests and the default job build a model with these helpers, save it
with ``save_pretrained`` and load it back with ``AutoModelForCausalLM.from_pretrained`` -- the same
path a user's hub model takes.

    tok = build_tokenizer(["some text", ...], vocab_size=256)
    model = build_tiny_model(tok, arch="qwen2")
    path = save_tiny(tmp_path / "tiny", tok, model)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

# A ChatML template: what Qwen uses, and what most chat datasets expect. Tool results are messages with
# role "tool" (``<|im_start|>tool\n7<|im_end|>``); when ``tools`` are given, one short system turn names
# them, "Tools: calculator(expression)" (the tiny model has 512 positions: no JSON schemas). Without
# tools the rendering is plain ChatML, exactly as before tools were supported. Prefix-preserving: an
# earlier turn renders the same whatever follows (``grouprl check-template``).
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\nTools: ' }}"
    "{% for tool in tools %}{% set f = tool.function if tool.function is defined else tool %}"
    "{{ f.name + '(' }}{% if f.parameters is defined and f.parameters.properties is defined %}"
    "{{ f.parameters.properties | join(', ') }}{% endif %}{{ ')' }}{% if not loop.last %}{{ ', ' }}{% endif %}"
    "{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added tokens that are NOT special, like Qwen3's and the DeepSeek-R1 distills' <think> / <tool_call>: each
# is one token, but ``decode(..., skip_special_tokens=True)`` (what TRL and our rollout do) keeps it, so
# the rewards see the tags. Ids 0-3 are SPECIAL_TOKENS, 4-9 these, in this order (warm starts rely on it).
EXTRA_TOKENS = ["<think>", "</think>", "<answer>", "</answer>", "<tool_call>", "</tool_call>"]

DEFAULT_CORPUS = [
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 + - * / = ( )",
    "<think>Add the numbers step by step.</think> The answer is 42.",
    "What is 12 + 30? Answer: 42",
    "def add(a, b):\n    return a + b\n",
    "<tool_call>calculator(expression='3.14159 * 5**2')</tool_call>",
]


def build_tokenizer(
    corpus: Iterable[str] | None = None,
    vocab_size: int = 512,
    *,
    character_digits: bool = True,
):
    """Train a byte-level BPE tokenizer on ``corpus`` locally and wrap it for transformers.

    ``character_digits`` splits every digit into its own token (as Llama and Qwen do), which makes
    arithmetic learnable by tiny models. ``SPECIAL_TOKENS`` get ids 0-3 and are special (dropped by
    ``skip_special_tokens=True``); ``EXTRA_TOKENS`` get ids 4-9 and are added, non-special tokens (kept).
    """
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(corpus) if corpus is not None else list(DEFAULT_CORPUS)
    tok = Tokenizer(models.BPE(unk_token=None))
    pre = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if character_digits:
        pre.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + EXTRA_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # The trainer reserves ids only for special tokens: train with all ten (ids 0-9, as before), then
    # clear the special flag of the extra ones. Encoding and ids are unchanged; only decoding differs.
    state = json.loads(tok.to_str())
    for added in state["added_tokens"]:
        if added["content"] in EXTRA_TOKENS:
            added["special"] = False
    tok = Tokenizer.from_str(json.dumps(state))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token=None,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
    )


def build_tiny_model(
    tokenizer: Any,
    arch: str = "qwen2",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    seed: int = 0,
):
    """A randomly initialised ``Qwen2ForCausalLM`` or ``LlamaForCausalLM`` sized for a CPU test."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    config_cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}.get(arch)
    if config_cls is None:
        raise ValueError(f"arch must be 'qwen2' or 'llama', got {arch!r}")
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny(path: str | Path, tokenizer: Any, model: Any) -> Path:
    """``save_pretrained`` both into ``path`` (a directory any ``from_pretrained`` can load)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return path


def make_tiny_checkpoint(path: str | Path, corpus: Iterable[str] | None = None, arch: str = "qwen2", **kw) -> Path:
    """Build a tokenizer and a random tiny model and save both to ``path``; returns ``path``."""
    tok = build_tokenizer(corpus)
    return save_tiny(path, tok, build_tiny_model(tok, arch=arch, **kw))


def loaded_tokenizer(tok, model):
    """The tokenizer ``AutoTokenizer.from_pretrained`` gives for the checkpoint ``tok`` and ``model`` save into,
    so the SFT trains on the token ids RL, evaluation and serving will see. transformers picks the tokenizer
    class from the model's config (``qwen2``: ``Qwen2Tokenizer``, whatever ``tokenizer_config.json`` names),
    and that class brings its own pre-tokenizer: runs of spaces split differently (``"\\n   1 |"``, the
    python environment's ``view()``), other text alike. Same vocabulary and merges."""
    import tempfile

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="grouprl-tok-") as tmp:
        save_tiny(tmp, tok, model)
        return AutoTokenizer.from_pretrained(tmp)
