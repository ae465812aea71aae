"""Triton puzzles of notebook 07: the solution kernels pass their checks (run by the CPU interpreter in
CI, tiny shapes), wrong kernels fail with a message that names the mistake, a stub is "not attempted".
conftest.py sets TRITON_INTERPRET=1 before anything imports triton when no GPU is present."""
import pytest

pytest.importorskip("triton", reason="the Triton puzzles need triton")
pytestmark = pytest.mark.triton
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from sparsity_lab.course.exercises import triton_puzzles as ex  # noqa: E402
from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED  # noqa: E402
from sparsity_lab.course.exercises.solutions import triton_puzzles as sol  # noqa: E402


@triton.jit
def _stub(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    # your code
    raise NotImplementedError


@triton.jit
def _unmasked_scale(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs))


@triton.jit
def _ties_keep_all(w_ptr, out_ptr, n_groups, BLOCK: tl.constexpr):
    """Ranks with strict comparisons only: a four-way tie keeps all four."""
    g = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = g < n_groups
    w0 = tl.load(w_ptr + 4 * g, mask=inside, other=0.0)
    w1 = tl.load(w_ptr + 4 * g + 1, mask=inside, other=0.0)
    w2 = tl.load(w_ptr + 4 * g + 2, mask=inside, other=0.0)
    w3 = tl.load(w_ptr + 4 * g + 3, mask=inside, other=0.0)
    a0, a1, a2, a3 = tl.abs(w0), tl.abs(w1), tl.abs(w2), tl.abs(w3)
    r0 = (a1 > a0).to(tl.int32) + (a2 > a0).to(tl.int32) + (a3 > a0).to(tl.int32)
    r1 = (a0 > a1).to(tl.int32) + (a2 > a1).to(tl.int32) + (a3 > a1).to(tl.int32)
    r2 = (a0 > a2).to(tl.int32) + (a1 > a2).to(tl.int32) + (a3 > a2).to(tl.int32)
    r3 = (a0 > a3).to(tl.int32) + (a1 > a3).to(tl.int32) + (a2 > a3).to(tl.int32)
    tl.store(out_ptr + 4 * g, tl.where(r0 < 2, w0, 0.0), mask=inside)
    tl.store(out_ptr + 4 * g + 1, tl.where(r1 < 2, w1, 0.0), mask=inside)
    tl.store(out_ptr + 4 * g + 2, tl.where(r2 < 2, w2, 0.0), mask=inside)
    tl.store(out_ptr + 4 * g + 3, tl.where(r3 < 2, w3, 0.0), mask=inside)


@triton.jit
def _hard_times_beta(w_ptr, out_ptr, beta, n_groups, BLOCK: tl.constexpr):
    """beta * (hard 2:4 pruning): forgets to subtract t."""
    g = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = g < n_groups
    w0 = tl.load(w_ptr + 4 * g, mask=inside, other=0.0)
    w1 = tl.load(w_ptr + 4 * g + 1, mask=inside, other=0.0)
    w2 = tl.load(w_ptr + 4 * g + 2, mask=inside, other=0.0)
    w3 = tl.load(w_ptr + 4 * g + 3, mask=inside, other=0.0)
    k0, k1, k2, k3 = sol._keep_top2(tl.abs(w0), tl.abs(w1), tl.abs(w2), tl.abs(w3))
    tl.store(out_ptr + 4 * g, tl.where(k0, beta * w0, 0.0), mask=inside)
    tl.store(out_ptr + 4 * g + 1, tl.where(k1, beta * w1, 0.0), mask=inside)
    tl.store(out_ptr + 4 * g + 2, tl.where(k2, beta * w2, 0.0), mask=inside)
    tl.store(out_ptr + 4 * g + 3, tl.where(k3, beta * w3, 0.0), mask=inside)


def test_solution_kernels_pass():
    assert ex.check_scale_kernel(sol.scale_kernel, show=False).status == PASSED
    assert ex.check_prune24_kernel(sol.prune24_kernel, show=False).status == PASSED
    assert ex.check_soft_threshold24_kernel(sol.soft_threshold24_kernel, show=False).status == PASSED


def test_stub_kernel_is_not_attempted():
    assert ex.check_scale_kernel(_stub, show=False).status == NOT_ATTEMPTED


def test_wrong_kernels_are_named():
    result = ex.check_scale_kernel(_unmasked_scale, show=False)
    assert result.status == FAILED and "past the end" in result.message, result.message
    result = ex.check_prune24_kernel(_ties_keep_all, show=False)
    assert result.status == FAILED and "ties" in result.message, result.message
    result = ex.check_soft_threshold24_kernel(_hard_times_beta, show=False)
    assert result.status == FAILED and "subtract t" in result.message, result.message
    result = ex.check_prune24_kernel(lambda *a: None, show=False)
    assert result.status == FAILED and "@triton.jit" in result.message, result.message
