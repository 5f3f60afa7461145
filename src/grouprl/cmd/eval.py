"""``grouprl eval -c recipe.yaml --checkpoint DIR``: held-out accuracy (greedy or sampled) and pass@k.

It calls ``grouprl.train.evaluate.evaluate_model``, the function the trainer's in-training evaluation uses,
so re-evaluating a run's final model with its ``config.yaml`` reproduces the logged ``eval/accuracy``.
"""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a checkpoint on the recipe's held-out split (accuracy, pass@k)")
    p.add_argument("-c", "--config", help="YAML recipe (dataset, eval split, eval reward, generation lengths)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override a config field")
    p.add_argument("--checkpoint", help="model directory (a checkpoint-<step> or final/); default: recipe's model")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (default: eval_temperature)")
    p.add_argument("--num-samples", "-n", type=int, default=None, help="samples per prompt (for pass@k)")
    p.add_argument("--k", type=int, nargs="*", default=None, help="k values for pass@k (default: 1 and n)")
    p.add_argument("--limit", type=int, default=None, help="evaluate at most this many prompts")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from grouprl.config import GRPOConfig
    from grouprl.sandbox.config import configure_for_run

    cfg = GRPOConfig.from_yaml(args.config, args.overrides)
    check_limit(args.limit)
    configure_for_run(cfg)
    temperature, n, ks = decoding_plan(cfg, args.temperature, args.num_samples, args.k)
    check_ks(ks, n)
    if temperature == 0 and args.num_samples is None and cfg.eval_num_samples > 1:
        print(f"note: greedy decoding (--temperature 0): 1 sample per prompt instead of the recipe's "
              f"eval_num_samples={cfg.eval_num_samples}; pass@k is not computed for greedy decoding.",
              file=sys.stderr)
    result = evaluate_checkpoint(cfg, args.checkpoint, temperature=temperature, num_samples=n, ks=ks,
                                 limit=args.limit)
    samples = result.pop("samples", [])
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    decoding = "greedy" if temperature == 0 else f"sampled, T={temperature}, n={n}"
    print(f"held-out accuracy: {result['accuracy']:.4f}  ({result['num_prompts']} prompts, {decoding})")
    for k in ks if temperature > 0 else ():  # greedy: one sample per prompt, accuracy is the whole story
        if f"pass@{k}" in result:
            print(f"pass@{k}: {result[f'pass@{k}']:.4f}")
    print(f"mean completion length: {result['completion_length']:.1f} tokens")
    if samples:
        print(f"example: {samples[0]['completion']!r} -> reward {samples[0]['reward']}")
    return 0


def check_limit(limit: int | None) -> None:
    from grouprl.errors import ConfigError

    if limit is not None and limit < 1:
        raise ConfigError(f"--limit {limit} must be >= 1 (it caps the prompts evaluated; leave it out for all).")


def check_ks(ks: tuple[int, ...], n: int) -> None:
    """pass@k needs 1 <= k <= n samples per prompt."""
    from grouprl.errors import ConfigError

    bad = [k for k in ks if k < 1 or k > n]
    if bad:
        raise ConfigError(f"--k {' '.join(map(str, bad))}: pass@k needs 1 <= k <= the samples per prompt ({n}). "
                          f"Fix: use k values in 1..{n}, or raise -n.")


def decoding_plan(cfg, temperature: float | None, num_samples: int | None,
                  k: list[int] | None) -> tuple[float, int, tuple[int, ...]]:
    """``grouprl.train.evaluate.decoding_plan`` (imported when called: the CLI starts without torch)."""
    from grouprl.train.evaluate import decoding_plan as plan

    return plan(cfg, temperature, num_samples, k)


def evaluate_checkpoint(cfg, checkpoint: str | None, *, temperature: float, num_samples: int,
                        ks: tuple[int, ...], limit: int | None = None) -> dict:
    """Load ``checkpoint`` (a full model or a LoRA adapter over ``cfg.model``) and evaluate it."""
    from pathlib import Path

    from grouprl.data.load import check_rows, load_dataset_any
    from grouprl.errors import ConfigError
    from grouprl.models import check_model_source, load_model, load_tokenizer, pick_device, resolve_model_path
    from grouprl.train.engine.model import apply_torch_threads
    from grouprl.train.evaluate import evaluate_model
    from grouprl.train.score import resolve_reward_funcs

    if cfg.dataset is None or cfg.eval_split is None:
        raise ConfigError("evaluation needs `dataset` and `eval_split` in the recipe.")
    source = checkpoint or cfg.model
    if source is None:
        raise ConfigError("no model: give --checkpoint DIR or set `model` in the recipe.")
    check_model_source(source, "--checkpoint" if checkpoint else "model")
    rows_ds = load_dataset_any(cfg.dataset, cfg.eval_split, **cfg.dataset_kwargs)
    if rows_ds is None:
        raise ConfigError(f"dataset {cfg.dataset!r} has no split {cfg.eval_split!r}.")
    n_rows = min(len(rows_ds), limit or cfg.max_eval_samples or len(rows_ds))
    rows_ds = rows_ds.select(range(n_rows))
    check_rows(rows_ds, cfg.prompt_column)
    apply_torch_threads(cfg)  # before the model loads
    device = pick_device(cfg.device)
    if checkpoint and (Path(checkpoint) / "adapter_config.json").is_file():
        from peft import PeftModel

        model = PeftModel.from_pretrained(load_model(cfg.model, device), checkpoint).to(device)
        tokenizer = load_tokenizer(checkpoint if (Path(checkpoint) / "tokenizer_config.json").is_file()
                                   else resolve_model_path(cfg.model))
    else:
        model = load_model(source, device)
        tokenizer = load_tokenizer(resolve_model_path(source))
    from grouprl.data.load import with_chat_template_kwargs

    tokenizer = with_chat_template_kwargs(tokenizer, cfg.chat_template_kwargs)  # as the trainer renders prompts
    reward_fn = resolve_reward_funcs([cfg.eval_reward], cfg.reward_kwargs)[0]
    rows = [rows_ds[i] for i in range(len(rows_ds))]
    # the same function the trainer logs eval/* with, so this reproduces the logged numbers
    return evaluate_model(cfg, model, tokenizer, rows, reward_fn, temperature=temperature,
                          num_samples=num_samples, ks=ks)
