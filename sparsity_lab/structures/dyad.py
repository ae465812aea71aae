"""DYAD (Chandy et al. 2023): a block-sparse drop-in for ``nn.Linear``.

With ``n`` blocks, in = n * b_in and out = n * b_out. The weight is the sum of two block-diagonal
matrices, the second one seen through a strided permutation:

    y = BD(A) x  +  P_out BD(B) P_in x

* BD(A): block k maps input slice x[k*b_in:(k+1)*b_in] to output slice y[k*b_out:(k+1)*b_out].
* P_in (the strided input permutation) feeds block k the inputs x[k], x[k+n], x[k+2n], ...
* P_out (the strided output permutation) writes block k's j-th output to y[j*n + k].
Variants: DYAD-IT permutes the input of the second term (P_out = I), DYAD-OT its output
(P_in = I), DYAD-DT both. A and B are (n, b_in, b_out) tensors; each term is one batched matmul.
Parameters and FLOPs: 2 * out * in / n, i.e. 2/n of dense.
"""
from __future__ import annotations

import math

import torch
from torch import nn

VARIANTS = ("it", "ot", "dt")


class DyadLinear(nn.Module):
    """y = x W^T + b with W = BD(A) + P_out BD(B) P_in. Input (..., in), output (..., out)."""

    def __init__(self, in_features: int, out_features: int, n_blocks: int = 4, variant: str = "it",
                 bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        variant = variant.lower().removeprefix("dyad-")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {['dyad-' + v for v in VARIANTS]}, got {variant!r}")
        if isinstance(n_blocks, bool) or not isinstance(n_blocks, int) or n_blocks < 1:
            raise ValueError(f"n_blocks must be a positive int, got {n_blocks!r}")
        for name, size in (("in_features", in_features), ("out_features", out_features)):
            if size % n_blocks:
                raise ValueError(f"{name}={size} is not divisible by n_blocks={n_blocks}")
        self.in_features, self.out_features = in_features, out_features
        self.n_blocks, self.variant = n_blocks, variant
        b_in, b_out = in_features // n_blocks, out_features // n_blocks
        factory = {"device": device, "dtype": dtype}
        self.blocks_a = nn.Parameter(torch.empty(n_blocks, b_in, b_out, **factory))
        self.blocks_b = nn.Parameter(torch.empty(n_blocks, b_in, b_out, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Each output sums 2 * b_in inputs: the fan-in of nn.Linear's default init is 2 * b_in.
        bound = 1.0 / math.sqrt(2 * self.in_features // self.n_blocks)
        for p in (self.blocks_a, self.blocks_b):
            nn.init.uniform_(p, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    @property
    def permutes_input(self) -> bool:
        return self.variant in ("it", "dt")

    @property
    def permutes_output(self) -> bool:
        return self.variant in ("ot", "dt")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.n_blocks
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        t = x2.shape[0]
        contiguous_in = x2.view(t, n, -1).transpose(0, 1)  # (n, T, b_in): block k = x[k*b_in:...]
        strided_in = x2.view(t, -1, n).permute(2, 0, 1)  # (n, T, b_in): block k = x[k::n]
        y_a = torch.bmm(contiguous_in, self.blocks_a)  # (n, T, b_out)
        y_b = torch.bmm(strided_in if self.permutes_input else contiguous_in, self.blocks_b)
        y = y_a.transpose(0, 1).reshape(t, self.out_features)
        if self.permutes_output:
            y = y + y_b.permute(1, 2, 0).reshape(t, self.out_features)  # y[j*n + k] = block k, output j
        else:
            y = y + y_b.transpose(0, 1).reshape(t, self.out_features)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def dense_weight(self) -> torch.Tensor:
        """The (out, in) matrix this layer represents, built entry by entry from its blocks."""
        n, b_in, b_out = self.blocks_a.shape
        w = torch.zeros(self.out_features, self.in_features, dtype=self.blocks_a.dtype,
                        device=self.blocks_a.device)
        for k in range(n):
            for i in range(b_in):
                for j in range(b_out):
                    w[k * b_out + j, k * b_in + i] += self.blocks_a[k, i, j]
                    row = j * n + k if self.permutes_output else k * b_out + j
                    col = i * n + k if self.permutes_input else k * b_in + i
                    w[row, col] += self.blocks_b[k, i, j]
        return w

    @classmethod
    def from_linear(cls, linear: nn.Linear, n_blocks: int = 4, variant: str = "it") -> "DyadLinear":
        """A freshly initialised DYAD layer with the shape, device and dtype of ``linear``."""
        return cls(linear.in_features, linear.out_features, n_blocks, variant, bias=linear.bias is not None,
                   device=linear.weight.device, dtype=linear.weight.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"n_blocks={self.n_blocks}, variant=dyad-{self.variant}, bias={self.bias is not None}")


def dyadify(model: nn.Module, n_blocks: int = 4, variant: str = "it", select=None) -> nn.Module:
    """Replace the selected nn.Linear modules (default: FFN linears) by fresh DyadLinear layers, in place."""
    from ..sparsify import module_selector

    chosen = module_selector(select)
    targets = [(name, mod) for name, mod in model.named_modules() if type(mod) is nn.Linear and chosen(name, mod)]
    if not targets:
        raise ValueError(f"no nn.Linear matched select={select!r}")
    built = []
    for name, linear in targets:  # build all before swapping any: an error leaves the model intact
        try:
            built.append((name, DyadLinear.from_linear(linear, n_blocks, variant)))
        except ValueError as err:
            raise ValueError(f"cannot make {name!r} DYAD: {err}") from err
    for name, layer in built:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
    return model
