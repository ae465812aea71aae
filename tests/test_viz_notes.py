"""A recorded NOTES.md inside a notebook page: one title per page, tables rendered, code left alone."""
import pytest

from sparsity_lab.provenance import RESULTS_DIR
from sparsity_lab.course.viz.notes_view import demote_headings, notes_html

NOTES = """# Title of the run

Some text.

## Section

| method | loss |
|---|---|
| dense | 0.84 |

```bash
# a comment, not a heading
sparsity-lab compare
```
"""


def test_headings_are_demoted_but_code_is_not():
    out = demote_headings(NOTES, 2)
    assert "### Title of the run" in out and "#### Section" in out
    assert "\n# a comment, not a heading" in out
    assert demote_headings("###### deep", 3) == "###### deep"
    with pytest.raises(ValueError, match="levels must be"):
        demote_headings(NOTES, -1)


def test_html_has_no_h1_and_real_tables():
    pytest.importorskip("markdown_it")
    html = notes_html(NOTES)
    assert "<h1" not in html and "<h3>Title of the run</h3>" in html
    assert "<table>" in html and "<td>0.84</td>" in html and "| dense |" not in html
    assert "# a comment, not a heading" in html  # inside <code>


def test_every_recorded_notes_file_renders_without_raw_tables_or_h1():
    pytest.importorskip("markdown_it")
    for path in sorted(RESULTS_DIR.glob("lab_compare_*/NOTES.md")):
        html = notes_html(path.read_text())
        assert "<h1" not in html and "|---" not in html and "| --- |" not in html, path
