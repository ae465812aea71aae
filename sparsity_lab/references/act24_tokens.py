"""Weight gradients of 2:4 activations, made 2:4 along the *token* dimension (plain PyTorch reference).

With 2:4 activations (``references.act24``) the two weight gradients of the FFN sum over the tokens:

    dW2 = dY^T A24        (d, h)      A24 (tokens, h) is 2:4 along h, not along the tokens
    dW1 = dH^T x          (h, d)      dH  (tokens, h) likewise

A sparse tensor-core product needs its structured operand 2:4 along the summed dimension, here the
tokens. Haziza et al. 2025 (https://arxiv.org/abs/2503.16672) re-sparsify the activation along the
tokens for these two products (per public summaries of the paper; written here from that idea):

* a few hidden features are active for most tokens; pruning them along the tokens would drop much of
  their mass, so the ``dense_count`` features with the most non-zeros in the batch (the set D) keep
  an exact dense product;
* the other features (S) are mostly zeros (squared ReLU), so keeping the 2 largest |values| of every
  group of 4 *tokens* drops little; the tokens are first shuffled by a permutation P so that a group
  of 4 is not 4 neighbouring (correlated) positions of one sequence.

One function covers both products. For A (tokens, h) (A24 or dH), G (tokens, k) (dY or x), a
permutation P of the tokens and D (|D| = ``dense_count``), S = the other columns:

    C[D] = A[:, D]^T G                                  (|D|, k)  exact
    B    = top2of4_tokens(A[P][:, S])                   (tokens, |S|) 2 of every 4 permuted tokens kept
    C[S] = B^T G[P]                                     (|S|, k)  the sparse product (sums over tokens)

and C (h, k) approximates A^T G, i.e. dW1 = C(dH, x) and dW2 = C(A24, dY)^T. Groups of 4 are taken
along the permuted tokens; a last, incomplete group is padded with zeros. ``top2of4_tokens`` keeps the
2 largest |values| of each group with the project's tie rule (ties to the lowest permuted position, a
NaN ranks first: ``references.act24.top2of4_mask``). D: the columns sorted by their count of
non-zeros, descending, ties to the lowest column index (a stable sort); the first ``dense_count``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .act24 import GROUP, top2of4_mask


def dense_feature_count(hidden: int, dense_fraction: float, multiple: int = 1) -> int:
    """|D| = ceil(dense_fraction * hidden), rounded up so that the sparse part |S| = hidden - |D| is a
    multiple of ``multiple`` (cuSPARSELt's compressed tiles need |S| % 64 == 0), at most ``hidden``."""
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise ValueError(f"hidden must be a positive int, got {hidden!r}")
    check_dense_fraction(dense_fraction)
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ValueError(f"multiple must be a positive int, got {multiple!r}")
    count = math.ceil(dense_fraction * hidden - 1e-9)  # 0.05 * 100 is 5.000000000000001 in floats
    sparse = (hidden - count) // multiple * multiple
    return hidden - sparse


def check_dense_fraction(dense_fraction: float) -> None:
    if isinstance(dense_fraction, bool) or not isinstance(dense_fraction, (int, float)) \
            or not 0.0 <= dense_fraction <= 1.0:
        raise ValueError(f"dense_fraction must be a number in [0, 1] (the share of hidden features kept dense), "
                         f"got {dense_fraction!r}")


def dense_features(a: torch.Tensor, dense_count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(D, S): the ``dense_count`` columns of a (tokens, h) with the most non-zeros (ties to the lowest
    column index), and the other columns; both int64 index vectors in increasing order."""
    _check_matrix(a, "a")
    hidden = a.shape[1]
    if isinstance(dense_count, bool) or not isinstance(dense_count, int) or not 0 <= dense_count <= hidden:
        raise ValueError(f"dense_count must be an int in [0, {hidden}] (a's hidden width), got {dense_count!r}")
    counts = (a.detach() != 0).sum(0)
    order = torch.sort(counts, descending=True, stable=True).indices
    # sorts of known sizes: no host-device synchronisation on a GPU
    return torch.sort(order[:dense_count]).values, torch.sort(order[dense_count:]).values


def top2of4_tokens_mask(b: torch.Tensor) -> torch.Tensor:
    """bool (tokens, f): the 2 largest |b| of every 4 consecutive rows (tokens) of each column.

    b: (tokens, f), any token count: a last incomplete group is padded with zeros (which are kept only
    where the real entries are fewer than two or tie with them: it changes no value). Ties to the
    lowest row, NaN ranks first, as ``references.act24.top2of4_mask`` along rows.
    """
    _check_matrix(b, "b", min_features=0)  # no sparse feature (all dense): an empty mask
    tokens = b.shape[0]
    if b.shape[1] == 0:
        return torch.zeros(b.shape, dtype=torch.bool, device=b.device)
    padded = F.pad(b.detach().t(), (0, -tokens % GROUP))  # (f, tokens rounded up to 4): groups along the rows
    return top2of4_mask(padded)[:, :tokens].t()


def check_permutation(perm: torch.Tensor, tokens: int, name: str = "perm") -> None:
    """perm must be a 1-D integer tensor holding each of 0 .. tokens - 1 once."""
    if not isinstance(perm, torch.Tensor) or perm.dim() != 1 or perm.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be a 1-D int32/int64 tensor (a permutation of the tokens), got "
                        f"{type(perm).__name__} {getattr(perm, 'dtype', '')} {tuple(getattr(perm, 'shape', ()))}")
    if perm.numel() != tokens or not torch.equal(torch.sort(perm).values.cpu(), torch.arange(tokens, dtype=perm.dtype)):
        raise ValueError(f"{name} must be a permutation of range({tokens}) (the tokens), got {perm.numel()} "
                         "entries that are not each token once")


def tokens24_kept(a: torch.Tensor, perm: torch.Tensor, dense_count: int) -> torch.Tensor:
    """What the approximate product reads of a (tokens, h), in the original token order: the columns D
    unchanged, the columns S with 2 of every 4 permuted tokens kept (zeros elsewhere)."""
    _check_matrix(a, "a")
    check_permutation(perm, a.shape[0])
    dense, sparse = dense_features(a, dense_count)
    perm = perm.to(a.device)
    b = a[perm][:, sparse]
    kept = torch.zeros_like(a)
    kept[:, dense] = a[:, dense]
    kept[perm[:, None], sparse[None, :]] = b * top2of4_tokens_mask(b)
    return kept


def tokens24_weight_grad(a: torch.Tensor, g: torch.Tensor, perm: torch.Tensor, dense_count: int) -> torch.Tensor:
    """C (h, k) ~ A^T G: exact on the dense features D, 2:4 along permuted tokens on the others.

    a: (tokens, h) A24 or dH; g: (tokens, k) dY or x, a's dtype and device; perm: (tokens,) a
    permutation of the tokens; dense_count: |D| (``dense_feature_count``). The products run in a's dtype
    (as the dense ``a.t() @ g``). dW1 = C(dH, x); dW2 = C(A24, dY)^T. ``dense_count = h`` gives the exact
    product; C equals A^T G (up to the order of the sums) when every group of 4 permuted tokens of the
    columns S already has at most 2 non-zeros.
    """
    _check_matrix(a, "a")
    _check_matrix(g, "g")
    if g.shape[0] != a.shape[0] or g.dtype != a.dtype or g.device != a.device:
        raise ValueError(f"g must have a's token count, dtype and device: a {tuple(a.shape)} {a.dtype} {a.device}, "
                         f"g {tuple(g.shape)} {g.dtype} {g.device}")
    check_permutation(perm, a.shape[0])
    dense, sparse = dense_features(a, dense_count)
    out = torch.empty(a.shape[1], g.shape[1], dtype=a.dtype, device=a.device)
    out[dense] = a[:, dense].t() @ g                              # C[D] = A[:, D]^T G, exact
    perm = perm.to(a.device)
    b = a[perm][:, sparse]                                        # A[P][:, S]  (tokens, |S|)
    out[sparse] = (b * top2of4_tokens_mask(b)).t() @ g[perm]      # C[S] = top2of4_tokens(B)^T G[P]
    return out


def tokens24_dropped(a: torch.Tensor, perm: torch.Tensor, dense_count: int) -> dict[str, float]:
    """How much of a (tokens, h) the token-dimension 2:4 drops: ``mass_fraction`` = ||A - kept||^2 /
    ||A||^2 (0 for an all-zero A), ``count_fraction`` = dropped non-zeros / non-zeros of A (0 when none),
    and ``dropped`` / ``nonzeros`` the counts themselves."""
    kept = tokens24_kept(a, perm, dense_count)
    af = a.detach().double()
    dropped = af - kept.double()
    total = float((af * af).sum())
    nonzeros = int((af != 0).sum())
    lost = int((dropped != 0).sum())
    return {"mass_fraction": float((dropped * dropped).sum()) / total if total > 0 else 0.0,
            "count_fraction": lost / nonzeros if nonzeros else 0.0,
            "dropped": lost, "nonzeros": nonzeros}


def _check_matrix(x, name: str, min_features: int = 1) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {type(x).__name__} {getattr(x, 'dtype', '')}")
    if x.dim() != 2 or x.shape[0] < 1 or x.shape[1] < min_features:
        raise ValueError(f"{name} must be a non-empty 2-D (tokens, features) tensor, got shape {tuple(x.shape)}")
