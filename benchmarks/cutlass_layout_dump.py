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

The analysis runs on any machine from the npz: ``sparsity_lab.references.cutlass_layout`` states the
layout, and ``--check FILE`` rebuilds every pattern on the CPU (the ``rand`` one from ``rand_a``) and
compares the reference's bytes with the dump's. ``--small-copy SRC DST`` writes the subset the tests
read (``tests/data/cutlass_layout_h200.npz``): the arrays of the small shapes, ``rand_a`` of some more,
and a SHA-256 of every array of the dump (``hash/<key>/<name>``), so each one is checked against it.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
from collections.abc import Iterator, Mapping

import numpy as np
import torch

PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
SHAPES = {
    torch.bfloat16: ((64, 64), (128, 128), (64, 256), (128, 512), (256, 128), (192, 320), (1024, 1024)),
    torch.float8_e4m3fn: ((64, 128), (128, 128), (128, 256), (256, 512), (192, 384), (1024, 1024)),
}
# the small copy: every array of these shapes, and rand_a of these (its other arrays as hashes)
SMALL_FULL = ("bfloat16_64x64", "float8_e4m3fn_64x128")
SMALL_RAND = ("bfloat16_128x128", "bfloat16_192x320", "float8_e4m3fn_128x256", "float8_e4m3fn_192x384")


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).cpu().numpy()


def _key(dtype: torch.dtype, rows: int, cols: int) -> str:
    return f"{str(dtype).replace('torch.', '')}_{rows}x{cols}"


