"""The figures and the decay slider of notebooks 3 and 4 (no browser: setting a widget's value fires its observers)."""
import pytest

pytest.importorskip("plotly", reason="plotly is in the test extra; this file needs it")
pytest.importorskip("ipywidgets", reason="ipywidgets is in the test extra; this file needs it")

from sparsity_lab.lab import GPTConfig, TrainConfig, load_corpus, read_log  # noqa: E402
from sparsity_lab.lab.decay_grid import DecayGrid, RunCurve, run_decay_grid  # noqa: E402
from sparsity_lab.provenance import RESULTS_DIR, read_result  # noqa: E402
from sparsity_lab.course.viz.decay_view import (curves_figure, decay_explorer, decay_search_figure,  # noqa: E402
                                         summary_text)
from sparsity_lab.course.viz.finetune_view import finetune_figure  # noqa: E402


def curve(label, method, decay, flips, losses, val=2.0):
    rows = [{"step": i + 1, "loss": loss, "flip_rate": f, "val_loss": val if i == len(losses) - 1 else None}
            for i, (f, loss) in enumerate(zip(flips, losses))]
    return RunCurve.from_history(label, method, decay, rows)


@pytest.fixture
def grid():
    """A hand-made grid: every run's numbers are known, so the plotted data can be checked exactly."""
    dense = curve("dense reference", "dense", None, [None, 0.04, 0.02, 0.01], [5.0, 4.0, 3.0, 2.5], val=2.0)
    runs = {
        0.0: curve("STE (decay 0)", "srste", 0.0, [None, 0.05, 0.03, 0.02], [5.0, 4.1, 3.1, 2.6], val=2.1),
        0.01: curve("SR-STE, lambda_W = 1e-02", "srste", 0.01, [None, 0.03, 0.01, 0.005], [5.0, 4.2, 3.2, 2.7], val=2.2),
        0.1: curve("SR-STE, lambda_W = 1e-01", "srste", 0.1, [None, 0.02, 0.004, 0.001], [5.0, 4.4, 3.5, 3.0], val=2.4),
    }
    return DecayGrid(method="srste", decays=(0.0, 0.01, 0.1), runs=runs, dense=dense, config={})


def selected_traces(fig):
    named = [t for t in fig.data if t.name == "selected run"]
    assert len(named) == 2  # flip rate (left) and loss (right)
    return named


def test_decay_explorer_swaps_the_selected_run_when_the_slider_moves(grid):
    box = decay_explorer(grid, decay=0.01)
    slider, fig, summary = box.children
    assert type(slider).__name__ == "SelectionSlider" and "decay" in slider.description
    assert list(slider.options) == [("0 (STE)", 0.0), ("1e-02", 0.01), ("1e-01", 0.1)]
    flip, loss = selected_traces(fig)
    assert list(flip.y) == [None, 0.03, 0.01, 0.005] and list(loss.y) == [5.0, 4.2, 3.2, 2.7]
    assert "final val loss 2.2000" in summary.value

    slider.value = 0.1
    flip, loss = selected_traces(fig)
    assert list(flip.y) == [None, 0.02, 0.004, 0.001]
    assert list(loss.y) == [5.0, 4.4, 3.5, 3.0]
    assert list(flip.x) == [1, 2, 3, 4]
    assert "1e-01" in fig.layout.title.text
    # the reader's method name, not the CLI key, in the title, the slider and the summary
    assert fig.layout.title.text.startswith("SR-STE,") and slider.description.startswith("SR-STE")
    assert summary.value.startswith("SR-STE, lambda_W")
    assert "final val loss 2.4000" in summary.value and "+20.00 %" in summary.value  # 2.4 vs dense 2.0
    assert "late flip rate 1.00e-03" in summary.value  # the last 10 % of 4 steps = the last step
    # the flip-rate axis (log) is relabelled for the selected run: whole numbers down to its lowest rate
    assert fig.layout.yaxis.type == "log" and min(fig.layout.yaxis.tickvals) == 0.001
    assert "0.001" in fig.layout.yaxis.ticktext

    slider.value = 0.0
    assert list(selected_traces(fig)[0].y) == [None, 0.05, 0.03, 0.02]


def test_decay_explorer_keeps_the_references_fixed(grid):
    box = decay_explorer(grid)
    fig = box.children[1]
    refs = {t.name: list(t.y) for t in fig.data if t.name != "selected run" and t.showlegend is not False}
    assert refs == {"dense reference": [None, 0.04, 0.02, 0.01], "STE (decay 0)": [None, 0.05, 0.03, 0.02]}
    box.children[0].value = 0.1
    after = {t.name: list(t.y) for t in fig.data if t.name != "selected run" and t.showlegend is not False}
    assert after == refs
    assert box.children[0].value == 0.1
    assert decay_explorer(grid).children[0].value == 0.01  # default: the middle of the grid


