"""Kernel 8 (compress a 2:4 matrix into cuSPARSELt's sm90 layout) against its reference, and the
reference against bytes that ``torch._cslt_compress`` wrote on the H100."""
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE

from sparsity_lab.references.cusparselt_layout import (CODES, compress24_reference, compressed_shape,
                                                     decompress24_reference,
                                                     fast_layout_problem, kept_pairs, metadata_nibble_index)
from sparsity_lab.kernels.compress24 import compress24
from sparsity_lab.masks.nm import nm_mask

FIXTURE = Path(__file__).parent / "data" / "cslt_compress_h100.npz"
DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)


def _pruned(rows, cols, dtype, gen, device=DEVICE, zeros=0.0):
    """A random 2:4 matrix; ``zeros`` is the fraction of kept entries set to 0 (groups with < 2 non-zeros)."""
    w = torch.randn(rows, cols, generator=gen)
    w = w * nm_mask(w, 2, 4)  # pruned entries are -0.0 where w < 0: both signs of zero occur
    if zeros:
        w = torch.where(torch.rand(rows, cols, generator=gen) < zeros, torch.zeros(()), w)
    return w.to(dtype).to(device)


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def test_reference_reproduces_the_h100_bytes():
    """The layout was mapped from dumps of _cslt_compress on the H100; these are five of them."""
    z = np.load(FIXTURE)
    keys = sorted({k.split("/")[0] for k in z.files})
    assert len(keys) == 5
    for key in keys:
        name, shape = key.rsplit("_", 1)
        rows, cols = map(int, shape.split("x"))
        dtype = getattr(torch, name)
        w = torch.from_numpy(z[f"{key}/rand_w"].reshape(-1).copy()).view(dtype).reshape(rows, cols)
        recorded = torch.from_numpy(z[f"{key}/rand_c"].reshape(-1).copy())
        assert torch.equal(_bytes(compress24_reference(w)), recorded), key
        assert torch.equal(_bytes(compress24(w.to(DEVICE))).cpu(), recorded), key


@pytest.mark.parametrize("dtype", DTYPES)
def test_nibble_index_is_a_permutation(dtype):
    idx = metadata_nibble_index(128, 256, dtype)
    assert torch.equal(idx.reshape(-1).sort().values, torch.arange(128 * 64))


def test_kept_pairs_codes_and_short_groups():
    a = torch.tensor([[1.0, 2, 0, 0, 0, 0, 3, 4, 0, -0.0, 0, 5, 0, 0, 0, 0, 0, 7, 0, 0, 6, 0, -0.0, 0]])
    i, j = kept_pairs(a)
    assert i.tolist() == [[0, 2, 0, 0, 1, 0]] and j.tolist() == [[1, 3, 3, 3, 3, 3]]
    assert {CODES[(int(p), int(q))] for p, q in zip(i[0], j[0])} <= set(CODES.values())


