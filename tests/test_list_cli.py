"""``grouprl list``: every registry and every entry, each with a complete one-line description."""

from __future__ import annotations

import pytest

from grouprl.builtins import load_builtins
from grouprl.cli import main


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")  # rich wraps the table to the terminal; keep one row per line


def test_list_prints_every_registry_entry_with_its_description(wide, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    sections = {block.splitlines()[0].split()[0]: block.splitlines() for block in out.split("\n\n") if block.strip()}
    registries = load_builtins()
    assert list(sections) == [*registries, "tasks", "models"]
    for key, reg in registries.items():
        lines = sections[key]
        assert reg.signature in lines[0] and len(reg) > 0, key
        rows = {line.split("│")[0].strip(): line.split("│")[1].strip() for line in lines if "│" in line}
        assert sorted(rows) == reg.names(), key
        for name in reg.names():
            desc = reg.describe(name)
            # a complete sentence (a docstring's first line cut mid-sentence is not), plain text (no reST)
            assert desc and desc.endswith((".", ")")) and "``" not in desc, (key, name, desc)
            assert rows[name] == desc, (key, name)


def test_list_one_registry_and_unknown_registry(wide, capsys):
    assert main(["list", "rewards"]) == 0
    out = capsys.readouterr().out
    assert "rewards" in out and "policy_losses" not in out and "composite" in out
    assert main(["list", "reward"]) == 2
    assert "Did you mean 'rewards'" in capsys.readouterr().err


def test_list_shows_the_built_in_tasks_and_models(wide, capsys):
    from grouprl.data.tasks import TASKS

    assert main(["list", "tasks"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("│")[0].strip(): line.split("│")[1].strip() for line in out.splitlines() if "│" in line}
    assert sorted(rows) == sorted(TASKS) == ["arithmetic", "calculator", "code_repair", "countdown", "retrieval"]
    assert rows["countdown"].endswith("trains on countdown (dataset: builtin:countdown).")
    assert main(["list", "models"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("│")[0].strip(): line.split("│")[1].strip() for line in out.splitlines() if "│" in line}
    assert {"arithmetic", "countdown"} <= set(rows) and "(model: builtin:arithmetic)." in rows["arithmetic"]
    assert "environments" not in out and "tasks" not in out
