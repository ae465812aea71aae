"""The prose of notebooks 08, 10 and 11: recorded figures are computed by cells, never typed into the
text; the expected time is stated at the top; methods and papers are cited with their links."""
import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ["08_speedups.ipynb", "10_dyad.ipynb", "11_prune_and_regrow.ipynb"]
# a speed-up such as 1.41x, a gap such as +32 % or 0.86 %, a loss such as 0.8724: figures a run records
RECORDED_FIGURE = re.compile(r"\b\d+\.\d+\s*x\b|[+-]\d+(\.\d+)?\s*%|\b\d+\.\d+\s*%|\b0\.\d{3,}\b")
TIME_LINE = re.compile(r"^\*\*Time:\*\* about .+ on a 2-core CPU at the default sizes \(CI sizes: about \d+ s\)\.$", re.M)


def _markdown(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "markdown"]


@pytest.mark.parametrize("name", NAMES)
def test_no_recorded_figure_typed_into_the_prose(name):
    found = [m.group(0) for text in _markdown(name) for m in RECORDED_FIGURE.finditer(text)]
    assert not found, f"{name}: recorded figures belong in cells that read results/, not in the text: {found}"


@pytest.mark.parametrize("name", NAMES)
def test_time_line_and_citations(name):
    first, everything = _markdown(name)[0], "\n".join(_markdown(name))
    assert TIME_LINE.search(first), f"{name}: the first cell needs the measured **Time:** line"
    assert "../docs/algorithms.md" in everything and "../docs/bibliography.md" in everything
    assert re.search(r"https://arxiv\.org/abs/\d{4}\.\d{4,5}", everything)
    for word in ("ALGORITHMS.md", "FACTS.md", "issue 13", "session "):
        assert word not in everything, f"{name}: internal wording {word!r}"
