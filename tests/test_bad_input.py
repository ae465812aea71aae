"""Bad input gets a clear error that names the argument and says what was expected."""
import pytest
import torch

from sparsity_lab.masks import (
    is_nm, kept_fraction, mask_diversity, nm_mask, transposable_mask, transposable_patterns,
    validate_transposable_mask,
)

# ---------------------------------------------------------------- masks
# Every entry point that builds a mask from weights: (name, call(weight, n, m)).
MASK_BUILDERS = [
    ("nm_mask", lambda w, n, m: nm_mask(w, n, m)),
    ("transposable_mask", lambda w, n, m: transposable_mask(w, n, m)),
    ("transposable_mask[flow]", lambda w, n, m: transposable_mask(w, n, m, solver="flow")),
    ("transposable_mask[greedy]", lambda w, n, m: transposable_mask(w, n, m, solver="greedy")),
]
builders = pytest.mark.parametrize("build", [b for _, b in MASK_BUILDERS], ids=[name for name, _ in MASK_BUILDERS])


@builders
def test_dimension_not_divisible_by_m(build):
    with pytest.raises(ValueError, match=r"weight has size 6 along dim 1, which is not divisible by m=4"):
        build(torch.randn(8, 6), 2, 4)


def test_dimension_not_divisible_names_the_dim():
    with pytest.raises(ValueError, match=r"weight has size 6 along dim 0, which is not divisible by m=4"):
        nm_mask(torch.randn(6, 8), 2, 4, dim=0)
    with pytest.raises(ValueError, match=r"weight has size 6 along dim 0"):
        transposable_mask(torch.randn(6, 8), 2, 4)  # rows must be divisible too


@builders
@pytest.mark.parametrize("n,m,message", [
    (5, 4, r"n must satisfy 1 <= n <= m, got n=5, m=4"),
    (0, 4, r"n must satisfy 1 <= n <= m, got n=0, m=4"),
    (-1, 4, r"n must satisfy 1 <= n <= m, got n=-1, m=4"),
    (2, 0, r"m must be >= 1, got m=0"),
])
def test_n_and_m_out_of_range(build, n, m, message):
    with pytest.raises(ValueError, match=message):
        build(torch.randn(8, 8), n, m)


@builders
@pytest.mark.parametrize("n,m,message", [
    (2.0, 4, r"n must be an int, got float \(2.0\)"),
    (2, 4.0, r"m must be an int, got float \(4.0\)"),
    (True, 4, r"n must be an int, got bool"),
    ("2", 4, r"n must be an int, got str"),
])
def test_n_and_m_must_be_ints(build, n, m, message):
    with pytest.raises(TypeError, match=message):
        build(torch.randn(8, 8), n, m)


@pytest.mark.parametrize("call", [
    lambda: is_nm(torch.ones(4, 4, dtype=torch.bool), 3, 2),
    lambda: validate_transposable_mask(torch.ones(4, 4, dtype=torch.bool), 0, 4),
    lambda: transposable_patterns(5, 4),
    lambda: mask_diversity("nm", 5, 4),
])
def test_n_m_checked_everywhere(call):
    with pytest.raises(ValueError, match="n must satisfy 1 <= n <= m"):
        call()


@builders
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_integer_and_bool_weights_rejected(build, dtype):
    w = torch.ones(8, 8, dtype=dtype)
    with pytest.raises(TypeError, match=rf"weight must be a floating-point tensor .* got dtype {dtype}"):
        build(w, 2, 4)


@builders
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_rejected(build, bad):
    w = torch.randn(8, 8)
    w[3, 5] = bad
    with pytest.raises(ValueError, match=r"weight contains 1 NaN/Inf value\(s\); expected finite values"):
        build(w, 2, 4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nan_rejected_in_low_precision(dtype):
    w = torch.randn(8, 8).to(dtype)
    w[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN/Inf"):
        nm_mask(w)
    with pytest.raises(ValueError, match="NaN/Inf"):
        transposable_mask(w)


@builders
@pytest.mark.parametrize("shape", [(0, 8), (8, 0), (0, 0)])
def test_empty_tensors_rejected(build, shape):
    with pytest.raises(ValueError, match=r"weight is empty \(shape .*\); expected at least one element"):
        build(torch.empty(shape), 2, 4)


@pytest.mark.parametrize("solver", ["auto", "patterns", "flow", "lp", "greedy", "greedy_prune"])
@pytest.mark.parametrize("shape", [(16,), (2, 4, 8)])
def test_transposable_mask_needs_2d(solver, shape):
    with pytest.raises(ValueError, match=r"weight must be 2-D \(out x in\), got \d-D with shape"):
        transposable_mask(torch.randn(shape), 2, 4, solver=solver)


def test_nm_mask_dim_checked():
    with pytest.raises(ValueError, match=r"dim=2 is out of range for a 2-D tensor"):
        nm_mask(torch.randn(4, 8), dim=2)
    with pytest.raises(TypeError, match=r"dim must be an int, got float"):
        nm_mask(torch.randn(4, 8), dim=1.0)


@pytest.mark.parametrize("solver", ["Flow", "hungarian", "", None])
def test_unknown_solver(solver):
    with pytest.raises(ValueError, match=r"solver must be 'auto' or one of \['flow', 'greedy', 'greedy_prune', 'lp', 'patterns'\]"):
        transposable_mask(torch.randn(8, 8), 2, 4, solver=solver)


def test_patterns_solver_refused_for_large_m():
    with pytest.raises(ValueError, match="solver='patterns' enumerates every tile pattern; 4:8 has too many, use 'flow'"):
        transposable_mask(torch.randn(8, 8), 4, 8, solver="patterns")


def test_weight_must_be_a_tensor():
    with pytest.raises(TypeError, match="weight must be a torch.Tensor, got list"):
        nm_mask([[1.0, 2.0, 3.0, 4.0]])
    with pytest.raises(TypeError, match="weight must be a torch.Tensor, got ndarray"):
        import numpy as np
        transposable_mask(np.ones((4, 4), dtype=np.float32))


def test_kept_fraction_bad_input():
    with pytest.raises(ValueError, match="mask must be a tensor of weight's shape"):
        kept_fraction(torch.randn(4, 8), torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="weight must be a floating-point tensor"):
        kept_fraction(torch.ones(4, 8, dtype=torch.int64), torch.ones(4, 8, dtype=torch.bool))