def test_pick_tables_hold_the_reference_rule_for_every_flag_pattern():
    """_pick looks the code up in two 32-bit tables indexed by the group's non-zero flags; each of the 16 nibbles
    is the code of kept_pairs' rule for that pattern (three and four non-zeros included: the rule is total)."""
    from sparsity_lab.kernels.compress24 import _PICK_CODES_HI, _PICK_CODES_LO

    table = int(_PICK_CODES_LO.value) | int(_PICK_CODES_HI.value) << 32
    flags = torch.tensor([[float((b >> k) & 1) for k in range(4)] for b in range(16)]).reshape(1, 64)
    i, j = kept_pairs(flags)
    for b in range(16):
        assert (table >> (4 * b)) & 0xF == int(i[0, b]) | int(j[0, b]) << 2, f"flags {b:04b}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_on_every_pattern_of_at_most_two_non_zeros_with_both_signs_of_zero(dtype):
    """Every group pattern compress24 accepts (11 sets of at most two non-zeros), each zero +0.0 or -0.0 at
    random, in every position of a 64-row tile: the kernel's table-driven pick writes the reference's bytes."""
    gen = torch.Generator().manual_seed(11)
    sets = [s for b in range(16) if bin(b).count("1") <= 2 for s in [[(b >> k) & 1 for k in range(4)]]]
    rows, cols = 64, 4 * 64
    pattern = torch.tensor(sets, dtype=torch.bool)[torch.randint(len(sets), (rows * cols // 4,), generator=gen)]
    values = torch.rand(rows * cols // 4, 4, generator=gen) + 0.5
    signs = torch.where(torch.rand(rows * cols // 4, 4, generator=gen) < 0.5, -1.0, 1.0)
    a = torch.where(pattern, values, torch.zeros(())) * signs  # unkept entries: +0.0 or -0.0
    a = a.reshape(rows, cols).to(dtype).to(DEVICE)
    assert _bytes(compress24(a)).equal(_bytes(compress24_reference(a)))


@settings(max_examples=20, deadline=None)
@given(row_tiles=st.integers(1, 3), col_blocks=st.integers(1, 5), dtype=st.sampled_from(DTYPES),
       transposed=st.booleans(), zeros=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**31 - 1))
def test_kernel_equals_reference_on_fresh_inputs(row_tiles, col_blocks, dtype, transposed, zeros, seed):
    gen = torch.Generator().manual_seed(seed)
    rows, cols = 64 * row_tiles, 64 * col_blocks
    a = _pruned(rows, cols, dtype, gen, zeros=zeros)
    if transposed:  # the same matrix stored column-major: the kernel reads the strided view
        a = a.t().contiguous().t()
    out = compress24(a)
    assert out.shape == compressed_shape(rows, cols, dtype) and out.dtype == dtype
    assert torch.equal(_bytes(out), _bytes(compress24_reference(a)))
    assert bool((decompress24_reference(out, rows, cols).float() == a.float()).all())


@pytest.mark.parametrize("block_groups", [8, 16, 32])
def test_every_block_size_writes_the_same_bytes(block_groups):
    a = _pruned(64, 128, torch.bfloat16, torch.Generator().manual_seed(1))
    assert torch.equal(_bytes(compress24(a, block_groups=block_groups)), _bytes(compress24_reference(a)))


def test_bad_inputs_are_refused_with_the_reason():
    a = _pruned(64, 128, torch.bfloat16, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="rows a multiple of 64"):
        compress24(a[:48])
    with pytest.raises(ValueError, match="cols a multiple of 64"):
        compress24(_pruned(64, 96, torch.float8_e4m3fn, torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="cols a multiple of 64"):  # 16-bit too: _cslt_compress pads 1056
        compress24(_pruned(64, 96, torch.bfloat16, torch.Generator().manual_seed(0)))
    with pytest.raises(TypeError, match="dtype"):
        compress24(a.float())
    with pytest.raises(ValueError, match="2-D"):
        compress24(a[None])
    with pytest.raises(ValueError, match="more than 2 non-zeros"):
        compress24(torch.ones(64, 128, dtype=torch.bfloat16, device=DEVICE), check=True)
    with pytest.raises(ValueError, match="block_groups"):
        compress24(a, block_groups=12)
    assert fast_layout_problem(64, 128, torch.float32) is not None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_bit_for_bit_equal_to_cslt_compress_on_gpu(dtype):
    """Pruned entries +0.0 and exactly two non-zeros per group: the bytes must be identical."""
    gen = torch.Generator().manual_seed(3)
    for rows, cols in ((64, 64), (128, 256), (1024, 1024), (4096, 1088), (320, 16384)):
        a = _pruned(rows, cols, torch.float32, gen, device="cuda")
        a = torch.where(a == 0, torch.zeros(()).cuda(), a).to(dtype)  # every zero +0.0
        ours, theirs = _bytes(compress24(a)), _bytes(torch._cslt_compress(a))
        assert ours.numel() == theirs.numel(), (rows, cols, ours.numel(), theirs.numel())
        assert torch.equal(ours, theirs), (rows, cols, int((ours != theirs).sum()))
        assert torch.equal(_bytes(compress24(a.t().contiguous().t())), theirs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_same_matrix_as_cslt_compress_with_signed_zeros_and_short_groups_on_gpu(dtype):
    """-0.0 at pruned places (what w * mask leaves for w < 0) and groups with < 2 non-zeros: ours
    must stand for exactly ``a``; cuSPARSELt's bytes may name other columns for zero values."""
    gen = torch.Generator().manual_seed(5)
    for rows, cols in ((128, 256), (1024, 1088)):
        for zeros in (0.0, 0.3):
            a = _pruned(rows, cols, dtype, gen, device="cuda", zeros=zeros)  # -0.0 where w < 0 was pruned
            ours = decompress24_reference(compress24(a), rows, cols).float()
            assert bool((ours == a.float()).all()), (rows, cols, zeros)
            theirs = torch._cslt_compress(a)
            same = torch.equal(_bytes(compress24(a)), _bytes(theirs))
            theirs_ok = bool((decompress24_reference(theirs, rows, cols).float() == a.float()).all())
            print(f"{dtype} {rows}x{cols} zeros {zeros}: bytes equal {same}, cuSPARSELt's stands for a: {theirs_ok}")


@pytest.mark.gpu
def test_products_with_the_fast_compressed_operand_on_gpu():
    gen = torch.Generator().manual_seed(4)
    a = _pruned(1024, 2048, torch.bfloat16, gen, device="cuda")
    b = torch.randn(2048, 512, device="cuda").to(torch.bfloat16)
    out = torch._cslt_sparse_mm(compress24(a), b)
    ref = a.float() @ b.float()
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
