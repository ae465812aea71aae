"""The layout's import rules (docs/architecture.md, "Import rules"), checked on the source.

Granularity: cycles are checked between modules, because a module is what Python imports (and
what a cycle leaves half-initialised), function-level imports included. The rules that say which
part may use which are stated between components: a subpackage or a top-level module of
``sparsity_lab``, and the kernels (``kernels/``, imported as ``sparsity_lab.kernels``).
The checker itself is tested on small synthetic packages below.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from _import_graph import (Rule, component_edges, cycles, import_graph, loaded_on_import, module_edges,
                           violations)

ROOT = Path(__file__).resolve().parents[1]
ROOTS = {"sparsity_lab": ROOT / "sparsity_lab", "sparsity_lab.kernels": ROOT / "kernels"}
STDLIB = tuple(sorted(sys.stdlib_module_names))

COURSE = ("sparsity_lab.course", "sparsity_lab.course.*")  # running the notebooks, building the book
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
    Rule("sparsity_lab.viz*", scope="sparsity_lab*", forbidden=("sparsity_lab.benchmarks*", "sparsity_lab.kernels*"),
         why="viz draws figures and widgets; measuring code lives in benchmarks/"),
    Rule("sparsity_lab.*", scope="sparsity_lab*", forbidden=COURSE, exempt=COURSE,
         why="nothing in the library depends on building the course"),
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
