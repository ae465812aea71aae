"""Shared test set-up.

Triton kernels run on CPU through the interpreter: TRITON_INTERPRET must be set before triton
is imported, so it is set here, first, when no GPU is present.

The course notebooks run once per test session at CI sizes (``executed_dir``) and the book is built
once from those copies (``course_book``): the papermill tests, the book build test and the book's
browser test all share them. A notebook with ```python blocks in its "Things to try" runs with those
blocks appended (``things_to_try_runs``), and that run provides its executed copy.
"""
import os
from pathlib import Path

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    from sparsity_lab.backends.triton import triton_installed

    if not triton_installed():  # macOS / Windows: no triton wheels; the reference backend still runs
        skip_triton = pytest.mark.skip(reason="needs the triton package (not installed; Linux wheels only): "
                                              "pip install triton")
        for item in items:
            if item.get_closest_marker("triton"):
                item.add_marker(skip_triton)
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_thread():
    """Runs the test on one intra-op thread. A CPU reduction split over threads (LayerNorm's weight
    gradient, seen here) rounds by the split, so a thread count that differs between two runs moves
    the last bit; a 2:4 activation model's top-2-of-4 choice turns that bit into a different
    trajectory. Bit-for-bit resume tests of such models pin the count so they compare the checkpoint,
    not the thread pool."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def device():
    return torch.device("cuda" if HAS_GPU else "cpu")


@pytest.fixture(scope="session")
def executed_dir(tmp_path_factory) -> Path:
    """Executed copies of the course notebooks at CI sizes, shared by the papermill tests and the book."""
    return tmp_path_factory.mktemp("executed-ci")


@pytest.fixture(scope="session")
def things_to_try_runs(executed_dir, tmp_path_factory) -> dict:
    """Each notebook whose "Things to try" has ```python blocks, run once at CI sizes with the blocks
    appended (tests/_commands.py): notebook name -> None (ran) or the failure message, which
    tests/test_commands_run.py reports. A run that got through writes the notebook's own executed copy
    (blocks taken out) into ``executed_dir``, so the notebook tests and the book reuse it."""
    pytest.importorskip("papermill", reason="papermill is in the test extra")
    import nbformat
    from _commands import fenced_blocks, python_blocks_failure, things_to_try

    from sparsity_lab.course import is_current, notebooks

    results = {}
    for path in notebooks():
        section = things_to_try(nbformat.read(path, as_version=4)) or ""
        blocks = [body for lang, body, _ in fenced_blocks(section) if lang == "python"]
        if blocks:
            target = executed_dir / path.name
            keep = None if is_current(target, path, "ci") else target
            results[path.name] = python_blocks_failure(path, blocks, tmp_path_factory.mktemp("things-to-try"),
                                                       executed_copy=keep)
    return results


@pytest.fixture(scope="session")
def course_book(executed_dir, things_to_try_runs, tmp_path_factory) -> Path:
    """The course's HTML book at CI sizes, built once (notebooks not yet run are run now); its index.html."""
    pytest.importorskip("papermill", reason="papermill is in the test extra")
    try:
        import jupyter_book  # noqa: F401
    except ImportError:
        pytest.fail("the book needs Jupyter Book 1, which the test extra installs: pip install -e '.[test]'")
    from sparsity_lab.course import build_course

    return build_course(out=tmp_path_factory.mktemp("course-book") / "book", sizes="ci",
                        executed_dir=executed_dir, reuse=True, progress=False)
