"""Tool-use demonstrations for a built-in warm start: chat conversations, tokenized as a rollout builds them.

A demonstration is a list of chat messages (user, assistant, tool, assistant). Its token ids are the
chat template's rendering cut at the turn boundaries, exactly as :mod:`grouprl.rollout.multiturn`
builds a trajectory: the prompt with its generation prompt, then each assistant turn's content and
end-of-turn token (loss mask 1: what the policy samples), then the template glue, the tool message and
the next generation prompt (mask 0: what the environment and the template add). So the SFT learns the
assistant tokens in the very context the rollout will show, and never learns to predict a tool's reply.
Hand-written because the rollout's own helpers (:mod:`grouprl.rollout.chat`) sit above this package.

Used by :func:`grouprl.builtin.warmstart.build_warmstart` for a :class:`WarmStart` with ``environment``,
which also stops its SFT at the quality gate :func:`copy_gate` (the demonstrated tool use, solved greedily
on unseen problems) when ``copy_gate`` is set.
"""

from __future__ import annotations

import random
from typing import Any

# What the tiny template shows of the calculator environment's tool (grouprl.envs.calculator): its name and
# argument names. The full schema the rollout passes renders the same ("Tools: calculator(expression)").
CALCULATOR_TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
TOOLS = {"calculator": CALCULATOR_TOOLS}


def tool_conversation(row: dict, *, call: bool, typo: tuple[str, str] | None = None,
                      mask_digits: bool = False, mask_decision: bool = False) -> list[dict]:
    """The messages of one demonstration for a calculator ``row``.

    ``call=True``: call the calculator with the row's expression (or the mistyped one of ``typo =
    (expression, value)``), read its reply, answer with it. ``call=False``: answer at once; with
    ``mask_digits`` that turn is marked ``"mask_digits": True`` (:func:`conversation_ids` then gives its
    digit tokens loss mask 0: the SFT learns the format of a direct answer, not digits the model cannot
    compute, so "Answer:" is followed by learned digits only where they were copied from a tool reply).
    ``mask_decision`` (with ``call=True``): the call turn is marked ``"mask_first": True``, so its first
    token (``<tool_call>``, the choice to call) is not trained, only the call and the answer that follow.
    """
    prompt = row["prompt"]
    messages = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if not call:
        turn = {"role": "assistant", "content": f"Answer: {row['answer']}"}
        return messages + [{**turn, "mask_digits": True} if mask_digits else turn]
    expression, value = typo if typo is not None else (row["work"], row["answer"])
    call_turn = {"role": "assistant", "content": f'<tool_call>calculator(expression="{expression}")</tool_call>'}
    return messages + [
        {**call_turn, "mask_first": True} if mask_decision else call_turn,
        {"role": "tool", "name": "calculator", "content": value},
        {"role": "assistant", "content": f"Answer: {value}"},
    ]


def tool_examples(spec: Any) -> tuple[list[tuple[list[dict], list[dict] | None]], float]:
    """``(messages, tools or None)`` demonstrations of ``spec`` and the fraction whose answer is right.

    ``spec.tool_fraction`` of them call the tool (``spec.noise`` of those with a mistyped expression);
    the others answer directly, ``spec.no_tools_fraction`` of those under a prompt that lists no tools.
    Only ``spec.decision_fraction`` of the calls train their first token (the choice to call).
    """
    from grouprl.data.tasks import generate_rows, mistyped_expression

    if spec.environment not in TOOLS:
        raise ValueError(f"WarmStart.environment={spec.environment!r}: known tool demonstrations: {', '.join(TOOLS)}")
    rows = generate_rows(spec.task, "train", n=spec.sft_rows, seed=1000 + spec.seed, **spec.task_kwargs)
    rng = random.Random(f"tools|{spec.seed}")
    out, right = [], 0
    for row in rows:
        call = rng.random() < spec.tool_fraction
        typo = mistyped_expression(row, rng) if call and rng.random() < spec.noise else None
        listed = call or rng.random() >= spec.no_tools_fraction
        decide = call and rng.random() < spec.decision_fraction if spec.decision_fraction < 1 else call
        messages = tool_conversation(row, call=call, typo=typo, mask_digits=spec.mask_direct_digits,
                                     mask_decision=call and not decide)
        right += messages[-1]["content"] == f"Answer: {row['answer']}"
        out.append((messages, TOOLS[spec.environment] if listed else None))
    return out, right / len(out)


def _render(tok: Any, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
    kwargs = {"tools": tools} if tools else {}
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)


