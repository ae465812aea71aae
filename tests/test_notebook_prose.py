"""Each notebook reads as a lesson: at most ~1,500 words of prose (split a notebook rather than cram it),
short sentences, prerequisites and a time estimate at the top, a "What to remember" of 3-5 lines at the
end, and code lines (in code cells and in fenced blocks of the text) that fit the book's column.

The notebooks named in NOT_YET_SHORT are still being rewritten to these rules: their tests are
expected to fail (strict xfail, so a notebook that complies must leave the list)."""
from __future__ import annotations

import re

import nbformat
import pytest

from sparsity_lab.course import notebooks

MAX_WORDS = 1500            # prose words per notebook (markdown, code blocks and display maths left out)
MAX_MEAN_SENTENCE = 22      # words per sentence on average
MAX_SENTENCE = 50           # words in the longest sentence
MAX_CODE_LINE = 100         # characters per code line (what the book's code boxes hold: tests/test_book_pages.py)
REMEMBER = "## What to remember"

# Notebooks not yet rewritten to these rules. Empty it as they comply (a complying notebook fails here).
NOT_YET_SHORT: list[str] = []  # every notebook follows the prose rules now
# Notebooks whose fenced code blocks (```bash, ```python in the text) still hold lines over MAX_CODE_LINE.
FENCED_NOT_YET_SHORT: list[str] = []


def prose(markdown: str) -> str:
    """The words a reader reads as text: fenced code, display maths, link targets, HTML tags, headings
    and table rows left out."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"</?[A-Za-z][^<>]*>", " ", text)  # tags, not the < and > of maths
    text = re.sub(r"^\s*#.*$", " ", text, flags=re.M)
    return re.sub(r"^\s*\|.*$", " ", text, flags=re.M)


def sentences(text: str) -> list[str]:
    """Sentences of the prose: paragraphs and list items split at . ! ? before a capital or a marker."""
    out = []
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.)\s)", text):
        block = " ".join(block.split())
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`*(\[$])", block) if s.strip()]
    return out


def markdown_of(nb) -> str:
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def _mark(path):
    if path.name in NOT_YET_SHORT:
        return pytest.param(path, id=path.name, marks=pytest.mark.xfail(
            strict=True, reason=f"{path.name} is in NOT_YET_SHORT: not yet rewritten to the prose rules"))
    return pytest.param(path, id=path.name)


PATHS = [_mark(p) for p in notebooks()]


def test_not_yet_short_names_real_notebooks():
    names = {p.name for p in notebooks()}
    assert set(NOT_YET_SHORT) <= names, set(NOT_YET_SHORT) - names
    assert set(FENCED_NOT_YET_SHORT) <= names, set(FENCED_NOT_YET_SHORT) - names


def fenced_code_lines(markdown: str) -> list[str]:
    """The lines of the fenced code blocks of a Markdown text."""
    return [line for block in re.findall(r"^\s*```[^\n]*\n(.*?)^\s*```", markdown, flags=re.S | re.M)
            for line in block.splitlines()]


@pytest.mark.parametrize("path", [
    pytest.param(p, id=p.name, marks=[pytest.mark.xfail(strict=True, reason=f"{p.name} is in FENCED_NOT_YET_SHORT")]
                 if p.name in FENCED_NOT_YET_SHORT else []) for p in notebooks()])
def test_fenced_code_in_the_text_fits_the_column(path):
    """A command or snippet in the text (Things to try) must fit the book's code box as a cell's code does."""
    long = [line for line in fenced_code_lines(markdown_of(nbformat.read(path, as_version=4)))
            if len(line) > MAX_CODE_LINE]
    assert not long, (f"{path.name}: {len(long)} lines of fenced code over {MAX_CODE_LINE} characters "
                      f"(break a command with a backslash), e.g. {long[0]!r}")


def problems(path) -> list[str]:
    """Every rule of this module the notebook at ``path`` breaks, one line each."""
    nb = nbformat.read(path, as_version=4)
    found = []
    text = prose(markdown_of(nb))
    words, parts = len(text.split()), sentences(text)
    if words > MAX_WORDS:
        found.append(f"{words} words of prose, at most {MAX_WORDS}: split the notebook or cut")
    if words / max(len(parts), 1) > MAX_MEAN_SENTENCE:
        found.append(f"{words / len(parts):.1f} words per sentence on average, at most {MAX_MEAN_SENTENCE}")
    longest = max(parts, key=lambda s: len(s.split()), default="")
    if len(longest.split()) > MAX_SENTENCE:
        found.append(f"a sentence of {len(longest.split())} words: {longest[:160]!r}")
    first = nb.cells[0].source
    if "**Prerequisites:**" not in first or "**Time:**" not in first:
        found.append("the first cell needs **Prerequisites:** and **Time:**")
    last = [c for c in nb.cells if c.cell_type == "markdown"][-1].source
    if REMEMBER not in last:
        found.append(f"the last markdown cell must hold '{REMEMBER}'")
    else:
        items = [line for line in last.split(REMEMBER, 1)[1].splitlines() if re.match(r"\s*[-*] ", line)]
        if not 3 <= len(items) <= 5:
            found.append(f"'What to remember' has {len(items)} items, 3-5 wanted")
    long = [line for c in nb.cells if c.cell_type == "code" for line in c.source.splitlines()
            if len(line) > MAX_CODE_LINE]
    if long:
        found.append(f"{len(long)} code lines over {MAX_CODE_LINE} characters, e.g. {long[0]!r}")
    return found


@pytest.mark.parametrize("path", PATHS)
def test_notebook_reads_as_a_lesson(path):
    found = problems(path)
    assert not found, f"{path.name}:\n" + "\n".join(found)


def test_the_measures_see_what_they_should():
    md = "# Title\n\nOne short sentence. Another one here.\n\n```python\nnot = counted\n```\n\n- an item\n"
    assert len(prose(md).split()) == 9 and len(sentences(prose(md))) == 3
    # maths with < and > stays text (its words count); an HTML tag does not
    assert prose("keep $j < i$ when $a > b$, <b>bold</b>").split() == ["keep", "$j", "<", "i$", "when", "$a",
                                                                       ">", "b$,", "bold"]
    assert fenced_code_lines("text\n```bash\nrun --a \\\n    --b\n```\nmore") == ["run --a \\", "    --b"]
