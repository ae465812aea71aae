"""Kernel benchmark sections for the one-pass mask refreshes, each timed side by side with the chain it replaces:
21 refresh24 (cuSPARSELt's layout; the chain kernels 2, 9, the mask copy, 11) and 24 refresh24_cutlass (CUTLASS's
layout, bf16 and E4M3; the chain kernels 2, 9, the copy, 22). Every variant's mask, flips and bytes are checked
against its chain on the same tensors first."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from sparsity_lab import kernels as K
from benchmarks.kernels.bench import BF16 as bf16
from benchmarks.kernels.bench import Bench
from benchmarks.kernels.checks import check

NOTE = "added after the copy-rate target was set: not counted in it"


@dataclass
class Variant:
    """One timed refresh: ``fused(mask, **config)`` and ``chain(mask)`` each refresh ``mask`` in place and return
    (flips, outputs...); ``parts``: the chain's kernels, timed one by one; bytes counted for both."""

    label: str
    fused: Callable
    chain: Callable
    chain_name: str
    parts: dict
    fused_bytes: int
    chain_bytes: int
    forms: str = ""  # what the one pass writes besides the mask and flips, for the row's name


def _tensors(out):
    """The tensors of a kernel's outputs (nested pairs and None flattened), in order."""
    for x in out:
        if isinstance(x, (tuple, list)):
            yield from _tensors(x)
        elif x is not None:
            yield x


def _step_apart(bench: Bench, shape):
    """bf16 W of ``shape`` and a previous mask one training step away from it (about 1 % of the entries differ)."""
    w0 = torch.randn(shape, device=bench.device)
    previous = K.transposable_mask24(w0, pruned=False)[0]
    return (w0 + 0.02 * torch.randn(shape, device=bench.device)).to(bf16), previous


def _shapes(bench: Bench):
    """(rows, cols) and (cols, rows): 16384 x 4096 and 4096 x 16384 at the default --mib, an FFN's two weights at
    d_model 4096 (smoke: both are 64 x 64, one is run)."""
    r = max(64, bench.rows - bench.rows % 64)
    return ((r, bench.cols),) if bench.smoke else ((r, bench.cols), (bench.cols, r))


def _mask_parts(w, previous, scratch) -> dict:
    """The chain's mask steps, each alone: kernel 2's mask, kernel 9's count, the copy into the mask buffer."""
    return {"2 transposable24 mask": lambda: K.transposable_mask24(w, pruned=False),
            "9 count_flips": lambda: K.count_flips(scratch, previous), "mask copy_": lambda: scratch.copy_(previous)}


def _new_mask(w, mask):
    """The chain's first three steps on ``mask``: kernel 2, kernel 9, the copy; returns the flips."""
    new = K.transposable_mask24(w, pruned=False)[0]
    flips = K.count_flips(mask, new)
    mask.copy_(new)
    return flips


def _measure(bench: Bench, section: str, shape, previous, v: Variant) -> None:
    report, timer = bench.report, bench.timer
    mask_a, mask_b = previous.clone(), previous.clone()
    got, want = v.fused(mask_a), v.chain(mask_b)
    check(f"{section.split()[1]} {v.label}", torch.equal(mask_a, mask_b) and int(got[0]) == int(want[0])
          and all(torch.equal(g.reshape(-1).view(torch.uint8), e.reshape(-1).view(torch.uint8))
                  for g, e in zip(_tensors(got[1:]), _tensors(want[1:]), strict=True)))
    n = previous.numel()
    print(f"  {section.split()[1]} {v.label}: {int(got[0])} of {n} entries flipped ({int(got[0]) / n:.4f})")
    ms, cfg, allc = bench.sweep(lambda **c: (lambda: v.fused(mask_a, **c)), [{"num_warps": nw} for nw in (4, 8)])
    report.memory_bound(section, f"{v.label}: one pass" + v.forms, shape, v.fused_bytes, ms, cfg, allc,
                        counts_for_target=False, note=NOTE)
    parts = {name: timer(fn) for name, fn in v.parts.items()}
    chain_ms = timer(lambda: v.chain(mask_b))
    report.memory_bound(section, f"{v.label}: {v.chain_name}", shape, v.chain_bytes, chain_ms, {},
                        counts_for_target=False, note=NOTE)
    report.rows[-1]["parts_ms"] = parts
    print(f"  {v.label}, the chain's parts: " + ", ".join(f"{k} {t:.3f} ms" for k, t in parts.items()))
    report.ratio(section, f"{v.label}: one pass vs the chain", shape, ms, "the chain", chain_ms, None,
                 nbytes=v.fused_bytes)


