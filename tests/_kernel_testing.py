"""Helpers shared by tests/test_kernels_*.py.

Importing this module skips the importing test file, with the reason shown, where the triton package
is not installed (it has Linux wheels only; the reference backend runs everywhere else). A triton that
is installed but broken is not skipped: its tests fail.
"""
import pytest
import torch

from sparsity_lab.backends.triton import triton_installed

if not triton_installed():
    pytest.skip("needs the triton package (not installed; Linux wheels only): pip install triton",
                allow_module_level=True)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# small tests run wherever the suite runs: CPU (interpreter) in CI, CUDA on the GPU machine
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def assert_close_ulp(actual: torch.Tensor, expected: torch.Tensor, ulps: float = 1.0,
                     scale: torch.Tensor | None = None, atol: torch.Tensor | float = 0.0) -> None:
    """|actual - expected| <= ulps * eps(dtype) * |expected| (+ the dtype's smallest normal).

    The kernels compute in float32 and round once; the GPU rounds to nearest, triton's CPU
    interpreter truncates float32 -> bf16, so one ulp of the output dtype is the honest bound.
    ``scale`` replaces |expected| where the float32 intermediate can cancel (a + b with a ~ -b);
    ``atol`` adds an absolute (elementwise) allowance for such float32 intermediates.
    """
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (actual.shape, expected.shape,
                                                                               actual.dtype, expected.dtype)
    info = torch.finfo(expected.dtype)
    a, e = actual.double(), expected.double()
    bound = ulps * info.eps * (e.abs() if scale is None else scale.double()) + atol + info.tiny
    bad = (a - e).abs() > bound
    assert not bool(bad.any()), (f"{int(bad.sum())} of {bad.numel()} elements differ by more than {ulps} ulp; "
                                 f"first: got {a[bad][:3].tolist()}, expected {e[bad][:3].tolist()}")


def allocate_dirty(monkeypatch, byte: int = 0xA5) -> None:
    """From here on in the test, ``torch.empty`` returns tensors filled with ``byte``: a kernel that leaves any
    byte of an uncleared output unwritten shows it."""
    empty = torch.empty

    def dirty(*args, **kwargs):
        t = empty(*args, **kwargs)
        if t.dim():
            t.view(torch.uint8).fill_(byte)
        return t
    monkeypatch.setattr(torch, "empty", dirty)


class AdamwMagnitudes:
    """Running sums over AdamW steps of the magnitudes of each step's operands, per element: the scale of the
    float32 rounding differences between two correct implementations.

    On the GPU a kernel may contract ``p * keep - u`` or ``beta1 * m + (1 - beta1) * g`` into one fused
    multiply-add, rounding once where the reference rounds twice: a difference of an ulp of the *operands*, which
    cancellation makes many ulps of a small result, and which later steps carry along. ``add`` one step of the
    reference (its state before and after); ``masters`` and ``exp_avgs`` are then the ``scale`` for
    ``assert_close_ulp`` (the second moment sums positive terms: its own magnitude is its scale).

    One more case: where a step's gradient is itself a sum that nearly cancels (MaskedDecay's g + decay W), its
    few-ulp difference is all there is of it, and AdamW's normalisation m / (sqrt(v) + eps) turns it into a
    difference of up to lr in the weight. ``add`` marks the elements whose computed gradient (``effective_grad``,
    given where it is such a sum) came within ``NEAR_ZERO`` eps of zero; ``masters_atol(lr)`` allows them lr a step,
    the others nothing."""

    NEAR_ZERO = 1e4  # |g| below this many eps: the normalised step depends on g's last bits

    def __init__(self) -> None:
        self.masters: torch.Tensor | float = 0.0
        self.exp_avgs: torch.Tensor | float = 0.0
        self.steps = 0
        self.near_zero: torch.Tensor | bool = False

    def add(self, master_before, exp_avg_before, grad, master_after, keep: float, beta1: float,
            effective_grad: torch.Tensor | None = None, eps: float = 1e-8) -> None:
        kept = master_before * keep
        self.masters = self.masters + kept.abs() + (kept - master_after).abs() + master_after.abs()
        self.exp_avgs = self.exp_avgs + beta1 * exp_avg_before.abs() + (1 - beta1) * grad.float().abs()
        self.steps += 1
        if effective_grad is not None:
            self.near_zero = self.near_zero | (effective_grad.float().abs() < self.NEAR_ZERO * eps)

    def masters_atol(self, lr: float) -> torch.Tensor | float:
        """Per element: lr for each step where the gradient nearly cancelled, else a negligible 1e-12."""
        if isinstance(self.near_zero, bool):
            return 1e-12
        return torch.where(self.near_zero, torch.tensor(lr * self.steps), torch.tensor(1e-12))
