"""Exercises of notebooks 15 (delayed FP8 scaling) and 06 (the bytes of a scale pass): the solution passes, mistakes are named, the stub is not attempted."""
import math

import pytest

from sparsity_lab.course.exercises import fp8_scaling as ex
from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED
from sparsity_lab.course.exercises.solutions import fp8_scaling as sol


def _failed(result, *words):
    assert result.status == FAILED, result.message
    for word in words:
        assert word in result.message, result.message


@pytest.mark.parametrize("check, solution", [(ex.check_delayed_scales, sol.delayed_scales),
                                              (ex.check_pass_bytes, sol.pass_bytes)])
def test_solution_passes_and_the_stub_is_not_attempted(check, solution):
    assert check(solution, show=False).status == PASSED

    def stub(*args):
        raise NotImplementedError
    assert check(stub, show=False).status == NOT_ATTEMPTED


def test_a_window_without_the_current_step_is_caught():
    def lagging(amaxes, length, margin, fmax):
        out, scale = [], 1.0
        for t in range(len(amaxes)):
            window = amaxes[max(0, t - length):t] or [0.0]
            a = max(window)
            if a > 0 and math.isfinite(a):
                scale = a / fmax * 2.0 ** margin
            out.append(scale)
        return out
    _failed(ex.check_delayed_scales(lagging, show=False), "a spike")


def test_ignoring_the_margin_or_a_bad_amax_is_caught():
    def no_margin(amaxes, length, margin, fmax):
        return sol.delayed_scales(amaxes, length, 0, fmax)
    _failed(ex.check_delayed_scales(no_margin, show=False), "margin 2")

    def trusts_every_amax(amaxes, length, margin, fmax):
        return [max(amaxes[max(0, t - length + 1):t + 1]) / fmax * 2.0 ** margin for t in range(len(amaxes))]
    _failed(ex.check_delayed_scales(trusts_every_amax, show=False), "infinite")


# --- the bytes of a scale pass (notebook 06, section 4) ------------------------------------------------
def test_pass_bytes_mistakes_are_named_and_the_hint_waits_for_a_second_failure():
    def read_only(m, n, b_in, b_out):
        return m * n * b_in
    first = ex.check_pass_bytes(read_only, show=False)
    _failed(first, "one direction only")
    assert not first.hint_shown and "Hint" not in first.message
    assert ex.check_pass_bytes(read_only, show=False).hint_shown  # the second failure in a row shows it

    def always_bf16(m, n, b_in, b_out):
        return 4 * m * n
    _failed(ex.check_pass_bytes(always_bf16, show=False), "float32 in, bf16 out")
    assert ex.check_pass_bytes(sol.pass_bytes, show=False).status == PASSED
