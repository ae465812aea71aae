"""The notebooks as tests: committed clean, executed by papermill at CI sizes, checked by nbval."""
import subprocess
import sys

import pytest

pytest.importorskip("papermill", reason="papermill is in the test extra")
import papermill  # noqa: E402
from _notebooks import REFERENCE, ROOT, code_sources, has_outputs, notebooks  # noqa: E402

# small sizes injected into each notebook's `parameters` cell for the CPU run
CI_PARAMETERS = {
    "10_dyad.ipynb": {"width": 16},
    "11_prune_and_regrow.ipynb": {"width": 32, "steps": 20, "update_every": 5},
}
NOTEBOOKS = notebooks()


def test_every_notebook_has_ci_parameters():
    assert NOTEBOOKS, "no notebooks found"
    assert {p.name for p in NOTEBOOKS} == set(CI_PARAMETERS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    assert not has_outputs(path), f"{path.name} carries outputs: clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_runs_with_papermill_at_ci_sizes(path, tmp_path):
    papermill.execute_notebook(str(path), str(tmp_path / path.name), parameters=CI_PARAMETERS[path.name],
                               kernel_name="python3", cwd=str(ROOT), progress_bar=False)


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
