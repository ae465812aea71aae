"""Notebook 10's exercises: solutions pass, wrong answers fail with a message naming the problem."""
import pytest
import torch

from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED
from sparsity_lab.course.exercises.dyad import (check_dyad_it_weight, check_dyad_params, check_product_fractions,
                                         reference_dyad_weight)
from sparsity_lab.course.exercises.solutions import dyad as solution


def _stub(*args):
    raise NotImplementedError


@pytest.mark.parametrize("check, fn", [(check_dyad_it_weight, solution.dyad_it_weight),
                                       (check_dyad_params, solution.dyad_params),
                                       (check_product_fractions, solution.product_fractions)])
def test_solutions_pass_and_stubs_are_not_attempted(check, fn):
    assert check(fn, show=False).status == PASSED
    assert check(_stub, show=False).status == NOT_ATTEMPTED


def test_dyad_weight_wrong_answers():
    ot = check_dyad_it_weight(lambda a, b: reference_dyad_weight(a, b, "ot"), show=False)
    assert ot.status == FAILED and "DYAD-OT" in ot.message
    no_perm = check_dyad_it_weight(
        lambda a, b: torch.block_diag(*[a[k].T for k in range(a.shape[0])]) +
        torch.block_diag(*[b[k].T for k in range(b.shape[0])]), show=False)
    assert no_perm.status == FAILED and "entries differ" in no_perm.message
    untransposed = check_dyad_it_weight(
        lambda a, b: reference_dyad_weight(a.transpose(1, 2), b.transpose(1, 2), "it"), show=False)
    assert untransposed.status == FAILED  # wrong shape when b_in != b_out, named transposition when square
    assert "transposed" in untransposed.message or "shape" in untransposed.message


def test_dyad_params_wrong_answers():
    no_bias = check_dyad_params(lambda i, o, n, bias: 2 * i * o // n, show=False)
    assert no_bias.status == FAILED and "bias is missing" in no_bias.message
    one_term = check_dyad_params(lambda i, o, n, bias: i * o // n + (o if bias else 0), show=False)
    assert one_term.status == FAILED and "two block tensors" in one_term.message


def test_product_fractions_wrong_answers():
    def all_half(method, n):
        f = {"dense": 1.0, "24": 0.5, "24_mvue": 0.5, "dyad": 2 / n}[method]
        return {"forward": f, "grad_input": f, "grad_weight": f}
    wrong = check_product_fractions(all_half, show=False)
    assert wrong.status == FAILED and "product_fractions('24', 4)['grad_weight']" in wrong.message

    def dyad_one_over_n(method, n):
        out = solution.product_fractions(method, n)
        return {k: 1 / n for k in out} if method == "dyad" else out
    assert "expected 0.5" in check_product_fractions(dyad_one_over_n, show=False).message
