"""`grouprl serve` flags: the batching and queue bounds reach the server; bad values fail before a model loads."""

from __future__ import annotations

import pytest

from grouprl.cli import build_parser
from grouprl.errors import ConfigError


def test_the_flags_parse():
    args = build_parser().parse_args(["serve", "builtin:calculator", "--max-batch", "8", "--queue-timeout", "5"])
    assert args.max_batch == 8 and args.queue_timeout == 5.0 and args.max_new_tokens == 256


@pytest.mark.parametrize("flag, value", [("--max-batch", "0"), ("--queue-timeout", "0"), ("--max-new-tokens", "0"),
                                         ("--max-time", "-1")])
def test_bad_bounds_fail_before_the_model_loads(flag, value):
    args = build_parser().parse_args(["serve", "/nonexistent/model", flag, value])
    with pytest.raises(ConfigError, match=flag.lstrip("-")):
        args.func(args)
