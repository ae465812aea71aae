"""MVUE 2:4 (exact water-filling and the sequential scheme of the reference kernels).

Statistical tests use many independent draws of one fixed input (the draws are made in one call
on a tensor that repeats the input along a new batch dimension: every group is sampled
independently) and bounds that shrink like 1/sqrt(draws). The mean bound is Bernstein's
inequality with the exact per-entry variance, union-bounded over the entries, so the test is
rigorous rather than a normal approximation:
    P(|mean - x| >= t) <= 2 exp(-n t^2 / (2 var + 2 R t / 3)),   R = |x| / p (range of one draw).
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsity_lab.masks.nm import is_nm
from sparsity_lab.methods.mvue import mvue24, mvue_probabilities, sequential_probabilities, top2_24

METHODS = ("exact", "sequential")
PROBABILITIES = {"exact": mvue_probabilities, "sequential": sequential_probabilities}
FALSE_FAILURE = 1e-9  # total, over all entries of one test

# a group entry: exact zero or a magnitude in [1e-6, 100] with either sign (float64 entries below
# ~1e-300 of their group total would underflow p; float32/16 inputs never get there)
ENTRY = st.one_of(st.just(0.0), st.floats(1e-6, 100.0).flatmap(lambda v: st.sampled_from([v, -v])))
GROUP = st.lists(ENTRY, min_size=4, max_size=4)


def special_input() -> torch.Tensor:
    """(4, 16) float64: random groups plus the awkward ones (zero, one non-zero, two non-zeros,
    one dominant entry, ties, tiny values)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(4, 16, dtype=torch.float64, generator=g)
    x[0, 0:4] = 0.0                                      # all-zero group
    x[0, 4:8] = torch.tensor([0.0, -3.0, 0.0, 0.0])      # one non-zero
    x[0, 8:12] = torch.tensor([0.5, 0.0, -2.0, 0.0])     # two non-zeros
    x[1, 0:4] = torch.tensor([10.0, 0.1, -0.2, 0.3])     # the largest is capped at p = 1
    x[1, 4:8] = torch.tensor([1.0, -1.0, 1.0, -1.0])     # ties
    x[1, 8:12] = torch.tensor([1e-35, 2e-35, -3e-35, 0.0])  # tiny but non-zero
    return x


def inclusion_probabilities(x: torch.Tensor, method: str) -> torch.Tensor:
    groups = x.reshape(*x.shape[:-1], -1, 4)
    return PROBABILITIES[method](groups).reshape(x.shape)


