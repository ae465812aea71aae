"""Measurements a notebook runs live, small and quick: the mask solvers timed side by side, one FFN
dense against 2:4, a DYAD layer against nn.Linear.

The recorded figures come from the benchmarks of a clone (``python -m benchmarks NAME``, which reuse
these functions); a notebook calls them to show the same comparison on the learner's own machine.
"""
from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from ..masks import nm_mask, transposable_mask
from ..masks.quality import ROWWISE, applicable_solvers, quality_rows
from ..masks.tiles import check_transposable_input
from ..methods.config import STE
from ..sparsify import sparsify
from ..training_hooks import sparse_layers
from .viz.speedup_view import PHASES


def median_ms(fn, rep_ms: int = 100, cuda: bool = True) -> float:
    """Median milliseconds of fn(): triton's do_bench when ``cuda`` (fn runs on the GPU); else one call
    after a warm-up call (it checks that the code runs on the CPU; the number means little)."""
    if cuda:
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=max(25, rep_ms // 4), rep=rep_ms, return_mode="median"))
    fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def time_call(fn, repeats: int, budget_s: float):
    """Run fn() up to ``repeats`` times (fewer once ``budget_s`` is spent); return (seconds list, last result)."""
    times, out = [], None
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
        if sum(times) >= budget_s:
            break
    return times, out


def time_solvers(weight: torch.Tensor, n: int = 2, m: int = 4, solvers=None, repeats: int = 3,
                 budget_s: float = 10.0) -> list[dict]:
    """Every applicable solver (and row-wise N:M) on ``weight``, timed side by side, with its quality.

    Returns masks.quality.quality_rows dicts plus median_s (median wall time of up to ``repeats``
    runs; fewer once a solver's runs took ``budget_s``) and runs. Optimum: the exact mask of "auto".
    """
    check_transposable_input(weight, n, m)
    solvers = applicable_solvers(n, m) if solvers is None else list(solvers)
    for s in solvers:  # warm-up (imports, pattern tables), untimed
        transposable_mask(weight[:m, :m], n, m, solver=s)
    times, masks = {}, {}
    times[ROWWISE], _ = time_call(lambda: nm_mask(weight, n, m, dim=1), repeats, budget_s)
    for s in solvers:
        times[s], masks[s] = time_call(lambda s=s: transposable_mask(weight, n, m, solver=s), repeats, budget_s)
    rows = quality_rows(weight, masks, n, m)
    for r in rows:
        r.update({"median_s": statistics.median(times[r["solver"]]), "runs": len(times[r["solver"]])})
    return rows



def time_fwd_bwd(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor, repeats: int) -> float:
    """Median seconds of one forward + backward (input and weight gradients)."""
    def once():
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).backward(grad)

    for _ in range(3):
        once()
    times = []
    cuda = x.is_cuda
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            once()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            once()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)



def _ffn(d_model: int, ffn: int, device, dtype) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_model, ffn, device=device, dtype=dtype), nn.GELU(),
                         nn.Linear(ffn, d_model, device=device, dtype=dtype))


def _check_shapes(shapes) -> list[tuple[int, int, int]]:
    out = []
    for s in shapes:
        if not (isinstance(s, (list, tuple)) and len(s) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in s)):
            raise ValueError(f"shapes must be (tokens, d_model, ffn) triples of positive ints, got {s!r}")
        out.append(tuple(s))
    if not out:
        raise ValueError("shapes is empty: give at least one (tokens, d_model, ffn)")
    return out


