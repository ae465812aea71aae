"""The package's import graph, read from the source (``ast``, nothing is imported), and the checks
that keep its architecture: no import cycles, no import against the layering (docs/architecture.md).

A node is a module by its dotted name (a package is its ``__init__``). An edge is an import
statement anywhere in the module, at the top or inside a function (a deferred import hides a
cycle from Python's import order, not from a reader), or a literal ``importlib.import_module("...")``.
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""
from __future__ import annotations

import ast
import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    target: str  # the imported module (or the nearest known package of a name)
    line: int
    top_level: bool  # executed when the module is imported (not inside a function)


def module_files(roots: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """{dotted name: (file, is_package)} for every .py file under each root (root package -> folder)."""
    found = {}
    for package, folder in roots.items():
        for path in sorted(Path(folder).rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found[".".join([package, *parts])] = (path, is_package)
    return found


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, int, bool]]:
    """(dotted target as written, line, top level) of every import in the tree."""
    found = []

    def visit(node: ast.AST, top_level: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno, top_level) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node)
            found.extend((f"{base}.{alias.name}" if alias.name != "*" else base, node.lineno, top_level)
                         for alias in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and not node.args[0].value.startswith(".")):
            found.append((node.args[0].value, node.lineno, top_level))
        inside = top_level and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, True)
    return found


def import_graph(roots: dict[str, Path]) -> dict[str, list[Import]]:
    """{module: imports}. Targets inside the roots are resolved to a known module (``pkg.name`` ->
    ``pkg`` when name is not a module); other targets are kept as written (``torch.nn``, ``os``)."""
    files = module_files(roots)
    graph = {}
    for module, (path, is_package) in files.items():
        edges = []
        for target, line, top_level in _imports(ast.parse(path.read_text(), str(path)), module, is_package):
            if any(target == root or target.startswith(root + ".") for root in roots):
                while target not in files and "." in target:
                    target = target.rpartition(".")[0]
            if target != module:
                edges.append(Import(target, line, top_level))
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (each sorted), sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def strong(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                strong(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def module_edges(graph: dict[str, list[Import]]) -> dict[str, set[str]]:
    """Edges between the graph's own modules."""
    return {m: {i.target for i in imports if i.target in graph} for m, imports in graph.items()}


def component(module: str, root: str) -> str:
    """The architecture's unit: ``root.x`` for anything in subpackage or module x of root, else the module
    itself (``sparsity_lab.backends.cusparselt.ops`` -> ``sparsity_lab.backends``)."""
    if module == root or not module.startswith(root + "."):
        return module
    return ".".join(module.split(".")[:len(root.split(".")) + 1])


def component_edges(graph: dict[str, list[Import]], root: str, separate: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """Edges between components (the root package's own ``__init__`` left out: it only re-exports).
    ``separate``: modules that are components of their own (a root living elsewhere, e.g. the kernels)."""
    def unit(m: str) -> str:
        return next((s for s in separate if m == s or m.startswith(s + ".")), None) or component(m, root)

    edges: dict[str, set[str]] = {}
    for module, targets in module_edges(graph).items():
        if module == root:
            continue
        edges.setdefault(unit(module), set()).update(unit(t) for t in targets if unit(t) != unit(module))
    return edges


@dataclass(frozen=True)
class Rule:
    """Modules matching ``importer`` may import, within ``scope``, only modules matching ``allowed``
    (or, when ``forbidden`` is given, anything but those). Patterns are fnmatch globs on dotted names."""

    importer: str
    why: str
    allowed: tuple[str, ...] = ()
    forbidden: tuple[str, ...] = ()
    scope: str = "*"  # which targets the rule speaks about (e.g. "sparsity_lab*": the package's own)
    exempt: tuple[str, ...] = ()  # importers matching ``importer`` that the rule does not cover


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def violations(graph: dict[str, list[Import]], rules: list[Rule]) -> list[str]:
    """One line per import that breaks a rule: ``module:line imports target (why)``."""
    found = []
    for module, imports in sorted(graph.items()):
        for rule in rules:
            if not fnmatch.fnmatchcase(module, rule.importer) or _matches(module, rule.exempt):
                continue
            for imp in imports:
                if not fnmatch.fnmatchcase(imp.target, rule.scope):
                    continue
                bad = _matches(imp.target, rule.forbidden) if rule.forbidden else not _matches(imp.target, rule.allowed)
                line = f"{module}:{imp.line} imports {imp.target} ({rule.why})"
                if bad and line not in found:
                    found.append(line)
    return found


def loaded_on_import(graph: dict[str, list[Import]], start: str) -> set[str]:
    """Every module that importing ``start`` executes: top-level imports followed transitively (outside
    modules are included as written, not followed). Parent packages run too: ``a.b`` brings ``a``."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:k]) for k in range(1, len(parts)) if ".".join(parts[:k]) in graph)
        todo.extend(i.target for i in graph.get(module, ()) if i.top_level)
    return seen
