"""The library as a user gets it from a wheel, not from this checkout.

The wheel is built from a copy of the build inputs (nothing lands in the checkout), then:
- it holds every module of ``sparsity_lab/`` and ``kernels/`` and the course material
  (notebooks, docs, book configuration, recorded results);
- installed into a fresh virtual environment and run from an empty folder, the ``sparsity_lab``
  imported is the wheel's (never the editable install of the checkout), ``demo`` runs, a recorded
  demo writes its result under the current folder with the commit the wheel was built from, one course
  notebook runs headless through ``sparsity-lab course`` from the shipped copy, and nothing is written
  into the installed package.
"""
import fnmatch
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# what setup.py and pyproject.toml read to build the wheel
BUILD_INPUTS = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "sparsity_lab", "kernels",
                "notebooks", "docs", "book", "results"]
# build outputs and caches of a working checkout, never build inputs
NOT_INPUTS = shutil.ignore_patterns("__pycache__", "*.pyc", "_build", "_shipped", ".ipynb_checkpoints")
COMMIT = "0123abc-wheel-test"  # what the build records as its commit (SPARSITY_LAB_COMMIT)
NOTEBOOK = "02"                # a short notebook (about 20 s at CI sizes) that reads recorded results


def _clean_env(**extra) -> dict:
    """The environment without what would put the checkout on sys.path or pick another venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra)
    return env


def _run(cmd, cwd: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, \
        f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if importlib.util.find_spec("setuptools") is None:
        pytest.fail("building the wheel needs setuptools, which the test extra installs: pip install -e '.[test]'")
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=NOT_INPUTS)
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source],
         cwd=source, env=_clean_env(SPARSITY_LAB_COMMIT=COMMIT), timeout=300)
    (found,) = out.glob("sparsity_lab-*.whl")
    return found


def _source_modules() -> set[str]:
    """Every .py file of the package's source, as its path inside the wheel."""
    found = set()
    for folder, inside in ((ROOT / "sparsity_lab", "sparsity_lab"), (ROOT / "kernels", "sparsity_lab/kernels")):
        found |= {f"{inside}/{p.relative_to(folder).as_posix()}" for p in folder.rglob("*.py")}
    return {f for f in found if "__pycache__" not in f and "/_shipped/" not in f}


def test_the_wheel_holds_every_module_of_the_source_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_source_modules() - names)
    assert not missing, ("modules of the source tree missing from the wheel (a package folder without "
                         f"__init__.py, or not found by setup.py?): {missing}")
    assert "sparsity_lab/kernels/__init__.py" in names and "sparsity_lab/course/command.py" in names


def _results_the_notebooks_read() -> set[str]:
    """results/ paths the notebooks name: ``read_result("X")`` (X.json), ``RESULTS_DIR / "X"`` (a file, or a
    recorded comparison's results.json), ``results/X.json`` in a printed line."""
    import re
    found = set()
    for nb in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"):
        code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        names = re.findall(r'read_result\(\s*"([\w.-]+)"\s*\)', code) + re.findall(r'"results/([\w.-]+)\.json', code)
        found |= {f"results/{n}.json" for n in names}
        for name in re.findall(r'RESULTS_DIR\s*/\s*"([\w.-]+)"', code):
            found.add(f"results/{name}" if "." in name else f"results/{name}/results.json")
    return {f for f in found if (ROOT / f).is_file()}