def conversation_ids(tok: Any, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
    """Token ids of ``messages`` and their loss mask: 1 on each assistant turn's content + end-of-turn token.

    An assistant message with ``"mask_digits": True`` keeps mask 0 on its digit tokens, one with
    ``"mask_first": True`` on its first token (the rest of the turn is trained). The first user turn and its generation prompt, and everything between an assistant turn's
    end-of-turn token and the next generation prompt (glue, tool messages) get 0. Raises ValueError when
    the template is not prefix-preserving (the rollout would refuse it too).
    """
    eos = tok.eos_token
    ids: list[int] = []
    mask: list[int] = []
    done = ""
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tok, messages[:k], tools, True)
        full = _render(tok, messages[: k + 1], tools, False)
        if not (before.startswith(done) and full.startswith(before)):
            raise ValueError("conversation_ids: the chat template is not prefix-preserving")
        body = full[len(before):]
        turn = body[: body.index(eos) + len(eos)]
        for text, trained in ((before[len(done):], 0), (turn, 1)):
            piece = tok.encode(text, add_special_tokens=False)
            ids += piece
            if trained and message.get("mask_digits"):
                mask += [0 if tok.decode([t]).strip().isdigit() else 1 for t in piece]
            elif trained and message.get("mask_first"):
                mask += [0] + [1] * (len(piece) - 1)
            else:
                mask += [trained] * len(piece)
        done = before + turn
    return ids, mask


def encode_conversations(tok: Any, conversations: list[tuple[list[dict], list[dict] | None]]):
    """:func:`conversation_ids` of each ``(messages, tools)``, as the warm start's ``(ids, mask)`` rows."""
    return [conversation_ids(tok, messages, tools) for messages, tools in conversations]


def tool_corpus(spec: Any, tok: Any, n: int = 600) -> list[str]:
    """Texts to train the tokenizer on: ``n`` demonstrations rendered by the chat template of ``tok``
    (so the template's words and the call syntax get tokens of their own)."""
    from dataclasses import replace

    conversations, _ = tool_examples(replace(spec, sft_rows=n, tool_fraction=max(spec.tool_fraction, 0.5)))
    return [_render(tok, messages, tools, False) for messages, tools in conversations]


def demo_tokenizer(spec: Any):
    """The tokenizer of a tool warm start: BPE trained on the demonstrations as the chat template renders them."""
    from grouprl.builtin.tiny import build_tokenizer
    from grouprl.data.tasks import corpus

    return build_tokenizer(tool_corpus(spec, build_tokenizer(corpus(spec.task))), vocab_size=spec.vocab_size)


def gate_rows(spec: Any, n: int = 64) -> list[dict]:
    """``n`` problems for the copy gate: train-split problems drawn apart from the SFT rows (none of them in
    the SFT set, none from the held-out test split the recipes evaluate on)."""
    from grouprl.data.tasks import generate_rows

    seen = {r["key"] for r in generate_rows(spec.task, "train", n=spec.sft_rows, seed=1000 + spec.seed,
                                            **spec.task_kwargs)}
    rows = generate_rows(spec.task, "train", n=n + 16, seed=5000 + spec.seed, **spec.task_kwargs)
    return [r for r in rows if r["key"] not in seen][:n]


def copy_gate(spec: Any, tok: Any, n: int = 64):
    """The warm start's quality gate: ``score(model)`` = the fraction of ``n`` unseen problems whose whole
    demonstrated tool use -- the call with the expression copied, then the answer with the tool's reply
    copied -- is the model's argmax at every trained token after the first (``<tool_call>``, the choice to
    call, which RL learns). Teacher-forced argmax at every token is exactly greedy decoding, so the score is
    the fraction of problems a model that decides to call solves greedily: the skill RL needs."""
    checked = []
    for row in gate_rows(spec, n):
        ids, mask = conversation_ids(tok, tool_conversation(row, call=True), TOOLS[spec.environment])
        first = mask.index(1)
        checked.append((ids, [0] * (first + 1) + mask[first + 1:]))
    return argmax_gate(tok, checked)


def argmax_gate(tok: Any, checked: list[tuple[list[int], list[int]]]):
    """``score(model)``: the fraction of the ``(ids, check)`` rows whose every token with check 1 is the model's
    argmax given the tokens before it (teacher-forced argmax at every token is exactly greedy decoding)."""
    import torch

    width = max(len(ids) for ids, _ in checked)
    ids = torch.full((len(checked), width), tok.pad_token_id, dtype=torch.long)
    check = torch.zeros((len(checked), width), dtype=torch.bool)
    for r, (seq, flags) in enumerate(checked):
        ids[r, : len(seq)] = torch.tensor(seq)
        check[r, : len(seq)] = torch.tensor(flags, dtype=torch.bool)
    attn = (torch.arange(width)[None, :] < torch.tensor([len(s) for s, _ in checked])[:, None]).long()

    def score(model) -> float:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            pred = model(input_ids=ids, attention_mask=attn).logits[:, :-1].argmax(-1)
        model.train(was_training)
        right = (pred == ids[:, 1:]) | ~check[:, 1:]
        return float(right.all(dim=1).float().mean())

    return score


demo_examples = tool_examples
demo_gate = copy_gate
