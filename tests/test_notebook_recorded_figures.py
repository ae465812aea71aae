"""Notebook prose never hard-codes a figure recorded in results/: a cell computes it, the text refers to it.

Re-recording a benchmark rewrites its JSON; a figure copied into a markdown cell would then be stale
without anyone noticing. This test reads every number written with a unit in the markdown cells of
notebooks/*.ipynb ("1.43x", "18.8 ms", "235k tokens/s", "680 TFLOP/s", "6.71 GiB", "18.8M tokens",
"0.94 of the copy rate", "1.57e-3") and reports it when a value recorded under a key of the same kind
in results/**/*.json rounds to it (a speed-up against ``speedup``/``ratio`` keys, milliseconds against
``ms`` keys, and so on; a number in scientific notation against every recorded value).

Not counted: numbers with fewer than two significant digits ("2x": the pattern's own figure, too
coarse to be a copied measurement; three for scientific notation, and for whole numbers of seconds or
percent, "75 %" of the blocks), the course's **Time:** line, fenced code blocks and inline code
(commands and their sizes), and any sentence that carries a link to a paper (arXiv, DOI,
OpenReview, a proceedings page): figures cited from a paper are stated with their source.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

NUMBER = r"(\d+(?:[.,]\d+)*(?:\.\d+)?)"
# unit name -> (pattern whose group 1 is the number and group 2 an optional scale letter, key test)
UNITS: dict[str, tuple[re.Pattern, re.Pattern]] = {
    "speed-up": (re.compile(NUMBER + r"()\s*(?:x|×|\\times)(?![\w{])"),
                 re.compile(r"speedup|ratio|_vs_|^measured$|paired_m(?:in|ax)|unpaired")),
    "ms": (re.compile(NUMBER + r"()\s*ms\b"), re.compile(r"(?:^|_)ms(?:$|_)")),
    "s": (re.compile(NUMBER + r"()\s*s\b(?!/)"), re.compile(r"(?:^|_)s$|seconds|_s_")),
    "tokens/s": (re.compile(NUMBER + r"\s*([kM])?\s*tokens?/s"), re.compile(r"tokens_per_s")),
    "tokens": (re.compile(NUMBER + r"\s*([kMB])\s*tokens\b(?!/)"), re.compile(r"^tokens|tokens_per_variant")),
    "TFLOP/s": (re.compile(NUMBER + r"()\s*TFLOP/s"), re.compile(r"tflops")),
    "GiB": (re.compile(NUMBER + r"()\s*GiB\b"), re.compile(r"gib")),
    "GB/s": (re.compile(NUMBER + r"()\s*GB/s"), re.compile(r"gbps")),
    "TB/s": (re.compile(NUMBER + r"()\s*TB/s"), re.compile(r"gbps")),
    "of copy": (re.compile(NUMBER + r"()\s*(?:of (?:the )?copy|x copy)"), re.compile(r"fraction")),
    "%": (re.compile(NUMBER + r"()\s*(?:%|\\%|percent)"), re.compile(r"pct|percent|fraction|share")),
}
SCIENTIFIC = re.compile(r"(\d\.\d+)\s*(?:e|E|\s*\\times\s*10\^)\{?([-−]\d+)\}?")
SCALE = {"": 1.0, "k": 1e3, "M": 1e6, "B": 1e9}
# units whose keys hold values of every kind (wall times, fractions): a whole number needs 3 digits
COARSE_KEYS = {"s", "%"}
# the course's own timing line, measured when the notebook was written (not a recorded result)
TIME_LINE = re.compile(r"^\*\*Time:\*\*.*$", re.M)
# a sentence with one of these is citing a paper; its figures are the paper's
PAPER_LINK = re.compile(r"arxiv\.org|doi\.org|openreview\.net|proceedings\.|aclanthology\.org|papers\.nips\.cc", re.I)
FENCED = re.compile(r"```.*?```", re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
SENTENCE_END = re.compile(r"(?<=[.!?:;])\s+(?=[A-Z(*\[])|\n\s*\n|\n(?=\s*[-*|#])")


@dataclass(frozen=True)
class Hit:
    where: str
    written: str
    unit: str
    recorded: str

    def __str__(self) -> str:
        return f"{self.where}: {self.written!r} ({self.unit}) equals {self.recorded}"


def recorded_values(results_dir: Path) -> list[tuple[str, str, float]]:
    """(file, key, value) for every number in results/**/*.json; a list's numbers carry the list's key."""
    found: list[tuple[str, str, float]] = []

    def walk(name: str, key: str, value) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, (int, float)) and math.isfinite(value):
            found.append((name, key, float(value)))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(name, str(k), v)
        elif isinstance(value, list):
            for v in value:
                walk(name, key, v)

    for path in sorted(results_dir.rglob("*.json")):
        walk(str(path.relative_to(results_dir.parent)), "", json.loads(path.read_text()))
    return found


def significant_digits(text: str) -> int:
    digits = text.replace(",", "").replace(".", "").lstrip("0")
    if "." not in text:
        digits = digits.rstrip("0")
    return len(digits)


def decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def prose_sentences(markdown: str) -> list[str]:
    """The prose of a markdown cell, split into sentences, without code blocks or inline code."""
    text = INLINE_CODE.sub(" ", FENCED.sub(" ", TIME_LINE.sub(" ", markdown)))
    return [s for s in SENTENCE_END.split(text) if s.strip()]


def _in_written_unit(value: float, unit: str, letter: str, key: str) -> float:
    """A recorded value in the unit the prose wrote it in: "235k" tokens/s, "94 %" of a fraction, TB/s of GB/s."""
    if unit == "%" and not re.search(r"pct|percent", key):
        return value * 100.0
    return value / SCALE[letter] / (1e3 if unit == "TB/s" else 1.0)


def hard_coded_figures(markdown: str, where: str, recorded: list[tuple[str, str, float]]) -> list[Hit]:
    """Every figure of ``markdown``'s prose that a recorded value of the same kind rounds to."""
    hits: list[Hit] = []
    for sentence in prose_sentences(markdown):
        if PAPER_LINK.search(sentence):
            continue
        for unit, (pattern, key_test) in UNITS.items():
            for match in pattern.finditer(sentence):
                text, letter = match.group(1).replace(",", ""), match.group(2) or ""
                if significant_digits(text) < 2:
                    continue
                if unit in COARSE_KEYS and "." not in text and significant_digits(text) < 3:
                    continue  # "75 %" of the blocks, "18 s": a value of every size has keys like these
                written, places = float(text), decimals(text)
                for name, key, value in recorded:
                    if not key_test.search(key.lower()):
                        continue
                    if round(_in_written_unit(value, unit, letter, key.lower()), places) == written:
                        hits.append(Hit(where, match.group(0), unit, f"{name} {key} = {value!r}"))
                        break
        for match in SCIENTIFIC.finditer(sentence):
            mantissa, exponent = match.group(1), int(match.group(2).replace("−", "-"))
            if significant_digits(mantissa) < 3:
                continue
            written = float(mantissa)
            for name, key, value in recorded:
                if value == 0:
                    continue
                if math.floor(math.log10(abs(value))) == exponent and \
                        round(abs(value) / 10.0 ** exponent, decimals(mantissa)) == written:
                    hits.append(Hit(where, match.group(0), "scientific", f"{name} {key} = {value!r}"))
                    break
    return hits


