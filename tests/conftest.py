"""Shared test set-up.

Triton kernels run on CPU through the interpreter: TRITON_INTERPRET must be set before triton
is imported, so it is set here, first, when no GPU is present.
"""
import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    from sparsity_lab.backends.triton_backend import triton_installed

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
def device():
    return torch.device("cuda" if HAS_GPU else "cpu")
