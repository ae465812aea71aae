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
    assert "index (0,)" in result.message and "got 3" in result.message and "solutions/demo.py" in result.hint_text


def test_wrong_shape_and_crash_are_failures_not_exceptions():
    assert "shape" in _check_double(lambda x: x[0]).message
    crashed = _check_double(lambda x: x.nonexistent())
    assert crashed.status == FAILED and "AttributeError" in crashed.message


# --- hints come after an attempt -----------------------------------------------------------------------
import importlib  # noqa: E402
import inspect  # noqa: E402
import pkgutil  # noqa: E402

import pytest  # noqa: E402

from sparsity_lab.course import exercises  # noqa: E402
from sparsity_lab.course.exercises import checking  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_hint_state(monkeypatch):
    monkeypatch.setattr(checking, "_failures", {})
    monkeypatch.setattr(checking, "_last_failed", [])


def _printed(capsys, fn, **kwargs):
    report = ExerciseReport("double", hint="multiply by 2", solution="demo")

    def body(r):
        x = torch.arange(1.0, 6.0)
        r.expect_tensor(r.call(fn, x, what="double(x)"), 2 * x, "double(x)", atol=1e-6)
    result = run_check(report, body, **kwargs)
    return result, capsys.readouterr().out


def test_untouched_stub_prints_one_line_and_no_hint(capsys):
    result, out = _printed(capsys, _stub)
    assert out.strip().count("\n") == 0 and "not attempted" in out
    assert "multiply by 2" not in out and "solutions/demo.py" not in out and "Hint" not in out
    result, out = _printed(capsys, _stub)  # a stub never counts as an attempt
    assert "multiply by 2" not in out


def test_first_failure_names_the_error_but_not_the_hint(capsys):
    result, out = _printed(capsys, lambda x: x * 3)
    assert result.status == FAILED and "index (0,)" in out
    assert "multiply by 2" not in out and "solutions/demo.py" not in out
    assert "hint()" in out  # says how to ask for one


def test_second_failure_in_a_row_shows_the_hint_and_a_pass_starts_again(capsys):
    _printed(capsys, lambda x: x * 3)
    _, out = _printed(capsys, lambda x: x + 1)
    assert "Hint: multiply by 2" in out and "solutions/demo.py" in out
    _printed(capsys, lambda x: x * 2)
    _, out = _printed(capsys, lambda x: x * 3)
    assert "multiply by 2" not in out


def test_hint_on_request_after_a_failure(capsys):
    _, out = _printed(capsys, lambda x: x * 3, hint=True)
    assert "Hint: multiply by 2" in out
    checking._failures.clear()
    checking._last_failed.clear()
    assert "No failed attempt yet" in exercises.hint()
    _printed(capsys, lambda x: x * 3)
    text = exercises.hint()
    assert "multiply by 2" in text and "solutions/demo.py" in text and text in capsys.readouterr().out


def test_hint_must_be_a_bool():
    with pytest.raises(TypeError, match="hint must be True or False"):
        run_check(ExerciseReport("double"), lambda r: None, show=False, hint="yes")


def _all_checks():
    """Every check_... of the exercise modules, except the Triton puzzles (their stubs are kernels:
    tests/test_exercises_triton.py)."""
    for info in pkgutil.iter_modules(exercises.__path__):
        if info.name in ("checking", "solutions", "triton_puzzles"):
            continue
        module = importlib.import_module(f"{exercises.__name__}.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("check_") and fn.__module__ == module.__name__:
                yield f"{info.name}.{name}", fn


def _any_stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("name,check", list(_all_checks()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_check_of_a_stub_is_one_line_without_hint(name, check, capsys):
    assert "hint" in inspect.signature(check).parameters, f"{name} takes no hint=True"
    result = check(_any_stub)
    out = capsys.readouterr().out
    assert result.status == NOT_ATTEMPTED, (name, out)
    assert out.strip().count("\n") == 0 and "Hint" not in out and "solutions/" not in out, (name, out)
