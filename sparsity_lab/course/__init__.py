"""The notebook course: running the notebooks, building them into a book, opening them in JupyterLab.

- :mod:`.running`: where the notebooks are, their CI sizes, executing them with papermill.
- :mod:`.book` and :mod:`.book_page`: executed notebooks laid out and built as a Jupyter Book.
- :mod:`.widget_snapshot`: static pictures of live plotly widgets, for the book.
- :mod:`.workdir`: the learner's working copy of the shipped notebooks.
- :mod:`.command`: ``sparsity-lab course`` (JupyterLab, or ``--headless``).

The notebooks, docs, book configuration and recorded results are read where
:mod:`sparsity_lab.shipped` finds them (a source checkout or the installed wheel) and never written.
"""
from ..shipped import NOTEBOOK_DIR
from .book import BookBuildFailed, build_book, build_course, write_book_source
from .book_page import PLOTLY_JSON, WIDGET_STATE, WIDGET_VIEW, book_notebook
from .running import (SIZES, NotebookFailed, ci_parameters, execute, execute_all, is_current, notebooks,
                      parameters_for, run_report, select_notebooks)

__all__ = [
    "BookBuildFailed", "NOTEBOOK_DIR", "NotebookFailed", "PLOTLY_JSON", "SIZES", "WIDGET_STATE", "WIDGET_VIEW",
    "book_notebook", "build_book", "build_course", "ci_parameters", "execute", "execute_all", "is_current",
    "notebooks", "parameters_for", "run_report", "select_notebooks", "write_book_source",
]
