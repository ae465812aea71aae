"""N:M magnitude masks (``nm_mask``, ``is_nm``, ``kept_fraction``) against a plain sort reference.

The reference sorts each group of M in Python by (-|w|, index): the N first are kept, so ties go
to the lowest index. It shares no code with ``nm_mask`` (which ranks by pairwise comparison for
M <= 8 and by a stable torch sort above).
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsity_lab.masks import is_nm, kept_fraction, nm_mask

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def reference_nm_mask(weight: torch.Tensor, n: int, m: int, dim: int) -> torch.Tensor:
    """Keep the n largest |w| of each group of m along dim; ties to the lowest index."""
    moved = weight.abs().double().movedim(dim, -1).contiguous()
    flat = moved.reshape(-1, m).tolist()
    keep = []
    for group in flat:
        chosen = set(sorted(range(m), key=lambda i: (-group[i], i))[:n])
        keep.append([i in chosen for i in range(m)])
    return torch.tensor(keep, dtype=torch.bool).reshape(moved.shape).movedim(-1, dim)


@st.composite
def nm_cases(draw):
    m = draw(st.integers(1, 16))  # above 8 nm_mask switches from pairwise ranks to a sort
    n = draw(st.integers(1, m))
    ndim = draw(st.integers(1, 3))
    dim = draw(st.integers(-ndim, ndim - 1))
    shape = [draw(st.integers(1, 5)) for _ in range(ndim)]
    shape[dim] = m * draw(st.integers(1, 4))
    dtype = draw(st.sampled_from(DTYPES))
    ties = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    if ties:
        # few distinct magnitudes, random signs: many ties, including 0.0 against -0.0
        mags = torch.randint(0, 3, shape, generator=g).float()
        signs = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
        w = mags * signs
    else:
        w = torch.randn(shape, generator=g)
    return w.to(dtype), n, m, dim


@settings(max_examples=60, deadline=None)
@given(nm_cases())
def test_nm_mask_keeps_the_n_largest_ties_to_lowest_index(case):
    w, n, m, dim = case
    mask = nm_mask(w, n, m, dim=dim)
    assert mask.dtype == torch.bool and mask.shape == w.shape
    assert is_nm(mask, n, m, dim=dim)  # exactly n per group
    assert torch.equal(mask, reference_nm_mask(w, n, m, dim))


@settings(max_examples=30, deadline=None)
@given(nm_cases())
def test_nm_mask_on_views_equals_contiguous(case):
    w, n, m, dim = case
    # the same values in a bigger buffer with permuted strides, sliced: a non-contiguous view
    big = torch.cat([w, w], dim=dim).movedim(dim, 0).contiguous().movedim(0, dim)
    view = big.narrow(dim, w.shape[dim], w.shape[dim])
    assert torch.equal(view, w)
    assert torch.equal(nm_mask(view, n, m, dim=dim), nm_mask(view.contiguous(), n, m, dim=dim))


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_and_transposed_views(dtype):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(12, 40, generator=g).to(dtype)
    # transpose: the mask of W^T along dim 0 is the transpose of the mask of W along dim 1
    assert not w.T.is_contiguous()
    assert torch.equal(nm_mask(w.T, 2, 4, dim=0), nm_mask(w, 2, 4, dim=1).T)
    assert torch.equal(nm_mask(w.T, 2, 4, dim=0), nm_mask(w.T.contiguous(), 2, 4, dim=0))
    # step slicing along the masked dim and across it
    v = w[::3, ::2]
    assert not v.is_contiguous()
    assert torch.equal(nm_mask(v, 1, 4), nm_mask(v.contiguous(), 1, 4))
    assert torch.equal(nm_mask(v, 1, 4), reference_nm_mask(v, 1, 4, 1))
    # a broadcast (stride 0) view
    e = w[:1].expand(5, 40)
    assert torch.equal(nm_mask(e, 3, 8), nm_mask(e.contiguous(), 3, 8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_equals_fp32_on_the_same_values(dtype):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 64, generator=g).to(dtype)  # values exactly representable in fp32 too
    assert torch.equal(nm_mask(w), nm_mask(w.float()))


def test_ties_lowest_index_examples():
    w = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, -0.0, 0.0, 0.0], [-2.0, 1.0, 2.0, 2.0]])
    assert nm_mask(w).tolist() == [
        [True, True, False, False],
        [True, True, False, False],
        [True, False, True, False],
    ]


def test_n_equal_m_keeps_everything():
    w = torch.randn(3, 10)
    assert nm_mask(w, 5, 5).all()
    assert nm_mask(w, 1, 1).all()


def test_requires_grad_weight_is_fine():
    w = torch.randn(4, 8, requires_grad=True)
    mask = nm_mask(w)
    assert not mask.requires_grad and is_nm(mask)


def test_is_nm():
    w = torch.randn(8, 16)
    mask = nm_mask(w, 2, 4)
    assert is_nm(mask, 2, 4)
    assert is_nm(mask.int(), 2, 4)  # any 0/1 dtype
    assert not is_nm(mask, 2, 4, dim=0)  # row-wise 2:4 is not 2:4 down the columns (a.s.)
    fewer = mask.clone()
    fewer[0, fewer[0].nonzero()[0]] = False  # drop one kept entry
    assert not is_nm(fewer, 2, 4)
    assert is_nm(fewer, 2, 4, exact=False)
    more = mask.clone()
    more[0, (~more[0]).nonzero()[0]] = True  # add one
    assert not is_nm(more, 2, 4, exact=False)
    assert not is_nm(torch.ones(4, 6, dtype=torch.bool), 2, 4)  # 6 is not a multiple of 4


def test_kept_fraction():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(16, 32, generator=g)
    mask = nm_mask(w)
    expected = (w.abs() * mask).sum().double() / w.abs().sum().double()
    assert kept_fraction(w, mask) == pytest.approx(float(expected), rel=1e-6)
    assert kept_fraction(w, torch.ones_like(mask)) == pytest.approx(1.0)
    assert kept_fraction(w, torch.zeros_like(mask)) == 0.0
    assert kept_fraction(torch.ones(4, 8), nm_mask(torch.ones(4, 8))) == pytest.approx(0.5)
    # the N largest of each group: at least N/M of each group's mass
    assert kept_fraction(w, mask) >= 0.5


def test_kept_fraction_rejects_mismatched_or_degenerate_input():
    w = torch.randn(4, 8)
    with pytest.raises(ValueError, match="mask must be a tensor of weight's shape"):
        kept_fraction(w, torch.ones(8, dtype=torch.bool))  # would broadcast silently
    with pytest.raises(ValueError, match="all zeros"):
        kept_fraction(torch.zeros(4, 8), torch.ones(4, 8, dtype=torch.bool))
