"""Triton puzzles: write a kernel body, the check runs it against PyTorch at once. Notebook 07 has
puzzles 1-5 (scale, 2:4 pruning, the soft threshold, MVUE sampling, the flip count), notebook 14 puzzles
6-8 on the compressed 2:4 format (compress, decompress, a matrix-vector product from the metadata).

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


def _launch(r: ExerciseReport, kernel, device: torch.device, grid: tuple[int, ...], tensors, *scalars,
            what: str = "your kernel", **meta) -> list[torch.Tensor] | None:
    """Copy ``tensors`` to ``device``, launch ``kernel[grid](*tensors, *scalars, **meta)`` and return the
    tensors back on the CPU; None when the launch raised (the problem is already recorded)."""
    args = [t.to(device) for t in tensors]
    if not _ran(r, _launcher(kernel, grid, *args, *scalars, **meta), what):
        return None
    return [t.cpu() for t in args]


def _run_puzzle(report: ExerciseReport, kernel, body, show: bool, hint: bool) -> CheckResult:
    """``run_check`` with the device chosen for ``kernel`` first: ``body(r, device)`` runs only when the
    kernel is a Triton kernel (else the problem is recorded and the body is skipped)."""
    def checked(r: ExerciseReport) -> None:
        device = _device_for(r, kernel)
        if device is not None:
            body(r, device)
    return run_check(report, checked, show, hint)


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

    def body(r: ExerciseReport, device: torch.device) -> None:
        n, block = 19, 8
        x = torch.randn(n + 5, generator=_fresh_generator())  # 5 guard elements past the end stay untouched
        ran = _launch(r, kernel, device, (_cdiv(n, block),), (x, torch.full_like(x, -7.0)), n, 2.5, BLOCK=block)
        if ran is None:
            return
        out = ran[1]
        _compare(r, out[:n], 2.5 * x[:n], "out[:19]", block, rtol=1e-6)
        r.expect(bool((out[n:] == -7.0).all()), "your kernel wrote past the end (elements 19..23 must stay untouched): "
                                                "mask the store with offs < n")
    return _run_puzzle(report, kernel, body, show, hint)


def _prune_cases() -> list[tuple[torch.Tensor, str]]:
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

    def body(r: ExerciseReport, device: torch.device) -> None:
        block = 4
        for w, label in _prune_cases():
            n_groups = w.numel() // 4
            ran = _launch(r, kernel, device, (_cdiv(n_groups, block),), (w, torch.full_like(w, -7.0)), n_groups,
                          what=f"{label}: your kernel", BLOCK=block)
            if ran is None:
                continue
            out, want = ran[1], w * nm_mask(w, 2, 4)
            got_mask = out != 0
            if not torch.equal(out, want) and bool((got_mask.reshape(-1, 4).sum(-1) > 2).any()) and \
                    bool((out != -7.0).all()):
                r.expect(False, f"{label}: some groups keep more than 2 entries: on ties, keep the lower index only "
                                "(count a_j == a_i as beating i only when j < i)")
                continue
            at = tie_broken_otherwise(out, want, 4)
            if at is not None:
                r.expect(False, tie_problem(label, at))
                continue
            _compare(r, out, want, label, 4 * block)
    return _run_puzzle(report, kernel, body, show, hint)


def check_soft_threshold24_kernel(kernel, show: bool = True, hint: bool = False) -> CheckResult:
    r"""Puzzle 3: ``kernel(w_ptr, out_ptr, beta, n_groups, BLOCK: tl.constexpr)`` writes $\beta S(w)$, S-STE's
    soft threshold of every group of 4 (keep the 2 largest |w|; subtract t, the largest pruned |w|, from
    their magnitudes). Reference: ``beta * soft_threshold(w)``, float32, to within one rounding."""
    report = ExerciseReport("Triton puzzle 3: S-STE soft threshold, beta * S(w)", solution=SOLUTION,
                            hint="with the keep flags k0..k3 of puzzle 2: t = max of |w_j| over the pruned members "
                                 "(tl.where(k_j, 0, |w_j|), then tl.maximum); out_i = beta * sign(w_i) * max(|w_i| - t, 0) "
                                 "where kept, 0 elsewhere.")

    def body(r: ExerciseReport, device: torch.device) -> None:
        block = 4
        for w, label in _prune_cases():
            n_groups, beta = w.numel() // 4, 1.5
            ran = _launch(r, kernel, device, (_cdiv(n_groups, block),), (w, torch.full_like(w, -7.0)), beta, n_groups,
                          what=f"{label}: your kernel", BLOCK=block)
            if ran is None:
                continue
            out, want, hard = ran[1], beta * soft_threshold(w), beta * w * nm_mask(w, 2, 4)
            if torch.allclose(out, hard, rtol=1e-6) and not torch.allclose(want, hard, rtol=1e-6):
                r.expect(False, f"{label}: this is beta * (hard 2:4 pruning): subtract t from the kept magnitudes")
                continue
            _compare(r, out, want, label, 4 * block, atol=1e-6, rtol=1e-6)
    return _run_puzzle(report, kernel, body, show, hint)


# --- puzzles 4 and 5: a random kernel with given random numbers, and a reduction --------------------
def check_mvue24_kernel(kernel, show: bool = True, hint: bool = False) -> CheckResult:
    r"""Puzzle 4: MVUE 2:4 sampling. ``kernel(x_ptr, p_ptr, u_ptr, out_ptr, n_groups, BLOCK: tl.constexpr)``:
    x and p float32 (4 per group; p the inclusion probabilities, each <= 1, summing to 2), u one uniform
    per group. Member j owns the interval $[lo_j, hi_j)$ with $hi_j = p_0 + \dots + p_j$ ($hi_3 = 2$),
    $lo_j = hi_{j-1}$ ($lo_0 = 0$); it is picked when u or u + 1 falls in it and then written as
    $x_j / p_j$, else 0. Reference: the library's systematic sampling (``sparsity_lab.methods.mvue``)."""
    from ...methods.mvue import _systematic_pick, mvue_probabilities

    report = ExerciseReport("Triton puzzle 4: MVUE 2:4 sampling from given uniforms", solution=SOLUTION,
                            hint="loop j over tl.static_range(4) keeping a running lo: hi = lo + p_j (2.0 for the "
                                 "last member); picked = (lo <= u < hi) | (lo <= u + 1 < hi); then lo = hi.")

    def body(r: ExerciseReport, device: torch.device) -> None:
        gen, block = _fresh_generator(), 4
        x = torch.randn(9, 4, generator=gen)
        x[0] = torch.tensor([4.0, 0.1, 0.2, 0.1])   # the largest is capped at p = 1
        x[1] = torch.tensor([0.0, 0.0, 1.5, 0.0])   # one non-zero: kept exactly
        p = mvue_probabilities(x).float()
        u = torch.rand(9, generator=gen)
        want = torch.where(_systematic_pick(p, u[:, None]), x / p, torch.zeros_like(x))
        ran = _launch(r, kernel, device, (_cdiv(9, block),), (x, p, u, torch.full((9, 4), -7.0)), 9, BLOCK=block)
        if ran is None:
            return
        got = ran[3]
        kept = (got != 0).sum(-1)
        if bool((kept > 2).any()):
            r.expect(False, f"group {int((kept > 2).nonzero()[0])} keeps {int(kept.max())} entries: exactly two of "
                            "u and u + 1 fall in the intervals, so at most two are picked")
            return
        if torch.equal(got != 0, want != 0) and not torch.allclose(got, want, rtol=1e-6):
            r.expect(False, "the right entries are picked, but a kept x_j must be divided by p_j (that makes the "
                            "draw unbiased)")
            return
        _compare(r, got, want, "out", 4 * block, rtol=1e-6)
    return _run_puzzle(report, kernel, body, show, hint)


