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


@pytest.mark.parametrize("wrong, named", [
    (lambda f, s: (s + 1) / 2, "mean of the speed-ups s and 1 at equal weights"),
    (lambda f, s: f * s + (1 - f), "weighted by time"),
    (lambda f, s: 2 / (1 / s + 1), "right only when the products take half the step"),
    (lambda f, s: s, "the products' speed-up alone"),
    (lambda f, s: (1 - f) + f / s, "the speed-up is its inverse"),
    (lambda f, s: 1 / ((1 - f) + f * s), "f / s, not f * s"),
    (lambda f, s: 1 / (1 - f), "infinitely fast products"),
])
def test_step_speedup_names_each_classic_mistake(wrong, named):
    result = check_step_speedup(wrong, show=False)
    assert result.status == FAILED and named in result.message, result.message
    assert result.message.count(" (that") + result.message.count(" (the") == 1  # one mistake named, not several


def test_step_speedup_inputs_tell_the_mean_from_amdahl():
    """The mean of the speed-ups equals Amdahl's answer at f = s / (s + 1): the check's first inputs are
    far from it, so a mean is caught there, not after a lucky pass."""
    from sparsity_lab.course.exercises.speedups import reference_step_speedup

    seen = []
    check_step_speedup(lambda f, s: seen.append((f, s)) or reference_step_speedup(f, s), show=False)
    f, s = seen[0]
    assert abs((s + 1) / 2 - reference_step_speedup(f, s)) > 0.1
    assert abs(2 / (1 / s + 1) - reference_step_speedup(f, s)) > 0.1


def test_step_speedup_other_wrong_answers():
    anything = check_step_speedup(lambda f, s: 1.0, show=False)
    assert anything.status == FAILED and "expected 1.81818" in anything.message and " (th" not in anything.message
    text = check_step_speedup(lambda f, s: "1.8x", show=False)
    assert text.status == FAILED and "'1.8x'" in text.message
    raises = check_step_speedup(lambda f, s: [f, s][2], show=False)
    assert raises.status == FAILED and "IndexError" in raises.message


def test_step_speedup_hint_only_after_a_failed_attempt():
    from sparsity_lab.course.exercises import checking

    checking._failures.clear()
    assert "Hint:" not in check_step_speedup(_stub, show=False).message
    first = check_step_speedup(lambda f, s: (s + 1) / 2, show=False)
    second = check_step_speedup(lambda f, s: (s + 1) / 2, show=False)
    assert "Hint:" not in first.message and "Hint:" in second.message and "old time over the new" in second.message
