"""The machinery every ``check_...`` function shares: run the learner's code, collect what is wrong,
print one clear verdict.

A check builds an :class:`ExerciseReport`, calls the learner's function through ``report.call`` (which
turns ``NotImplementedError`` into "not attempted" and any other exception into a failure that names
it), records problems with ``report.expect_*`` and returns ``report.verdict()``.

Hints come after an attempt, never before: an untouched stub gets one line, a first failure names what
is wrong, and the hint (with the worked solution's file) is printed after a second failure in a row of
the same exercise, or on request: ``check_x(your_fn, hint=True)`` or :func:`hint` after a failure.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

PASSED, FAILED, NOT_ATTEMPTED = "passed", "failed", "not attempted"
_SYMBOL = {PASSED: "PASS", FAILED: "FAIL", NOT_ATTEMPTED: "TODO"}
HINT_AFTER = 2  # failed attempts in a row after which the hint is shown unasked

# the tie rule of every mask in the course, said the same way by every check that finds a tie broken otherwise
TIE_RULE = ("among equal magnitudes the lowest index is kept: rank with a stable sort "
            "(torch.sort(a, descending=True, stable=True)) or by counting; torch.topk does not say which of "
            "equal values it returns")


def tie_problem(label: str, at: Any) -> str:
    """The problem text for a mask with the right magnitudes whose ties went elsewhere (first at ``at``)."""
    return f"{label}: right magnitudes, but a tie is broken differently (first at index {at}): {TIE_RULE}"


def tie_broken_otherwise(got: torch.Tensor, want: torch.Tensor, m: int) -> tuple[int, ...] | None:
    """The first index where ``got`` and ``want`` differ when every group of ``m`` along the last dimension
    keeps the same magnitudes in both (a tie went to another member); None when they are equal or differ
    in what they keep. got, want: pruned tensors, or masks times the magnitudes, of one shape (..., K)."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.shape[-1] % m or torch.equal(got, want):
        return None
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    sorted_g = g.abs().reshape(*g.shape[:-1], -1, m).sort(-1).values
    sorted_w = w.abs().reshape(*w.shape[:-1], -1, m).sort(-1).values
    if not torch.equal(sorted_g, sorted_w):
        return None
    return tuple(int(i) for i in (g != w).nonzero()[0])


_failures: dict[str, int] = {}  # exercise title -> failed attempts in a row, in this Python process
_last_failed: list["CheckResult"] = []  # the latest failed check, for hint()


class _NotAttempted(Exception):
    """Raised inside a check when the learner's function is still the stub."""


@dataclass
class CheckResult:
    """What a check found. Truthy only when the exercise passed."""

    title: str
    status: str
    problems: list[str] = field(default_factory=list)
    hint: str = ""
    solution: str = ""        # the worked solution's path, shown with the hint
    hint_shown: bool = False  # whether ``message`` carries the hint (after a failed attempt only)

    def __bool__(self) -> bool:
        return self.status == PASSED

    @property
    def hint_text(self) -> str:
        """The hint and the worked solution's file, one line each (empty when the check has neither)."""
        lines = [f"  Hint: {self.hint}"] if self.hint else []
        if self.solution:
            lines.append(f"  A worked solution: {self.solution} (read it after trying)")
        return "\n".join(lines)

    @property
    def message(self) -> str:
        head = f"[{_SYMBOL[self.status]}] {self.title}"
        if self.status == PASSED:
            return head + ": correct."
        if self.status == NOT_ATTEMPTED:
            return head + ": not attempted yet (replace `raise NotImplementedError` with your code)."
        lines = [head + ":"] + [f"  - {p}" for p in self.problems[:5]]
        if len(self.problems) > 5:
            lines.append(f"  ... and {len(self.problems) - 5} more")
        if self.hint_shown and self.hint_text:
            lines.append(self.hint_text)
        elif self.hint_text:
            lines.append("  Stuck? hint() shows a hint; a second failed attempt shows it too.")
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
    def verdict(self, show: bool = True, hint: bool = False) -> CheckResult:
        """The result; a failure counts towards the hint (shown at the HINT_AFTER-th failure in a row, or
        at once with ``hint=True``), a pass starts the count again, a stub leaves it alone."""
        if not self._attempted:
            status = NOT_ATTEMPTED
        else:
            status = FAILED if self.problems else PASSED
        solution = f"sparsity_lab/course/exercises/solutions/{self.solution}.py" if self.solution else ""
        result = CheckResult(self.title, status, list(self.problems), self.hint, solution)
        if status == FAILED:
            _failures[self.title] = _failures.get(self.title, 0) + 1
            result.hint_shown = hint or _failures[self.title] >= HINT_AFTER
            _last_failed[:] = [result]
        elif status == PASSED:
            _failures.pop(self.title, None)
        if show:
            print(result.message)
        return result


def run_check(report: ExerciseReport, body: Callable[[ExerciseReport], None], show: bool = True,
              hint: bool = False) -> CheckResult:
    """Run ``body(report)`` (which calls the learner's code through ``report.call``) and return the verdict;
    a stub stops the body early and is reported as not attempted. ``hint``: show the hint on a failure
    now, not only after the second one."""
    if not isinstance(hint, bool):
        raise TypeError(f"hint must be True or False, got {hint!r}")
    try:
        body(report)
    except _NotAttempted:
        pass
    return report.verdict(show=show, hint=hint)


def hint() -> str:
    """Print (and return) the hint of the latest failed check. Before any failed attempt there is none
    to give: the check of your attempt says what is wrong first."""
    if not _last_failed:
        text = "No failed attempt yet: write your code, run its check, and ask again if it fails."
    else:
        result = _last_failed[0]
        text = f"{result.title}:\n{result.hint_text}" if result.hint_text else f"{result.title}: this check has no hint."
    print(text)
    return text