def check_count_flips_kernel(kernel, show: bool = True, hint: bool = False) -> CheckResult:
    """Puzzle 5: the flip count. ``kernel(prev_ptr, new_ptr, partial_ptr, n, BLOCK: tl.constexpr)``: two
    masks of n entries (int8, 0 or 1); program ``pid`` writes ``partial[pid]``, how many of its BLOCK
    entries differ. The partials add up to the number of flips (notebook 03's flip rate times n)."""
    report = ExerciseReport("Triton puzzle 5: count the mask flips, one partial sum per program", solution=SOLUTION,
                            hint="load both blocks with mask=offs < n (other=0 for both, so the tail counts 0); "
                                 "tl.sum((prev != new).to(tl.int32), axis=0); store it at partial_ptr + pid.")

    def body(r: ExerciseReport, device: torch.device) -> None:
        gen, n, block = _fresh_generator(), 45, 16
        prev = (torch.rand(n, generator=gen) < 0.5).to(torch.int8)
        new = prev.clone()
        flip = torch.randperm(n, generator=gen)[:11]
        new[flip] = 1 - new[flip]
        programs = _cdiv(n, block)
        ran = _launch(r, kernel, device, (programs,), (prev, new, torch.full((programs,), -7, dtype=torch.int32)), n,
                      BLOCK=block)
        if ran is None:
            return
        got = ran[2]
        pad = torch.zeros(programs * block, dtype=torch.int8)
        per_block = (torch.cat([prev, pad[n:]]) != torch.cat([new, pad[n:]])).reshape(programs, block).sum(1)
        if int(got.sum()) == int(new.sum()) or int(got.sum()) == int(prev.sum()):
            r.expect(False, "your partials add up to the kept entries of one mask: count where the masks differ")
            return
        if bool((got[:-1] == per_block[:-1].int()).all()) and int(got[-1]) != int(per_block[-1]):
            r.expect(False, f"the last program's partial is {int(got[-1])}, expected {int(per_block[-1])}: its block "
                            "runs past n; load with mask=offs < n and the same other= for both masks")
            return
        r.expect_tensor(got, per_block.int(), "partial (one count per program)")
    return _run_puzzle(report, kernel, body, show, hint)


