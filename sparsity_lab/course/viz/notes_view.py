"""A recorded run's NOTES.md shown inside a notebook page: headings moved down so the page keeps a
single title, and the tables rendered (the book's default Markdown renderer for outputs is plain
CommonMark, which shows GitHub-style tables as raw text)."""
from __future__ import annotations

import html
import re

_HEADING = re.compile(r"^(#{1,6})(\s)")
_FENCE = re.compile(r"^\s*(```|~~~)")


def demote_headings(text: str, levels: int = 2) -> str:
    """Every Markdown heading ``levels`` deeper (at most ######); fenced code blocks are left alone
    (a ``# comment`` in a bash block is not a heading)."""
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 0:
        raise ValueError(f"levels must be an int >= 0, got {levels!r}")
    out, in_code = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_code = not in_code
        elif not in_code:
            line = _HEADING.sub(lambda m: "#" * min(6, len(m.group(1)) + levels) + m.group(2), line)
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def notes_html(text: str, levels: int = 2) -> str:
    """The Markdown ``text`` as an HTML fragment: headings demoted by ``levels``, tables rendered
    (markdown-it-py, which the course's Jupyter Book brings). Without markdown-it-py the text is shown
    preformatted, with a line saying why."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str (the Markdown of a NOTES.md), got {type(text).__name__}")
    body = demote_headings(text, levels)
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return ("<p><em>markdown-it-py is not installed (pip install 'sparsity-lab[lab]'): the notes are shown "
                f"as text.</em></p><pre style=\"white-space: pre-wrap\">{html.escape(body)}</pre>")
    rendered = MarkdownIt("commonmark").enable("table").render(body)
    return f'<div class="sparsity-lab-notes" style="max-width: 100%; overflow-x: auto">{rendered}</div>'


def show_notes(text: str, levels: int = 2):
    """``notes_html`` as an IPython HTML object, for a notebook cell's output."""
    from IPython.display import HTML
    return HTML(notes_html(text, levels))