def _reference_output(model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """The FFN with S(W) = mask * W, in float32: what the 2:4 products must reproduce."""
    up, down = model[0], model[2]
    h = F.gelu(F.linear(x.float(), (up.mask * up.weight).float(), up.bias.float()))
    return F.linear(h, (down.mask * down.weight).float(), down.bias.float())


def measure_ffn(shapes, backend: str = "cusparselt", device: str = "cuda", dtype: torch.dtype = torch.bfloat16,
                rep_ms: int = 100, seed: int = 0) -> list[dict]:
    """Time one FFN (Linear d->ffn, GELU, Linear ffn->d) dense and 2:4, side by side, per shape and phase.

    Variants: "dense" (nn.Linear), "ours_fixed_mask" (SparseLinear, STE with a transposable mask, the
    prepared operand reused: the mask does not change between calls) and "ours_mask_every_step" (the
    mask recomputed and the operand rebuilt before every call, as in training with refresh interval 1).
    Phases: "fwd" (forward with autograd recording) and "fwd_bwd" (plus the input and weight gradients).
    Returns rows in the schema of FFN_KEYS; the "fwd" rows of ours also carry ``rel_err``, the relative
    error of the 2:4 output against a float32 product with the same masked weights.
    On a CUDA device the times are medians of triton's do_bench over about rep_ms; on the CPU each is
    one call after a warm-up (it checks that the code runs; the numbers mean nothing).
    """
    shapes = _check_shapes(shapes)
    device = torch.device(device)
    def timer(fn):
        return median_ms(fn, rep_ms, cuda=device.type == "cuda")
    rows = []
    for tokens, d_model, ffn in shapes:
        torch.manual_seed(seed)
        dense = _ffn(d_model, ffn, device, dtype)
        x = torch.randn(tokens, d_model, device=device, dtype=dtype, requires_grad=True)
        dy = torch.randn(tokens, d_model, device=device, dtype=dtype)
        models = {"dense": (dense, False)}
        for variant, every_step in (("ours_fixed_mask", False), ("ours_mask_every_step", True)):
            model = sparsify(copy.deepcopy(dense), STE(transposable=True, backend=backend), select="all")
            for _, layer in sparse_layers(model):
                layer.attached_optimizer = True  # no optimizer here: the steps are advanced below
            models[variant] = (model, every_step)

        def call(model, every_step: bool, backward: bool):
            def run():
                if every_step:
                    for _, layer in sparse_layers(model):
                        layer.advance_step()  # a new step: the mask is due and the operand is rebuilt
                model.zero_grad(set_to_none=True)
                x.grad = None
                y = model(x)
                if backward:
                    y.backward(dy)
            return run

        times = {}
        for phase in PHASES:
            for variant, (model, every_step) in models.items():
                times[(variant, phase)] = timer(call(model, every_step, phase == "fwd_bwd"))
        for phase in PHASES:
            for variant, (model, _) in models.items():
                ms = times[(variant, phase)]
                row = {"tokens": tokens, "d_model": d_model, "ffn": ffn, "variant": variant, "phase": phase,
                       "ms": ms, "speedup_vs_dense": times[("dense", phase)] / ms}
                if variant != "dense" and phase == "fwd":
                    with torch.no_grad():
                        ref = _reference_output(model, x.detach())
                        out = model(x.detach()).float()
                    row["rel_err"] = float((out - ref).norm() / ref.norm())
                rows.append(row)
    return rows


def measure_dyad(widths, blocks=(4, 8), variants=("it", "ot", "dt"), tokens: int = 8192,
                 dtype: torch.dtype = torch.bfloat16, repeats: int = 20, device: str | torch.device = "cuda") -> list[dict]:
    """DYAD against nn.Linear, forward + backward, at each width x n x variant x shape ("square": d -> d,
    "ffn_up": d -> 4d), on ``tokens`` rows. Each row: the median ms of both, ``speedup`` (dense / DYAD) and
    the dense product's TFLOP/s. Checks first that DYAD equals its dense matrix on the device."""
    from ..structures.dyad import DyadLinear

    device = torch.device(device)
    rows = []
    grid = [(w, n, v, shape) for w in widths for n in blocks for v in variants
            for shape in ("square", "ffn_up")]
    for width, n, variant, shape in grid:
        d_in, d_out = width, (width if shape == "square" else 4 * width)
        torch.manual_seed(0)
        x = torch.randn(tokens, d_in, device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn(tokens, d_out, device=device, dtype=dtype)
        dense = nn.Linear(d_in, d_out, device=device, dtype=dtype)
        dyad = DyadLinear(d_in, d_out, n, variant, device=device, dtype=dtype)
        # same function check before timing: DYAD equals its dense matrix on this device
        if width <= 1024 and variant == "it" and shape == "square":
            with torch.no_grad():
                small = DyadLinear(64, 64, n, variant, device=device, dtype=torch.float32)
                xs = torch.randn(16, 64, device=device)
                err = (small(xs) - (xs @ small.dense_weight().T + small.bias)).abs().max().item()
            if err > 1e-4:
                raise RuntimeError(f"DYAD output differs from its dense matrix on {device}: {err}")
        t_dense = time_fwd_bwd(dense, x, grad, repeats)
        t_dyad = time_fwd_bwd(dyad, x, grad, repeats)
        flops_dense = 3 * 2 * tokens * d_in * d_out
        rows.append({"width": width, "shape": shape, "in": d_in, "out": d_out, "n_blocks": n,
                     "variant": f"dyad-{variant}", "tokens": tokens, "dense_ms": t_dense * 1e3,
                     "dyad_ms": t_dyad * 1e3, "speedup": t_dense / t_dyad,
                     "dense_tflops": flops_dense / t_dense / 1e12,
                     "dyad_flops_fraction": 2 / n})
    return rows


def refresh_interval_runs(base, intervals, corpus=None) -> list[dict]:
    """Train the lab GPT with STE once per mask refresh interval (same seed, data and steps as ``base``, a
    lab ``TrainConfig``) and return one row per interval: ``refreshes`` (mask computations after the
    first), ``flips_per_refresh`` (mean share of the mask that changed at a refresh), ``flips_per_step``
    (the flips of the whole run over its steps) and ``final_val_loss``."""
    from ..lab.compare import variant_config
    from ..lab.trainer import Trainer

    if not intervals or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in intervals):
        raise ValueError(f"intervals must be a non-empty list of ints >= 1, got {intervals!r}")
    rows = []
    for k in intervals:
        trainer = Trainer(variant_config(base, "ste", {"mask_refresh_interval": k}, None, None), corpus=corpus)
        summary = trainer.run()
        flips = [r["flip_rate"] for r in trainer.history if r["flip_rate"] is not None]
        rows.append({"interval": k, "refreshes": len(flips),
                     "flips_per_refresh": sum(flips) / len(flips) if flips else float("nan"),
                     "flips_per_step": sum(flips) / len(trainer.history), "final_val_loss": summary["final_val_loss"]})
    return rows
