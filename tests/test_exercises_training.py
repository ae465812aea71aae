"""The training exercises: each solution passes, the stub is not attempted, plausible wrong answers
fail with a message that names the problem."""
import statistics

import pytest
import torch

from sparsity_lab.course.exercises import training as ex
from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED
from sparsity_lab.course.exercises.solutions import training as sol

CHECKS = {
    "flip_rate": (ex.check_flip_rate, sol.flip_rate),
    "overall_flip_rate": (ex.check_overall_flip_rate, sol.overall_flip_rate),
    "srste_gradient": (ex.check_srste_gradient, sol.srste_gradient),
    "adamw_on_gradients": (ex.check_adamw_on_gradients, sol.adamw_on_gradients),
    "adamw_on_weights": (ex.check_adamw_on_weights, sol.adamw_on_weights),
    "dense_finetune_switch": (ex.check_dense_finetune_switch, sol.dense_finetune_switch),
    "flip_trend": (ex.check_flip_trend, sol.flip_trend),
    "seed_band": (ex.check_seed_band, sol.seed_band),
    "bands_separated": (ex.check_bands_separated, sol.bands_separated),
}


def stub(*args):
    raise NotImplementedError


@pytest.mark.parametrize("name", list(CHECKS))
def test_solution_passes_and_stub_is_not_attempted(name):
    check, solution = CHECKS[name]
    assert check(solution, show=False).status == PASSED
    assert check(stub, show=False).status == NOT_ATTEMPTED


def failure(check, fn):
    result = check(fn, show=False)
    assert result.status == FAILED, result.message
    return result.message


def test_adam_step_from_scratch_matches_torch():
    torch.manual_seed(0)
    w = torch.randn(4, 8, dtype=torch.float64)
    p = torch.nn.Parameter(w.clone())
    opt = torch.optim.AdamW([p], lr=1e-2, betas=ex.BETAS, eps=ex.EPS, weight_decay=0.0)
    state = ex.new_adam_state(w)
    for _ in range(3):
        g = torch.randn(4, 8, dtype=torch.float64)
        p.grad = g.clone()
        opt.step()
        w = ex.adamw_step(w, g, 1e-2, state)
    torch.testing.assert_close(w, p.detach())


def test_flip_rate_wrong_answers():
    assert "kept entries" in failure(ex.check_flip_rate, lambda p, c: (p ^ c).sum().item() / p.sum().item())
    assert "joined it" in failure(ex.check_flip_rate, lambda p, c: (p & ~c).sum().item() / p.numel())
    assert "mean of the per-layer rates" in failure(
        ex.check_overall_flip_rate, lambda pairs: sum(sol.flip_rate(p, c) for p, c in pairs) / len(pairs))


def test_srste_wrong_answers():
    assert "kept weights" in failure(ex.check_srste_gradient, lambda g, w, m, d: g + d * w * m)
    assert "wrong sign" in failure(ex.check_srste_gradient, lambda g, w, m, d: g - d * w * ~m)


def test_decay_placements_swapped_or_missing_are_named():
    assert "other placement" in failure(ex.check_adamw_on_gradients, sol.adamw_on_weights)
    assert "other placement" in failure(ex.check_adamw_on_weights, sol.adamw_on_gradients)
    plain = lambda w, g, m, d, lr, state: ex.adamw_step(w, g, lr, state)  # noqa: E731
    assert "term is missing" in failure(ex.check_adamw_on_weights, plain)
    # the decay of the weights before the step instead of after: close, but not the library's update
    before = lambda w, g, m, d, lr, s: ex.adamw_step(w - lr * d * w * ~m, g, lr, s)  # noqa: E731
    assert "differ" in failure(ex.check_adamw_on_weights, before)


def test_other_wrong_answers():
    assert "expected" in failure(ex.check_dense_finetune_switch, lambda t, a: int(a * t))
    assert "window edges" in failure(ex.check_flip_trend, lambda rates, steps: 1.0)

    def population_band(runs):
        cols = list(zip(*runs))
        m = [statistics.fmean(c) for c in cols]
        s = [statistics.pstdev(c) for c in cols]
        return m, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)]
    assert "population standard deviation" in failure(ex.check_seed_band, population_band)
    means = lambda hi, lo: statistics.fmean(hi) > statistics.fmean(lo)  # noqa: E731
    assert "seeds overlap" in failure(ex.check_bands_separated, means)
