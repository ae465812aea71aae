"""Exercises of notebook 10 (DYAD): build the DYAD-IT weight from its blocks, count its parameters,
and say what share of each product's multiply-adds DYAD and 2:4 need."""
from __future__ import annotations

import math
import random

import torch

from ...structures.dyad import DyadLinear
from ...flops import PRODUCTS, product_fractions
from .checking import ExerciseReport, run_check


def reference_dyad_weight(blocks_a: torch.Tensor, blocks_b: torch.Tensor, variant: str = "it") -> torch.Tensor:
    """The (out, in) matrix of a DYAD layer with these (n, b_in, b_out) blocks (the library's layer)."""
    n, b_in, b_out = blocks_a.shape
    layer = DyadLinear(n * b_in, n * b_out, n, variant, bias=False, dtype=blocks_a.dtype)
    with torch.no_grad():
        layer.blocks_a.copy_(blocks_a)
        layer.blocks_b.copy_(blocks_b)
        return layer.dense_weight()


def check_dyad_it_weight(dyad_it_weight_fn, show: bool = True, hint: bool = False):
    """``dyad_it_weight_fn(blocks_a, blocks_b)`` -> the (n*b_out, n*b_in) DYAD-IT weight
    W = BD(A) + BD(B) P_in, blocks of shape (n, b_in, b_out) (block k maps b_in inputs to b_out outputs)."""
    report = ExerciseReport("dyad_it_weight: the DYAD-IT weight from its two block tensors",
                            hint="W[k*b_out + j, k*b_in + i] = A[k, i, j] (a block of W is A[k] transposed); "
                                 "B's block k reads the strided inputs k, k+n, k+2n, ...: "
                                 "W[k*b_out + j, i*n + k] += B[k, i, j].",
                            solution="dyad")

    def body(r):
        rng = random.Random()
        shapes = [(1, 1, 1), (2, 2, 2), (4, 3, 3), (3, 2, 5), (4, 4, 2)]
        shapes += [(rng.randint(2, 5), rng.randint(1, 5), rng.randint(1, 5)) for _ in range(2)]
        for n, b_in, b_out in shapes:
            a = torch.randn(n, b_in, b_out, dtype=torch.float64)
            b = torch.randn(n, b_in, b_out, dtype=torch.float64)
            what = f"dyad_it_weight(A, B) with n={n}, b_in={b_in}, b_out={b_out}"
            got = r.call(dyad_it_weight_fn, a.clone(), b.clone(), what=what)
            if got is None:
                return
            want = reference_dyad_weight(a, b, "it")
            if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.allclose(
                    got.double(), want, atol=1e-9):
                for name, other in (("DYAD-OT (permuted outputs)", reference_dyad_weight(a, b, "ot")),
                                    ("DYAD-DT (both sides permuted)", reference_dyad_weight(a, b, "dt"))):
                    if torch.allclose(got.double(), other, atol=1e-9):
                        r.expect(False, f"{what}: you built {name}; DYAD-IT permutes the input side only")
                        return
                transposed = reference_dyad_weight(a.transpose(1, 2), b.transpose(1, 2), "it") \
                    if b_in == b_out else None
                if transposed is not None and torch.allclose(got.double(), transposed, atol=1e-9):
                    r.expect(False, f"{what}: each block of W should be A[k] transposed (A[k] is (b_in, b_out), "
                                    f"W maps inputs to outputs: W is (out, in))")
                    return
            if not r.expect_tensor(got, want, what, atol=1e-9):
                return
    return run_check(report, body, show, hint)


def reference_dyad_params(d_in: int, d_out: int, n_blocks: int, bias: bool = True) -> int:
    return 2 * d_in * d_out // n_blocks + (d_out if bias else 0)


def check_dyad_params(dyad_params_fn, show: bool = True, hint: bool = False):
    """``dyad_params_fn(d_in, d_out, n_blocks, bias)`` -> the number of trainable parameters of a DYAD layer."""
    report = ExerciseReport("dyad_params: the parameters of a DYAD layer",
                            hint="two block tensors of shape (n, d_in/n, d_out/n), plus the bias if there is one.",
                            solution="dyad")

    def body(r):
        rng = random.Random()
        cases = [(8, 8, 2, False), (8, 8, 4, True), (384, 1536, 4, True), (12, 6, 3, False), (16, 16, 1, True)]
        for _ in range(3):
            n = rng.choice([2, 4, 8])
            cases.append((n * rng.randint(1, 40), n * rng.randint(1, 40), n, rng.random() < 0.5))
        for d_in, d_out, n, bias in cases:
            got = r.call(dyad_params_fn, d_in, d_out, n, bias, what=f"dyad_params({d_in}, {d_out}, {n}, {bias})")
            if got is None:
                return
            layer = DyadLinear(d_in, d_out, n, "it", bias=bias)
            want = sum(p.numel() for p in layer.parameters())
            assert want == reference_dyad_params(d_in, d_out, n, bias)
            if got != want:
                why = ""
                if got == want - (d_out if bias else 0):
                    why = " (the bias is missing)"
                elif got == d_in * d_out // n + (d_out if bias else 0):
                    why = " (half: there are two block tensors, A and B)"
                r.expect(False, f"dyad_params({d_in}, {d_out}, {n}, {bias}) = {got!r}, expected {want}{why}")
                return
    return run_check(report, body, show, hint)


def check_product_fractions(product_fractions_fn, show: bool = True, hint: bool = False):
    """``product_fractions_fn(method, n_blocks)`` -> dict {"forward", "grad_input", "grad_weight"}: the
    share of each product's dense multiply-adds the method needs. method: "dense", "24" (a 2:4 weight),
    "24_mvue" (2:4 weight and an MVUE 2:4 output gradient for dW), "dyad" (n_blocks blocks)."""
    report = ExerciseReport("product_fractions: which products DYAD and 2:4 make cheaper",
                            hint="write each product with its operands: Z = X S(W)^T, dX = dZ S(W), dW = dZ^T X. "
                                 "Only a product with a sparse operand (or DYAD's block tensors) does less work.",
                            solution="dyad")

    def body(r):
        cases = [("dense", 4), ("24", 4), ("24_mvue", 4), ("dyad", 4), ("dyad", 8), ("dyad", 2)]
        for method, n in cases:
            got = r.call(product_fractions_fn, method, n, what=f"product_fractions({method!r}, {n})")
            if got is None:
                return
            want = product_fractions(method, n_blocks=n)
            if not isinstance(got, dict) or set(got) != set(PRODUCTS):
                r.expect(False, f"product_fractions({method!r}, {n}) should return a dict with keys "
                                f"{list(PRODUCTS)}, got {got!r}")
                return
            for name in PRODUCTS:
                if not isinstance(got[name], (int, float)) or not math.isclose(got[name], want[name], rel_tol=1e-9):
                    r.expect(False, f"product_fractions({method!r}, {n})[{name!r}] = {got[name]!r}, "
                                    f"expected {want[name]:g}")
                    return
    return run_check(report, body, show, hint)
