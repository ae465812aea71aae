"""The reference of CUTLASS's SM90 compressed layout (``sparsity_lab/references/cutlass_layout.py``) against
what CUTLASS's compressor wrote on the H200 (``benchmarks/cutlass_layout_dump.py``), and its own properties.

``tests/data/cutlass_layout_h200.npz`` is the small copy of that dump (``--small-copy``): every array of
two shapes, the random matrix of four more, and a SHA-256 of every array of all 13 shapes; the full dump
(3.7 MB) gave 343 of 343 arrays equal with ``python -m benchmarks.cutlass_layout_dump --check FILE``.
"""
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import cutlass_layout_dump as dump
from sparsity_lab.references import cutlass_layout as layout

FIXTURE = Path(__file__).parent / "data" / "cutlass_layout_h200.npz"
DTYPES = (torch.bfloat16, torch.float8_e4m3fn)


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def test_reference_reproduces_every_array_of_the_h200_dump():
    arrays = np.load(FIXTURE)
    verdicts = dump.check(arrays)
    assert len(verdicts) == 343  # every array of the full dump but the 13 inputs rand_a, each by bytes or hash
    differ = [label for label, verdict in verdicts.items() if verdict == "DIFFERS"]
    assert not differ, differ
    unchecked = {label for label, verdict in verdicts.items() if verdict.startswith("not checked")}
    with_rand = set(dump.SMALL_FULL) | set(dump.SMALL_RAND)
    # only the random pattern's arrays of the shapes whose rand_a the small copy leaves out (the large ones)
    assert all(label.split("/")[0] not in with_rand and label.split("/")[1].startswith(("rand_", "digit"))
               for label in unchecked), sorted(unchecked)
    assert sum(v == "equal" for v in verdicts.values()) >= 50 and len(unchecked) <= 45


def test_the_dump_holds_the_short_groups_whose_rule_the_reference_states():
    """The random matrices keep -0.0 in some kept slots, so groups with one and with no non-zero occur in
    the dump (their codes and +0.0 slots are then part of what the reference reproduced)."""
    arrays = np.load(FIXTURE)
    counts = []
    for key in dump.SMALL_FULL + dump.SMALL_RAND:
        _, _, c = layout.kept_columns(dump.rand_matrix(arrays, key))
        counts.append(c.reshape(-1))
    counts = torch.cat(counts)
    assert int((counts == 0).sum()) > 0 and int((counts == 1).sum()) > 100 and int((counts == 2).sum()) > 10000


def test_compressed_shape_is_what_the_library_reported():
    arrays = np.load(FIXTURE)
    keys = [name.split("/")[0] for name in arrays.files if name.endswith("/shape")]
    assert len(keys) == 13
    for key in keys:
        dtype, m, k = dump._parse_key(key)
        shape = layout.compressed_shape(m, k, dtype)
        assert [*shape.values, *shape.metadata, 1] == arrays[f"{key}/shape"][2:7].tolist(), key


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(64, 128), (1, 32), (65, 160), (200, 384)])
def test_nibble_index_is_one_to_one_and_leaves_only_the_padding(dtype, m, k):
    shape = layout.compressed_shape(m, k, dtype)
    index = layout.metadata_nibble_index(m, k, dtype).reshape(-1)
    assert index.unique().numel() == index.numel() and int(index.min()) >= 0
    assert int(index.max()) < 2 * shape.metadata_bytes
    # the padded extent (rows to 64, columns to 128) holds exactly the nibbles of the real groups and the padding
    padded = layout.metadata_nibble_index(shape.metadata[0], shape.metadata[1] * 8, dtype).reshape(-1)
    assert torch.equal(padded.sort().values, torch.arange(2 * shape.metadata_bytes))


@pytest.mark.parametrize("dtype", DTYPES)
def test_groups_with_fewer_than_two_non_zeros_follow_the_compressors_rule(dtype):
    rows = torch.tensor([[0.0, 0.0, 0.0, 3.0], [2.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1.5, 0.0], [0.0, 0.0, 0.0, 0.0],
                         [-0.0, 5.0, -0.0, -0.0], [-0.0, -0.0, -0.0, -0.0], [1.0, 0.0, -0.0, 2.0]])
    a = torch.cat([rows, torch.zeros(7, 28)], 1).to(dtype)
    i, j, counts = layout.kept_columns(a)
    assert i[:, 0].tolist() == [0, 0, 2, 0, 1, 0, 0] and j[:, 0].tolist() == [3, 3, 3, 0, 3, 0, 3]
    assert counts[:, 0].tolist() == [1, 1, 1, 0, 1, 0, 2]
    values, meta = layout.compress(a)
    pairs = values[:, :2].float()
    assert pairs.tolist() == [[0.0, 3.0], [2.0, 0.0], [-1.5, 0.0], [0.0, 0.0], [5.0, 0.0], [0.0, 0.0], [1.0, 2.0]]
    assert not torch.signbit(values.float()[values.float() == 0]).any()  # a -0.0 is never copied
    nib = layout.metadata_nibble_index(7, 32, dtype)[:, 0]
    nibbles = torch.stack([meta & 15, meta >> 4], -1).reshape(-1)
    assert nibbles[nib].tolist() == [12, 12, 14, 0, 13, 0, 12]


