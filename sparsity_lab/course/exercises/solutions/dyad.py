"""Worked solutions to the exercises of notebook 10 (DYAD)."""
import torch


def dyad_it_weight(blocks_a, blocks_b):
    n, b_in, b_out = blocks_a.shape
    # BD(A): block k of W (rows k*b_out..., columns k*b_in...) is A[k]^T (W is (out, in)).
    bd_a = torch.block_diag(*[blocks_a[k].T for k in range(n)])
    bd_b = torch.block_diag(*[blocks_b[k].T for k in range(n)])
    # P_in: the strided permutation. Block k of BD(B) reads inputs k, k+n, k+2n, ...: column c of
    # BD(B) (block k = c // b_in, position i = c % b_in) is input i*n + k.
    d_in = n * b_in
    perm = torch.tensor([(c % b_in) * n + c // b_in for c in range(d_in)])
    p_in = torch.zeros(d_in, d_in, dtype=blocks_a.dtype)
    p_in[torch.arange(d_in), perm] = 1.0  # (P_in x)[c] = x[perm[c]]
    return bd_a + bd_b @ p_in


def dyad_params(d_in, d_out, n_blocks, bias):
    return 2 * (d_in // n_blocks) * (d_out // n_blocks) * n_blocks + (d_out if bias else 0)


def product_fractions(method, n_blocks):
    return {"dense": {"forward": 1.0, "grad_input": 1.0, "grad_weight": 1.0},
            # dX = dZ S(W) uses the same sparse weight; dW = dZ^T X has no sparse operand
            "24": {"forward": 0.5, "grad_input": 0.5, "grad_weight": 1.0},
            "24_mvue": {"forward": 0.5, "grad_input": 0.5, "grad_weight": 0.5},
            "dyad": {name: 2 / n_blocks for name in ("forward", "grad_input", "grad_weight")}}[method]
