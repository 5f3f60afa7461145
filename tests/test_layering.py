"""Import layering, checked by parsing the source with ast (DESIGN.md: imports flow one way).

- ``grouprl/algo/`` is pure tensor math: torch, a few pure stdlib modules, and grouprl.algo / registry /
  errors / types only. No I/O (os, pathlib, subprocess, io, json, ...), no config, no trainer, no logging.
  It also never calls ``.item()`` or ``print`` (metrics stay tensors; the trainer reduces and logs).
- ``grouprl/rewards/`` is pure Python: it never imports torch.
- ``grouprl/config/`` imports no torch and nothing of grouprl but errors / registry / builtins, the last two
  only lazily inside functions (so ``--help`` and validation stay instant, and the config never loads the sandbox).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "grouprl"

ALGO_ALLOWED = {
    "torch", "math", "typing", "__future__", "dataclasses", "collections", "functools", "enum",
    "numbers", "itertools", "operator", "abc", "types",
    "grouprl.algo", "grouprl.registry", "grouprl.errors", "grouprl.types",
}


def _imports(path: pathlib.Path) -> list[str]:
    """Absolute names of every module imported anywhere in ``path`` (including inside functions)."""
    module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    return _imports_in(path.read_text(encoding="utf-8"), package.removesuffix(".__init__"))


def _imports_in(source: str, package: str) -> list[str]:
    tree = ast.parse(source)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if node.module:
                names.append(base)
            # 'from grouprl import config' imports the module grouprl.config: record base.name too
            names.extend(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            names.append("<dynamic __import__>")
    return names


def _allowed(name: str, allowed: set[str]) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


def _files(sub: str) -> list[pathlib.Path]:
    return sorted((SRC / sub).rglob("*.py"))


@pytest.mark.parametrize("path", _files("algo"), ids=lambda p: p.name)
def test_algo_imports_only_pure_modules(path):
    bad = [n for n in _imports(path) if not _allowed(n, ALGO_ALLOWED)]
    assert not bad, f"{path.relative_to(SRC)} imports {bad}; algo/ may import only {sorted(ALGO_ALLOWED)}"


@pytest.mark.parametrize("path", _files("algo"), ids=lambda p: p.name)
def test_algo_has_no_item_print_or_logging_calls(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    offenders = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in {"item", "backward", "cuda"}:
                offenders.append(f"line {node.lineno}: .{f.attr}()")
            if isinstance(f, ast.Name) and f.id in {"print", "open", "input", "breakpoint"}:
                offenders.append(f"line {node.lineno}: {f.id}()")
    assert not offenders, f"{path.relative_to(SRC)}: {offenders}"


def test_algo_package_is_scanned():
    # guards against the parametrisation above silently collecting nothing
    names = {p.name for p in _files("algo")}
    assert {"__init__.py", "ops.py", "advantages.py", "losses.py", "kl.py", "aggregate.py"} <= names


@pytest.mark.parametrize("path", _files("rewards"), ids=lambda p: p.name)
def test_rewards_never_import_torch(path):
    bad = [n for n in _imports(path) if _allowed(n, {"torch", "grouprl.algo", "grouprl.train"})]
    assert not bad, f"{path.relative_to(SRC)} imports {bad}; rewards/ must stay pure Python (no torch)"


CONFIG_STDLIB = {"__future__", "ast", "dataclasses", "functools", "inspect", "math", "pathlib", "typing",
                 "warnings", "importlib", "yaml"}


def _module_level_imports(path: pathlib.Path) -> list[str]:
    """Imports made when the module is imported (its top-level import statements)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    eager = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    package = module.removesuffix(".__init__") if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    return _imports_in(ast.unparse(ast.Module(body=eager, type_ignores=[])), package)


@pytest.mark.parametrize("path", _files("config"), ids=lambda p: p.name)
def test_config_imports_no_torch_no_sandbox_only_errors_registry_builtins(path):
    names = _imports(path)
    bad = [n for n in names if not _allowed(n, CONFIG_STDLIB | {"grouprl.config", "grouprl.errors",
                                                                "grouprl.registry", "grouprl.builtins"})]
    assert not bad, f"{path.relative_to(SRC)} imports {bad}; config/ may import the stdlib, yaml, errors, " \
                    f"and (lazily) registry / builtins only"
    eager = [n for n in _module_level_imports(path) if _allowed(n, {"grouprl.registry", "grouprl.builtins"})]
    assert not eager, f"{path.relative_to(SRC)} imports {eager} at module level; import them inside a function"


def test_config_package_is_scanned():
    assert not (SRC / "config.py").exists(), "grouprl/config.py and grouprl/config/ would shadow each other"
    assert {"__init__.py", "fields.py", "presets.py", "validate.py", "io.py"} <= {p.name for p in _files("config")}


def test_import_resolver_sees_relative_lazy_and_dynamic_imports():
    source = (
        "from .ops import masked_mean\n"
        "from .. import config\n"
        "import os.path\n"
        "def f():\n"
        "    import json\n"
        "    return __import__('subprocess')\n"
    )
    names = _imports_in(source, "grouprl.algo")
    assert names == [
        "grouprl.algo.ops", "grouprl.algo.ops.masked_mean", "grouprl.config", "os.path", "json",
        "<dynamic __import__>",
    ]
    assert [n for n in names if not _allowed(n, ALGO_ALLOWED)] == names[2:]
