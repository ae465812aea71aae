"""The notebooks as tests: committed clean, executed by papermill at CI sizes, checked by nbval."""
import subprocess
import sys

import pytest

pytest.importorskip("papermill", reason="papermill is in the test extra")
import nbformat  # noqa: E402
from _notebooks import REFERENCE, ROOT, code_sources, has_outputs  # noqa: E402

from sparsity_lab.course import ci_parameters, execute, notebooks  # noqa: E402

NOTEBOOKS = notebooks()


def test_the_course_has_notebooks():
    assert NOTEBOOKS, "no notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_a_parameters_cell_and_ci_sizes(path):
    """papermill injects the CI sizes (kept in the notebook's metadata) into its `parameters` cell."""
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name} needs exactly one cell tagged 'parameters'"
    params = ci_parameters(path)
    assert params, f"{path.name}: empty ci_parameters"
    for name in params:
        assert f"{name} =" in tagged[0].source, f"{path.name}: CI parameter {name!r} is not in its parameters cell"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    assert not has_outputs(path), f"{path.name} carries outputs: clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_runs_with_papermill_at_ci_sizes(path, tmp_path):
    execute(path, tmp_path / path.name, sizes="ci")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbval_reference_has_the_notebooks_cells(path):
    reference = REFERENCE / path.name
    assert reference.exists(), f"missing {reference}: run python tests/_notebooks.py"
    assert code_sources(reference) == code_sources(path), \
        f"{reference.name} is out of date: run python tests/_notebooks.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbval_lax_checks_the_key_printed_facts(path):
    """pytest --nbval-lax fails on any cell error and on a changed output of a # NBVAL_CHECK_OUTPUT cell."""
    pytest.importorskip("nbval", reason="nbval is in the test extra")
    out = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider",
                          str(REFERENCE / path.name)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout
