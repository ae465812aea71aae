"""Graded exercises for the course notebooks.

Each topic module (``masks``, ``sste``, ...) offers ``check_<thing>(your_function)``: it runs your code
on fresh random inputs and hand-made edge cases, compares with the library's reference, and prints
what is wrong (or that it is right). A function that still raises ``NotImplementedError`` is reported
as not attempted, so a notebook runs from top to bottom before you have written anything. A hint comes
after a failed attempt: at the second failure in a row, or on request (``hint()`` after a failure, or
``check_<thing>(your_function, hint=True)``). Worked solutions live in ``sparsity_lab.course.exercises.solutions`` (one module per topic): try first.
"""
from .checking import CheckResult, ExerciseReport, hint

__all__ = ["CheckResult", "ExerciseReport", "hint"]
