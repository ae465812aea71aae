"""Exercises of notebook 06 (MVUE): solutions pass, named failures, stubs not attempted; the sampler
check is statistical and catches a small bias in the inclusion probabilities."""
import torch

from sparsity_lab.course.exercises import mvue as ex
from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED
from sparsity_lab.course.exercises.solutions import mvue as sol
from sparsity_lab.masks import nm_mask
from sparsity_lab.methods.mvue import _sequential_pick, mvue24, mvue_probabilities


def _stub(*args):
    raise NotImplementedError


def _failed(result, *words):
    assert result.status == FAILED, result.message
    for word in words:
        assert word in result.message, result.message


def test_solutions_pass_and_stubs_are_not_attempted():
    for check, solution in ((ex.check_mvue_probabilities, sol.mvue_probabilities),
                            (ex.check_mvue_sampler, sol.mvue24), (ex.check_mvue_variance, sol.mvue_variance)):
        assert check(solution, show=False).status == PASSED, check(solution, show=False).message
        assert check(_stub, show=False).status == NOT_ATTEMPTED
    # the library's exact sampler passes too
    assert ex.check_mvue_sampler(lambda x, g: mvue24(x, generator=g), show=False)


def test_probability_mistakes_are_named():
    _failed(ex.check_mvue_probabilities(lambda x: 2 * x.abs() / x.abs().sum(-1, keepdim=True), show=False),
            "not a probability")
    _failed(ex.check_mvue_probabilities(lambda x: x.abs() / x.abs().sum(-1, keepdim=True), show=False), "sum p = 2")


def test_sampler_mistakes_are_named():
    def no_rescale(x, g):
        y = sol.mvue24(x, g)
        return torch.where(y != 0, x, y)
    _failed(ex.check_mvue_sampler(no_rescale, show=False), "divide them by p_i")

    def sequential_picks_exact_division(x, g):   # slightly wrong inclusion probabilities: biased
        groups = x.reshape(-1, 4)
        keep = _sequential_pick(groups, g) & (groups != 0)
        return torch.where(keep, groups / mvue_probabilities(groups), 0 * groups).reshape(x.shape)
    _failed(ex.check_mvue_sampler(sequential_picks_exact_division, show=False), "standard errors")

    def global_rng(x, g):
        return sol.mvue24(x, torch.Generator().manual_seed(int(torch.randint(0, 2**30, ()))))
    _failed(ex.check_mvue_sampler(global_rng, show=False), "generator")

    def top2(x, g):
        return x * nm_mask(x, 2, 4)
    _failed(ex.check_mvue_sampler(top2, show=False))


def test_sampler_bound_scales_with_the_draw_count():
    """A 2 % bias in the kept frequency of one entry hides in 400 draws but not in 40 000: the bound is
    Z standard errors, and the standard error shrinks like 1 / sqrt(draws)."""
    def slightly_biased(x, g):
        groups = x.double().reshape(-1, 4)
        p = mvue_probabilities(groups)
        q = p.clone()
        q[..., 1] = torch.where((p[..., 1] > 0.1) & (p[..., 1] < 0.9), p[..., 1] - 0.02, p[..., 1])
        q[..., 2] = torch.where((p[..., 1] > 0.1) & (p[..., 1] < 0.9), p[..., 2] + 0.02, p[..., 2])
        hi = torch.cumsum(q, -1)
        hi[..., -1] = 2.0
        lo = torch.cat([torch.zeros_like(hi[..., :1]), hi[..., :-1]], -1)
        u = torch.rand(groups.shape[0], 1, generator=g, dtype=torch.float64)
        keep = ((lo <= u) & (u < hi)) | ((lo <= u + 1) & (u + 1 < hi))
        return torch.where(keep & (groups != 0), groups / p, 0 * groups).reshape(x.shape)
    assert ex.check_mvue_sampler(slightly_biased, draws=40_000, show=False).status == FAILED
    # 400 draws: the standard error of a frequency near 0.5 is 0.025, a 0.02 shift is within 5 of them
    assert ex.check_mvue_sampler(slightly_biased, draws=400, show=False).status == PASSED


def test_variance_mistake_is_named():
    _failed(ex.check_mvue_variance(lambda x: (x.double() ** 2 * (1 / mvue_probabilities(x) - 1)).sum(-1), show=False),
            "nan")
