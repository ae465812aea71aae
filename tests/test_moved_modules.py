"""Old module paths (``sparsity_lab.dyad``, ``sparsity_lab.backends.cusparselt_backend``, ...) still
import, warn with the new path, and give the very module at the new path."""
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sparsity_lab  # noqa: F401  (installs the finder for the old paths)
from sparsity_lab._moved import MOVED


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_old_path_warns_naming_the_new_one_and_gives_that_module(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {new}")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_from_import_of_an_old_path_gives_the_same_objects():
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    from sparsity_lab.dyad import DyadLinear\nexcept DeprecationWarning as w:\n    print(w)\n"
            "import warnings; warnings.simplefilter('ignore', DeprecationWarning)\n"
            "from sparsity_lab.dyad import DyadLinear\n"
            "from sparsity_lab.structures.dyad import DyadLinear as New\n"
            "print(DyadLinear is New)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "sparsity_lab.dyad moved to sparsity_lab.structures.dyad; import it from there (the old path will be removed)",
        "True"]


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_nothing_is_left_at_the_old_file_and_the_new_one_exists(old, new):
    assert importlib.util.find_spec(new).origin.endswith(new.replace(".", "/") + ".py")
    package, _, name = old.rpartition(".")
    leftover = [folder for folder in importlib.import_module(package).__path__ if (Path(folder) / f"{name}.py").exists()]
    assert not leftover, f"{old} still has a file in {leftover}: the finder would never be asked"


def test_an_unknown_path_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("sparsity_lab.no_such_module")
