"""The checks of the MVUE variant benchmark (``mvue_variants``): each returns (ok, detail) and never
raises on a wrong kernel output, so one broken variant is recorded and the others still run."""
from __future__ import annotations

import torch

from sparsity_lab.methods.mvue import mvue_probabilities

DRAWS = 200  # draws of the unbiasedness check


def groups_of(t: torch.Tensor, dim: int) -> torch.Tensor:
    """(..., L, ...) with groups of 4 along ``dim`` -> (n_groups, 4)."""
    return t.movedim(dim, -1).reshape(-1, 4)


def check_support_and_values(x: torch.Tensor, y: torch.Tensor, probabilities: torch.Tensor,
                             rtol: float = 1.6e-2) -> tuple[bool, str]:
    """At most 2 non-zeros per group; kept values x / p; groups with < 2 non-zeros unchanged.

    x, y: (n_groups, 4) float64 views of the same groups; probabilities: the reference's p for x.
    rtol: bf16 rounding of x / p (2^-7 covers the interpreter's truncation too).
    """
    kept = y != 0
    most = int(kept.sum(1).max())
    if most > 2:
        return False, f"a group keeps {most} entries"
    if bool((kept & (probabilities <= 0)).any()):
        return False, "an entry with p = 0 was kept"
    expected = x / probabilities.clamp_min(1e-300)
    bad = (y - expected).abs()[kept] > rtol * expected.abs()[kept]
    if bool(bad.any()):
        return False, f"{int(bad.sum())} kept values differ from x / p by more than rtol={rtol}"
    few = (x != 0).sum(1) < 2
    if not torch.equal(y[few], x[few]):
        return False, "a group with fewer than 2 non-zeros was changed"
    return True, "ok"


def check_unbiased(x: torch.Tensor, draws_mean: torch.Tensor, kept_freq: torch.Tensor, probabilities: torch.Tensor,
                   draws: int, ulp: float) -> tuple[bool, str]:
    """Mean of ``draws`` draws within 6 standard errors of x (+ ``ulp`` * |x| of output rounding);
    kept frequency of every non-zero within 6 standard deviations of p. All (n_groups, 4) float64."""
    var = x ** 2 * (1 / probabilities.clamp_min(1e-300) - 1)  # variance of one draw
    err = (draws_mean - x).abs()
    bound = 6 * (var / draws).sqrt() + (ulp + 1e-12) * x.abs() + 1e-30  # 1e-12: float64 summation
    if not bool((err <= bound).all()):
        return False, f"mean off by {float((err / bound).max()):.2f} x the bound"
    nz = x != 0
    fbound = 6 * (probabilities * (1 - probabilities) / draws).sqrt() + 1e-9
    if not bool(((kept_freq - probabilities).abs()[nz] <= fbound[nz]).all()):
        return False, "kept frequency differs from p"
    return True, "ok"


def check_independent_neighbours(code: torch.Tensor) -> tuple[bool, str]:
    """code: (rows, groups) pick patterns of all-ones groups (5 = {0, 2}, 10 = {1, 3}, each with
    probability 1/2). Groups 1..3 apart along either axis agree half of the time when independent."""
    if not bool(((code == 5) | (code == 10)).all()):
        return False, "an all-ones group did not keep {0, 2} or {1, 3}"
    for d in (1, 2, 3):
        for axis, same in (("groups", code[:, d:] == code[:, :-d]), ("rows", code[d:, :] == code[:-d, :])):
            if same.numel() == 0:
                continue
            freq = float(same.double().mean())
            if abs(freq - 0.5) > 6 * (0.25 / same.numel()) ** 0.5:
                return False, f"groups {d} apart along the {axis} agree {freq:.3f} of the time (expected 0.5)"
    return True, "ok"


def small_checks(M, variant: str, dim: int, block: int, warps: int, device: torch.device, smoke: bool) -> dict:
    """Unbiasedness over DRAWS draws and independence of neighbouring groups, bf16 (one launch each).

    Sizes keep the integer arguments in the benchmark's specialisation class (multiples of 16), so
    the configuration compiled for the timing is reused on the GPU.
    """
    n = 16 if smoke else 64
    gen = torch.Generator().manual_seed(123)
    x = torch.randn(n, n, generator=gen)
    x[0, :4] = torch.tensor([3.0, 0.1, 0.1, 0.1])  # the largest capped at p = 1
    x[1, :4] = torch.tensor([0.0, 0.0, 2.0, 0.0])  # a single non-zero
    x[2, :4] = torch.tensor([0.0, 1.5, 0.0, -0.5])  # two non-zeros: both kept
    x[3, :4] = 0.0
    x = x.to(torch.bfloat16)
    if dim == 0:
        x = x.t().contiguous()  # the special groups along the rows
        rep = x.repeat(1, DRAWS).to(device)  # the draws side by side in the columns
        ys = M.mvue24(rep, dim=0, seed=11, block=block, num_warps=warps, variant=variant).cpu()
        ys = ys.reshape(n, DRAWS, n).transpose(0, 1)
    else:
        rep = x.unsqueeze(0).expand(DRAWS, n, n).contiguous().to(device)
        ys = M.mvue24(rep, dim=-1, seed=11, block=block, num_warps=warps, variant=variant).cpu()
    ys = ys.double()
    gx = groups_of(x.double(), dim)
    p = mvue_probabilities(gx)
    mean = groups_of(ys.mean(0), dim)
    freq = groups_of((ys != 0).double().mean(0), dim)
    unbiased = check_unbiased(gx, mean, freq, p, DRAWS, ulp=torch.finfo(torch.bfloat16).eps)

    m = 32 if smoke else 128
    ones = torch.ones(m, m, dtype=torch.bfloat16, device=device)
    y1 = M.mvue24(ones, dim=dim, seed=17, block=block, num_warps=warps, variant=variant).cpu()
    kept = (y1 != 0).movedim(dim, -1).reshape(m, m // 4, 4)
    code = (kept.int() * torch.tensor([1, 2, 4, 8])).sum(-1)
    independent = check_independent_neighbours(code)
    return {"unbiased": unbiased, "independent": independent}
