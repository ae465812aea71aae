"""Notebook 08's exercises: the worked solutions pass, plausible wrong answers fail with a message
that names the problem, a stub is "not attempted"."""
import pytest

from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED
from sparsity_lab.course.exercises.solutions import speedups as solution
from sparsity_lab.course.exercises.speedups import check_linear_flops, check_step_speedup, check_tflops


def _stub(*args):
    raise NotImplementedError


@pytest.mark.parametrize("check, fn", [(check_linear_flops, solution.linear_flops), (check_tflops, solution.tflops),
                                       (check_step_speedup, solution.step_speedup)])
def test_solutions_pass_and_stubs_are_not_attempted(check, fn):
    assert check(fn, show=False).status == PASSED
    assert check(_stub, show=False).status == NOT_ATTEMPTED


def test_linear_flops_wrong_answers():
    macs_only = check_linear_flops(lambda t, i, o: {k: t * i * o for k in ("forward", "grad_input", "grad_weight")},
                                   show=False)
    assert macs_only.status == FAILED and "multiply-add is 2 FLOPs" in macs_only.message
    forward_only = check_linear_flops(lambda t, i, o: {"forward": 2 * t * i * o}, show=False)
    assert forward_only.status == FAILED and "keys" in forward_only.message
    total = check_linear_flops(lambda t, i, o: 6 * t * i * o, show=False)
    assert total.status == FAILED and "dict" in total.message


def test_tflops_wrong_answers():
    seconds = check_tflops(lambda f, ms: f / ms / 1e12, show=False)
    assert seconds.status == FAILED and "milliseconds" in seconds.message
    gflops = check_tflops(lambda f, ms: f / (ms * 1e-3) / 1e9, show=False)
    assert gflops.status == FAILED and "expected" in gflops.message


def test_step_speedup_wrong_answers():
    mean = check_step_speedup(lambda parts: sum(s for _, s in parts) / len(parts), show=False)
    assert mean.status == FAILED and "averages the speed-ups" in mean.message
    assert "weighted by time" not in mean.message  # a plain mean is told it is one, not a weighted one
    # the harmonic mean of the speed-ups equals Amdahl's answer when every part takes the same time
    harmonic = check_step_speedup(lambda parts: len(parts) / sum(1 / s for _, s in parts), show=False)
    assert harmonic.status == FAILED and "how long each part takes" in harmonic.message
    weighted = check_step_speedup(lambda parts: sum(m * s for m, s in parts) / sum(m for m, _ in parts), show=False)
    assert weighted.status == FAILED and "weighted by time" in weighted.message
    products_only = check_step_speedup(lambda parts: parts[0][1], show=False)
    assert products_only.status == FAILED
