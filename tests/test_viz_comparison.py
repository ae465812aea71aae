"""The pre-training comparison notebook's helpers: finding and ranking recorded comparisons, the
tables, the claims, the loss curves and the explorer that switches between runs."""
import json

import pytest

pytest.importorskip("plotly", reason="plotly is in the test extra; this file needs it")
pytest.importorskip("ipywidgets", reason="ipywidgets is in the test extra; this file needs it")

from sparsity_lab.lab.figures import flip_rate_figure, loss_figure, read_logs  # noqa: E402
from sparsity_lab.provenance import RESULTS_DIR  # noqa: E402
from sparsity_lab.course.viz._provenance import provenance_line  # noqa: E402
from sparsity_lab.course.viz.comparison_view import (claims_figure, claims_text, comparison_explorer, describe,  # noqa: E402
                                              find_comparisons, gap_figure, load_comparison, overview_figure,
                                              results_table_figure)

CLAIMS = ["1. flips", "2. decay", "3. fine-tune", "4. S-STE", "5. within 2 %"]


def _log_rows(variant: str, steps: int, tokens_per_step: int, flips: bool) -> list[dict]:
    """A made-up log: loss falls with the step; a validation loss every 2 steps."""
    offset = len(variant) / 100
    return [{"step": s, "tokens": s * tokens_per_step, "loss": 3.0 - 0.1 * s + offset,
             "val_loss": 3.1 - 0.1 * s + offset if s % 2 == 0 else None,
             "flip_rate": (0.01 / s if flips and s > 1 else None)} for s in range(1, steps + 1)]


def write_comparison(folder, variants, steps, holds, date, tokens_per_step=100, legacy=False, notes=None,
                     gpu="Test GPU"):
    """A comparison folder as `sparsity-lab compare` writes it (results.json + logs), made up."""
    folder.mkdir(parents=True)
    switch_key = "val_at_switch" if legacy else "val_before_switch"
    table, runs = [], {}
    for i, v in enumerate(variants):
        rows = _log_rows(v, steps, tokens_per_step, flips=v != "dyad")
        (folder / v).mkdir()
        (folder / v / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        table.append({"variant": v, "method": v, "status": "ok", "steps": steps, "tokens": steps * tokens_per_step,
                      "final_val_loss": 2.0 + i / 10, switch_key: 2.5 + i / 10, "flip_early": 0.01,
                      "flip_late": None if v == "dyad" else 0.002, "flip_trend": 0.2,
                      "median_tokens_per_s": 1000.0, "gap_vs_dense_pct": 5.0 * i})
        runs[v] = {"config": {"model": {"n_layer": 2, "d_model": 32, "n_head": 2, "context": 16},
                              "batch_size": 4, "lr": 1e-3, "warmup_steps": 2, "seed": 0}, "log": f"{v}/log.jsonl"}
    claims = [{"claim": c, "rule": f"rule {k}", "holds": h, "evidence": f"evidence {k}"}
              for k, (c, h) in enumerate(zip(CLAIMS, holds))]
    payload = {"provenance": {"date": date, "gpu": gpu, "git_commit": "abcdef0123456789", "torch": "2.11",
                              "triton": "3.6", "command": "sparsity-lab compare ..."},
               "steps": steps, "tokens_per_step": tokens_per_step, "table": table, "claims": claims, "runs": runs}
    (folder / "results.json").write_text(json.dumps(payload))
    if notes:
        (folder / "NOTES.md").write_text(notes)
    return payload


@pytest.fixture
def results(tmp_path):
    """Four comparisons and one folder whose results.json is not a comparison."""
    all24 = ["dense", "ste", "srste", "masked_decay", "sste"]
    write_comparison(tmp_path / "short", all24, 4, [False, True, True, False, True], "2026-01-01T00:00:00+00:00",
                     notes="short run")
    write_comparison(tmp_path / "long", all24[:3], 8, [False, None, None, False, True], "2026-01-02T00:00:00+00:00",
                     legacy=True)
    write_comparison(tmp_path / "structures", ["dense", "dyad"], 12, [None] * 5, "2026-01-03T00:00:00+00:00")
    write_comparison(tmp_path / "newest", all24, 10, [True, False, True, False, False], "2026-01-04T00:00:00+00:00")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "results.json").write_text(json.dumps({"provenance": {}, "rows": []}))
    return tmp_path


