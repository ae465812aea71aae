"""Worked solutions: the compressed 2:4 format of notebook 14."""
from __future__ import annotations

import torch


def compress24(w):
    rows, cols = w.shape
    groups = w.reshape(rows, cols // 4, 4)
    nonzero = groups != 0
    # rank the columns: non-zeros first (stable, so in column order), then the zeros in column order
    order = torch.sort((~nonzero).to(torch.int8), dim=-1, stable=True).indices[..., :2]
    indices = order.sort(-1).values                      # the smaller column first
    values = groups.gather(-1, indices)
    return values.reshape(rows, cols // 2), indices.reshape(rows, cols // 2)


def decompress24(values, indices):
    rows, half = values.shape
    dense = torch.zeros(rows, half // 2, 4, dtype=values.dtype)
    dense.scatter_(-1, indices.reshape(rows, half // 2, 2).long(), values.reshape(rows, half // 2, 2))
    return dense.reshape(rows, 2 * half)
