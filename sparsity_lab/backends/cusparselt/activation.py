"""The 2:4 activation products on cuSPARSELt: the activation is the sparse operand (``Backend``'s
``act24_linear``, ``act24_grad``, ``act24_grad_input`` and ``tokens24_weight_grad``).

A24 and dH are produced compressed by the Triton kernels ``kernels/act24.py`` and
``kernels/act24_backward.py`` (activation, selection and cuSPARSELt's layout in one pass) and
multiplied through cuSPARSELt with the activation on the left: cuSPARSELt's structured operand A of
D = A @ B is 2:4 along its rows, i.e. along the summed dimension, which for y = A24 W2^T and
dx = dH W1 is exactly the hidden dimension. For the token-dimension weight gradients the pruned
features of A are gathered, pruned along the permuted tokens and compressed in one pass
(``kernels/prune24_tokens.py``).

Tokens that are not a multiple of 64 are padded with zero rows (zero H gives zero A24 and dH); the
hidden width must be a multiple of 64. Algorithms: searched and checked once per product shape
(``algorithms.AlgorithmCache``, the backend's).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .algorithms import AlgorithmCache, ProductKey

TILE = 64  # the Triton kernels take whole 64 x 64 tiles of (tokens, hidden)


def _pad_tokens(x: torch.Tensor) -> torch.Tensor:
    extra = -x.shape[0] % TILE
    return x if extra == 0 else F.pad(x, (0, 0, 0, extra))


class ActivationProducts:
    """The activation products of one :class:`~.backend.CusparseltBackend` (its ops and algorithm cache)."""

    def __init__(self, ops, algorithms: AlgorithmCache) -> None:
        import sparsity_lab.kernels as kernels  # triton: imported only when an activation product is about to run
        self.ops, self.algorithms = ops, algorithms
        self._forward_kernel, self._backward_kernel = kernels.act24, kernels.act24_backward
        self._tokens_kernel = kernels.prune24_tokens

    def _mm(self, compressed: torch.Tensor, b: torch.Tensor, m: int) -> torch.Tensor:
        k, n = b.shape
        key = ProductKey(m, k, n, b.dtype, not b.is_contiguous(), False)
        return self.ops.mm(compressed, b, None, False, self.algorithms.get(key, b.device))

    def linear(self, h: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = h.shape[0]
        hp = _pad_tokens(h)
        compressed, a24 = self._forward_kernel(hp, out_dtype=h.dtype, dense=True)
        y = self._mm(compressed, weight.t(), hp.shape[0])  # A24 (tokens, hidden) @ W^T (hidden, out)
        return y[:tokens], a24[:tokens]

    def grad(self, h: torch.Tensor, grad_a24: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        tokens = h.shape[0]
        compressed, dh = self._backward_kernel(_pad_tokens(h), _pad_tokens(grad_a24), out_dtype=h.dtype, dense=True)
        return dh[:tokens], (compressed, dh.shape[0], tokens)

    def grad_input(self, operand: tuple, weight: torch.Tensor) -> torch.Tensor:
        compressed, rows, tokens = operand
        return self._mm(compressed, weight.contiguous(), rows)[:tokens]  # dH (tokens, hidden) @ W (hidden, d)

    def tokens24_weight_grad(self, a: torch.Tensor, g: torch.Tensor, perm: torch.Tensor,
                             dense_count: int) -> torch.Tensor:
        """C (hidden, k) ~ A^T G (``references.act24_tokens``): the dense features D by a dense product; the
        others by cuSPARSELt with B^T = top2of4_tokens(A[P][:, S])^T (|S|, tokens) gathered, pruned and
        compressed in one pass (``kernels/prune24_tokens.py``) times G[P] (tokens padded to 64 with zeros)."""
        from ...references.act24_tokens import dense_features
        dense, sparse = dense_features(a, dense_count)
        out = torch.empty(a.shape[1], g.shape[1], dtype=a.dtype, device=a.device)
        if dense.numel():
            out[dense] = a[:, dense].t() @ g
        if sparse.numel():
            compressed = self._tokens_kernel(a, perm, sparse)
            out[sparse] = self._mm(compressed, _pad_tokens(g[perm]), sparse.numel())
        return out
