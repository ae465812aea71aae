"""The shared checking machinery of the course exercises: stub, right, wrong and crashing answers."""
import torch

from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED, ExerciseReport, run_check


def _check_double(fn):
    report = ExerciseReport("double", hint="multiply by 2", solution="demo")

    def body(r):
        x = torch.arange(1.0, 6.0)
        r.expect_tensor(r.call(fn, x, what="double(x)"), 2 * x, "double(x)", atol=1e-6)
    return run_check(report, body, show=False)


def _stub(x):
    raise NotImplementedError


def test_stub_is_not_attempted():
    assert _check_double(_stub).status == NOT_ATTEMPTED


def test_right_answer_passes():
    assert _check_double(lambda x: x * 2).status == PASSED


def test_wrong_values_name_the_first_wrong_entry():
    result = _check_double(lambda x: x * 3)
    assert result.status == FAILED and not result
    assert "index (0,)" in result.message and "got 3" in result.message and "solutions/demo.py" in result.message


def test_wrong_shape_and_crash_are_failures_not_exceptions():
    assert "shape" in _check_double(lambda x: x[0]).message
    crashed = _check_double(lambda x: x.nonexistent())
    assert crashed.status == FAILED and "AttributeError" in crashed.message
