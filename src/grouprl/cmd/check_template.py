"""``grouprl check-template MODEL``: can this chat template drive token-in/token-out tool rollouts?

Renders a two-tool conversation (the assistant calls two tools, the results come back, the assistant
answers) token by token as a multi-turn rollout builds it, prints every completion token with its loss
mask (1 = sampled by the model, 0 = tool output or template glue) and exits 1 with the reason when the
template is not prefix-preserving.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-template", help="show the loss mask of a tool conversation under a chat template")
    p.add_argument("model", help="a local model/tokenizer directory, a hub id, builtin:<name>, or 'tiny' "
                                 "(the built-in tiny tokenizer, no model built)")
    p.add_argument("--chat-template", default=None,
                   help="a .jinja file (or Jinja string) to use instead of the tokenizer's own template")
    p.set_defaults(func=run)


def load_tokenizer(name: str):
    """The tokenizer of ``name`` (see the ``model`` argument)."""
    if name == "tiny":
        from importlib import import_module

        return import_module("grouprl.builtin.tiny").build_tokenizer()
    from pathlib import Path

    from transformers import AutoTokenizer

    from grouprl.errors import ConfigError
    from grouprl.models import looks_like_path, resolve_model_path

    if looks_like_path(name) and not Path(name).expanduser().exists():  # not a hub id error's traceback
        raise ConfigError(f"model={name!r}: no such folder (looked in {str(Path.cwd())!r}). Fix: give a model or "
                          f"tokenizer folder, a hub id (org/name), builtin:<name> or tiny.")
    return AutoTokenizer.from_pretrained(resolve_model_path(name))


def run(args: argparse.Namespace) -> int:
    from grouprl.rollout.chat import check_prefix_preserving

    tokenizer = load_tokenizer(args.model)
    report = check_prefix_preserving(tokenizer, chat_template=args.chat_template)
    if not report.ok:
        print(f"check-template: {args.model}: NOT usable for multi-turn tool rollouts: {report.reason}", file=sys.stderr)
        return 1
    print(f"prompt: {len(report.prompt_ids)} tokens; completion: {len(report.completion_ids)} tokens "
          f"({sum(report.loss_mask)} sampled, mask 1; {len(report.loss_mask) - sum(report.loss_mask)} tool/glue, mask 0)")
    print("mask  id      token")
    for tid, mask, piece in zip(report.completion_ids, report.loss_mask, report.pieces):
        print(f"{mask:>4}  {tid:<6}  {piece!r}")
    if not report.retokenize_matches:
        print("note: tokenizing the full rendered conversation gives different ids; rollouts keep the sampled ids "
              "(token-in/token-out), so this only matters for tools that re-tokenize text.")
    print(f"check-template: {args.model}: OK (prefix-preserving)")
    return 0
