"""Exercises of notebook 05 (S-STE): solutions pass, named failures, stubs not attempted."""
import torch

from sparsity_lab.course.exercises import sste as ex
from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED
from sparsity_lab.course.exercises.solutions import sste as sol
from sparsity_lab.masks import nm_mask


def _stub(*args):
    raise NotImplementedError


def _failed(result, *words):
    assert result.status == FAILED, result.message
    for word in words:
        assert word in result.message, result.message


def test_solutions_pass_and_stubs_are_not_attempted():
    for check, solution in ((ex.check_soft_threshold, sol.soft_threshold), (ex.check_sste_beta, sol.sste_beta),
                            (ex.check_sste_weight, sol.sste_weight)):
        assert check(solution, show=False).status == PASSED, check(solution, show=False).message
        assert check(_stub, show=False).status == NOT_ATTEMPTED


def test_soft_threshold_mistakes_are_named():
    _failed(ex.check_soft_threshold(lambda w: w * nm_mask(w, 2, 4), show=False), "hard-pruned")
    _failed(ex.check_soft_threshold(lambda w: sol.soft_threshold(w).abs(), show=False), "sign")

    def smallest_t(w):
        a = w.abs()
        t = a.reshape(w.shape[0], -1, 4).amin(-1, keepdim=True).expand(-1, -1, 4).reshape(w.shape)
        return torch.where(nm_mask(w, 2, 4), torch.sign(w) * (a - t).clamp_min(0), torch.zeros_like(w))
    _failed(ex.check_soft_threshold(smallest_t, show=False), "largest *pruned*")


def test_beta_and_weight_mistakes_are_named():
    _failed(ex.check_sste_beta(lambda w, s: float((s.double() ** 2).sum() / (w.double() * s.double()).sum()),
                               show=False), "inverse")
    _failed(ex.check_sste_beta(lambda w, s: float(w.norm() / s.norm()) if s.norm() > 0 else 1.0, show=False),
            "||W|| / ||S||")
    _failed(ex.check_sste_weight(lambda w, b: (b * sol.soft_threshold(w)).detach(), show=False), "does not require grad")
    _failed(ex.check_sste_weight(lambda w, b: w * nm_mask(w, 2, 4) + (b * sol.soft_threshold(w.detach())
                                                                       - w * nm_mask(w, 2, 4)).detach(), show=False),
            "zero at pruned entries")