def refresh24(bench: Bench) -> None:
    """21. A step's mask refresh in one pass (mask in place, flips, S(W) and S(W)^T compressed for cuSPARSELt)
    against the chain it replaces, on bf16 W of both FFN shapes, S-STE and STE; and the mask and flips alone (the
    refresh before a CUDA-graph replay) against kernels 2, 9 and the copy."""
    for shape in _shapes(bench):
        w, previous = _step_apart(bench, shape)
        n, scratch = w.numel(), previous.clone()
        for beta, mname, operands in ((torch.tensor(0.9, device=bench.device), "S-STE", True), (None, "STE", True),
                                      (None, "mask + flips only", False)):
            parts = _mask_parts(w, previous, scratch)
            if operands:
                parts["11 prepare24"] = lambda beta=beta: K.prepare24(w, previous, beta, out_dtype=bf16)

            def fused(mask, beta=beta, operands=operands, **c):
                return K.refresh24(w, mask, beta, out_dtype=bf16, forward=operands, transposed=operands, **c)

            def chain(mask, beta=beta, operands=operands):
                flips = _new_mask(w, mask)
                return (flips, *K.prepare24(w, mask, beta, out_dtype=bf16)) if operands else (flips,)
            forms = 3 * n + 2 * (n + n // 8) if operands else 0  # kernel 11: W, mask in; two compressed forms out
            _measure(bench, "21 refresh24", shape, previous, Variant(
                f"{shape[0]}x{shape[1]} {mname}", fused, chain, "kernels 2, 9, copy" + (", 11" if operands else ""),
                parts, 2 * n + n + n + (forms - 3 * n if operands else 0), 3 * n + 2 * n + 2 * n + forms,
                " (mask, flips, S(W), S(W)^T)" if operands else ""))


def refresh24_cutlass(bench: Bench) -> None:
    """24. Kernel 21's refresh writing CUTLASS's layout (bf16 S-STE and STE, E4M3 STE with a given scale, as with
    delayed scaling) against the chain it replaces (kernels 2, 9, the copy, 22), on bf16 W of both FFN shapes;
    and the mask with its flips alone (what the CUTLASS backends' refresh_mask_ runs)."""
    for shape in _shapes(bench):
        w, previous = _step_apart(bench, shape)
        n, scratch = w.numel(), previous.clone()
        inv_scale = (448.0 / (2 * w.abs().amax().float())).reshape(1)
        for beta, mname, fp8 in ((torch.tensor(0.9, device=bench.device), "S-STE bf16", False),
                                 (None, "STE bf16", False), (None, "STE E4M3", True), (None, "mask + flips only", None)):
            parts = _mask_parts(w, previous, scratch)
            if fp8 is not None:
                parts["22 prepare24_cutlass" + ("_fp8" if fp8 else "")] = (
                    lambda: K.prepare24_cutlass_fp8(w, previous, None, inv_scale)) if fp8 else (
                    lambda beta=beta: K.prepare24_cutlass(w, previous, beta))

            def fused(mask, beta=beta, fp8=fp8, **c):
                if fp8:
                    return K.refresh24_cutlass_fp8(w, mask, beta, inv_scale, **c)
                return K.refresh24_cutlass(w, mask, beta, forward=fp8 is not None, transposed=fp8 is not None, **c)

            def chain(mask, beta=beta, fp8=fp8):
                flips = _new_mask(w, mask)
                if fp8 is None:
                    return (flips,)
                forms = K.prepare24_cutlass_fp8(w, mask, beta, inv_scale) if fp8 else K.prepare24_cutlass(w, mask, beta)
                return (flips, *forms)
            p = 1 if fp8 else 2
            forms = 2 * (p * n // 2 + n // 8) if fp8 is not None else 0  # two compressed forms (the padding not counted)
            _measure(bench, "24 refresh24_cutlass", shape, previous, Variant(
                f"{shape[0]}x{shape[1]} {mname}", fused, chain, "kernels 2, 9, copy" + (", 22" if forms else ""),
                parts, 2 * n + n + n + forms, 3 * n + 2 * n + 2 * n + (3 * n + forms if forms else 0),
                " (mask, flips, S(W), S(W)^T in CUTLASS's layout)" if forms else ""))
