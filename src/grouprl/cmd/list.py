"""``grouprl list``: every registry and its entries, each with a one-line description."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list the registries (losses, advantages, rewards, ...) and their entries")
    p.add_argument("registry", nargs="?", help="only this registry (e.g. policy_losses, rewards)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from grouprl.builtins import load_builtins
    from grouprl.errors import did_you_mean

    registries = load_builtins()
    if args.registry and args.registry not in registries:
        from grouprl.errors import ConfigError

        raise ConfigError(
            f"no registry {args.registry!r}; known: {', '.join(registries)}."
            + did_you_mean(args.registry, registries)
        )
    console = Console()
    for key, reg in registries.items():
        if args.registry and key != args.registry:
            continue
        console.print(f"[bold]{key}[/bold]  [dim]{reg.signature}[/dim]")
        table = Table(show_edge=False)
        table.add_column("name", style="bold cyan", no_wrap=True)
        table.add_column("description")
        for name in reg.names():
            table.add_row(name, reg.describe(name))
        console.print(table)
        console.print()
    return 0
