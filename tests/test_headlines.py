"""One fact, one number: every headline figure that README.md, docs/*.md and the notebooks' text quote
agrees with sparsity_lab.course.headlines, which reads each from one file under results/."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sparsity_lab.course import headlines

ROOT = Path(__file__).resolve().parent.parent

# how each unit is written in prose; a clause that quotes a fact is checked for numbers of its unit
NUMBER = {
    "x": r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x\b",
    "fraction": r"(?<![\w.])[01]\.\d\d(?:-[01]\.\d\d)?(?= of\b)",
    "s": r"(?<![\w.])\d+(?:\.\d+)? s\b",
    "ms": r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ms\b",
    "%": r"(?<![\w.])[+-]?\d+(?:\.\d+)? ?%",
}
# figures that are not measurements: the hardware's promise, the targets the runs are judged by, and a
# prediction computed from measured parts (notebook 08's Amdahl exercise)
NOT_MEASURED = re.compile(r"(?<![\w.])2x\b|within \d+ ?%|under \d+(?:\.\d+)? s\b|\d\.\d\d of the copy rate or more"
                          r"|predicts \d+\.\d+x")

# where each fact must be quoted (a figure nobody quotes needs no check; one the README drops is lost)
QUOTED_IN = {
    "README.md": ["ffn_speedup", "gpt_step_speedup", "gpt_step_all_linears_speedup", "kernel_copy_fraction",
                  "mvue_copy_fraction", "transposable_kernel_speedup", "gated_kernel_speedup", "mask_solver_24",
                  "mask_solver_48", "cslt_host_overhead", "fp8_loss_gap"],
}


# the evidence page: it lists every recorded run with that run's own figures (two runs of one benchmark
# differ), and the figures behind the code's choices; the lessons, the README and the other docs quote
# the one headline
EVIDENCE = ("measuring.md",)


def documents() -> dict[str, str]:
    """README.md, docs/*.md (but the evidence page) and every notebook's markdown cells, by path relative
    to the root."""
    docs = {"README.md": (ROOT / "README.md").read_text()}
    docs.update({f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in EVIDENCE})
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        docs[f"notebooks/{nb.name}"] = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return docs


def clauses(text: str) -> list[str]:
    """Sentences and semicolon clauses, lines joined (a figure and its cue may sit on two lines)."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        out += re.split(r"(?<=[.;])\s+(?=[A-Z(`*\[-])|;\s+", " ".join(para.split()))
    return out


def disagreements(text: str, facts: dict[str, headlines.Headline]) -> list[str]:
    """Each clause that quotes a fact with a number other than the headline's."""
    bad = []
    for clause in clauses(text):
        quoted = [h for h in facts.values() if re.search(h.cue, clause, re.IGNORECASE)]
        stripped = NOT_MEASURED.sub("", clause)
        for unit in {h.unit for h in quoted}:
            allowed = {h.text for h in quoted if h.unit == unit}
            for number in re.findall(NUMBER[unit], stripped):
                if number not in allowed:
                    keys = ", ".join(f"{h.key} = {h.text}" for h in quoted if h.unit == unit)
                    bad.append(f"{number!r} where the headline is {keys}: {clause[:160]!r}")
    return bad


@pytest.fixture(scope="module")
def facts():
    return headlines.all_headlines()


def test_every_headline_reads_and_formats(facts):
    assert len(facts) >= 12
    for h in facts.values():
        assert h.text and h.source.startswith("results/") and (ROOT / h.source).is_file(), h
        found = re.search(NUMBER[h.unit], f"({h.text} of")  # the checker must see the headline as a figure
        assert found and found.group(0) == h.text, h
        assert h.text in str(h) and h.baseline in str(h)


def test_ffn_headline_is_the_fastest_dense_one(facts):
    h = facts["ffn_speedup"]
    assert h.text == "1.31x" and "704 TFLOP/s" in h.baseline and "H100" in h.where, h


@pytest.mark.parametrize("name", list(documents()))
def test_quoted_figures_agree_with_the_headlines(name, facts):
    bad = disagreements(documents()[name], facts)
    assert not bad, f"{name} quotes figures that differ from sparsity_lab.course.headlines:\n" + "\n".join(bad)


def test_the_checker_catches_a_second_number_for_one_fact(facts):
    old = ("An FFN block at 16384 tokens x d_model 4096 trains 1.28-1.31x faster than the fastest dense step; "
           "notebook 01 says the same FFN at 16384 x 4096 is 1.43x.")
    assert len(disagreements(old, facts)) == 2
    assert not disagreements(f"The FFN at 16384 x 4096 runs {facts['ffn_speedup'].text} dense, not 2x.", facts)
    fp8 = f"An FP8 2:4 FFN block at 16384 x 4096 ran {facts['fp8_ffn_speedup'].text} faster than dense FP8."
    bf16 = f"A 2:4 FFN block at 16384 x 4096 ran {facts['fp8_ffn_speedup'].text} faster than dense bf16."
    assert not disagreements(fp8, facts) and disagreements(bf16, facts)


@pytest.mark.parametrize("doc", list(QUOTED_IN))
def test_key_facts_are_quoted(doc, facts):
    text = documents()[doc]
    missing = [k for k in QUOTED_IN[doc]
               if not any(re.search(facts[k].cue, c, re.IGNORECASE) and facts[k].text in c for c in clauses(text))]
    assert not missing, f"{doc} does not quote {[str(facts[k]) for k in missing]}"


def test_step_profile_parts_are_the_runs_own_amdahl_figures(facts):
    """Notebook 08's Amdahl exercise reads the step profile's parts: with them, Amdahl's law gives the
    ceiling that the benchmark recorded for the same run, and the quoted step is that run's measured one."""
    from sparsity_lab.provenance import read_result

    run = read_result(headlines.STEP_PROFILE_RUN)
    parts = headlines.step_profile_parts(run)
    recorded = run["summary"]["runs"][f"{parts['mode']} {parts['config']}"]
    f, s = facts["profiled_products_share"].value, facts["profiled_products_speedup"].value
    assert 1 / ((1 - f) + f / s) == pytest.approx(recorded["ceiling"]["ceiling_speedup"], rel=1e-9)
    assert facts["profiled_step_speedup"].value == pytest.approx(recorded["speedup_vs_fastest_dense"], rel=1e-9)
    assert parts["mode"] == run["summary"]["fastest_dense"] and parts["sparse_ms"] < parts["dense_ms"]
    assert facts["profiled_products_share"].text == f"{f:.2f}"


# --- the printed outputs: a notebook's checked cells (tests/nbval_reference/) quote the same figures ----------

REFERENCE = ROOT / "tests" / "nbval_reference"
TABLE_ROW = re.compile(r"\d\s{2,}\S")  # columns of numbers: a row of a printed table


def output_clauses(text: str) -> list[str]:
    """The clauses of a printed output: each line (a wrapped line, indented 4 or more and not a table row,
    joined to the one it continues) together with the first line of its paragraph, which titles a table
    or a list; the first line alone too."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = []
        for line in para.splitlines():
            if not line.strip():
                continue
            if lines and line.startswith("    ") and not TABLE_ROW.search(line):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line.strip())
        if lines:
            out += [lines[0]] + [f"{lines[0]} {line}" for line in lines[1:]]
    return out


def checked_outputs() -> dict[str, str]:
    """The printed text of every checked cell of every notebook's reference copy, by notebook."""
    found = {}
    for path in sorted(REFERENCE.glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        found[path.name] = "\n\n".join("".join(out.get("text", "")) for c in cells for out in c.get("outputs", [])
                                       if out.get("output_type") == "stream")
    return found


@pytest.mark.parametrize("name", list(checked_outputs()))
def test_printed_outputs_quote_the_headline_figures(name, facts):
    """A recorded figure a cell prints (a table of another run, a summary line) gives no second number for
    a headline fact: notebook 10 printed 1.43x for the FFN at 16384 x 4096, 06 a 1.25x FP8 FFN step."""
    bad = [b for clause in output_clauses(checked_outputs()[name]) for b in disagreements(clause, facts)]
    assert not bad, f"{name} prints figures that differ from sparsity_lab.course.headlines:\n" + "\n".join(bad)


def test_the_output_check_reads_tables_and_wrapped_lines(facts):
    table = ("2:4 FFN (S-STE + MVUE), fwd + bwd, paired:\n  tokens  d_model  2:4 speed-up\n"
             "   16384     4096          1.43x\n    4096     1024          0.17x")
    assert [b.split("'")[1] for c in output_clauses(table) for b in disagreements(c, facts)] == ["1.43x"]
    wrapped = (f"FP8 2:4 FFN block, forward + backward, 16384 tokens x d_model 4096: "
               f"{facts['fp8_ffn_speedup'].text} against dense FP8\n"
               f"the same FP8 2:4 FFN block with cuSPARSELt's host alpha in place of a scale pass after each\n"
               f"    product: {facts['fp8_host_alpha_gain'].text} against the step with the scale pass")
    assert not [b for c in output_clauses(wrapped) for b in disagreements(c, facts)]
