"""Triton puzzles of notebook 07: write a kernel body, the check runs it against PyTorch at once.

On a CPU the kernels run in Triton's interpreter: set ``os.environ["TRITON_INTERPRET"] = "1"`` **before**
triton is imported (restart the kernel otherwise). Each check launches your ``@triton.jit`` kernel on
tiny tensors (the interpreter is slow), compares with the PyTorch reference and names what is wrong:
the entries that differ, the boundary of the last program, the tie rule.
This module imports triton only inside the checks, so importing it never fixes the interpreter choice.
Worked solutions: ``sparsity_lab/course/exercises/solutions/triton_puzzles.py``.
"""
from __future__ import annotations

import os

import secrets

import torch

from ...masks import nm_mask
from ...methods import soft_threshold
from .checking import CheckResult, ExerciseReport, run_check, tie_broken_otherwise, tie_problem

SOLUTION = "triton_puzzles"


def _fresh_generator() -> torch.Generator:
    """Fresh random inputs for every check, without touching the notebook's global torch RNG."""
    return torch.Generator().manual_seed(secrets.randbits(31))


def _device_for(r: ExerciseReport, kernel) -> torch.device | None:
    """CPU when the kernel is interpreted, else CUDA (a compiled kernel cannot read CPU memory); None
    (a recorded problem) when ``kernel`` is not a Triton kernel."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError as err:
        raise ImportError("the Triton puzzles need triton, which has Linux wheels only: pip install triton") from err

    if not isinstance(kernel, (InterpretedFunction, JITFunction)):
        r.expect(False, f"expected a @triton.jit kernel, got {type(kernel).__name__}: decorate your function "
                        "with @triton.jit")
        return None
    if isinstance(kernel, InterpretedFunction):
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    raise RuntimeError("this kernel is compiled for a GPU and there is none: set os.environ['TRITON_INTERPRET'] = '1' "
                       "before triton is first imported (restart the Python kernel, then run the notebook's first "
                       f"cells again); TRITON_INTERPRET is {os.environ.get('TRITON_INTERPRET')!r} now")


def _launcher(kernel, grid: tuple[int, ...], *args, **meta):
    """A function that launches ``kernel[grid](*args, **meta)``; a ``raise NotImplementedError`` in the
    kernel body (the stub) reaches the check as NotImplementedError, not wrapped by the interpreter."""
    def launch():
        try:
            kernel[grid](*args, **meta)
        except Exception as exc:  # the interpreter wraps what the kernel body raised
            cause = exc
            while cause is not None:
                if isinstance(cause, NotImplementedError) or "NotImplementedError" in f"{type(cause).__name__}: {cause}"[:200]:
                    raise NotImplementedError from None
                cause = cause.__cause__ or cause.__context__
            raise
    return launch


def _ran(r: ExerciseReport, launch, what: str) -> bool:
    """Run the launch through ``r.call``; False when it raised (the problem is already recorded)."""
    before = len(r.problems)
    r.call(launch, what=what)
    return len(r.problems) == before


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _compare(r: ExerciseReport, got: torch.Tensor, want: torch.Tensor, label: str, block_elems: int,
             atol: float = 0.0, rtol: float = 0.0) -> None:
    """got == want; when only the tail past the last full block differs, say it is the boundary."""
    g, w = got.cpu().double().reshape(-1), want.cpu().double().reshape(-1)
    bad = ~torch.isclose(g, w, atol=atol, rtol=rtol)
    if not bool(bad.any()):
        return
    full = (w.numel() // block_elems) * block_elems
    if 0 < full < w.numel() and not bool(bad[:full].any()):
        r.expect(False, f"{label}: only the last program's elements {full}..{w.numel() - 1} are wrong: guard its "
                        "loads and stores with mask=offsets < n (the last block runs past the end)")
        return
    r.expect_tensor(got.cpu().reshape(want.shape), want.cpu(), label, atol=atol, rtol=rtol)


def check_scale_kernel(kernel, show: bool = True, hint: bool = False) -> CheckResult:
    """Puzzle 1 (warm-up): ``kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr)`` writes
    ``out[i] = alpha * x[i]`` for i < n; program ``pid`` handles elements ``pid * BLOCK ... + BLOCK - 1``.
    Launched with BLOCK = 8 on n = 19 (three programs, the last one partly past the end)."""
    report = ExerciseReport("Triton puzzle 1: out = alpha * x", solution=SOLUTION,
                            hint="offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK); x = tl.load(x_ptr + offs, "
                                 "mask=offs < n); tl.store(out_ptr + offs, alpha * x, mask=offs < n).")

    def body(r: ExerciseReport) -> None:
        device = _device_for(r, kernel)
        if device is None:
            return
        n, block = 19, 8
        x = torch.randn(n + 5, generator=_fresh_generator()).to(device)  # 5 guard elements past the end stay untouched
        out = torch.full_like(x, -7.0)
        if not _ran(r, _launcher(kernel, (_cdiv(n, block),), x, out, n, 2.5, BLOCK=block), "your kernel"):
            return
        _compare(r, out[:n], 2.5 * x[:n], "out[:19]", block, rtol=1e-6)
        r.expect(bool((out[n:] == -7.0).all()), "your kernel wrote past the end (elements 19..23 must stay untouched): "
                                                "mask the store with offs < n")
    return run_check(report, body, show, hint)


def _prune_cases(device: torch.device) -> list[tuple[torch.Tensor, str]]:
    gen = _fresh_generator()
    return [(torch.tensor([[0.9, -0.4, 0.3, -1.2, 1.0, 1.0, 1.0, 1.0]]), "[[0.9, -0.4, 0.3, -1.2, 1, 1, 1, 1]]"),
            (torch.randn(4, 16, generator=gen), "random 4 x 16"),
            (torch.randint(-2, 3, (4, 8), generator=gen).float(), "many ties (integers -2..2)"),
            (torch.randn(3, 12, generator=gen), "3 x 12: 9 groups, not a multiple of BLOCK = 4")]


def check_prune24_kernel(kernel, show: bool = True, hint: bool = False) -> CheckResult:
    """Puzzle 2: ``kernel(w_ptr, out_ptr, n_groups, BLOCK: tl.constexpr)`` writes the 2:4-pruned w (groups of
    4 consecutive elements; keep the 2 largest |w|, ties to the lower index; 0 elsewhere). Program ``pid``
    handles groups ``pid * BLOCK ... + BLOCK - 1``. Reference: ``w * nm_mask(w, 2, 4)``."""
    report = ExerciseReport("Triton puzzle 2: 2:4 magnitude pruning", solution=SOLUTION,
                            hint="load member j of each group at w_ptr + 4 * g + j (four loads); member i is kept when "
                                 "fewer than 2 members beat it: a_j > a_i, or a_j == a_i with j < i.")

    def body(r: ExerciseReport) -> None:
        device = _device_for(r, kernel)
        if device is None:
            return
        block = 4
        for w, label in _prune_cases(device):
            w = w.to(device)
            out = torch.full_like(w, -7.0)
            n_groups = w.numel() // 4
            if not _ran(r, _launcher(kernel, (_cdiv(n_groups, block),), w, out, n_groups, BLOCK=block),
                        f"{label}: your kernel"):
                continue
            want = w * nm_mask(w, 2, 4)
            got_mask = out != 0
            if not torch.equal(out, want) and bool((got_mask.reshape(-1, 4).sum(-1) > 2).any()) and \
                    bool((out != -7.0).all()):
                r.expect(False, f"{label}: some groups keep more than 2 entries: on ties, keep the lower index only "
                                "(count a_j == a_i as beating i only when j < i)")
                continue
            at = tie_broken_otherwise(out.cpu(), want.cpu(), 4)
            if at is not None:
                r.expect(False, tie_problem(label, at))
                continue
            _compare(r, out, want, label, 4 * block)
    return run_check(report, body, show, hint)


def check_soft_threshold24_kernel(kernel, show: bool = True, hint: bool = False) -> CheckResult:
    r"""Puzzle 3: ``kernel(w_ptr, out_ptr, beta, n_groups, BLOCK: tl.constexpr)`` writes $\beta S(w)$, S-STE's
    soft threshold of every group of 4 (keep the 2 largest |w|; subtract t, the largest pruned |w|, from
    their magnitudes). Reference: ``beta * soft_threshold(w)``, float32, to within one rounding."""
    report = ExerciseReport("Triton puzzle 3: S-STE soft threshold, beta * S(w)", solution=SOLUTION,
                            hint="with the keep flags k0..k3 of puzzle 2: t = max of |w_j| over the pruned members "
                                 "(tl.where(k_j, 0, |w_j|), then tl.maximum); out_i = beta * sign(w_i) * max(|w_i| - t, 0) "
                                 "where kept, 0 elsewhere.")

    def body(r: ExerciseReport) -> None:
        device = _device_for(r, kernel)
        if device is None:
            return
        block = 4
        for w, label in _prune_cases(device):
            w = w.to(device)
            out = torch.full_like(w, -7.0)
            n_groups = w.numel() // 4
            beta = 1.5
            if not _ran(r, _launcher(kernel, (_cdiv(n_groups, block),), w, out, beta, n_groups, BLOCK=block),
                        f"{label}: your kernel"):
                continue
            want = beta * soft_threshold(w.cpu()).to(device)
            if torch.allclose(out.cpu(), (beta * w * nm_mask(w, 2, 4)).cpu(), rtol=1e-6) and \
                    not torch.allclose(want.cpu(), (beta * w * nm_mask(w, 2, 4)).cpu(), rtol=1e-6):
                r.expect(False, f"{label}: this is beta * (hard 2:4 pruning): subtract t from the kept magnitudes")
                continue
            _compare(r, out, want, label, 4 * block, atol=1e-6, rtol=1e-6)
    return run_check(report, body, show, hint)