# --- puzzles 6-8 (notebook 14): the compressed format ------------------------------------------------
def _compress_cases() -> list[tuple[torch.Tensor, str]]:
    from ...masks import nm_mask as mask24
    gen = _fresh_generator()
    w = torch.randn(3, 16, generator=gen)
    return [(torch.tensor([[0.9, 0.0, 0.0, -1.2, 0.0, 0.3, 0.7, 0.0]]), "[[0.9, 0, 0, -1.2, 0, 0.3, 0.7, 0]]"),
            (w * mask24(w, 2, 4), "a random 3 x 16 2:4 matrix (12 groups: the last program runs past the end)"),
            (torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.5, 0.0, -1.5, 0.0, 0.0]]),
             "groups with fewer than two non-zeros")]


def check_compress24_kernel(kernel, show: bool = True, hint: bool = False) -> CheckResult:
    """Puzzle 6: compress. ``kernel(w_ptr, val_ptr, idx_ptr, n_groups, BLOCK: tl.constexpr)``: w float32, at
    most two non-zeros per group of 4; write ``val[2g], val[2g + 1]`` (the kept values, column order) and
    ``idx[2g], idx[2g + 1]`` (int32, their columns 0..3, the smaller first). Any two columns holding every
    non-zero of the group are right: the check decompresses and compares with w."""
    from .compressed import decompress24

    report = ExerciseReport("Triton puzzle 6: compress a 2:4 matrix to values + indices", solution=SOLUTION,
                            hint="with n_c = (w_c != 0): i = first non-zero of columns 0..2 (0 if none) by nested "
                                 "tl.where, j = the last non-zero after i (3 if none); pick v0 and v1 the same way.")

    def body(r: ExerciseReport, device: torch.device) -> None:
        block = 4
        for w, label in _compress_cases():
            n_groups = w.numel() // 4
            blank = (w, torch.full((2 * n_groups,), -7.0), torch.full((2 * n_groups,), -7, dtype=torch.int32))
            ran = _launch(r, kernel, device, (_cdiv(n_groups, block),), blank, n_groups,
                          what=f"{label}: your kernel", BLOCK=block)
            if ran is None:
                return
            val, idx = ran[1], ran[2].long()
            pairs = idx.reshape(-1, 2)
            if not r.expect(bool(((pairs >= 0) & (pairs <= 3)).all() and (pairs[:, 0] < pairs[:, 1]).all()),
                            f"{label}: every group needs two different indices in 0..3, the smaller first "
                            f"(got {pairs.tolist()[:4]} for the first groups)"):
                return
            back = decompress24(val.reshape(w.shape[0], -1), idx.reshape(w.shape[0], -1))
            _compare(r, back, w, f"{label}: w rebuilt from your values and indices", 4 * block)
    return _run_puzzle(report, kernel, body, show, hint)