def test_decay_explorer_on_a_real_grid():
    cfg = TrainConfig(model=GPTConfig(n_layer=1, n_head=2, d_model=16, context=16), batch_size=2, steps=4,
                      warmup_steps=1, eval_interval=2, eval_batches=1, device="cpu", progress=False)
    g = run_decay_grid(cfg, [0.0, 0.5], corpus=load_corpus(max_bytes=20_000))
    box = decay_explorer(g, decay=0.0)
    box.children[0].value = 0.5
    flip, loss = selected_traces(box.children[1])
    assert list(loss.y) == list(g.runs[0.5].loss)
    assert list(flip.y)[1:] == list(g.runs[0.5].flip_rate)[1:]


def test_decay_explorer_bad_input(grid):
    with pytest.raises(ValueError, match="not in the grid"):
        decay_explorer(grid, decay=0.5)
    with pytest.raises(TypeError, match="DecayGrid"):
        decay_explorer({"runs": {}})


def test_summary_text_without_dense_reference(grid):
    no_dense = DecayGrid(method="srste", decays=grid.decays, runs=grid.runs, dense=None, config={})
    text = summary_text(no_dense, 0.01)
    assert "dense" not in text and "final val loss 2.2000" in text


def test_curves_figure_draws_two_panels_per_run(grid):
    fig = curves_figure([grid.dense, grid.runs[0.0], grid.runs[0.1]], title="t")
    assert len(fig.data) == 6
    assert [t.name for t in fig.data[::2]] == ["dense reference", "STE (decay 0)", "SR-STE, lambda_W = 1e-01"]
    assert list(fig.data[4].y) == [None, 0.02, 0.004, 0.001]  # NaN sent as a gap
    assert fig.layout.yaxis.type == "log"


def test_decay_search_figure_on_the_recorded_search():
    result = read_result("lab_decay_search_h100")
    fig = decay_search_figure(result)
    trials = sorted(result["trials"], key=lambda t: t["decay"])
    assert list(fig.data[0].x) == [t["decay"] for t in trials]
    assert list(fig.data[0].y) == pytest.approx([100 * t["gap_vs_dense"] for t in trials])
    assert list(fig.data[1].y) == pytest.approx([t["flip_vs_dense"] for t in trials])
    colors = list(fig.data[0].marker.color)
    chosen = [t["decay"] for t, c in zip(trials, colors) if c == "#d62728"]
    assert chosen == [result["chosen"]["decay"]]


def log_rows(steps, switch, dense_after_switch=True):
    rows = []
    for s in range(1, steps + 1):
        dense = dense_after_switch and s > switch
        rows.append({"step": s, "loss": 3.0 - s / 100, "val_loss": 2.0 if s % 5 == 0 else None,
                     "flip_rate": None if (s == 1 or dense) else 0.01})
    return rows


def test_finetune_figure_marks_the_switch_and_stops_flip_rates_after_it():
    logs = {"masked_decay": log_rows(12, 10), "masked_decay_noft": log_rows(12, 10, dense_after_switch=False)}
    fig = finetune_figure(logs, switch_step=10, smooth=1)
    assert len(fig.data) == 6  # per run: training loss, validation points, flip rate
    loss, val, flips = fig.data[:3]
    assert list(loss.y) == pytest.approx([3.0 - s / 100 for s in range(1, 13)])
    assert list(val.x) == [5, 10]
    assert list(flips.x) == list(range(2, 11))  # no flip rate at step 1 nor after the switch
    assert list(fig.data[5].x) == list(range(2, 13))
    assert [shape.x0 for shape in fig.layout.shapes] == [10, 10]
    assert "step 10" in fig.layout.annotations[-1].text
    # the legend names the runs for a reader, not by the CLI's variant keys
    assert [t.name for t in fig.data if t.showlegend is not False] == ["masked decay, dense fine-tune",
                                                                       "masked decay, no fine-tune"]


def test_finetune_figure_on_the_recorded_h100_logs():
    folder = RESULTS_DIR / "lab_compare_h100_triton"
    cmp = read_result("results", directory=folder)
    logs = {v: read_log(folder / v / "log.jsonl") for v in ("ste", "masked_decay")}
    fig = finetune_figure(logs, cmp["switch_step"])
    md_flips = fig.data[5]
    assert max(md_flips.x) == cmp["switch_step"]  # the masked-decay run computes no mask after the switch
    assert max(fig.data[2].x) == cmp["steps"]  # STE's masks go on to the end


def test_finetune_figure_bad_input():
    with pytest.raises(ValueError, match="logs is empty"):
        finetune_figure({}, 3)
    with pytest.raises(ValueError, match="switch_step"):
        finetune_figure({"a": log_rows(3, 2)}, -1)
    with pytest.raises(ValueError, match="no logged rows"):
        finetune_figure({"a": []}, 2)