def test_the_wheel_ships_the_course_material(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    wanted |= {f"docs/{p.relative_to(ROOT / 'docs').as_posix()}" for p in (ROOT / "docs").rglob("*.md")}
    wanted |= {"book/_config.yml", "book/intro.md"}
    wanted |= {f"book/_static/{p.name}" for p in (ROOT / "book" / "_static").iterdir()}
    read = _results_the_notebooks_read()
    wanted |= read
    missing = sorted(w for w in wanted if f"sparsity_lab/_shipped/{w}" not in names)
    assert len(read) >= 10 and not missing, f"course material missing from the wheel: {missing}"
    assert not [n for n in names if n.startswith("sparsity_lab/_shipped/") and n.endswith(".html")]


def test_the_wheel_ships_at_most_5_mb_of_results_and_no_benchmarks(wheel):
    info = zipfile.ZipFile(wheel).infolist()
    results = sum(i.file_size for i in info if i.filename.startswith("sparsity_lab/_shipped/results/"))
    assert results <= 5 * 2**20, f"the wheel ships {results / 2**20:.1f} MiB of results (at most 5)"
    names = [i.filename for i in info]
    assert not [n for n in names if n.startswith("benchmarks/") or "/benchmarks/" in n], \
        "benchmarks run from a clone; the wheel must not ship them"
    # every comparison a notebook draws ships its logs, packed (lab.runlog.read_log reads them)
    for table in (n for n in _results_the_notebooks_read() if n.endswith("/results.json")):
        logs = [n for n in names if n.startswith(f"sparsity_lab/_shipped/{table.rsplit('/', 1)[0]}/") and n.endswith("log.jsonl.gz")]
        assert logs, f"{table}: its logs are not in the wheel"


def test_a_packed_log_reads_as_the_recorded_one_without_the_per_layer_flips(wheel, tmp_path):
    from sparsity_lab.lab.runlog import read_log

    archive = zipfile.ZipFile(wheel)
    name = next(n for n in archive.namelist() if n.endswith("lab_compare_h100_triton/sste/log.jsonl.gz"))
    (tmp_path / "sste").mkdir()
    (tmp_path / "sste" / "log.jsonl.gz").write_bytes(archive.read(name))
    packed = read_log(tmp_path / "sste" / "log.jsonl")
    recorded = read_log(ROOT / "results" / "lab_compare_h100_triton" / "sste" / "log.jsonl")
    assert packed == [{k: v for k, v in row.items() if not k.startswith("flip/")} for row in recorded]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> dict:
    """A fresh venv with the wheel installed (no dependencies): {"python", "bin", "package", "env", "cwd"}.

    The venv reaches the test environment's packages (torch, papermill, ...) through a .pth file
    listing its site-packages folders. Python does not run the .pth files inside folders listed that
    way, so the checkout's editable install (a .pth hook) cannot put the checkout on the path.
    """
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv, env=_clean_env(), timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=venv, env=_clean_env(), timeout=60).stdout.strip())
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel],
         cwd=venv, env=_clean_env(), timeout=300)
    # after the install, so that pip sees an empty venv and never the checkout's editable install
    outer = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    (purelib / "_test_environment.pth").write_text("\n".join(outer) + "\n")
    cwd = tmp_path_factory.mktemp("empty-folder")
    env = _clean_env(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    return {"python": python, "bin": venv / "bin", "package": purelib / "sparsity_lab", "env": env, "cwd": cwd}


def _package_files(package: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(package).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in package.rglob("*") if p.is_file()}


# what the installed package says about itself: the files imported, where its shipped files come from,
# the commit in its provenance, and the python that papermill's kernel (the notebooks) would run
PROBE = """
import sparsity_lab, sparsity_lab.kernels, sparsity_lab.shipped
from jupyter_client.manager import KernelManager
from sparsity_lab.provenance import provenance
print(sparsity_lab.__file__)
print(sparsity_lab.kernels.__file__)
print(sparsity_lab.shipped.installed_from())
print(provenance()["git_commit"])
print(KernelManager(kernel_name="python3").format_kernel_cmd()[0])
"""


def test_the_installed_wheel_runs_demo_and_a_notebook_from_an_empty_folder(installed):
    python, env, cwd, package = installed["python"], installed["env"], installed["cwd"], installed["package"]
    before = _package_files(package)

    probe = _run([python, "-c", PROBE], cwd=cwd, env=env, timeout=120).stdout.split("\n")
    init, kernels_init, installed_from, commit, kernel_python = probe[:5]
    assert Path(init).resolve() == (package / "__init__.py").resolve(), f"imported {init}, not the wheel's"
    assert Path(kernels_init).resolve().parent == (package / "kernels").resolve(), kernels_init
    assert installed_from == "wheel" and commit == COMMIT
    assert Path(kernel_python).resolve() == python.resolve(), \
        f"the notebooks' kernel would run {kernel_python}, not the venv's python (a python3 kernelspec elsewhere?)"

    demo = _run([installed["bin"] / "sparsity-lab", "demo", "--steps", "12", "--size", "64"],
                cwd=cwd, env=env, timeout=300)
    assert "1. A 2:4 mask" in demo.stdout and "flip rate early" in demo.stdout

    # a result written without --out-dir goes to results/ of the current folder, with the wheel's commit
    _run([installed["bin"] / "sparsity-lab", "demo", "--seeds", "2", "--steps", "12", "--size", "64",
          "--record", "results/flip_bands_demo.json"], cwd=cwd, env=env, timeout=300)
    assert json.loads((cwd / "results" / "flip_bands_demo.json").read_text())["provenance"]["git_commit"] == COMMIT

    course = _run([installed["bin"] / "sparsity-lab", "course", "--headless", "--no-book", "--only", NOTEBOOK,
                   "--workdir", "course"], cwd=cwd, env=env, timeout=300)
    assert "ok" in course.stdout, course.stdout
    (executed,) = (cwd / "course" / "book" / "_build" / "executed-ci").glob(f"{NOTEBOOK}_*.ipynb")
    cells = json.loads(executed.read_text())["cells"]
    assert not [o for c in cells for o in c.get("outputs", []) if o["output_type"] == "error"]

    after = _package_files(package)
    changed = sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
    assert not changed, f"written into the installed package: {changed}"
