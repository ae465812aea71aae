"""Module paths that moved, kept importable with a ``DeprecationWarning`` that names the new path.

``import sparsity_lab.dyad`` (or ``from sparsity_lab.dyad import DyadLinear``) still works and gives
the module at its new path (the very same module object, so classes and functions are identical).
One table instead of a stub file per old path: nothing stays behind at the old file names.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old module path -> new module path
MOVED = {
    "sparsity_lab.fp8": "sparsity_lab.references.fp8",
    "sparsity_lab.gated": "sparsity_lab.references.gated",
    "sparsity_lab.dyad": "sparsity_lab.structures.dyad",
    "sparsity_lab.prune_regrow": "sparsity_lab.structures.prune_regrow",
    "sparsity_lab.backends.cusparselt_backend": "sparsity_lab.backends.cusparselt.backend",
    "sparsity_lab.integrations.architectures": "sparsity_lab.architectures",
    "sparsity_lab.integrations.conv1d": "sparsity_lab.conv1d",
    "sparsity_lab.course_command": "sparsity_lab.course.command",
    "sparsity_lab.course_workdir": "sparsity_lab.course.workdir",
    "sparsity_lab.widget_snapshot": "sparsity_lab.course.widget_snapshot",
    "sparsity_lab.book_page": "sparsity_lab.course.book_page",
}


class _MovedModuleLoader(importlib.abc.Loader):
    def __init__(self, new_name: str) -> None:
        self.new_name = new_name

    def create_module(self, spec):
        return None  # a plain module object; exec_module swaps the real one in

    def exec_module(self, module) -> None:
        warnings.warn(f"{module.__name__} moved to {self.new_name}; import it from there "
                      f"(the old path will be removed)", DeprecationWarning, stacklevel=2)
        # the import system returns what sys.modules holds once this returns: the module at its new path
        sys.modules[module.__name__] = importlib.import_module(self.new_name)


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers only for the old paths of MOVED (asked last, after the real finders found nothing)."""

    def find_spec(self, fullname, path=None, target=None):
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedModuleLoader(new_name))


def install() -> None:
    """Add the finder to ``sys.meta_path`` once (``import sparsity_lab`` calls this)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
