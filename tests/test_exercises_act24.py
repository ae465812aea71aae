"""Notebook 13's exercises: the worked solutions pass, plausible wrong answers fail with a message
that names the problem, a stub is "not attempted"."""
import pytest
import torch

from sparsity_lab.course.exercises.act24 import check_act24, check_ffn_speedup, check_grad_h, check_natural_sparsity
from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED
from sparsity_lab.course.exercises.solutions import act24 as solution


def _stub(*args):
    raise NotImplementedError


@pytest.mark.parametrize("check, fn", [(check_act24, solution.act24), (check_natural_sparsity, solution.natural_sparsity),
                                       (check_grad_h, solution.grad_h), (check_ffn_speedup, solution.ffn_speedup)])
def test_solutions_pass_and_stubs_are_not_attempted(check, fn):
    assert check(fn, show=False).status == PASSED
    assert check(_stub, show=False).status == NOT_ATTEMPTED


def _topk_keep(a):
    g = a.reshape(*a.shape[:-1], -1, 4)
    idx = g.topk(2, dim=-1).indices
    return torch.zeros_like(g, dtype=torch.bool).scatter_(-1, idx, True).reshape(a.shape)


def test_act24_wrong_answers():
    no_prune = check_act24(lambda h: torch.relu(h) ** 2, show=False)
    assert no_prune.status == FAILED and "keeps" in no_prune.message and "at most 2" in no_prune.message
    before_relu = check_act24(lambda h: torch.relu(h) ** 2 * _topk_keep(h.abs()), show=False)
    assert before_relu.status == FAILED and "before the ReLU" in before_relu.message
    no_square = check_act24(lambda h: torch.relu(h) * _topk_keep(torch.relu(h)), show=False)
    assert no_square.status == FAILED and "differ" in no_square.message


def test_natural_sparsity_wrong_answers():
    strict = check_natural_sparsity(lambda a: ((a == 0).float().mean().item(),
                                               ((a != 0).reshape(-1, 4).sum(-1) < 2).float().mean().item()),
                                    show=False)
    assert strict.status == FAILED and "<= 2, not < 2" in strict.message
    # the non-zero fraction instead of the zero fraction (the second value right): named as zero_fraction
    density = check_natural_sparsity(lambda a: ((a != 0).float().mean().item(), solution.natural_sparsity(a)[1]),
                                     show=False)
    assert density.status == FAILED and "zero_fraction" in density.message
    scalar = check_natural_sparsity(lambda a: 0.5, show=False)
    assert scalar.status == FAILED and "pair of numbers" in scalar.message


def test_grad_h_wrong_answers():
    no_mask = check_grad_h(lambda h, da: da * 2 * torch.relu(h), show=False)
    assert no_mask.status == FAILED and "pruned entries received a gradient" in no_mask.message
    half = check_grad_h(lambda h, da: solution.grad_h(h, da) / 2, show=False)
    assert half.status == FAILED and "2 relu(h)" in half.message
    upstream_only = check_grad_h(lambda h, da: da * (solution.act24(h) != 0), show=False)
    assert upstream_only.status == FAILED and "differ" in upstream_only.message


def test_ffn_speedup_wrong_answers():
    averaged = check_ffn_speedup(lambda k, s, n=6: 1 + k / n * (s - 1), show=False)
    assert averaged.status == FAILED and "averages the speed-ups" in averaged.message
    product_only = check_ffn_speedup(lambda k, s, n=6: s, show=False)
    assert product_only.status == FAILED and "expected" in product_only.message



def test_ties_to_the_higher_index_fail_with_the_shared_tie_rule():
    """A ranking that breaks ties otherwise (as torch.topk may) is named as a tie problem, in the words
    every check uses; the hint no longer recommends topk."""
    from sparsity_lab.course.exercises.checking import TIE_RULE

    def higher_index_wins(h):
        a = torch.relu(h) ** 2
        g = a.reshape(*a.shape[:-1], -1, 4).flip(-1)  # a stable sort of the reversed group: ties to the higher index
        order = torch.sort(g, dim=-1, descending=True, stable=True).indices[..., :2]
        keep = torch.zeros_like(g, dtype=torch.bool).scatter_(-1, order, True).flip(-1)
        return (a.reshape(g.shape) * keep).reshape(a.shape)

    result = check_act24(higher_index_wins, show=False)
    assert result.status == FAILED
    assert "a tie is broken differently" in result.message and TIE_RULE in result.message
    assert "topk" not in result.hint
