"""Property tests of every mask solver and nm_mask on adversarial magnitudes (tests/_adversarial.py).

Validity always (exactly N per row and column of each tile for the exact solvers, at most N for
the greedy ones, exactly N per group for nm_mask, also on NaN/Inf input with check=False).
Optimality against brute force for the exact solvers, within the resolution each one states
(sparsity_lab/masks/flow.py's docstring): kept mass >= optimum - c * (the tile's max |w|).
nm_mask is compared with a sorted-list reference exactly. The greedy solvers against their
stated guarantees. CI: a small derandomized count; SPARSITY_LAB_FULL_PROPERTIES=1: 20x more.
"""
import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from _adversarial import adversarial, examples, non_finite
from sparsity_lab.masks import is_nm, is_transposable, nm_mask, transposable_mask
from sparsity_lab.masks.flow import COST_LEVELS
from sparsity_lab.masks.patterns import transposable_patterns
from sparsity_lab.masks.tiles import to_tiles

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# resolution c of each exact solver, relative to the tile's max |w| (see the solvers' docstrings)
RESOLUTION = {"patterns": {torch.float64: 1e-13, None: 2e-5}, "flow": {None: 2 * 4 / COST_LEVELS + 1e-12},
              "lp": {None: 2e-6}}

_EXACT_PATTERNS = transposable_patterns(2, 4).reshape(90, 16).tolist()
# every 4x4 0/1 matrix with at most 2 ones per row and column (the greedy solvers' feasible set)
_AT_MOST = [bits for bits in itertools.product((0, 1), repeat=16)
            if all(sum(bits[4 * r:4 * r + 4]) <= 2 for r in range(4)) and all(sum(bits[c::4]) <= 2 for c in range(4))]


def _tiles(w: torch.Tensor) -> list[list[float]]:
    """|w| per 4x4 tile, each tile times a power of two bringing its max to [0.5, 1) (exact; sums of
    float64 values near the maximum would overflow otherwise)."""
    tiles = []
    for tile in to_tiles(w.detach().abs().double(), 4).reshape(-1, 16).tolist():
        shift = -math.frexp(max(tile))[1]
        tiles.append([math.ldexp(v, shift) for v in tile])
    return tiles


def _best(tile: list[float], patterns) -> float:
    return max(math.fsum(v for v, k in zip(tile, p) if k) for p in patterns)


def _kept(tile, keep) -> float:
    return math.fsum(v for v, k in zip(tile, keep) if k)


shapes = st.sampled_from([(4, 4), (4, 8), (8, 4), (8, 8)])


@pytest.mark.parametrize("solver", ["patterns", "flow", "lp"])
@given(data=st.data())
@examples(40)
def test_exact_solvers_valid_and_optimal(solver, data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    w = data.draw(adversarial(data.draw(shapes, label="shape"), dtype), label="w")
    mask = transposable_mask(w, 2, 4, solver=solver)
    assert mask.dtype == torch.bool and mask.shape == w.shape
    assert is_transposable(mask, 2, 4)
    res = RESOLUTION[solver]
    c = res.get(dtype, res[None])
    for k, (tile, keep) in enumerate(zip(_tiles(w), to_tiles(mask, 4).reshape(-1, 16).tolist())):
        best, got = _best(tile, _EXACT_PATTERNS), _kept(tile, keep)
        assert got >= best - c * max(tile), f"tile {k}: kept {got!r}, optimum {best!r}, tile {tile}"


@pytest.mark.parametrize("solver", ["greedy", "greedy_prune"])
@given(data=st.data())
@examples(40)
def test_greedy_solvers_valid_and_within_their_guarantee(solver, data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    w = data.draw(adversarial(data.draw(shapes, label="shape"), dtype), label="w")
    mask = transposable_mask(w, 2, 4, solver=solver)
    assert is_transposable(mask, 2, 4, exact=False)
    for tile, keep in zip(_tiles(w), to_tiles(mask, 4).reshape(-1, 16).tolist()):
        best, got = _best(tile, _AT_MOST), _kept(tile, keep)
        if solver == "greedy":  # keeps at least half of the best "at most 2" mass
            assert got >= 0.5 * best * (1 - 1e-12)
        else:  # Hubara et al.'s 2-approximation of the pruned mass (summed directly: no cancellation)
            pruned = math.fsum(v for v, k in zip(tile, keep) if not k)
            least = min(math.fsum(v for v, k in zip(tile, p) if not k) for p in _AT_MOST)
            assert pruned <= 2 * least * (1 + 1e-12)


def _reference_nm(w: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Keep the n largest |w| of each group of m along the last dim, ties to the lowest index."""
    a = w.detach().abs().double().reshape(-1, m).tolist()
    keep = [[i in sorted(range(m), key=lambda j: (-g[j], j))[:n] for i in range(m)] for g in a]
    return torch.tensor(keep).reshape(w.shape)


@given(data=st.data())
@examples(60)
def test_nm_mask_is_the_reference_top_n(data):
    n, m = data.draw(st.sampled_from([(2, 4), (1, 4), (3, 4), (2, 8), (5, 16)]), label="n:m")
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    w = data.draw(adversarial((data.draw(st.integers(1, 3)), m * data.draw(st.integers(1, 3))), dtype), label="w")
    mask = nm_mask(w, n, m)
    assert is_nm(mask, n, m)
    assert torch.equal(mask, _reference_nm(w, n, m))
    # the same along dim 0
    assert torch.equal(nm_mask(w.t().contiguous(), n, m, dim=0), mask.t())


@given(data=st.data())
@examples(40)
def test_masks_stay_valid_on_non_finite_input(data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    w = data.draw(non_finite(data.draw(shapes, label="shape"), dtype), label="w")
    for n, m in ((2, 4), (1, 4)):
        assert is_nm(nm_mask(w, n, m, dim=1, check=False), n, m, dim=1)
    for solver in ("patterns", "flow", "lp"):
        assert is_transposable(transposable_mask(w, 2, 4, solver=solver, check=False), 2, 4)
    for solver in ("greedy", "greedy_prune"):
        assert is_transposable(transposable_mask(w, 2, 4, solver=solver, check=False), 2, 4, exact=False)


@given(data=st.data())
@examples(8)
def test_triton_mask_kernels_on_adversarial_input(data):
    kernels = pytest.importorskip("sparsity_lab.kernels")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: the interpreter
    dtype = data.draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]), label="dtype")
    finite = data.draw(st.booleans(), label="finite")
    shape = data.draw(shapes, label="shape")
    w = data.draw(adversarial(shape, dtype) if finite else non_finite(shape, dtype), label="w")
    if device.type == "cpu" and dtype == torch.bfloat16:
        # Triton's interpreter converts bfloat16 subnormals to float32 wrongly (9.2e-41 -> 0,
        # 1.0e-39 -> 4.4e-39, seen with a plain load/convert/store kernel); a GPU converts exactly
        w = torch.where(w.abs() < torch.finfo(dtype).smallest_normal, torch.zeros_like(w), w)
    _, bits = kernels.prune24(w.to(device), values=False)
    rowwise = kernels.unpack_mask24(bits).cpu()
    assert torch.equal(rowwise, nm_mask(w, 2, 4, check=False)), "the kernel ranks like the reference"
    mask = kernels.transposable_mask24(w.to(device), pruned=False)[0].cpu()
    assert is_transposable(mask, 2, 4)
    if finite:
        for tile, keep in zip(_tiles(w), to_tiles(mask, 4).reshape(-1, 16).tolist()):
            assert _kept(tile, keep) >= _best(tile, _EXACT_PATTERNS) - 2e-5 * max(tile)
