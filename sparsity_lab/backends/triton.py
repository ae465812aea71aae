"""The "triton" backend: the Triton kernels where they exist, the reference for the dense products.

Same operations, same results as the reference backend ("torch"):
    mask          row-wise 2:4: kernel 1 (prune24, mask only); transposable: kernel 2 (90 patterns)
    sparse_weight m * W (one elementwise product), or beta * S(W): kernel 3 (soft threshold)
    grad_weight   dense dZ^T X, or MVUE(dZ^T) X with kernel 4 along the tokens
    masked_decay_ kernel 5, in place
    prepare, linear, grad_input: the reference's dense products (a 2:4 sparse product needs
    cuSPARSELt, a separate backend).
Kernels implement 2:4 only and float16/bfloat16/float32 weights; other N:M or dtypes raise.

Runs on a CUDA GPU, or on the CPU through the Triton interpreter when TRITON_INTERPRET=1 was set
before triton was imported (slow; what the CPU tests use). Anything else raises when the backend is
created, so a layer never runs the reference silently under the name "triton".
"""
from __future__ import annotations

import importlib.util
import os

import torch

from .base import Backend, kernel_seed
from .report import BackendReport
from .torch_reference import TorchBackend

TRITON_MISSING = ("backend 'triton' needs the triton package, which is not installed: `pip install triton` "
                  "(wheels exist for Linux only; on macOS and Windows use backend='torch', the reference, "
                  "which runs on any CPU)")


def triton_installed() -> bool:
    """True when the triton package can be found (it is not imported here)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except ImportError:  # a parent import hook that refuses it: treat as absent
        return False


def _check_24(n: int, m: int) -> None:
    if (n, m) != (2, 4):
        raise ValueError(f"backend 'triton' implements 2:4 masks only, got n={n}, m={m}; use backend='torch' for other N:M")


class TritonBackend(Backend, BackendReport):
    name = "triton"
    reads_seed_from_device = True  # the MVUE kernel reads a 0-d int64 device seed (CUDA-graph step)
    mask_refresh_capturable = True  # the transposable-mask and flip-count kernels (Triton) on CUDA tensors

    def __init__(self) -> None:
        if not triton_installed():
            raise RuntimeError(TRITON_MISSING)
        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "backend 'triton' needs a CUDA GPU, or TRITON_INTERPRET=1 set before triton is imported "
                "to run its kernels on the CPU through the (slow) interpreter; use backend='torch' otherwise")
        try:
            import sparsity_lab.kernels as kernels
        except ImportError as err:  # triton missing or broken
            raise RuntimeError(f"backend 'triton' could not import its kernels: {err}") from err
        self._k = kernels
        self._reference = TorchBackend()

    def __deepcopy__(self, memo):
        # one backend per process (backends.get_backend): a deep-copied model shares it
        return self

    def mask(self, weight, n, m, transposable):
        _check_24(n, m)
        if transposable:
            mask, _, _ = self._k.transposable_mask24(weight, pruned=False)
            return mask
        _, bits = self._k.prune24(weight, values=False)
        return self._k.unpack_mask24(bits)

    def mask_flips(self, previous, current):
        """0-d int64 count of differing entries, on the device (kernel 9)."""
        return self._k.count_flips(previous, current)

    def sparse_weight(self, weight, mask, beta, n, m):
        _check_24(n, m)
        if beta is None:
            return weight * mask
        return self._k.soft_threshold24(weight, mask, beta)

    def prepare(self, sparse_weight):
        return self._reference.prepare(sparse_weight)

    def linear(self, x, operand, bias):
        return self._reference.linear(x, operand, bias)

    def grad_input(self, grad_out, operand):
        return self._reference.grad_input(grad_out, operand)

    def grad_weight(self, grad_out, x, mvue, seed):
        if not mvue:
            return self._reference.grad_weight(grad_out, x, False, None)
        pad = (-grad_out.shape[0]) % 4
        if pad:  # zero rows change nothing: an all-zero group stays zero, the others stay unbiased
            grad_out = torch.nn.functional.pad(grad_out, (0, 0, 0, pad))
            x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        sparse = self._k.mvue24(grad_out, dim=0, seed=kernel_seed(seed))
        return sparse.t() @ x

    def masked_decay_(self, grad, weight, mask, decay):
        self._k.masked_decay_(grad, weight, mask, decay)

