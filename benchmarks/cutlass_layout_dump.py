"""Dump CUTLASS's SM90 compressor outputs (``backends/cutlass/ops.compress``) for known 2:4 patterns.

``python -m benchmarks.cutlass_layout_dump --out $OUT/cutlass_layout.npz`` on a Hopper GPU with the
CUTLASS backend built. For each dtype and shape (m, k) it stores, as raw bytes:

* ``rand_a``, ``rand_values``, ``rand_meta``: a random 2:4 matrix (random kept pairs, random
  values, some kept entries -0.0) and its compressed values and metadata, to check a layout against;
* ``plane{b}_meta``: the metadata of a matrix whose group ``i`` (row-major group index, 4 consecutive
  columns) keeps columns (2, 3) when bit ``b`` of ``i`` is set and (0, 1) otherwise: across the
  planes, each metadata bit that belongs to a group spells that group's index;
* ``pair{ab}_meta``: the metadata when every group keeps columns (a, b): the code of each pattern;
* ``digit{j}_values``: the compressed values of the ``rand`` pattern whose group ``g`` keeps
  ``(d + 1, -(d + 1))``, d the base-16 digit j of g: across the digits, each value spells its group;
* ``shape``: m, k and the compressed shape the library reports (values m, k; metadata m, k; bytes
  per metadata element; compressor workspace).

The analysis runs on any machine from the npz: ``sparsity_lab.references.cutlass_layout``.
"""
from __future__ import annotations

import argparse
import ctypes

import numpy as np
import torch

PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
SHAPES = {
    torch.bfloat16: ((64, 64), (128, 128), (64, 256), (128, 512), (256, 128), (192, 320), (1024, 1024)),
    torch.float8_e4m3fn: ((64, 128), (128, 128), (128, 256), (256, 512), (192, 384), (1024, 1024)),
}


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).cpu().numpy()


def _from_pairs(first, second, values, rows: int, cols: int, dtype) -> torch.Tensor:
    """Matrix whose group i keeps columns (first[i], second[i]) with values (rows*cols/4, 2)."""
    w = torch.zeros(rows * cols // 4, 4, device="cuda")
    idx = torch.arange(w.shape[0], device="cuda")
    w[idx, first] = values[:, 0]
    w[idx, second] = values[:, 1]
    return w.reshape(rows, cols).to(dtype)


def dump(dtype: torch.dtype, rows: int, cols: int, out: dict) -> None:
    from sparsity_lab.backends.cutlass import ops

    key = f"{str(dtype).replace('torch.', '')}_{rows}x{cols}"
    groups = rows * cols // 4
    lib = ops.library()
    sizes = (ctypes.c_int64 * 6)()
    lib.lib.sl_cutlass_compressed_shape(ops.DTYPE_CODES[dtype], rows, cols, sizes)
    out[f"{key}/shape"] = np.array([rows, cols, *list(sizes)], dtype=np.int64)
    gen = torch.Generator(device="cuda").manual_seed(rows * 7 + cols)
    pair_ids = torch.randint(0, 6, (groups,), device="cuda", generator=gen)
    pairs = torch.tensor(PAIRS, device="cuda")
    first, second = pairs[pair_ids, 0], pairs[pair_ids, 1]
    values = (torch.rand(groups, 2, device="cuda", generator=gen) * 4 + 0.25)
    values *= torch.where(torch.rand(groups, 2, device="cuda", generator=gen) < 0.5, -1.0, 1.0)
    values[torch.rand(groups, 2, device="cuda", generator=gen) < 0.05] = -0.0
    a = _from_pairs(first, second, values, rows, cols, dtype)
    c = ops.compress(a)
    out[f"{key}/rand_a"] = _bytes(a)
    out[f"{key}/rand_values"] = _bytes(c.values)
    out[f"{key}/rand_meta"] = _bytes(c.metadata)
    ones = torch.ones(groups, 2, device="cuda")
    idx = torch.arange(groups, device="cuda")
    for b in range(max(1, int(np.ceil(np.log2(groups))))):
        bit = ((idx >> b) & 1).bool()
        f = torch.where(bit, 2, 0)
        out[f"{key}/plane{b}_meta"] = _bytes(ops.compress(_from_pairs(f, f + 1, ones, rows, cols, dtype)).metadata)
    for p, q in PAIRS:
        f = torch.full((groups,), p, device="cuda")
        s = torch.full((groups,), q, device="cuda")
        out[f"{key}/pair{p}{q}_meta"] = _bytes(ops.compress(_from_pairs(f, s, ones, rows, cols, dtype)).metadata)
    # where the values go: group g keeps (d + 1, -(d + 1)) for d the base-16 digit j of g (exact in bf16
    # and e4m3), one plane per digit; the sign tells the group's first kept value from its second
    g = idx
    for j in range(max(1, int(np.ceil(np.log(groups) / np.log(16))))):
        d = ((g >> (4 * j)) & 15).float() + 1
        vals = torch.stack([d, -d], dim=1)
        out[f"{key}/digit{j}_values"] = _bytes(ops.compress(_from_pairs(first, second, vals, rows, cols, dtype)).values)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="npz file to write")
    args = p.parse_args(argv)
    out: dict[str, np.ndarray] = {}
    for dtype, shapes in SHAPES.items():
        for rows, cols in shapes:
            dump(dtype, rows, cols, out)
            print(f"dumped {dtype} {rows}x{cols}", flush=True)
    np.savez_compressed(args.out, **out)
    print(f"wrote {args.out}: {len(out)} arrays")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
