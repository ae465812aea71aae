"""The layout's import rules (docs/architecture.md, "Import rules"), checked on the source.

Granularity: cycles are checked between modules, because a module is what Python imports (and
what a cycle leaves half-initialised), function-level imports included. The rules that say which
part may use which are stated between components: a subpackage or a top-level module of
``sparsity_lab``, and the kernels (``kernels/``, imported as ``sparsity_lab.kernels``).
The checker itself is tested on small synthetic packages below.
"""
from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import pytest

from _import_graph import (Rule, component_edges, cycles, import_graph, loaded_on_import, module_edges,
                           violations)

ROOT = Path(__file__).resolve().parents[1]
ROOTS = {"sparsity_lab": ROOT / "sparsity_lab", "sparsity_lab.kernels": ROOT / "kernels"}
STDLIB = tuple(sorted(sys.stdlib_module_names))

# the applications: the lab (GPT, trainer, CLI) and the course (runner, book, figures, exercises). They
# import the library; the library never imports them, nor the benchmarks (top-level benchmarks/, a clone's)
APPS = ("sparsity_lab.lab", "sparsity_lab.lab.*", "sparsity_lab.course", "sparsity_lab.course.*",
        "sparsity_lab.__main__")
BENCHMARKS = ("benchmarks", "benchmarks.*")
RULES = [
    Rule("sparsity_lab.kernels*", scope="sparsity_lab*", allowed=("sparsity_lab.kernels*", "sparsity_lab.references*"),
         why="a kernel imports from the package only its plain-PyTorch references"),
    Rule("sparsity_lab.references*", allowed=("sparsity_lab.references*", "torch", "torch.*", "__future__",
                                              *STDLIB, *(f"{m}.*" for m in STDLIB)),
         why="a reference imports only torch and the standard library"),
    Rule("sparsity_lab.backends*", scope="sparsity_lab*",
         allowed=("sparsity_lab.backends*", "sparsity_lab.kernels*", "sparsity_lab.references*", "sparsity_lab.masks*",
                  "sparsity_lab.methods*", "sparsity_lab.validation"),
         why="a backend sits on the masks, methods, references and kernels, never on the layers above it"),
    Rule("sparsity_lab*", forbidden=(*APPS, *BENCHMARKS), exempt=APPS,
         why="the library never imports its applications (the lab, the course) or the benchmarks"),
    Rule("sparsity_lab.lab*", forbidden=("sparsity_lab.course*", *BENCHMARKS),
         why="the lab application stands on the library alone"),
    Rule("sparsity_lab.course*", forbidden=BENCHMARKS,
         why="the course runs from a wheel, which holds no benchmarks"),
    Rule("sparsity_lab.course.viz*", scope="sparsity_lab*", forbidden=("sparsity_lab.kernels*",),
         why="viz draws figures and widgets; it measures nothing"),
]
@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOTS)


def test_the_graph_sees_every_module_and_the_deferred_imports(graph):
    assert {"sparsity_lab", "sparsity_lab.layers", "sparsity_lab.kernels", "sparsity_lab.kernels.mvue24",
            "sparsity_lab.backends.cusparselt.backend", "sparsity_lab.references.fp8"} <= set(graph)
    # backends/__init__.py imports the triton backend inside a function
    deferred = {i.target for i in graph["sparsity_lab.backends"] if not i.top_level}
    assert "sparsity_lab.backends.triton" in deferred


def test_no_import_breaks_a_rule(graph):
    found = violations(graph, RULES)
    assert not found, "imports against the layering (docs/architecture.md):\n" + "\n".join(found)


def test_no_import_cycle_between_modules(graph):
    found = cycles(module_edges(graph))
    assert found == [], f"module import cycles: {found}"


def test_no_import_cycle_between_components(graph):
    found = cycles(component_edges(graph, "sparsity_lab", separate=("sparsity_lab.kernels",)))
    assert found == [], f"component import cycles: {found}"


def test_importing_the_package_loads_no_triton_plotly_or_widgets(graph):
    loaded = loaded_on_import(graph, "sparsity_lab")
    heavy = sorted(m for m in loaded if m.split(".")[0] in ("triton", "plotly", "ipywidgets", "anywidget"))
    assert heavy == []
    assert "sparsity_lab.layers" in loaded and "sparsity_lab.kernels" not in loaded


# --- the checker on synthetic packages ------------------------------------------------------------
def _graph(tmp_path: Path, files: dict[str, str]) -> dict:
    """The import graph of a package ``pkg`` made of ``files`` ({path in pkg: source})."""
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return import_graph({"pkg": tmp_path / "pkg"})


def test_checker_finds_a_cycle_through_a_function_level_import(tmp_path):
    graph = _graph(tmp_path, {
        "__init__.py": "from .a import f\n",
        "a.py": "from .b import g\ndef f():\n    return g()\n",
        "b.py": "def g():\n    from .a import f  # deferred: Python never notices\n    return f\n",
        "c.py": "from . import a\n",
    })
    assert cycles(module_edges(graph)) == [["pkg.a", "pkg.b"]]
    assert [i.top_level for i in graph["pkg.b"]] == [False]


