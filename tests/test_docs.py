"""Cheap consistency checks of the reference pages in docs/.

Every ``sparsity_lab/...`` path named there exists, every ``sparsity_lab.x.y`` name imports, every
arXiv link carries a well-formed identifier, relative links point at existing pages, the headings
other pages link to are present, and no internal working word leaks into a public page.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))

# a module path such as sparsity_lab/masks/greedy.py or sparsity_lab/lab/ (not part of a dotted name)
PATH_RE = re.compile(r"(?<![\w.])sparsity_lab(?:/[A-Za-z_][\w]*)+(?:\.(?:py|txt|json|md))?/?")
# a dotted name such as sparsity_lab.masks.greedy.solve_greedy_keep
NAME_RE = re.compile(r"(?<![\w/])sparsity_lab(?:\.[A-Za-z_]\w*)+")
# arXiv links; the identifier is checked separately so that a malformed one is reported, not skipped
ARXIV_RE = re.compile(r"arxiv\.org/(?:abs|pdf|html)/([^\s)>\]]+)", re.IGNORECASE)
ARXIV_ID_RE = re.compile(r"(\d{2})(\d{2})\.(\d{4,5})(?:v\d+)?")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
INTERNAL_RES = [
    re.compile(r"ALGORITHMS\.md"), re.compile(r"FACTS\.md"), re.compile(r"STYLE\.md"),
    re.compile(r"shared/design"), re.compile(r"/work/"),
    re.compile(r"\bissue\s+#?\d+", re.IGNORECASE), re.compile(r"\bsession\s+#?\d+", re.IGNORECASE),
]
# headings that notebooks and other pages link to; renaming one breaks their anchors
STABLE_HEADINGS = {
    "algorithms.md": [
        "## Conventions", "## N:M magnitude masks", "## Transposable N:M masks", "## Flip rate",
        "## Straight-through estimator (STE)", "## SR-STE", "## Masked decay: on gradients and on weights",
        "## Choosing the decay factor in warm-up", "## Dense fine-tuning", "## Mask refresh interval",
        "## S-STE", "## MVUE 2:4", "## FP8 per-tensor scaling", "## DYAD",
        "## Structured dynamic sparse pre-training (prune and regrow)",
    ],
}


def module_paths(text: str) -> set[str]:
    return {match.rstrip("/") for match in PATH_RE.findall(text)}


def dotted_names(text: str) -> set[str]:
    return {match.rstrip(".") for match in NAME_RE.findall(text)}


def path_exists(path: str) -> bool:
    target = ROOT / path
    return target.is_dir() or target.is_file() or (ROOT / f"{path}.py").is_file()


def resolve(name: str) -> object:
    """Import the longest importable module prefix of ``name`` and walk the rest as attributes.
    Raises ImportError/AttributeError when the name does not exist."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as error:
            if error.name is not None and not name.startswith(error.name):
                raise  # a module that exists failed to import one of its own dependencies
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no importable prefix in {name!r}")


def arxiv_problems(text: str) -> list[str]:
    problems = []
    for ident in ARXIV_RE.findall(text):
        match = ARXIV_ID_RE.fullmatch(ident)
        if match is None:
            problems.append(f"{ident!r} is not an arXiv identifier YYMM.NNNNN")
            continue
        year, month, number = int(match[1]), int(match[2]), match[3]
        if not 1 <= month <= 12:
            problems.append(f"{ident!r}: month {month:02d} does not exist")
        # new-style identifiers started in 2007-04; five-digit numbers in 2015-01
        elif (year, month) < (7, 4) or (len(number) == 5) != ((year, month) >= (15, 1)):
            problems.append(f"{ident!r}: {len(number)}-digit number does not fit 20{year:02d}-{month:02d}")
    return problems


def internal_words(text: str) -> list[str]:
    return [m.group(0) for pattern in INTERNAL_RES for m in pattern.finditer(text)]