def exact_variance(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Var(x_i 1{kept} / p_i) = x_i^2 (1 / p_i - 1); 0 where x_i = 0 (the entry contributes 0)."""
    x = x.double()
    safe_p = torch.where(x != 0, p, torch.ones_like(p))
    return x * (x / safe_p) - x * x  # not x^2 (1/p - 1): 1/p overflows for subnormal x


def bernstein_bound(var: torch.Tensor, value_range: torch.Tensor, n: int, entries: int) -> torch.Tensor:
    """t such that P(|mean of n draws - mu| >= t) <= FALSE_FAILURE / entries for each entry."""
    log_term = math.log(2 * entries / FALSE_FAILURE)
    a = 2 * value_range * log_term / 3
    return (a + torch.sqrt(a * a + 8 * n * var * log_term)) / (2 * n)


def many_draws(x: torch.Tensor, n: int, method: str, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return mvue24(x.expand(n, *x.shape).contiguous(), dim=-1, generator=gen, method=method)


@pytest.mark.parametrize("method", METHODS)
def test_unbiased_with_exact_variance(method):
    x = special_input()
    n = 4000
    draws = many_draws(x, n, method)
    p = inclusion_probabilities(x, method)
    var = exact_variance(x, p)
    value_range = x.abs() / torch.where(p > 0, p, torch.ones_like(p))
    bound = bernstein_bound(var, value_range, n, x.numel())
    err = (draws.mean(0) - x).abs()
    assert bool((err <= bound).all()), f"max err/bound {float((err / bound).nan_to_num(0).max()):.3g}"
    # the bound is a real constraint: it is of the order sqrt(var / n), far below a pruned |x|
    assert float(bound.max()) < 0.25 * float(x.abs().max())

    # empirical variance (around the known mean x) against the exact one: per entry, within 6
    # standard errors (from the exact 4th central moment of the two-point law), and in total
    d_kept = x * (1 - p) / torch.where(p > 0, p, torch.ones_like(p))
    mu4 = p * d_kept**4 + (1 - p) * x**4
    se = torch.sqrt((mu4 - var**2).clamp_min(0) / n)
    emp = ((draws - x) ** 2).mean(0)
    assert bool(((emp - var).abs() <= 6 * se + 1e-12 * var.max()).all())
    assert float(emp.sum() / var.sum()) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("method", METHODS)
def test_keep_frequencies_match_inclusion_probabilities(method):
    """Each entry is kept with probability p_i: checks the probability formula against the sampler
    (Hoeffding bound on a Bernoulli mean, union over entries)."""
    x = special_input()[:, :12].contiguous()
    n = 4000
    kept = many_draws(x, n, method, seed=7) != 0
    freq = kept.double().mean(0)
    p = inclusion_probabilities(x, method)
    t = math.sqrt(math.log(2 * x.numel() / FALSE_FAILURE) / (2 * n))
    nonzero = x != 0  # zeros are "kept" as 0, invisible
    assert bool(((freq - p).abs()[nonzero] <= t).all())


@pytest.mark.parametrize("method", METHODS)
def test_tiny_values_keep_exact_probabilities(method):
    """Regression: an epsilon clamp (1e-30) once turned p for [1e-35, 2e-35, 3e-35, 0] into
    [0, 1, 1, 0], silently dropping the smallest entry (biased)."""
    g = torch.tensor([[1e-35, 2e-35, -3e-35, 0.0]], dtype=torch.float64)
    p = PROBABILITIES[method](g)
    reference = PROBABILITIES[method](g * 1e35)  # the same group at a normal scale
    torch.testing.assert_close(p, reference, rtol=1e-12, atol=0)
    assert float(p[0, 0]) > 0.2


@settings(max_examples=60, deadline=None)
@given(GROUP, st.sampled_from(METHODS))
def test_probabilities_in_unit_interval_and_sum_to_two(values, method):
    p = PROBABILITIES[method](torch.tensor([values], dtype=torch.float64))
    assert bool(((p >= 0) & (p <= 1 + 1e-12)).all())
    assert float(p.sum()) == pytest.approx(2.0, abs=1e-9)
    a = torch.tensor(values, dtype=torch.float64).abs()
    if method == "exact" and int((a > 0).sum()) >= 2:
        # p_i = min(1, c |x_i|): proportional to |x| below the cap, zeros never picked
        below = (p[0] < 1 - 1e-9) & (a > 0)
        if int(below.sum()) >= 2:
            pb, ab = p[0][below], a[below]  # compare normalised shapes (subnormal-safe)
            torch.testing.assert_close(pb / pb.max(), ab / ab.max(), rtol=1e-6, atol=0)
        assert bool((p[0][a == 0] == 0).all())


@settings(max_examples=60, deadline=None)
@given(GROUP, st.integers(0, 2**31 - 1))
def test_exact_probabilities_minimise_variance(values, seed):
    """Water-filling gives the least variance of all feasible p (sum 2, 0 < p <= 1 on non-zeros),
    and in particular no more than the sequential scheme."""
    x = torch.tensor([values], dtype=torch.float64)
    v_exact = float(exact_variance(x, mvue_probabilities(x)).sum())
    v_seq = float(exact_variance(x, sequential_probabilities(x)).sum())
    assert v_exact <= v_seq * (1 + 1e-9) + 1e-12
    gen = torch.Generator().manual_seed(seed)
    # random feasible p: 2 * Dirichlet(1, 1, 1, 1) (normalised exponentials), kept when all <= 1
    e = -torch.log(torch.rand(200, 4, generator=gen, dtype=torch.float64))
    p = 2 * e / e.sum(-1, keepdim=True)
    p = p[(p <= 1).all(-1)]
    assert p.shape[0] > 10
    v_random = exact_variance(x.expand_as(p), p).sum(-1)
    assert bool((v_exact <= v_random * (1 + 1e-9) + 1e-12).all())


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(0, 2), st.sampled_from(METHODS),
       st.integers(0, 2**31 - 1))
def test_at_most_two_nonzeros_per_group_along_dim(a, b, dim, method, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = [a + 1, b + 2, 3]
    shape[dim] = 4 * (shape[dim] % 3 + 1)
    x = torch.randn(*shape, generator=gen)
    y = mvue24(x, dim=dim, generator=gen, method=method)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert is_nm(y, 2, 4, dim=dim, exact=False)
    # kept entries are x / p >= |x| in magnitude with x's sign
    kept = y != 0
    assert bool((torch.sign(y[kept]) == torch.sign(x[kept])).all())
    assert bool((y[kept].abs() >= x[kept].abs() * (1 - 1e-6)).all())


@pytest.mark.parametrize("method", METHODS)
def test_degenerate_groups_are_exact(method):
    """Zero groups stay zero; groups with 1 or 2 non-zeros are returned unchanged (p = 1)."""
    x = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, -3.0, 0.0, 0.0, 0.5, 0.0, -2.0, 0.0]])
    for seed in range(20):
        y = mvue24(x, generator=torch.Generator().manual_seed(seed), method=method)
        assert torch.equal(y, x)


@pytest.mark.parametrize("method", METHODS)
def test_seeded_generator_reproducible(method):
    x = torch.randn(6, 32)
    y1 = mvue24(x, generator=torch.Generator().manual_seed(3), method=method)
    y2 = mvue24(x, generator=torch.Generator().manual_seed(3), method=method)
    y3 = mvue24(x, generator=torch.Generator().manual_seed(4), method=method)
    assert torch.equal(y1, y2)
    assert not torch.equal(y1, y3)


def test_groups_along_chosen_dim_match_transposed_call():
    """Groups along dim 0 (the tokens, as in the layer's dW = MVUE(dZ^T) X): the same draws as
    grouping the transpose along its last dim."""
    x = torch.randn(12, 5)
    y0 = mvue24(x, dim=0, generator=torch.Generator().manual_seed(9))
    y1 = mvue24(x.t().contiguous(), dim=-1, generator=torch.Generator().manual_seed(9))
    assert torch.equal(y0, y1.t())
    assert is_nm(y0, 2, 4, dim=0, exact=False)


def test_top2_is_biased_mvue_is_not():
    """Top-2 is deterministic: zero variance but a bias of -x on every pruned entry. MVUE has zero
    bias (within the statistical bound) and pays in variance; exact MVUE variance <= sequential."""
    x = special_input()
    top2 = top2_24(x)
    pruned = (top2 == 0) & (x != 0)
    assert bool(pruned.any())
    top2_bias = top2 - x
    assert torch.equal(top2_bias[pruned], -x[pruned])

    n = 4000
    var = {}
    for method in METHODS:
        p = inclusion_probabilities(x, method)
        var[method] = exact_variance(x, p)
        draws = many_draws(x, n, method, seed=11)
        value_range = x.abs() / torch.where(p > 0, p, torch.ones_like(p))
        bound = bernstein_bound(var[method], value_range, n, x.numel())
        mvue_bias = draws.mean(0) - x
        assert bool((mvue_bias.abs() <= bound).all())
        # the same bound rejects top-2: its bias is far outside it on the pruned entries
        assert bool((top2_bias.abs()[pruned] > bound[pruned]).any())
        assert float((top2_bias.abs()[pruned] > bound[pruned]).double().mean()) > 0.9
        emp_var = float(draws.var(0).sum())
        assert emp_var == pytest.approx(float(var[method].sum()), rel=0.05)
    assert float(var["exact"].sum()) <= float(var["sequential"].sum())
    # per group too (the exact p are the minimum-variance ones group by group)
    ve = var["exact"].reshape(-1, 4).sum(-1)
    vs = var["sequential"].reshape(-1, 4).sum(-1)
    assert bool((ve <= vs * (1 + 1e-9) + 1e-30).all())
    # MSE comparison: top-2's squared bias against MVUE's variance, both finite and positive
    assert float((top2_bias**2).sum()) > 0 and float(var["exact"].sum()) > 0


@pytest.mark.parametrize("method", METHODS)
def test_dtype_preserved_and_low_precision(method):
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    y = mvue24(x, generator=torch.Generator().manual_seed(0), method=method)
    assert y.dtype == torch.bfloat16
    assert is_nm(y, 2, 4, exact=False)


def test_unchecked_call_passes_non_finite_groups_through():
    """With check=False (the layer's backward under a GradScaler) an overflow must survive: a group
    with two infs once came out as zeros, hiding the overflow from the scaler."""
    x = torch.tensor([[float("inf"), float("inf"), 1.0, 2.0, 1.0, 2.0, 3.0, 4.0],
                      [float("nan"), 1.0, 2.0, 3.0, 4.0, 3.0, 2.0, 1.0]])
    for method in METHODS:
        y = mvue24(x, generator=torch.Generator().manual_seed(0), method=method, check=False)
        assert not bool(torch.isfinite(y[0, :4]).all())
        assert bool(torch.isnan(y[1, :4]).any())
        assert bool(torch.isfinite(y[:, 4:]).all())
        assert is_nm(y[:, 4:], 2, 4, exact=False)