def test_find_comparisons_ranks_by_claims_then_tokens_then_variants_then_date(results):
    found = find_comparisons(results)
    # newest and short test all 5 claims (newest has more tokens); long tests 3; structures none
    assert [c.name for c in found] == ["newest", "short", "long", "structures"]
    assert [c.claims_tested for c in found] == [5, 5, 3, 0]
    assert [c.claims_held for c in found] == [2, 3, 1, 0]
    assert [c.tokens_per_variant for c in found] == [1000, 400, 800, 1200]
    assert found[1].notes == "short run" and found[0].notes is None


def test_more_variants_then_the_date_break_ties(tmp_path):
    for name, variants, date in (("a", ["dense", "ste"], "2026-02-01T00:00:00+00:00"),
                                 ("b", ["dense", "ste"], "2026-03-01T00:00:00+00:00"),
                                 ("c", ["dense", "ste", "sste"], "2026-01-01T00:00:00+00:00")):
        write_comparison(tmp_path / name, variants, 4, [True] * 5, date)
    assert [c.name for c in find_comparisons(tmp_path)] == ["c", "b", "a"]


def test_bad_folders_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="results_dir"):
        find_comparisons(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no results.json"):
        load_comparison(tmp_path / "empty")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text('{"provenance": {')
    with pytest.raises(ValueError, match="not valid JSON"):
        find_comparisons(tmp_path)  # a half-written file is reported, not skipped
    with pytest.raises(ValueError, match="comparisons is empty"):
        overview_figure([])


def test_logs_follow_the_table_and_a_missing_log_is_named(results):
    short = load_comparison(results / "short")
    logs = short.logs()
    assert list(logs) == short.variants and all(len(rows) == 4 for rows in logs.values())
    (results / "short" / "ste" / "log.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="ste"):
        short.logs()


def test_logs_packed_as_the_wheel_ships_them_are_read(results):
    """An installed wheel carries the recorded logs as log.jsonl.gz only (setup.py): the comparison
    and the lab's figure readers find them there."""
    import gzip

    folder = results / "short"
    expected = load_comparison(folder).logs()
    for log in folder.glob("*/log.jsonl"):
        log.with_name("log.jsonl.gz").write_bytes(gzip.compress(log.read_bytes()))
        log.unlink()
    assert load_comparison(folder).logs() == expected
    assert read_logs(folder) == expected


def test_results_table_shows_the_rows_and_the_legacy_switch_column(results):
    new = load_comparison(results / "newest").payload
    fig = results_table_figure(new)
    header = list(fig.data[0].header.values)
    cells = dict(zip(header, fig.data[0].cells.values))
    assert list(cells["variant"]) == ["dense", "ste", "srste", "masked_decay", "sste"]
    assert list(cells["final val loss"]) == ["2.0000", "2.1000", "2.2000", "2.3000", "2.4000"]
    assert list(cells["vs dense"])[:2] == ["+0.00 %", "+5.00 %"]
    assert list(cells["tokens"])[0] == "1,000"
    assert "val loss before switch" in header and "val loss at switch" not in header
    assert "FFN FLOPs vs dense" not in header  # no row has it
    # plotly cuts a word longer than its column: a column holds its longest cell, or a third of its title
    widths = {title: width - 3 for title, width in zip(header, fig.data[0].columnwidth)}  # 3: the padding
    assert widths["variant"] == len("masked_decay") and widths["vs dense"] == len("+20.00 %")
    assert widths["val loss before switch"] == len("val loss before switch") // 3 + 1
    legacy = results_table_figure(load_comparison(results / "long").payload)
    assert "val loss at switch" in legacy.data[0].header.values
    structures = results_table_figure(load_comparison(results / "structures").payload)
    late = dict(zip(structures.data[0].header.values, structures.data[0].cells.values))["flip rate late"]
    assert list(late) == ["2.00e-03", "n/a"]


def test_claims_as_recorded(results):
    payload = load_comparison(results / "long").payload
    fig = claims_figure(payload)
    claim, verdict = fig.data[0].cells.values[:2]
    assert list(claim) == CLAIMS
    assert list(verdict) == ["FAILS", "NOT TESTED", "NOT TESTED", "FAILS", "HOLDS"]
    assert list(fig.data[0].cells.fill.color[1]) == ["#f9d6d5", "#eeeeee", "#eeeeee", "#f9d6d5", "#d9f2d9"]
    text = claims_text(payload)
    assert text.splitlines()[0] == "[FAILS] 1. flips" and "evidence 4" in text
    assert max(len(line) for line in claims_text(payload, width=20).splitlines()) <= 20


def test_describe_and_overview(results):
    found = find_comparisons(results)
    wrapped = describe(found[0], html=False)
    assert max(len(line) for line in wrapped.splitlines()) <= 96
    text = " ".join(wrapped.split())  # the words, as wrapped to the column
    assert "newest: 5 variants" in text and "1,000 tokens each (10 steps)" in text
    assert "2 of the 5 claims it tests hold" in text
    assert provenance_line(found[0].payload["provenance"]) in text
    assert "GPT 2 layers, width 32" in text
    assert "tests none of the five claims" in describe(found[-1])  # the HTML form: not wrapped
    folders = overview_figure(found).data[0].cells.values[0]
    assert list(folders) == ["newest", "short", "long", "structures"]


def test_loss_and_flip_figures_from_the_logs(results):
    logs = read_logs(results / "structures", ["dense", "dyad"])
    fig = loss_figure(logs)
    val = [t for t in fig.data if t.xaxis == "x2"]
    assert [t.name for t in val] == ["dense", "dyad"]
    assert list(val[1].y) == [r["val_loss"] for r in logs["dyad"] if r["val_loss"] is not None]
    assert list(val[1].x) == [r["tokens"] for r in logs["dyad"] if r["val_loss"] is not None]
    flips = flip_rate_figure(logs)
    assert [t.name for t in flips.data] == ["dense"]  # dyad has no masks, so no flip-rate line
    assert list(flips.data[0].x) == list(range(2, 13))
    assert flips.layout.yaxis.type == "log" and flips.layout.yaxis.dtick == 1  # labels at powers of ten only


def test_gap_figure_is_relative_to_dense_at_the_same_step(results):
    logs = read_logs(results / "short", ["dense", "ste", "sste"])
    fig = gap_figure(logs)
    assert [t.name for t in fig.data] == ["ste", "sste"]
    dense = {r["step"]: r["val_loss"] for r in logs["dense"] if r["val_loss"] is not None}
    expected = [100 * (r["val_loss"] / dense[r["step"]] - 1) for r in logs["ste"] if r["val_loss"] is not None]
    assert list(fig.data[0].y) == pytest.approx(expected) and all(g < 0 for g in expected)  # "ste" is shorter
    with pytest.raises(ValueError, match="reference 'dense'"):
        gap_figure({"ste": logs["ste"]})


def test_explorer_switches_runs(results):
    found = find_comparisons(results)
    box = comparison_explorer(found)
    choice, info, fig, claims = box.children
    assert {t.name for t in fig.data} == set(found[0].variants)
    assert "newest" in info.value and claims.value.count("HOLDS") == 2
    choice.value = "structures"
    assert [t.name for t in fig.data if t.xaxis == "x"] == ["dense", "dyad"]
    assert list(fig.data[0].x) == [r["tokens"] for r in found[-1].logs()["dense"]]
    assert "structures" in info.value and claims.value.count("NOT TESTED") == 5
    later = comparison_explorer(found, start=len(found) - 1)
    assert later.children[0].value == "structures" and "structures" in later.children[1].value
    with pytest.raises(ValueError, match="start"):
        comparison_explorer(found, start=len(found))


def test_the_recorded_comparisons_load_and_the_first_is_the_most_complete():
    found = find_comparisons(RESULTS_DIR)
    assert found, "results/ should hold the recorded GPU comparisons"
    assert found[0].rank_key() == max(c.rank_key() for c in found)
    assert found[0].payload["provenance"].get("gpu"), "the comparison shown first must be a GPU run"
    for comparison in found:
        # a CPU comparison (e.g. a quick all-linears check) says so in its name, so the explorer's list does
        if not comparison.payload["provenance"].get("gpu"):
            assert "cpu" in comparison.name, f"{comparison.name}: no GPU in its provenance and no 'cpu' in its name"
        logs = comparison.logs()
        for row in comparison.payload["table"]:
            if row["status"] == "ok":
                assert logs[row["variant"]][-1]["step"] == row["steps"], (comparison.name, row["variant"])