def test_docs_exist():
    names = {p.name for p in DOCS}
    assert {"algorithms.md", "bibliography.md"} <= names, f"docs/ holds {sorted(names)}"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_module_paths_exist(page):
    missing = sorted(p for p in module_paths(page.read_text()) if not path_exists(p))
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_dotted_names_import(page):
    broken = []
    for name in sorted(dotted_names(page.read_text())):
        try:
            resolve(name)
        except (ImportError, AttributeError) as error:
            broken.append(f"{name} ({type(error).__name__}: {error})")
    assert not broken, f"{page.name} names things that do not import: {broken}"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_arxiv_links_well_formed(page):
    problems = arxiv_problems(page.read_text())
    assert not problems, f"{page.name}: {problems}"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    targets = [t for t in LINK_RE.findall(page.read_text()) if "://" not in t and not t.startswith("#")]
    missing = [t for t in targets if not (page.parent / t.split("#")[0]).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


@pytest.mark.parametrize("page", [*DOCS, ROOT / "README.md"], ids=lambda p: p.name)
def test_no_control_characters(page):
    """A TeX command written through a Python string without r"" loses its backslash: \\top becomes a
    tab + "op", \\frac a form feed + "rac", \\nabla a new line + "abla"."""
    text = page.read_text()
    bad = [f"line {text.count(chr(10), 0, k) + 1}: {text[k]!r}" for k, ch in enumerate(text)
           if ch in "\t\f\v\b\r"]
    bad += [f"line {text.count(chr(10), 0, m.start()) + 1}: a line starting 'abla'"
            for m in re.finditer(r"\nabla", text)]
    assert not bad, f"{page.name}: {bad[:5]}"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_no_internal_words(page):
    found = internal_words(page.read_text())
    assert not found, f"{page.name} mentions internal working notes: {found}"


@pytest.mark.parametrize("name", sorted(STABLE_HEADINGS))
def test_stable_headings_present(name):
    lines = set((ROOT / "docs" / name).read_text().splitlines())
    missing = [h for h in STABLE_HEADINGS[name] if h not in lines]
    assert not missing, f"docs/{name} lost headings that other pages link to: {missing}"


def test_every_arxiv_paper_of_the_algorithms_page_is_in_the_bibliography():
    cited = set(ARXIV_RE.findall((ROOT / "docs" / "algorithms.md").read_text()))
    listed = set(ARXIV_RE.findall((ROOT / "docs" / "bibliography.md").read_text()))
    assert cited <= listed, f"cited on the algorithms page but not in the bibliography: {sorted(cited - listed)}"


# --- the checkers themselves catch what they are for --------------------------------------------
def test_checkers_flag_bad_input():
    assert arxiv_problems("see https://arxiv.org/abs/2404.01847v3 and https://arxiv.org/abs/2102.08124")  == []
    assert arxiv_problems("https://arxiv.org/abs/2413.01847")  # month 13
    assert arxiv_problems("https://arxiv.org/abs/2404.0184")  # four digits after 2015
    assert arxiv_problems("https://arxiv.org/abs/1412.69801")  # five digits before 2015
    assert arxiv_problems("https://arxiv.org/abs/cs/0101001")  # old-style, not allowed here
    assert internal_words("as FACTS.md says, see issue 13 and Session 3") == ["FACTS.md", "issue 13", "Session 3"]
    assert module_paths("`sparsity_lab/masks/greedy.py` and sparsity_lab/lab/") == {
        "sparsity_lab/masks/greedy.py", "sparsity_lab/lab"}
    assert dotted_names("`sparsity_lab.masks.nm.nm_mask`.") == {"sparsity_lab.masks.nm.nm_mask"}
    assert not path_exists("sparsity_lab/masks/no_such_module.py")
    with pytest.raises(AttributeError):
        resolve("sparsity_lab.masks.nm.no_such_function")
    with pytest.raises(ImportError):
        resolve("sparsity_lab_not_a_package.x")