def _from_pairs(first, second, values, rows: int, cols: int, dtype) -> torch.Tensor:
    """Matrix whose group i keeps columns (first[i], second[i]) with values (rows*cols/4, 2)."""
    w = torch.zeros(rows * cols // 4, 4, device=first.device)
    idx = torch.arange(w.shape[0], device=first.device)
    w[idx, first] = values[:, 0]
    w[idx, second] = values[:, 1]
    return w.reshape(rows, cols).to(dtype)


def known_patterns(rows: int, cols: int, dtype: torch.dtype, first: torch.Tensor | None = None,
                   second: torch.Tensor | None = None, device=None) -> Iterator[tuple[str, str, torch.Tensor]]:
    """(name, part, matrix) of the planes, the pairs and (given the ``rand`` pattern's kept columns
    ``first``, ``second``, each (groups,)) the digits; part: "meta" or "values", what the dump keeps."""
    groups = rows * cols // 4
    idx = torch.arange(groups, device=device)
    ones = torch.ones(groups, 2, device=device)
    for b in range(max(1, int(np.ceil(np.log2(groups))))):
        f = torch.where(((idx >> b) & 1).bool(), 2, 0)
        yield f"plane{b}_meta", "meta", _from_pairs(f, f + 1, ones, rows, cols, dtype)
    for p, q in PAIRS:
        f = torch.full((groups,), p, device=device)
        s = torch.full((groups,), q, device=device)
        yield f"pair{p}{q}_meta", "meta", _from_pairs(f, s, ones, rows, cols, dtype)
    if first is None:
        return
    # where the values go: group g keeps (d + 1, -(d + 1)) for d the base-16 digit j of g (exact in bf16
    # and e4m3), one plane per digit; the sign tells the group's first kept value from its second
    for j in range(max(1, int(np.ceil(np.log(groups) / np.log(16))))):
        d = ((idx >> (4 * j)) & 15).float() + 1
        yield f"digit{j}_values", "values", _from_pairs(first, second, torch.stack([d, -d], dim=1), rows, cols, dtype)


def dump(dtype: torch.dtype, rows: int, cols: int, out: dict) -> None:
    from sparsity_lab.backends.cutlass import ops

    key = _key(dtype, rows, cols)
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
    for name, part, matrix in known_patterns(rows, cols, dtype, first, second, device="cuda"):
        compressed = ops.compress(matrix)
        out[f"{key}/{name}"] = _bytes(compressed.metadata if part == "meta" else compressed.values)


def _sha256(array: np.ndarray) -> np.ndarray:
    """The SHA-256 digest of an array's bytes, as 32 uint8."""
    digest = hashlib.sha256(np.ascontiguousarray(array).reshape(-1).view(np.uint8).tobytes()).digest()
    return np.frombuffer(digest, dtype=np.uint8)


def _shape_keys(arrays: Mapping[str, np.ndarray]) -> list[str]:
    return sorted({name.split("/")[0] for name in arrays if name.endswith("/shape") and not name.startswith("hash/")})


def _parse_key(key: str) -> tuple[torch.dtype, int, int]:
    name, shape = key.rsplit("_", 1)
    rows, cols = map(int, shape.split("x"))
    return getattr(torch, name), rows, cols


def rand_matrix(arrays: Mapping[str, np.ndarray], key: str) -> torch.Tensor:
    """The dump's ``rand_a`` of ``key`` as an (m, k) tensor of its dtype (CPU)."""
    dtype, rows, cols = _parse_key(key)
    return torch.from_numpy(arrays[f"{key}/rand_a"].reshape(-1).copy()).view(dtype).reshape(rows, cols)


def _rand_kept_columns(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``rand`` pattern's kept columns per group: its entries with any bit set (a kept -0.0 has the sign
    bit; a pruned entry is +0.0), two per group."""
    rows, cols = a.shape
    bits = a.view(torch.int16 if a.element_size() == 2 else torch.uint8).reshape(rows * cols // 4, 4).ne(0)
    if not bool((bits.sum(-1) == 2).all()):
        raise ValueError("rand_a does not keep two entries (bits set) in every group")
    col = torch.arange(4)
    return torch.where(bits, col, 4).amin(-1), torch.where(bits, col, -1).amax(-1)


def check(arrays: Mapping[str, np.ndarray]) -> dict[str, str]:
    """Every array of a dump (its full npz, or the small copy with its hashes) against the reference
    (``sparsity_lab.references.cutlass_layout``), on the CPU: ``{"<key>/<name>": verdict}``, the verdict
    "equal", "equal (sha256)", "DIFFERS" or "not checked: ..." (the ``rand`` pattern's arrays of a shape
    whose ``rand_a`` the file does not hold)."""
    from sparsity_lab.references import cutlass_layout as layout

    verdicts: dict[str, str] = {}
    keys = sorted(set(_shape_keys(arrays)) | {n.split("/")[1] for n in arrays if n.startswith("hash/")})
    for key in keys:
        dtype, rows, cols = _parse_key(key)
        recorded = {n.split("/", 1)[1] for n in arrays if n.startswith(f"{key}/")}
        recorded |= {n.split("/", 2)[2] for n in arrays if n.startswith(f"hash/{key}/")}
        computed: dict[str, torch.Tensor] = {}
        shape = layout.compressed_shape(rows, cols, dtype)
        computed["shape"] = torch.tensor([rows, cols, *shape.values, *shape.metadata, 1])
        first = second = None
        if f"{key}/rand_a" in arrays:
            a = rand_matrix(arrays, key)
            computed["rand_values"], computed["rand_meta"] = layout.compress(a)
            first, second = _rand_kept_columns(a)
        for name, part, matrix in known_patterns(rows, cols, dtype, first, second):
            computed[name] = layout.compress(matrix)[1 if part == "meta" else 0]
        for name in sorted(recorded - {"rand_a"}):
            label = f"{key}/{name}"
            if name not in computed:
                verdicts[label] = "not checked: the file holds no rand_a of this shape"
                continue
            got = computed[name]
            if name == "shape":  # the workspace size (the last entry) is no part of the layout
                want = arrays.get(f"{key}/shape")
                verdicts[label] = ("equal" if want is not None and want[:7].tolist() == got.tolist()
                                   else "DIFFERS")
                continue
            got_bytes = got.contiguous().view(torch.uint8).reshape(-1).numpy()
            if f"{key}/{name}" in arrays:
                want = arrays[f"{key}/{name}"].reshape(-1)
                same = want.shape == got_bytes.shape and bool((want == got_bytes).all())
                verdicts[label] = "equal" if same else "DIFFERS"
            else:
                same = bytes(arrays[f"hash/{key}/{name}"]) == bytes(_sha256(got_bytes))
                verdicts[label] = "equal (sha256)" if same else "DIFFERS"
    return verdicts


def small_copy(source: str, target: str) -> dict[str, np.ndarray]:
    """Write the tests' subset of a full dump (module docstring) and return it."""
    full = np.load(source)
    out: dict[str, np.ndarray] = {}
    for name in full.files:
        key, part = name.split("/", 1)
        if key in SMALL_FULL or part == "shape" or (key in SMALL_RAND and part == "rand_a"):
            out[name] = full[name]
        elif part != "rand_a":
            out[f"hash/{key}/{part}"] = _sha256(full[name])
    np.savez_compressed(target, **out)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", help="npz file to write (on a Hopper GPU)")
    mode.add_argument("--check", metavar="FILE", help="compare a dump with the reference layout (any machine)")
    mode.add_argument("--small-copy", nargs=2, metavar=("SRC", "DST"), help="write the tests' subset of a dump")
    args = p.parse_args(argv)
    if args.check:
        verdicts = check(np.load(args.check))
        for label, verdict in verdicts.items():
            print(f"{label}: {verdict}")
        differ = sum(v == "DIFFERS" for v in verdicts.values())
        print(f"{sum(v.startswith('equal') for v in verdicts.values())} equal, {differ} differ, "
              f"{sum(v.startswith('not checked') for v in verdicts.values())} not checked")
        return 1 if differ else 0
    if args.small_copy:
        out = small_copy(*args.small_copy)
        print(f"wrote {args.small_copy[1]}: {len(out)} entries")
        return 0
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
