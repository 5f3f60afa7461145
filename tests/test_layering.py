"""Import layering, checked by parsing the source with ast (docs/DESIGN.md, "The one-way arrow").

Imports flow ``cli -> cmd -> serve | train -> run | rollout | envs | data | rewards | sandbox | report |
models -> algo -> registry -> errors``, and no two files import each other, directly or round a circle
(:func:`test_no_import_cycle_between_files`, lazy imports included). ``config`` validates names against the registries, so it sits above ``builtins`` (which imports
the built-in algo and rewards so that their registrations happen) and below ``train`` and ``run``. The demo
package ``grouprl.builtin`` (tiny models, warm starts) is reached only by name, from the model loader
(``grouprl.models``), which ``train``, ``serve`` and ``cmd`` share.

:data:`ALLOWED` lists, for every unit (a subpackage or top-level module of ``grouprl``), the units it may
import. An edge is any of: ``import`` / ``from ... import`` (also inside functions, also relative),
``importlib.import_module("literal")``, and a string that names a grouprl module (``"grouprl.x.y"`` or
``"grouprl.x:fn"``, as plug-in tables hold them; docstrings excluded). An ``import_module`` or
``__import__`` whose argument is not a literal is allowed only in the functions of :data:`DYNAMIC_IMPORTS`.

Also:
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
import re
from dataclasses import dataclass

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "grouprl"

ALGO_ALLOWED = {
    "torch", "math", "typing", "__future__", "dataclasses", "collections", "functools", "enum",
    "numbers", "itertools", "operator", "abc", "types",
    "grouprl.algo", "grouprl.registry", "grouprl.errors", "grouprl.types",
}

ROOT = "grouprl"  # the package itself (grouprl/__init__.py): lazy public names
_BASE = {"errors", "registry"}
_MIDDLE = _BASE | {"algo"}
# unit -> the units it may import (besides itself). Siblings of the middle row only along listed edges;
# some edges are for packages still to come (envs -> sandbox, rollout -> envs, rollout -> rewards for the
# shared tool-call parser).
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "registry": {"errors"},
    "types": {"errors"},
    "algo": {"errors", "registry", "types"},
    "builtins": _BASE | {"algo", "rewards", "envs", "scorers"},
    "scorers": _BASE | {"rewards"},  # learned rewards that need torch (reward_model), kept out of rewards/
    "config": _BASE | {"builtins"},
    "sandbox": _MIDDLE,
    "rewards": _BASE | {"sandbox"},  # no algo: rewards stay torch-free; sandbox for the code reward
    "data": _MIDDLE | {"rewards"},  # a built-in task names its default reward and reuses its evaluator
    "envs": _MIDDLE | {"sandbox"},
    "rollout": _MIDDLE | {"envs", "rewards"},
    "report": _MIDDLE | {"builtins"},  # the explainers load the registered functions
    "models": _BASE,  # model and tokenizer loading (hub id, folder, registered sources such as builtin:)
    "run": _BASE | {"config", "data", "rewards", "report", "models", "sandbox"},  # torch-free run lifecycle (lock, output dir, checks)
    "train": _MIDDLE | {"config", "builtins", "rollout", "envs", "data", "rewards", "sandbox", "report", "run", "models"},
    "cmd": _MIDDLE | {"config", "builtins", "rollout", "envs", "data", "rewards", "sandbox", "report", "train",
                      "serve", "run", "models"},
    "serve": _MIDDLE | {"models", "rollout", "rewards"},  # `grouprl serve`: loads the model through grouprl.models;
    # the rollouts' chat template and the tool-call parser, so a served agent sees what it saw in training
    "cli": {ROOT, "errors", "cmd"},
    "__main__": {"cli"},  # python -m grouprl (accelerate launch -m grouprl train ...)
    ROOT: {"algo", "rewards", "config", "train"},
    # demo models; nothing imports it statically (see BY_NAME). envs / rewards: the search agent's and the
    # judge's demonstrations are rendered by the search tool and the judge reward's own prompt builders.
    "builtin": _BASE | {"data", "envs", "rewards"},
}

# Edges allowed only as a lookup by name (import_module with a literal, or a module-name string) inside the
# named function -- never as an import statement.
BY_NAME = {("models", "builtin"): (("models.py", "resolve_model_path"),),
           ("cmd", "builtin"): (("cmd/check_template.py", "load_tokenizer"), ("cmd/list.py", "extra_sections"))}

# (file, function) -> why a non-literal import_module is right there.
DYNAMIC_IMPORTS = {
    ("__init__.py", "__getattr__"): "lazy public names (_EXPORTS), so `import grouprl` needs no torch",
    ("cli.py", "build_parser"): "subcommands grouprl.cmd.<name>, imported only when the CLI is built",
    ("builtins.py", "load_builtins"): "the modules listed in BUILTIN_MODULES, whose decorators register",
    ("envs/resolve.py", "_import"): "user tools / environments named 'package.module:attr' in a recipe",
    ("registry.py", "Registry.resolve"): "the plug-in resolver: 'package.module:function' from the user",
    ("rollout/__init__.py", "backend_class"): "the backend loader: a built-in backend or 'package.module:Class'",
    ("rewards/adapters.py", "_resolve"): "a reward plug-in 'package.module:function' from the user",
    ("rewards/_limit.py", "_import"): "the time-limited worker runs the 'module:function' its parent names",
}

# (unit, imported unit) -> why the edge still exists. Each entry must still be found in the source (a stale
# entry fails test_tolerated_edges_are_still_there), so this list only shrinks.
TOLERATED: dict[tuple[str, str], str] = {}

# third-party modules a unit must never import
FORBIDDEN = {"config": {"torch", "transformers"}, "rewards": {"torch"}, "registry": {"torch"},
             "errors": {"torch"}, "builtins": {"torch"}}

_MODULE_NAME = re.compile(r"grouprl(\.\w+)+(:[\w.]+)?")


@dataclass(frozen=True)
class Edge:
    name: str  # absolute module name, or "<dynamic ...>"
    kind: str  # "import", "import_module", "string" or "dynamic"
    line: int
    func: str  # qualified name of the enclosing function ("" at module level)


def _package_of(relpath: str) -> str:
    module = ".".join(("grouprl", *pathlib.PurePosixPath(relpath).with_suffix("").parts))
    return module.removesuffix(".__init__") if relpath.endswith("__init__.py") else module.rsplit(".", 1)[0]


def _edges_in(source: str, relpath: str) -> list[Edge]:
    """Every import edge of the file ``relpath`` (relative to src/grouprl) whose text is ``source``."""
    package = _package_of(relpath)
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    edges: list[Edge] = []
    consumed: set[int] = set()

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{func}.{child.name}" if func else child.name)
                continue
            line = getattr(child, "lineno", 0)
            if isinstance(child, ast.Import):
                edges.extend(Edge(alias.name, "import", line, func) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                if child.module and base != ROOT:
                    edges.append(Edge(base, "import", line, func))
                # 'from grouprl import config' imports the module grouprl.config: record base.name too
                edges.extend(Edge(f"{base}.{alias.name}", "import", line, func) for alias in child.names)
            elif isinstance(child, ast.Call):
                f = child.func
                fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if fname in {"import_module", "__import__"}:
                    arg = child.args[0] if child.args else None
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and not arg.value.startswith("."):
                        edges.append(Edge(arg.value, "import_module", line, func))
                        consumed.add(id(arg))
                    else:
                        edges.append(Edge(f"<dynamic {fname}>", "dynamic", line, func))
            elif (isinstance(child, ast.Constant) and isinstance(child.value, str) and id(child) not in docstrings
                  and id(child) not in consumed and _MODULE_NAME.fullmatch(child.value)):
                edges.append(Edge(child.value.split(":", 1)[0], "string", line, func))
            visit(child, func)

    visit(tree, "")
    return edges


def _imports_in(source: str, package: str) -> list[str]:
    """Imported names of ``source`` as if it were a module of ``package`` (a dotted name)."""
    relpath = "/".join(package.split(".")[1:] + ["_probe.py"])
    return [e.name for e in _edges_in(source, relpath)]


def _imports(path: pathlib.Path) -> list[str]:
    """Absolute names of every module imported anywhere in ``path`` (including inside functions)."""
    return [e.name for e in _edges_in(path.read_text(encoding="utf-8"), path.relative_to(SRC).as_posix())]


def _unit_of_file(relpath: str) -> str:
    first = pathlib.PurePosixPath(relpath).parts[0]
    return ROOT if first == "__init__.py" else first.removesuffix(".py")


def _unit_of_name(name: str) -> str | None:
    """``grouprl.train.algorithms.grpo`` -> ``train``; an attribute of the package (``grouprl.__version__``) -> ROOT;
    a third-party module -> None."""
    parts = name.split(".")
    if parts[0] != ROOT:
        return None
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else ROOT


def _violations(source: str, relpath: str, *, tolerate: bool = True) -> list[str]:
    """What is wrong with the imports of the file ``relpath`` (relative to src/grouprl)."""
    unit = _unit_of_file(relpath)
    if unit not in ALLOWED:
        return [f"{relpath}: unit {unit!r} has no row in ALLOWED (tests/test_layering.py): add one"]
    out, seen = [], set()
    for e in _edges_in(source, relpath):
        if (e.line, _unit_of_name(e.name) or e.name.split(".")[0]) in seen:
            continue  # 'from a.b import c' is one import, reported once
        seen.add((e.line, _unit_of_name(e.name) or e.name.split(".")[0]))
        where = f"{relpath}:{e.line}"
        if e.kind == "dynamic":
            if (relpath, e.func) not in DYNAMIC_IMPORTS:
                out.append(f"{where}: non-literal {e.name[9:-1]}() in {e.func or 'module level'}; import by a "
                           f"literal name, or add ({relpath!r}, {e.func!r}) to DYNAMIC_IMPORTS with the reason")
            continue
        target = _unit_of_name(e.name)
        if target is None:
            top = e.name.split(".")[0]
            if top in FORBIDDEN.get(unit, set()):
                out.append(f"{where}: {unit} must not import {top!r}")
            continue
        if target == unit or target in ALLOWED[unit]:
            continue
        by_name = BY_NAME.get((unit, target))
        if by_name and e.kind != "import" and (relpath, e.func) in by_name:
            continue
        if tolerate and (unit, target) in TOLERATED:
            continue
        how = "imports" if e.kind == "import" else f"names ({e.kind})"
        out.append(f"{where}: {unit} {how} {e.name!r}, but {unit} may import only "
                   f"{sorted(ALLOWED[unit]) or 'nothing'} (docs/DESIGN.md; table ALLOWED in tests/test_layering.py)")
    return out


def _allowed(name: str, allowed: set[str]) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


def _files(sub: str) -> list[pathlib.Path]:
    return sorted((SRC / sub).rglob("*.py"))


ALL_FILES = sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.relative_to(SRC).as_posix())
def test_imports_follow_the_layering(path):
    relpath = path.relative_to(SRC).as_posix()
    assert _violations(path.read_text(encoding="utf-8"), relpath) == []


def test_the_allowed_table_has_no_cycle():
    graph = {u: {t for t in ALLOWED[u] if t in ALLOWED and t != u} for u in ALLOWED}
    for unit, target in [*BY_NAME, *TOLERATED]:
        graph[unit].add(target)
    state: dict[str, int] = {}

    def visit(u: str, path: list[str]) -> None:
        if state.get(u) == 1:
            raise AssertionError(f"cycle in ALLOWED: {' -> '.join(path + [u])}")
        if state.get(u) == 2:
            return
        state[u] = 1
        for t in sorted(graph[u]):
            visit(t, path + [u])
        state[u] = 2

    for u in sorted(graph):
        visit(u, [])


def test_tolerated_edges_are_still_there():
    found = {
        (_unit_of_file(p.relative_to(SRC).as_posix()), _unit_of_name(e.name))
        for p in ALL_FILES for e in _edges_in(p.read_text(encoding="utf-8"), p.relative_to(SRC).as_posix())
    }
    stale = [edge for edge in TOLERATED if edge not in found]
    assert not stale, f"{stale} no longer occur: delete them from TOLERATED so they cannot come back"


def test_every_dynamic_import_site_still_exists():
    sites = {
        (p.relative_to(SRC).as_posix(), e.func)
        for p in ALL_FILES for e in _edges_in(p.read_text(encoding="utf-8"), p.relative_to(SRC).as_posix())
        if e.kind == "dynamic"
    }
    assert set(DYNAMIC_IMPORTS) <= sites, f"stale DYNAMIC_IMPORTS entries: {set(DYNAMIC_IMPORTS) - sites}"


def test_nothing_imports_the_demo_package_statically():
    offenders = [
        f"{p.relative_to(SRC)}:{e.line}"
        for p in ALL_FILES if _unit_of_file(p.relative_to(SRC).as_posix()) != "builtin"
        for e in _edges_in(p.read_text(encoding="utf-8"), p.relative_to(SRC).as_posix())
        if e.kind == "import" and _unit_of_name(e.name) == "builtin"
    ]
    assert offenders == []



def test_importing_the_library_loads_no_demo_code():
    """At run time too: the trainer, the CLI and the config import nothing of grouprl.builtin until a
    ``builtin:`` model is asked for."""
    import subprocess
    import sys

    code = ("import sys, grouprl.train, grouprl.config, grouprl.cli; grouprl.cli.build_parser(); "
            "print(sorted(m for m in sys.modules if m.startswith(('grouprl.builtin', 'grouprl.tiny', "
            "'grouprl.warmstart')) and m != 'grouprl.builtins'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"

# --- the checker itself, on made-up sources -----------------------------------------------------------


@pytest.mark.parametrize(
    "relpath, source, expected",
    [
        ("algo/losses.py", "from grouprl.train import loop\n", "algo imports 'grouprl.train'"),
        ("algo/losses.py", "from ..config import GRPOConfig\n", "algo imports 'grouprl.config'"),
        ("rewards/x.py", "def f():\n    import torch\n", "rewards must not import 'torch'"),
        ("rewards/x.py", "import importlib\nimportlib.import_module('torch.nn')\n", "must not import 'torch'"),
        ("data/x.py", "import importlib\nm = importlib.import_module('grouprl.train.algorithms.grpo')\n",
         "data names (import_module) 'grouprl.train.algorithms.grpo'"),
        ("data/x.py", "from importlib import import_module\ndef g(n):\n    return import_module(n)\n",
         "non-literal import_module() in g"),
        ("sandbox/x.py", "def g(n):\n    return __import__(n)\n", "non-literal __import__() in g"),
        ("rollout/x.py", "PLUGINS = {'a': 'grouprl.train.algorithms.grpo:run'}\n", "rollout names (string) 'grouprl.train.algorithms.grpo'"),
        ("envs/x.py", "from grouprl.rollout import make_backend\n", "envs imports 'grouprl.rollout'"),
        ("sandbox/x.py", "from grouprl import rewards\n", "sandbox imports 'grouprl.rewards'"),
        ("train/algorithms/grpo.py", "from grouprl.builtin import model_path\n", "train imports 'grouprl.builtin'"),
        ("train/algorithms/grpo.py", "import importlib\nimportlib.import_module('grouprl.builtin')\n",
         "train names (import_module) 'grouprl.builtin'"),
        ("models.py", "def resolve_model_path(n):\n    from grouprl.builtin import model_path\n",
         "models imports 'grouprl.builtin'"),
        ("serve/x.py", "from grouprl.train.engine.model import load_model\n", "serve imports 'grouprl.train"),
        ("config.py", "from grouprl.sandbox import config\n", "config imports 'grouprl.sandbox'"),
        ("config/presets.py", "import torch\n", "config must not import 'torch'"),
        ("config/__init__.py", "from ..train import loop\n", "config imports 'grouprl.train'"),
        ("newpkg/x.py", "import os\n", "unit 'newpkg' has no row in ALLOWED"),
    ],
)
def test_checker_flags_a_bad_import(relpath, source, expected):
    found = _violations(source, relpath, tolerate=False)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize(
    "relpath, source",
    [
        ("models.py", "def resolve_model_path(n):\n    from importlib import import_module\n"
                      "    return import_module('grouprl.builtin').model_path(n)\n"),
        ("registry.py", "import importlib\nclass Registry:\n    def resolve(self, s):\n"
                        "        return importlib.import_module(s)\n"),
        ("rollout/x.py", "from grouprl.envs import calculator\nfrom ..rewards.tool_call import parse\n"),
        ("rewards/code.py", "from grouprl.sandbox import run_tests\nfrom ._text import strip\n"),
        ("config/__init__.py", "from .fields import X\nfrom grouprl.errors import ConfigError\n"
                               "def validate():\n    from grouprl.builtins import load_builtins\n"),
        ("cli.py", "from grouprl import __version__\n"),
        ("data/x.py", '"""Docstring naming grouprl.train.algorithms.grpo is prose, not an import."""\n'),
    ],
)
def test_checker_accepts_an_allowed_import(relpath, source):
    assert _violations(source, relpath, tolerate=False) == []


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
        "grouprl.algo.ops", "grouprl.algo.ops.masked_mean", "grouprl.config", "os.path", "json", "subprocess",
    ]
    assert [n for n in names if not _allowed(n, ALGO_ALLOWED)] == names[2:]


# --- per-package rules on third-party modules and calls ---------------------------------------------------


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


# --- declared dependencies (pyproject.toml) match what src/grouprl imports --------------------------------

# top-level import name -> the distribution that brings it, where the names differ
IMPORT_TO_DIST = {"yaml": "pyyaml", "huggingface_hub": "huggingface-hub", "math_verify": "math-verify",
                  "pandas": "datasets",  # datasets depends on pandas; only the CSV loader uses it directly
                  "openenv": "openenv-core"}
USED_WITHOUT_IMPORT = {"tensorboard": "torch.utils.tensorboard.SummaryWriter (train/metrics.py) needs it"}


def _declared() -> dict[str, set[str]]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))["project"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}

    return {"": names(project["dependencies"]),
            **{extra: names(reqs) for extra, reqs in project["optional-dependencies"].items()}}


def _third_party_imports() -> set[str]:
    import sys

    tops = {e.name.split(".")[0] for p in ALL_FILES
            for e in _edges_in(p.read_text(encoding="utf-8"), p.relative_to(SRC).as_posix()) if e.kind != "dynamic"}
    return {t for t in tops if t != ROOT and t not in sys.stdlib_module_names}


def test_every_imported_distribution_is_declared():
    declared = _declared()
    everything = set().union(*declared.values())
    missing = {t for t in _third_party_imports() if IMPORT_TO_DIST.get(t, t).replace("_", "-") not in everything}
    assert not missing, f"src/grouprl imports {sorted(missing)} but pyproject.toml does not declare them"


def test_every_runtime_dependency_is_used():
    used = {IMPORT_TO_DIST.get(t, t).replace("_", "-") for t in _third_party_imports()} | set(USED_WITHOUT_IMPORT)
    unused = _declared()[""] - used
    assert not unused, f"pyproject.toml requires {sorted(unused)}, which src/grouprl never imports: drop them"


def test_the_vllm_extra_serves_the_vllm_backend():
    from grouprl.rollout import BACKENDS

    assert "vllm" in _declared() and "vllm" in BACKENDS, "the vllm extra exists only with a vLLM rollout backend"


# --- no import cycle between files (docs/DESIGN.md: imports flow one way, lazy imports included) ----------


def _module_of(relpath: str) -> str:
    parts = ("grouprl", *pathlib.PurePosixPath(relpath).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _file_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules of ``sources`` (relpath -> text) it imports, anywhere in the file (inside
    functions too, by ``import_module`` with a literal, or as a ``"grouprl.x:fn"`` string). ``from pkg import
    mod`` is an edge to ``pkg.mod`` only; ``from pkg import name`` (not a module) an edge to ``pkg``."""
    modules = {_module_of(r) for r in sources}

    def target(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for relpath, source in sources.items():
        me, by_line, out = _module_of(relpath), {}, set()
        for e in _edges_in(source, relpath):
            if e.kind == "string" and e.name in modules and e.name != me and ":" in _string_at(source, e.line):
                out.add(e.name)  # 'grouprl.x:fn' in a plug-in table; a logger name or an old path imports nothing
            elif e.kind in ("import", "import_module") and e.name.startswith(ROOT + "."):
                by_line.setdefault(e.line, []).append(e.name)
        for names in by_line.values():
            for n in names:
                if any(x != n and x.startswith(n + ".") and x in modules for x in names):
                    continue  # the package part of 'from pkg import mod'
                t = target(n)
                if t is not None and t != me:
                    out.add(t)
        graph[me] = out
    return graph


def _string_at(source: str, line: int) -> str:
    return source.splitlines()[line - 1] if line else ""


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _all_sources() -> dict[str, str]:
    return {p.relative_to(SRC).as_posix(): p.read_text(encoding="utf-8") for p in ALL_FILES}


def test_no_import_cycle_between_files():
    cycles = _cycles(_file_graph(_all_sources()))
    assert cycles == [], "import cycles between files (lazy imports count): " + "; ".join(
        " <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("sources, cycle", [
    ({"a/x.py": "from grouprl.a.y import f\n", "a/y.py": "def f():\n    from grouprl.a import x\n"},
     ["grouprl.a.x", "grouprl.a.y"]),
    ({"a/x.py": "import importlib\nm = importlib.import_module('grouprl.b.z')\n", "b/z.py": "from grouprl.c import w\n",
      "c/w.py": "PLUGIN = 'grouprl.a.x:run'\n"}, ["grouprl.a.x", "grouprl.b.z", "grouprl.c.w"]),
    ({"a/__init__.py": "from grouprl.a.x import f\n", "a/x.py": "from grouprl.a import helper\n"},
     ["grouprl.a", "grouprl.a.x"]),
])
def test_the_cycle_check_finds_a_made_up_cycle(sources, cycle):
    assert _cycles(_file_graph(sources)) == [cycle]


def test_the_cycle_check_ignores_a_one_way_chain():
    sources = {"a/__init__.py": "from grouprl.a.x import f\n", "a/x.py": "from grouprl.a import y\n", "a/y.py": ""}
    assert _cycles(_file_graph(sources)) == []


def test_the_run_lifecycle_imports_no_torch():
    """run/ (lock, output dir, resume table, signals, report refresh, reward watch, start-up checks) is
    torch-free at run time too (docs/DESIGN.md, "Layout"): ``grouprl train --dry-run`` decides a run's folder
    without loading torch for it."""
    import subprocess
    import sys

    mods = [f"grouprl.run.{p.stem}" for p in _files("run") if p.stem != "__init__"]
    code = f"import sys; import {', '.join(mods)}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
