"""Where the shipped files are found (sparsity_lab.shipped) and which commit provenance names, in a
checkout and outside one (an installed wheel: tests/test_wheel.py runs the real thing)."""
from pathlib import Path

from sparsity_lab import provenance, shipped

ROOT = Path(__file__).resolve().parent.parent


def test_in_this_checkout_the_repository_folders_are_used():
    assert shipped.source_checkout() == ROOT and shipped.installed_from() == "checkout"
    assert shipped.NOTEBOOK_DIR == ROOT / "notebooks" and provenance.RESULTS_DIR == ROOT / "results"
    assert shipped.DOCS_DIR == ROOT / "docs" and shipped.BOOK_CONFIG_DIR == ROOT / "book"


def test_outside_a_checkout_git_is_not_asked(monkeypatch):
    """An installed package may sit in a venv inside some other git repository: its HEAD is not ours."""
    monkeypatch.setattr(provenance, "source_checkout", lambda: None)
    real_run = provenance.subprocess.run

    def no_git(cmd, *args, **kwargs):
        assert cmd[0] != "git", f"git ran: {cmd}"
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(provenance.subprocess, "run", no_git)
    monkeypatch.setattr(provenance, "build_commit", lambda: None)
    assert provenance._git_commit() == "unknown"
    monkeypatch.setattr(provenance, "build_commit", lambda: "abc123")
    assert provenance._git_commit() == "abc123"
    monkeypatch.setenv("SPARSITY_LAB_COMMIT", "from-the-environment")
    assert provenance.provenance()["git_commit"] == "from-the-environment"


def test_write_result_defaults_to_results_under_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = provenance.write_result("probe", {"x": 1})
    assert path == Path("results") / "probe.json" and (tmp_path / "results" / "probe.json").is_file()
    assert provenance.read_result("probe", directory=tmp_path / "results")["x"] == 1


def test_only_shipped_py_finds_files_through_its_own_location():
    """A module that builds paths from its own ``__file__`` reads or writes beside the installed
    package; shipped.py is the one place that looks there (for the shipped copies, read-only)."""
    import re

    own_file = re.compile(r"(?<![\w.])__file__")
    offenders = [str(p.relative_to(ROOT)) for folder in (ROOT / "sparsity_lab", ROOT / "kernels")
                 for p in folder.rglob("*.py") if p.name != "shipped.py" and "_shipped" not in p.parts
                 and own_file.search(p.read_text())]
    assert not offenders, f"modules that locate files from their own __file__ (use sparsity_lab.shipped): {offenders}"