def _random_24(m, k, dtype, gen, short):
    """Random 2:4 along k with any of the six pairs, some kept entries 0 / -0.0 (``short``), both signs of zero
    where pruned, values spanning many binades (huge and tiny)."""
    groups = m * k // 4
    pairs = torch.tensor(dump.PAIRS)[torch.randint(0, 6, (groups,), generator=gen)]
    big = 1e4 if dtype == torch.bfloat16 else 400.0
    values = torch.randn(groups, 2, generator=gen) * torch.pow(torch.tensor(big), torch.rand(groups, 2, generator=gen)
                                                                 * 2 - 1)
    if short:
        values[torch.rand(groups, 2, generator=gen) < 0.3] = 0.0
        values[torch.rand(groups, 2, generator=gen) < 0.2] = -0.0
    w = torch.where(torch.rand(groups, 4, generator=gen) < 0.5, torch.tensor(-0.0), torch.tensor(0.0))
    idx = torch.arange(groups)
    w[idx, pairs[:, 0]] = values[:, 0]
    w[idx, pairs[:, 1]] = values[:, 1]
    return w.reshape(m, k).to(dtype)


@settings(max_examples=30, deadline=None)
@given(dtype=st.sampled_from(DTYPES), m=st.integers(1, 200), k_units=st.integers(1, 12), short=st.booleans(),
       transposed_view=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_decompress_inverts_compress(dtype, m, k_units, short, transposed_view, seed):
    """Odd m, k any multiple of the 16-byte rule; -0.0 comes back as +0.0 (the compressor's copy), all else bit
    for bit; any strides are read."""
    gen = torch.Generator().manual_seed(seed)
    k = k_units * layout.row_multiple(dtype)
    a = _random_24(m, k, dtype, gen, short)
    if transposed_view:
        a = a.t().contiguous().t()
    values, meta = layout.compress(a)
    shape = layout.compressed_shape(m, k, dtype)
    assert tuple(values.shape) == shape.values and values.dtype == dtype and meta.numel() == shape.metadata_bytes
    bits = a.view(torch.int16 if dtype == torch.bfloat16 else torch.uint8)
    sign_off = 0x7FFF if dtype == torch.bfloat16 else 0x7F
    expected = torch.where((bits.to(torch.int32) & sign_off) != 0, bits, torch.zeros_like(bits))
    assert torch.equal(_bytes(layout.decompress(values, meta, m, k)), _bytes(expected))
    # the padding of the metadata is zero
    used = torch.zeros(2 * shape.metadata_bytes, dtype=torch.bool)
    used[layout.metadata_nibble_index(m, k, dtype).reshape(-1)] = True
    nibbles = torch.stack([meta & 15, meta >> 4], -1).reshape(-1)
    assert not nibbles[~used].any()


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="dtype must be one of"):
        layout.compress(torch.zeros(64, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="multiple of 16"):
        layout.compress(torch.zeros(64, 72, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="multiple of 32"):
        layout.compressed_shape(64, 48, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="positive"):
        layout.compressed_shape(0, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="2-D"):
        layout.compress(torch.zeros(2, 64, 64, dtype=torch.bfloat16))
    three = torch.zeros(64, 64, dtype=torch.bfloat16)
    three[5, 4:7] = 1.0
    with pytest.raises(ValueError, match="more than 2 non-zeros"):
        layout.compress(three)
    values, meta = layout.compress(torch.zeros(64, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="values has shape"):
        layout.decompress(values[:, :16], meta, 64, 64)
    with pytest.raises(ValueError, match="uint8 bytes"):
        layout.decompress(values, meta[:-1], 64, 64)
    bad = meta.clone()
    bad[0] = 0x33  # (3, 0): not a code the compressor writes
    with pytest.raises(ValueError, match="not i \\| j << 2"):
        layout.decompress(values, bad, 64, 64)
