"""``grouprl list``: every registry and its entries, each with a one-line description, then the built-in
tasks (``dataset: builtin:<name>``) and models (``model: builtin:<name>``)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list the registries (losses, advantages, rewards, environments, ...), the "
                                    "built-in tasks and the built-in models")
    p.add_argument("registry", nargs="?", help="only this registry (e.g. policy_losses, rewards)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from grouprl.builtins import load_builtins
    from grouprl.errors import did_you_mean

    registries = {**load_builtins(), **extra_sections()}
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


class Section:
    """A listing with the two methods ``run`` reads from a registry (``names``, ``describe``)."""

    def __init__(self, signature: str, entries: dict[str, str]) -> None:
        self.signature, self.entries = signature, entries

    def names(self) -> list[str]:
        return sorted(self.entries)

    def describe(self, name: str) -> str:
        return self.entries[name]


def extra_sections() -> dict[str, Section]:
    """The built-in tasks and models (the models' package is looked up by name: nothing imports it statically)."""
    from importlib import import_module

    from grouprl.data.tasks import TASKS

    tasks = {}
    for name, task in TASKS.items():
        doc = (task.make.__doc__ or "").strip().split("\n")[0].replace("``", "").rstrip(".")
        tasks[name] = f"{doc}; trains on {', '.join(task.reward_funcs)} (dataset: builtin:{name})."
    warm = import_module("grouprl.builtin").warmstart.WARMSTARTS
    models = {name: (f"{w.num_layers}-layer, {w.hidden_size}-wide model, SFT-warm-started on builtin:{w.task}"
                     f"{f' with {w.noise:.0%} demonstration noise (WarmStart.noise)' if w.noise else ''}; built on first use, no "
                     f"download (model: builtin:{name}).") for name, w in warm.items()}
    return {"tasks": Section("dataset: builtin:<name>", tasks), "models": Section("model: builtin:<name>", models)}
