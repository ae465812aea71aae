"""The machinery every ``check_...`` function shares: run the learner's code, collect what is wrong,
print one clear verdict.

A check builds an :class:`ExerciseReport`, calls the learner's function through ``report.call`` (which
turns ``NotImplementedError`` into "not attempted" and any other exception into a failure that names
it), records problems with ``report.expect_*`` and returns ``report.verdict()``.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

PASSED, FAILED, NOT_ATTEMPTED = "passed", "failed", "not attempted"
_SYMBOL = {PASSED: "PASS", FAILED: "FAIL", NOT_ATTEMPTED: "TODO"}


class _NotAttempted(Exception):
    """Raised inside a check when the learner's function is still the stub."""


@dataclass
class CheckResult:
    """What a check found. Truthy only when the exercise passed."""

    title: str
    status: str
    problems: list[str] = field(default_factory=list)
    hint: str = ""

    def __bool__(self) -> bool:
        return self.status == PASSED

    @property
    def message(self) -> str:
        head = f"[{_SYMBOL[self.status]}] {self.title}"
        if self.status == PASSED:
            return head + ": correct."
        if self.status == NOT_ATTEMPTED:
            return head + ": not attempted yet (replace `raise NotImplementedError` with your code)." + \
                (f"\n  Hint: {self.hint}" if self.hint else "")
        lines = [head + ":"] + [f"  - {p}" for p in self.problems[:5]]
        if len(self.problems) > 5:
            lines.append(f"  ... and {len(self.problems) - 5} more")
        if self.hint:
            lines.append(f"  Hint: {self.hint}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.message


class ExerciseReport:
    """Collects the problems one check finds. ``title`` names the exercise; ``solution`` names the
    module of :mod:`sparsity_lab.course.exercises.solutions` that solves it (shown on failure)."""

    def __init__(self, title: str, hint: str = "", solution: str | None = None) -> None:
        self.title = title
        self.hint = hint
        self.solution = solution
        self.problems: list[str] = []
        self._attempted = True

    # --- running the learner's code ------------------------------------------------------
    def call(self, fn: Callable, *args: Any, what: str = "", **kwargs: Any) -> Any:
        """fn(*args, **kwargs); NotImplementedError -> not attempted; another error -> a problem
        (and :class:`_NotAttempted`-style early stop through ``None``)."""
        if not callable(fn):
            raise TypeError(f"{self.title}: pass your function itself (e.g. check(my_fn)), got {type(fn).__name__}")
        try:
            return fn(*args, **kwargs)
        except NotImplementedError:
            self._attempted = False
            raise _NotAttempted from None
        except Exception as exc:  # the learner's bug, reported rather than raised
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.problems.append(f"{what or 'your function'} raised {type(exc).__name__}: {exc} "
                                 f"(line {where.lineno}: {where.line})")
            return None

    # --- expectations --------------------------------------------------------------------
    def expect(self, condition: bool, problem: str) -> bool:
        if not condition:
            self.problems.append(problem)
        return bool(condition)

    def expect_tensor(self, got: Any, want: torch.Tensor, what: str, *, atol: float = 0.0, rtol: float = 0.0,
                      dtype_matters: bool = False) -> bool:
        """got equals want (within atol + rtol * |want|): type, shape, then values; the first wrong
        entry is named so the learner can look at it."""
        if got is None:
            return False  # the call already reported why
        if not isinstance(got, torch.Tensor):
            return self.expect(False, f"{what}: expected a torch.Tensor, got {type(got).__name__}")
        if got.shape != want.shape:
            return self.expect(False, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        if dtype_matters and got.dtype != want.dtype:
            return self.expect(False, f"{what}: dtype {got.dtype}, expected {want.dtype}")
        g, w = got.detach().to("cpu", torch.float64), want.detach().to("cpu", torch.float64)
        bad = ~torch.isclose(g, w, atol=atol, rtol=rtol, equal_nan=False)
        if bool(bad.any()):
            idx = tuple(int(i) for i in bad.nonzero()[0])
            return self.expect(False, f"{what}: {int(bad.sum())} of {want.numel()} entries differ; first at "
                                      f"index {idx}: got {g[idx].item():.6g}, expected {w[idx].item():.6g}")
        return True

    # --- the verdict ---------------------------------------------------------------------
    def verdict(self, show: bool = True) -> CheckResult:
        if not self._attempted:
            status = NOT_ATTEMPTED
        else:
            status = FAILED if self.problems else PASSED
        hint = self.hint
        if status == FAILED and self.solution:
            hint = (hint + " " if hint else "") + f"(A worked solution: sparsity_lab/course/exercises/solutions/{self.solution}.py)"
        result = CheckResult(self.title, status, list(self.problems), hint)
        if show:
            print(result.message)
        return result


def run_check(report: ExerciseReport, body: Callable[[ExerciseReport], None], show: bool = True) -> CheckResult:
    """Run ``body(report)`` (which calls the learner's code through ``report.call``) and return the verdict;
    a stub stops the body early and is reported as not attempted."""
    try:
        body(report)
    except _NotAttempted:
        pass
    return report.verdict(show=show)