@pytest.fixture(scope="module")
def recorded():
    values = recorded_values(ROOT / "results")
    assert len(values) > 1000, f"only {len(values)} recorded numbers found under results/"
    return values


def _markdown_cells(path: Path) -> list[tuple[int, str]]:
    cells = json.loads(path.read_text())["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_prose_does_not_hard_code_recorded_figures(notebook, recorded):
    hits = [hit for index, source in _markdown_cells(notebook)
            for hit in hard_coded_figures(source, f"{notebook.name} cell {index}", recorded)]
    assert not hits, ("markdown states figures recorded in results/; compute them in a cell from the JSON "
                      "and let the text refer to that cell:\n" + "\n".join(map(str, hits)))


# --- the checker itself ---------------------------------------------------------------------------
FAKE = [("results/ffn.json", "speedup_vs_dense", 1.4312), ("results/ffn.json", "ms", 18.83),
        ("results/run.json", "median_tokens_per_s", 235_123.0), ("results/run.json", "flip_late", 0.0015704),
        ("results/ffn.json", "threshold", 1.35), ("results/k.json", "fraction_of_copy", 0.9412),
        ("results/run.json", "tokens_per_variant", 18_776_064), ("results/d.json", "peak_memory_gib_per_rank", 6.7131)]


@pytest.mark.parametrize("prose, unit", [
    ("The sparse FFN ran **1.43x** faster than dense.", "speed-up"),
    ("Dense took 18.8 ms per step.", "ms"),
    ("The lab trained at 235k tokens/s on the H100.", "tokens/s"),
    ("STE's late flip rate was 1.57e-3 against 1.97e-3 for dense.", "scientific"),
    ("MVUE ran at 0.94 of the copy rate.", "of copy"),
    ("MVUE ran at 94.1 % of the copy rate.", "%"),
    ("It trained 18.8M tokens per method.", "tokens"),
    ("Peak memory 6.71 GiB per rank.", "GiB"),
    ("A planted figure in a list:\n- the step is 1.43× faster", "speed-up"),
])
def test_checker_catches_a_planted_figure(prose, unit):
    hits = hard_coded_figures(prose, "planted", FAKE)
    assert [h.unit for h in hits] == [unit], hits


@pytest.mark.parametrize("prose", [
    "Twice the dense rate in theory: 2x, never more.",  # one significant digit: the pattern's own figure
    "The target is 1.35x, against the fastest dense.",  # recorded only as a threshold, not a measurement
    "Hu et al. report 1.43x on their GPT ([arXiv:2404.01847](https://arxiv.org/abs/2404.01847)).",
    "Run `python -m benchmarks ffn --budget-s 18.8` and read the cell above.",  # inline code
    "```bash\nsparsity-lab compare --max-tokens 18.8e6\n```",
    "The cell above prints the speed-up beside the dense baseline's TFLOP/s.",
    "A value of 1.44x was never recorded.",
    "**Time:** about 2 min on a 2-core CPU at the default sizes (CI sizes: 19 s).",
    "Prune 75 % of the blocks.",
])
def test_checker_allows_cited_coarse_and_code_figures(prose):
    assert hard_coded_figures(prose, "allowed", FAKE) == []


def test_checker_reads_a_notebook_with_a_planted_figure(tmp_path, recorded):
    """End to end on a copy of a real notebook: a figure of results/ planted in a markdown cell fails."""
    import nbformat

    ffn = json.loads((ROOT / "results" / "cusparselt_ffn_h100.json").read_text())
    measured = ffn["targets"]["ffn_fwd_bwd_ours_mvue"]["measured"]
    nb = nbformat.read(ROOT / "notebooks" / "08_speedups.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell(f"The FFN step ran {measured:.2f}x faster than dense."))
    planted = tmp_path / "08_speedups.ipynb"
    nbformat.write(nb, planted)
    hits = [hit for index, source in _markdown_cells(planted)
            for hit in hard_coded_figures(source, f"cell {index}", recorded)]
    assert [h.written for h in hits] == [f"{measured:.2f}x"], hits
