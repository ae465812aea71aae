"""The repository cites only its own files and public sources, never internal notes or work items.

Every tracked text file (``git ls-files``) is scanned for the names of the team's design notes and
for work-item words ("issue 4", "session 3"). A reader of the repository cannot open either: a fact
must cite docs/, the notebooks, a results/ file, or a public paper or project (a GitHub issue is
cited by its URL, which is allowed). Each hit is reported as ``path:line: text``.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# files whose purpose is to hold these words: the detectors themselves
DETECTORS = {
    "tests/test_docs.py",
    "tests/test_book_pages.py",
    "tests/test_notebook_prose_structures.py",
    "tests/test_repository_speaks_for_itself.py",
}
# the notes' names are matched case-sensitively: docs/algorithms.md is the repository's own page
INTERNAL = re.compile(
    r"ALGORITHMS\.md|FACTS\.md|STYLE\.md|shared/design"
    # "issue 4", "Session 3", "issue #13", and the joined forms of file names: "session3", "issue-4", "_session_3"
    r"|(?i:(?<![a-z])(?:issue|session)s?[\s_-]*#?\d+\b)"
)
# a public issue cited by its address is a public source, e.g. github.com/pytorch/pytorch/issues/155333
GITHUB_ISSUE_URL = re.compile(r"(?:https?://)?github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+\S*")


def internal_citations(text: str) -> list[tuple[int, str]]:
    """(line number, matched words) for every line of ``text`` that cites an internal note or work item."""
    hits = []
    for number, line in enumerate(text.splitlines(), start=1):
        found = [m.group(0) for m in INTERNAL.finditer(GITHUB_ISSUE_URL.sub("", line))]
        if found:
            hits.append((number, ", ".join(found)))
    return hits


def tracked_text_files() -> list[Path]:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = []
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if not name or name in DETECTORS or not path.is_file():
            continue
        if b"\0" in path.read_bytes()[:8192]:  # binary
            continue
        files.append(path)
    return files


def test_detector_catches_internal_citations_and_allows_public_issue_links():
    assert [n for n, _ in internal_citations("fine\nsee FACTS.md\nas Issue 4 asked\nsessions 2 to 4")] == [2, 3, 4]
    assert internal_citations("../shared/design/ALGORITHMS.md and STYLE.md") == [
        (1, "shared/design, ALGORITHMS.md, STYLE.md")]
    assert internal_citations("Session 3: results") and internal_citations("issue #13")
    assert internal_citations("see docs/algorithms.md and ../docs/algorithms.md") == []
    assert internal_citations("https://github.com/pytorch/pytorch/issues/155333 (pytorch/pytorch#155333)") == []
    assert internal_citations("the issue slots of a warp; issues/155333; session-based; 2 sessions") == []
    assert [words for _, words in internal_citations("run6_final_session3.json\nissue-4 fix\nnotes_issue_13")] == [
        "session3", "issue-4", "issue_13"]
    assert internal_citations("tissue 4 and obsession 2") == []


def test_no_tracked_file_cites_internal_notes_or_work_items():
    files = tracked_text_files()
    assert len(files) > 50, f"only {len(files)} tracked text files found under {ROOT}"
    hits = []
    for path in files:
        # the file's own name is read too: results/run6_final_session3.json cites a work item
        for _, words in internal_citations(str(path.relative_to(ROOT))):
            hits.append(f"{path.relative_to(ROOT)}: (its name) {words}")
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, words in internal_citations(text):
            hits.append(f"{path.relative_to(ROOT)}:{number}: {words}")
    assert not hits, ("cite docs/, notebooks, results/ or a public source instead of internal notes "
                      "or work items:\n" + "\n".join(hits))
