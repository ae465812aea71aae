"""The activation widget and histogram (viz/act24_view.py) and benchmarks act24's CPU smoke run."""
import pytest
import torch

pytest.importorskip("plotly", reason="figures need the lab extra")

from sparsity_lab.course.viz.act24_view import act24_widget, activation_histogram, kept_mass, layer_summary


def test_kept_mass_and_summary():
    a = torch.tensor([[4.0, 1.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0]])
    assert kept_mass(a) == pytest.approx(7.0 / 8.0)        # 1.0 dropped from the first group
    assert kept_mass(torch.zeros(2, 8)) == 1.0
    s = layer_summary(a)
    assert s["zero_fraction"] == pytest.approx(5 / 8) and s["at_most_2_fraction"] == pytest.approx(0.5)


def test_widget_moves_its_window_and_names_the_layer():
    torch.manual_seed(0)
    acts = {"block 0": torch.relu(torch.randn(40, 64)) ** 2, "block 1": torch.relu(torch.randn(40, 64) - 1) ** 2}
    w = act24_widget(acts, tokens=8, units=16)
    (layer, token, unit), fig, summary = w.children[0].children, w.children[1], w.children[2]
    first = [list(r) for r in fig.data[0].z]
    assert "block 0" in summary.value
    token.value = 5
    assert [list(r) for r in fig.data[0].z] != first
    layer.value = "block 1"
    assert "block 1" in summary.value
    # every red cross marks a non-zero entry that 2:4 drops: at most 2 kept per group of 4
    z = torch.tensor([list(r) for r in fig.data[0].z])
    for x, y in zip(fig.data[1].x, fig.data[1].y):
        assert z[int(y), int(x)] != 0
    with pytest.raises(ValueError, match="hidden % 4"):
        act24_widget({"bad": torch.ones(4, 6)})
    with pytest.raises(ValueError, match="empty"):
        act24_widget({})
    fig = activation_histogram(acts)
    assert len(fig.data) == 2 and fig.layout.yaxis.type == "log" and fig.layout.yaxis.dtick == 1


def test_bench_smoke_runs_every_variant_and_judges_nothing():
    from benchmarks.act24_speed import VARIANTS, Settings, benchmark
    result = benchmark(Settings(smoke=True, device=torch.device("cpu"), tokens=64, d_model=16, rounds=1,
                                reps=1, warmup=0, graph=False))
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == set(VARIANTS) and not any(r["error"] for r in rows.values())
    for name, row in rows.items():
        assert row["eager_ms"] > 0 and row["speedup_vs_fastest_dense"] > 0
        if name.startswith("act24"):  # the reference products against themselves
            assert row["y_rel_err"] == 0.0
    assert all(t["met"] is None for t in result["targets"].values())