def check_decompress24_kernel(kernel, show: bool = True, hint: bool = False) -> CheckResult:
    """Puzzle 7: decompress. ``kernel(val_ptr, idx_ptr, out_ptr, n_groups, BLOCK: tl.constexpr)``: write the
    dense groups, ``out[4g + idx[2g + k]] = val[2g + k]`` for k = 0, 1 and 0 at the other two columns."""
    from .compressed import compress24

    report = ExerciseReport("Triton puzzle 7: decompress values + indices to the dense matrix", solution=SOLUTION,
                            hint="load v0, v1, i, j of each group; for c in tl.static_range(4): store "
                                 "tl.where(i == c, v0, tl.where(j == c, v1, 0.0)) at out_ptr + 4 * g + c.")

    def body(r: ExerciseReport, device: torch.device) -> None:
        block = 4
        for w, label in _compress_cases():
            values, indices = compress24(w)
            n_groups = w.numel() // 4
            ran = _launch(r, kernel, device, (_cdiv(n_groups, block),),
                          (values.reshape(-1), indices.reshape(-1).int(), torch.full((w.numel(),), -7.0)), n_groups,
                          what=f"{label}: your kernel", BLOCK=block)
            if ran is None:
                return
            got = ran[2]
            if bool((got == -7.0).any()):
                r.expect(False, f"{label}: some entries were never written (first at {int((got == -7.0).nonzero()[0])}):"
                                " write all four columns of every group, zeros included")
                return
            _compare(r, got, w.reshape(-1), label, 4 * block)
    return _run_puzzle(report, kernel, body, show, hint)


def check_sparse_dot_kernel(kernel, show: bool = True, hint: bool = False) -> CheckResult:
    """Puzzle 8: a 2:4 matrix times a vector, from the compressed form, as a sparse tensor core does it.
    ``kernel(val_ptr, idx_ptr, x_ptr, out_ptr, n_groups, BLOCK_G: tl.constexpr)``, one program per row:
    row r's values and indices start at ``2 * n_groups * r``; ``out[r] = sum_g val[.., 2g] x[4g + idx[.., 2g]]
    + val[.., 2g+1] x[4g + idx[.., 2g+1]]``. BLOCK_G >= n_groups (a power of two; mask the rest)."""
    from .compressed import compress24

    report = ExerciseReport("Triton puzzle 8: a 2:4 matrix-vector product from the metadata", solution=SOLUTION,
                            hint="groups = tl.arange(0, BLOCK_G), masked by groups < n_groups; load v0, v1, i, j at "
                                 "2 * n_groups * row + 2 * groups (+1); x_i = tl.load(x_ptr + 4 * groups + i); "
                                 "tl.sum(v0 * x_i + v1 * x_j, axis=0).")

    def body(r: ExerciseReport, device: torch.device) -> None:
        for w, label in _compress_cases():
            rows, n_groups = w.shape[0], w.shape[1] // 4
            values, indices = compress24(w)
            x = torch.randn(w.shape[1], generator=_fresh_generator())
            block_g = 1 << max(n_groups - 1, 0).bit_length()
            ran = _launch(r, kernel, device, (rows,),
                          (values.reshape(-1), indices.reshape(-1).int(), x, torch.full((rows,), -7.0)), n_groups,
                          what=f"{label}: your kernel", BLOCK_G=block_g)
            if ran is None:
                return
            got, want = ran[3], w @ x
            ignored = values.reshape(rows, n_groups, 2) * x.reshape(n_groups, 4)[:, :2]
            if not torch.allclose(want, ignored.sum((1, 2)), rtol=1e-5) and torch.allclose(got, ignored.sum((1, 2)),
                                                                                            rtol=1e-5):
                r.expect(False, f"{label}: each value was multiplied by x at columns 0 and 1 of its group: the "
                                "indices pick the entries of x (x[4g + idx])")
                return
            if not r.expect_tensor(got, want, f"{label}: out = W x", atol=1e-5, rtol=1e-5):
                return
    return _run_puzzle(report, kernel, body, show, hint)
