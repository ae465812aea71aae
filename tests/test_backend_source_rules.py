"""Rules of the library's source (``sparsity_lab/`` and ``kernels/``) that keep measurements and A/B
switches out of it:

* no environment switch: a benchmark chooses a backend's variant through the backend's arguments
  (e.g. ``FP8Engine(fused=False)``), so no ``SPARSITY_LAB_*`` name is read in the library besides
  ``SPARSITY_LAB_COMMIT`` (the provenance of a recorded result);
* no measured time in a docstring or comment: timings live in ``results/`` and docs/measuring.md,
  and the code keeps the design reason ("chosen on the H100, see docs/measuring.md").
"""
import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCES = sorted([*(REPO / "sparsity_lab").rglob("*.py"), *(REPO / "kernels").rglob("*.py")])
ALLOWED_ENV = {"SPARSITY_LAB_COMMIT"}  # provenance of recorded results, not an A/B switch

# a time quoted with its unit (0.72 ms, 103.6 us, 5 µs), a rate (TFLOP/s, GB/s) with a number, or a
# measured speed ratio ("1.72x faster")
TIME = re.compile(r"\d+(\.\d+)?\s?(ms|us|µs)\b|\d+(\.\d+)?\s?(TFLOP/s|GB/s)|\d+(\.\d+)?x (faster|slower)")


def _relative(path: Path) -> str:
    return str(path.relative_to(REPO))


def _docstrings_and_comments(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every string statement (docstrings) of a module."""
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.append((node.lineno, node.value.value))
    return found


def _sparsity_lab_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of every string in the code (not docstrings) naming a SPARSITY_LAB_ variable."""
    tree = ast.parse(source)
    docs = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [(node.lineno, name) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            for name in re.findall(r"SPARSITY_LAB_[A-Z0-9_]+", node.value)]


def test_the_library_reads_no_ab_switch_from_the_environment():
    found = [f"{_relative(path)}:{line}: {name}" for path in SOURCES
             for line, name in _sparsity_lab_names(path.read_text()) if name not in ALLOWED_ENV]
    assert not found, ("the library reads SPARSITY_LAB_* switches (a benchmark passes a backend argument "
                       f"instead): {found}")


def test_no_docstring_or_comment_quotes_a_measured_time():
    found = [f"{_relative(path)}:{line}: {match.group(0)!r}" for path in SOURCES
             for line, text in _docstrings_and_comments(path.read_text()) for match in TIME.finditer(text)]
    assert not found, ("measured times belong in results/ and docs/measuring.md, the code keeps the reason "
                       f"(e.g. 'chosen on the H100, see docs/measuring.md'): {found}")


@pytest.mark.parametrize("text,quotes", [("took 0.72 ms", True), ("103.6 us", True), ("5 µs", True),
                                         ("660 TFLOP/s", True), ("60 GB/s", True), ("1.72x faster", True),
                                         ("rate in TFLOP/s", False), ("in ms (milliseconds)", False),
                                         ("4 groups", False), ("2 s n bytes", False)])
def test_the_time_pattern_tells_a_quoted_time_from_a_unit(text, quotes):
    assert bool(TIME.search(text)) is quotes


def test_the_rules_see_reads_and_comments():
    source = 'import os\n"""Doc: 3 ms."""\nx = os.environ.get("SPARSITY_LAB_FAST", "1")  # 0.5 ms\n'
    assert _sparsity_lab_names(source) == [(3, "SPARSITY_LAB_FAST")]
    assert sorted(t for _, t in _docstrings_and_comments(source)) == ["# 0.5 ms", "Doc: 3 ms."]