def test_checker_finds_a_cycle_between_packages_without_one_between_modules(tmp_path):
    graph = _graph(tmp_path, {
        "__init__.py": "", "low/__init__.py": "", "high/__init__.py": "",
        "low/x.py": "from ..high.y import helper\n",
        "high/y.py": "def helper():\n    return 1\n",
        "high/z.py": "from ..low import x\n",
    })
    assert cycles(module_edges(graph)) == []
    assert cycles(component_edges(graph, "pkg")) == [["pkg.high", "pkg.low"]]


def test_checker_flags_an_upward_import_with_its_line(tmp_path):
    graph = _graph(tmp_path, {
        "__init__.py": "", "backends/__init__.py": "", "layers.py": "X = 1\n",
        "backends/base.py": "import torch\n\ndef build():\n    from ..layers import X\n    return X\n",
        "references.py": "import os\nimport numpy\n",
    })
    rules = [Rule("pkg.backends*", scope="pkg*", allowed=("pkg.backends*",), why="downward only"),
             Rule("pkg.references", allowed=("os", "torch*"), why="torch and stdlib")]
    assert violations(graph, rules) == ["pkg.backends.base:4 imports pkg.layers (downward only)",
                                        "pkg.references:2 imports numpy (torch and stdlib)"]


def test_checker_resolves_names_modules_and_literal_import_module(tmp_path):
    graph = _graph(tmp_path, {
        "__init__.py": "from . import sub\nfrom .sub import thing\n",
        "sub/__init__.py": "thing = 1\n",
        "sub/deep.py": "import importlib\nM = importlib.import_module('pkg.other')\n",
        "other.py": "",
    })
    assert {i.target for i in graph["pkg"]} == {"pkg.sub"}
    assert "pkg.other" in {i.target for i in graph["pkg.sub.deep"]}


def test_checker_lists_what_an_import_loads(tmp_path):
    graph = _graph(tmp_path, {
        "__init__.py": "from .light import f\n",
        "light.py": "import math\ndef f():\n    import plotly\n",
        "heavy.py": "import triton\n",
    })
    loaded = loaded_on_import(graph, "pkg")
    assert loaded == {"pkg", "pkg.light", "math"}  # plotly only when f runs, heavy never


def _top_level_names(path: Path) -> set[str] | None:
    """Names a module defines or imports at its top level; None when it has a module ``__getattr__``."""
    import ast
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):  # names bound under a guard count too
            names.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
            names.update((a.asname or a.name).split(".")[0] for n in ast.walk(node)
                         if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names)
            names.update(n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
    return names


def unresolved_imports(roots: dict[str, Path]) -> list[str]:
    """Every ``from <package module> import name`` (function-level ones included, which only fail when
    the function runs) whose module is not a file of the package, or whose name is neither a submodule
    nor bound at the module's top level."""
    import ast
    from _import_graph import _absolute, module_files
    files = module_files(roots)
    missing = []
    for module, (path, is_package) in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _absolute(module, is_package, node)
            if not any(base == r or base.startswith(r + ".") for r in roots):
                continue
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}"
            if base not in files:
                missing.append(f"{where}: no module {base}")
                continue
            defined = _top_level_names(files[base][0])
            for alias in node.names:
                if alias.name != "*" and f"{base}.{alias.name}" not in files and defined is not None \
                        and alias.name not in defined:
                    missing.append(f"{where}: {base} has no {alias.name}")
    return missing


def test_every_import_inside_the_package_resolves():
    """A function-level import of a moved module fails only when the function runs (on a GPU, in a
    benchmark); this finds it on the source."""
    found = unresolved_imports(ROOTS)
    assert not found, "imports that would fail:\n" + "\n".join(found)


def test_checker_finds_an_import_of_a_module_that_moved(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "sub/__init__.py", "sub/new.py"):
        (pkg / f).write_text("X = 1\n")
    (pkg / "user.py").write_text("def f():\n    from .old import X\n    from .sub.new import X, Y\n    from .sub import new\n")
    found = unresolved_imports({"pkg": pkg})
    assert len(found) == 2 and "no module pkg.old" in found[0] and "has no Y" in found[1]


def imports_through_the_root(roots: dict[str, Path], root: str = "sparsity_lab") -> list[str]:
    """``from ... import kernels`` inside the package: the import names the root package (whose
    ``__init__`` imports the layers) instead of the module it wants. Python resolves it, but a reader
    of the imports, and any tool that draws them, sees the backend depend on the whole package."""
    from _import_graph import module_files
    found = []
    for module, (path, is_package) in module_files(roots).items():
        if module == root:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                if ".".join(base + ([node.module] if node.module else [])) == root:
                    found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}")
    return found


def test_no_module_imports_a_sibling_through_the_package_root():
    found = imports_through_the_root(ROOTS)
    assert not found, ("import the module by its own path (import sparsity_lab.kernels as kernels), "
                       "not through the package root:\n" + "\n".join(found))


def test_checker_finds_an_import_through_the_root(tmp_path):
    pkg = tmp_path / "sparsity_lab"
    (pkg / "backends").mkdir(parents=True)
    for f in ("__init__.py", "backends/__init__.py", "kernels.py"):
        (pkg / f).write_text("X = 1\n")
    (pkg / "backends" / "use.py").write_text("def f():\n    from .. import kernels\n    from ..kernels import X\n")
    found = imports_through_the_root({"sparsity_lab": pkg})
    assert len(found) == 1 and found[0].endswith("use.py:2")
