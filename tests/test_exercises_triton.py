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


@triton.jit
def _stub5(a, b, c, d, BLOCK: tl.constexpr):
    raise NotImplementedError


@triton.jit
def _stub6(a, b, c, d, e, BLOCK: tl.constexpr):
    raise NotImplementedError


@triton.jit
def _stub6g(a, b, c, d, e, BLOCK_G: tl.constexpr):
    raise NotImplementedError


@triton.jit
def _decompress_ignoring_indices(val_ptr, idx_ptr, out_ptr, n_groups, BLOCK: tl.constexpr):
    g = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = g < n_groups
    tl.store(out_ptr + 4 * g, tl.load(val_ptr + 2 * g, mask=inside), mask=inside)
    tl.store(out_ptr + 4 * g + 1, tl.load(val_ptr + 2 * g + 1, mask=inside), mask=inside)
    tl.store(out_ptr + 4 * g + 2, tl.zeros([BLOCK], dtype=tl.float32), mask=inside)
    tl.store(out_ptr + 4 * g + 3, tl.zeros([BLOCK], dtype=tl.float32), mask=inside)


@triton.jit
def _dot_ignoring_indices(val_ptr, idx_ptr, x_ptr, out_ptr, n_groups, BLOCK_G: tl.constexpr):
    g = tl.arange(0, BLOCK_G)
    inside = g < n_groups
    base = tl.program_id(0) * 2 * n_groups + 2 * g
    v0 = tl.load(val_ptr + base, mask=inside, other=0.0)
    v1 = tl.load(val_ptr + base + 1, mask=inside, other=0.0)
    x0 = tl.load(x_ptr + 4 * g, mask=inside, other=0.0)
    x1 = tl.load(x_ptr + 4 * g + 1, mask=inside, other=0.0)
    tl.store(out_ptr + tl.program_id(0), tl.sum(v0 * x0 + v1 * x1, axis=0))


@triton.jit
def _mvue_without_division(x_ptr, p_ptr, u_ptr, out_ptr, n_groups, BLOCK: tl.constexpr):
    g = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = g < n_groups
    u = tl.load(u_ptr + g, mask=inside, other=0.0)
    lo = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(4):
        x = tl.load(x_ptr + 4 * g + j, mask=inside, other=0.0)
        p = tl.load(p_ptr + 4 * g + j, mask=inside, other=1.0)
        if j < 3:
            hi = lo + p
        else:
            hi = tl.full([BLOCK], 2.0, tl.float32)
        picked = ((lo <= u) & (u < hi)) | ((lo <= u + 1) & (u + 1 < hi))
        tl.store(out_ptr + 4 * g + j, tl.where(picked, x, 0.0), mask=inside)
        lo = hi


@triton.jit
def _flips_tail_unmasked(prev_ptr, new_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    prev = tl.load(prev_ptr + offs, mask=offs < n, other=0)
    new = tl.load(new_ptr + offs, mask=offs < n, other=1)   # a different fill: the tail counts as flips
    tl.store(partial_ptr + tl.program_id(0), tl.sum((prev != new).to(tl.int32), axis=0))


PUZZLES = [(ex.check_scale_kernel, sol.scale_kernel, _stub), (ex.check_prune24_kernel, sol.prune24_kernel, None),
           (ex.check_soft_threshold24_kernel, sol.soft_threshold24_kernel, _stub5),
           (ex.check_mvue24_kernel, sol.mvue24_kernel, _stub6),
           (ex.check_count_flips_kernel, sol.count_flips_kernel, _stub5),
           (ex.check_compress24_kernel, sol.compress24_kernel, _stub5),
           (ex.check_decompress24_kernel, sol.decompress24_kernel, _stub5),
           (ex.check_sparse_dot_kernel, sol.sparse_dot_kernel, _stub6g)]


def test_there_are_eight_puzzles():
    checks = {name for name in dir(ex) if name.startswith("check_") and name.endswith("_kernel")}
    assert len(checks) >= 8 and checks == {c.__name__ for c, _, _ in PUZZLES}


@pytest.mark.parametrize("check,solution,stub", PUZZLES, ids=lambda v: getattr(v, "__name__", ""))
def test_solution_kernels_pass_and_stubs_are_one_line(check, solution, stub, capsys):
    assert check(solution, show=False).status == PASSED
    stub = stub or _stub_prune
    result = check(stub)
    out = capsys.readouterr().out
    assert result.status == NOT_ATTEMPTED and out.strip().count("\n") == 0 and "Hint" not in out, out


@triton.jit
def _stub_prune(w_ptr, out_ptr, n_groups, BLOCK: tl.constexpr):
    raise NotImplementedError


def test_wrong_new_kernels_are_named():
    result = ex.check_decompress24_kernel(_decompress_ignoring_indices, show=False)
    assert result.status == FAILED, result.message
    result = ex.check_sparse_dot_kernel(_dot_ignoring_indices, show=False)
    assert result.status == FAILED and "indices pick the entries of x" in result.message, result.message
    result = ex.check_mvue24_kernel(_mvue_without_division, show=False)
    assert result.status == FAILED and "divided by p_j" in result.message, result.message
    result = ex.check_count_flips_kernel(_flips_tail_unmasked, show=False)
    assert result.status == FAILED and "last program" in result.message, result.message


def test_wrong_kernels_are_named():
    result = ex.check_scale_kernel(_unmasked_scale, show=False)
    assert result.status == FAILED and "past the end" in result.message, result.message
    result = ex.check_prune24_kernel(_ties_keep_all, show=False)
    assert result.status == FAILED and "ties" in result.message, result.message
    result = ex.check_soft_threshold24_kernel(_hard_times_beta, show=False)
    assert result.status == FAILED and "subtract t" in result.message, result.message
    result = ex.check_prune24_kernel(lambda *a: None, show=False)
    assert result.status == FAILED and "@triton.jit" in result.message, result.message
