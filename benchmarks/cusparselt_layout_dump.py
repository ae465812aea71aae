"""Dump ``torch._cslt_compress`` outputs for known 2:4 patterns, to map its layout offline.

``python -m benchmarks.cusparselt_layout_dump --out $OUT/layout.npz`` on a GPU with
cuSPARSELt. For each dtype and shape it stores (as raw bytes):

* ``rand``: a random 2:4 matrix (random kept pairs, random values) and its compressed form, to check
  a decoded layout against;
* ``plane{b}``: the metadata region of the compressed form of a matrix whose group ``i`` (row-major
  group index, 4 consecutive columns) keeps columns (2, 3) when bit ``b`` of ``i`` is set and (0, 1)
  otherwise: across the planes, each metadata bit that belongs to a group spells that group's index;
* ``pair{ab}``: the metadata region when every group keeps columns (a, b): the code of each pattern.

The analysis (decoding the layout) runs on any machine from the npz: ``sparsity_lab.backends.
cusparselt_layout``.
"""
from __future__ import annotations

import argparse
import math

import numpy as np
import torch

PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
SHAPES = {
    torch.bfloat16: ((32, 64), (64, 128), (48, 80), (128, 256), (256, 512), (1024, 1024), (2048, 512)),
    torch.float16: ((64, 128), (256, 512)),
    torch.float8_e4m3fn: ((32, 64), (64, 128), (96, 160), (256, 512), (1024, 1024)),
}


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).cpu().numpy()


def _from_pairs(first: torch.Tensor, second: torch.Tensor, values: torch.Tensor, rows: int, cols: int, dtype):
    """Matrix with group i keeping columns (first[i], second[i]) with the given values (rows*cols/4, 2)."""
    w = torch.zeros(rows * cols // 4, 4, device="cuda")
    idx = torch.arange(w.shape[0], device="cuda")
    w[idx, first] = values[:, 0]
    w[idx, second] = values[:, 1]
    return w.reshape(rows, cols).to(dtype)


def dump(dtype: torch.dtype, rows: int, cols: int, out: dict) -> None:
    key = f"{str(dtype).replace('torch.', '')}_{rows}x{cols}"
    groups = rows * cols // 4
    nv_bytes = rows * cols // 2 * torch.empty(0, dtype=dtype).element_size()
    gen = torch.Generator(device="cuda").manual_seed(rows * 7 + cols)
    pair_ids = torch.randint(0, 6, (groups,), device="cuda", generator=gen)
    table = torch.tensor(PAIRS, device="cuda")
    vals = (torch.rand(groups, 2, device="cuda", generator=gen) + 0.5) * torch.where(
        torch.rand(groups, 2, device="cuda", generator=gen) < 0.5, -1.0, 1.0)
    w = _from_pairs(table[pair_ids, 0], table[pair_ids, 1], vals, rows, cols, dtype)
    c = torch._cslt_compress(w)
    out[f"{key}/rand_w"] = _bytes(w)
    out[f"{key}/rand_c"] = _bytes(c)
    ones = torch.ones(groups, 2, device="cuda")
    idx = torch.arange(groups, device="cuda")
    for b in range(max(1, math.ceil(math.log2(groups)))):
        bit = ((idx >> b) & 1).bool()
        first = torch.where(bit, 2, 0)
        cb = torch._cslt_compress(_from_pairs(first, first + 1, ones, rows, cols, dtype))
        out[f"{key}/plane{b}"] = _bytes(cb)[nv_bytes:]
    for a, b_ in PAIRS:
        full = torch.full((groups,), a, device="cuda")
        cp = torch._cslt_compress(_from_pairs(full, torch.full_like(full, b_), ones, rows, cols, dtype))
        out[f"{key}/pair{a}{b_}"] = _bytes(cp)[nv_bytes:]
    # two compressions of the same matrix: bits that differ are not data (e.g. uninitialised padding)
    out[f"{key}/rand_c_again"] = _bytes(torch._cslt_compress(w.clone()))
    print(f"{key}: compressed {c.numel()} elements ({c.numel() * c.element_size()} bytes), "
          f"values {nv_bytes} bytes", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out: dict = {}
    for dtype, shapes in SHAPES.items():
        for rows, cols in shapes:
            try:
                dump(dtype, rows, cols, out)
            except Exception as err:  # record and go on: one dtype failing must not lose the rest
                print(f"{dtype} {rows}x{cols}: {type(err).__name__}: {err}", flush=True)
    np.savez_compressed(args.out, **out)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
