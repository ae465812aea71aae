"""The functions behind notebook 06: MVUE 2:4 by simulation, and the FP8 rounding/scaling explorer."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("plotly", reason="plotly is in the test extra; this file needs it")
pytest.importorskip("ipywidgets", reason="ipywidgets is in the test extra; this file needs it")

from sparsity_lab.references.fp8 import dequantize_fp8, fp8_format, quantize_fp8  # noqa: E402
from sparsity_lab.masks.nm import nm_mask  # noqa: E402
from sparsity_lab.methods.mvue import mvue_probabilities, sequential_probabilities  # noqa: E402
from sparsity_lab.course.viz.fp8_view import (SAMPLES, format_facts, fp8_explorer, fp8_figure, fp8_grid,  # noqa: E402
                                       quantize_report, sample_tensor)
from sparsity_lab.course.viz.mvue_view import (inclusion_figure, mvue_convergence_figure, mvue_draws,  # noqa: E402
                                        mvue_simulation, mvue_variance_figure, squared_error_theory)


# --- MVUE -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["exact", "sequential"])
def test_draws_are_independent_2_of_4_with_kept_values_x_over_p(method):
    x = torch.randn(20, generator=torch.Generator().manual_seed(1)).double()
    d = mvue_draws(x, 300, method, seed=2)
    assert d.shape == (300, 20) and d.dtype == torch.float64
    assert int((d.reshape(300, 5, 4) != 0).sum(-1).max()) <= 2
    assert len({tuple(row.tolist()) for row in d}) > 10  # rows are different draws
    p = (mvue_probabilities if method == "exact" else sequential_probabilities)(x.reshape(-1, 4)).reshape(-1)
    kept = d != 0
    torch.testing.assert_close(d[kept], (x / p).expand_as(d)[kept])
    assert torch.equal(mvue_draws(x, 300, method, seed=2), d)  # seeded


@pytest.mark.parametrize("method", ["exact", "sequential"])
def test_theory_matches_simulated_squared_error_within_a_statistical_bound(method):
    x = torch.tensor([3.0, -1.0, 0.5, 0.25, 1.0, 1.0, 1.0, 1.0, 0.0, 2.0, -0.1, 0.0], dtype=torch.float64)
    draws = 20000
    d = mvue_draws(x, draws, method, seed=5)
    sq = ((d - x) ** 2).sum(1)
    v = squared_error_theory(x, method)
    # the sample mean of ||d - x||^2 has standard error std / sqrt(draws): allow 5 of them
    assert abs(float(sq.mean()) - v) <= 5 * float(sq.std()) / math.sqrt(draws)
    # unbiased: each coordinate's mean within 5 standard errors of x
    se = d.std(0) / math.sqrt(draws)
    assert bool(((d.mean(0) - x).abs() <= 5 * se + 1e-12).all())


def test_theory_by_hand_for_one_group():
    # x = (1, 1, 1, 1): p = 1/2 each, V = 4 * 1 * (2 - 1) = 4; top-2 error = 1 + 1 = 2
    x = torch.ones(4, dtype=torch.float64)
    assert squared_error_theory(x, "exact") == pytest.approx(4.0)
    sim = mvue_simulation(x, draws=50)
    assert sim["squared_error"]["top2"] == pytest.approx(2.0)
    # a capped entry (|x_0| > the rest together) is kept surely and adds nothing
    y = torch.tensor([10.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    assert squared_error_theory(y, "exact") == pytest.approx(1 * (2 - 1) * 2)


def test_simulation_scores_mean_and_bias():
    x = torch.randn(32, generator=torch.Generator().manual_seed(0))
    sim = mvue_simulation(x, draws=800, seed=0)
    xd = x.double()
    top2 = xd * nm_mask(xd, 2, 4)
    assert sim["top2_error"] == pytest.approx(float((top2 - xd).norm() / xd.norm()))
    assert sim["k"][0] == 1 and sim["k"][-1] == 800 and sim["k"] == sorted(set(sim["k"]))
    for method in ("exact", "sequential"):
        err, theory = sim["mean_error"][method], sim["mean_error_theory"][method]
        assert err[-1] < err[0] and err[-1] <= 5 * theory[-1]  # Markov: fails with probability < 4 %
        assert err[-1] < sim["top2_error"]
        assert sim["max_kept"][method] <= 2
        f, p = sim["keep_frequency"][method], sim["p"][method]
        assert bool(((f - p).abs() <= 5 * torch.sqrt(p * (1 - p) / 800) + 1e-12).all())
    assert sim["squared_error"]["exact"] > sim["squared_error"]["top2"]  # the price of unbiasedness


def test_mvue_figures_carry_the_simulation():
    x = torch.randn(16, generator=torch.Generator().manual_seed(0))
    sim = mvue_simulation(x, draws=100)
    fig = mvue_convergence_figure(sim)
    assert list(fig.data[0].y) == sim["mean_error"]["exact"] and list(fig.data[-1].y) == [sim["top2_error"]] * len(sim["k"])
    fig = mvue_variance_figure(sim)
    assert list(fig.data[0].y) == [sim["squared_error"][k] for k in ("exact", "sequential", "top2")]
    fig = inclusion_figure(sim, groups=2)
    assert list(fig.data[1].y) == sim["p"]["exact"][:8].tolist()


def test_mvue_bad_input_is_named():
    with pytest.raises(ValueError, match="multiple of 4"):
        mvue_draws(torch.randn(6), 10)
    with pytest.raises(ValueError, match="draws must be a positive int"):
        mvue_draws(torch.randn(8), 0)
    with pytest.raises(ValueError, match="method must be one of"):
        squared_error_theory(torch.randn(8), "top2")
    with pytest.raises(ValueError, match="all zeros"):
        mvue_simulation(torch.zeros(8), 10)


# --- FP8 --------------------------------------------------------------------------------------------------
def test_grid_is_every_positive_finite_value():
    e4, e5 = fp8_grid("e4m3"), fp8_grid("e5m2")
    assert e4.numel() == 126 and e5.numel() == 123
    assert float(e4[-1]) == 448.0 and float(e5[-1]) == 57344.0
    assert float(e4[0]) == 2.0 ** -9 and float(e5[0]) == 2.0 ** -16
    assert format_facts("e4m3")["min_normal"] == 2.0 ** -6 and format_facts("e5m2")["min_normal"] == 2.0 ** -14
    # any value in range rounds onto the grid (so no representable value is missing)
    for fmt, grid in (("e4m3", e4), ("e5m2", e5)):
        dtype, fmax = fp8_format(fmt)
        v = torch.exp(torch.empty(5000).uniform_(math.log(float(grid[0])), math.log(fmax)))
        rounded = v.to(dtype).double()
        assert bool(torch.isin(rounded[rounded > 0], grid).all())
        assert torch.equal(grid.float().to(dtype).double(), grid)  # and each grid value is exact


def test_amax_scaling_equals_the_library_quantizer():
    x = sample_tensor("heavy", 1000, seed=3)
    for fmt in ("e4m3", "e5m2"):
        q, scale = quantize_fp8(x, fmt)
        rep = quantize_report(x, fmt, "amax", 0)
        assert torch.equal(rep["x_hat"], dequantize_fp8(q, scale)) and rep["scale"] == float(scale)
        assert rep["clipped"] == 0 and rep["n"] == 1000


@settings(max_examples=30, deadline=None)
@given(fmt=st.sampled_from(["e4m3", "e5m2"]), shift=st.integers(-4, 4), seed=st.integers(0, 2**31 - 1),
       kind=st.sampled_from(sorted(SAMPLES)))
def test_error_bounds_and_counts(fmt, shift, seed, kind):
    x = sample_tensor(kind, 257, seed)
    rep = quantize_report(x, fmt, "amax", shift)
    facts = format_facts(fmt)
    scaled = x.double().abs() / rep["scale"]
    _, fmax = fp8_format(fmt)
    # counted with a float32-rounding slack (amax itself may land a rounding above fp8_max)
    assert int((scaled > fmax * (1 + 1e-5)).sum()) <= rep["clipped"] <= int((scaled > fmax * (1 - 1e-5)).sum())
    assert rep["flushed"] == int(((x != 0) & (rep["x_hat"] == 0)).sum())
    # round to nearest: relative error at most half a step, 2^-(mantissa bits + 1), in the normal range
    normal = (scaled >= facts["min_normal"]) & (scaled <= fmax)
    rel = ((rep["x_hat"].double() - x.double()).abs() / x.double().abs())[normal]
    assert bool((rel <= 2.0 ** -(facts["mantissa_bits"] + 1) * (1 + 1e-5)).all())
    if shift >= 0:
        assert rep["clipped"] == 0


def test_fixed_unit_scale_is_a_plain_cast():
    x = sample_tensor("normal", 500, seed=1)
    rep = quantize_report(x, "e4m3", "fixed", 0)
    assert rep["scale"] == 1.0 and torch.equal(rep["x_hat"], x.to(torch.float8_e4m3fn).float())
    small = quantize_report(sample_tensor("small", 500), "e4m3", "fixed", 0)
    assert small["flushed"] == 500 and small["rel_rms"] == 1.0  # 1e-6 is below E4M3's smallest subnormal


def test_samples():
    assert sample_tensor("outlier", 10)[0] == 1e4
    assert torch.equal(sample_tensor("heavy", 50, 2), sample_tensor("heavy", 50, 2))
    assert float(sample_tensor("small", 1000).abs().max()) < 1e-5


def test_fp8_figure_and_explorer_follow_the_controls():
    x = sample_tensor("normal", 300)
    fig, rep = fp8_figure(x, "e4m3")
    grid_x = torch.tensor(fig.data[1].x, dtype=torch.float64)
    assert torch.allclose(grid_x, (fp8_grid("e4m3") * rep["scale"]).log2())
    box = fp8_explorer("normal", "e4m3", n=300)
    (fmt_box, scaling_box, shift_box), kind_box, wfig, info = box.children[0].children, *box.children[1:]
    assert "E4M3" in info.value and len(wfig.data[1].x) == 126
    fmt_box.value = "e5m2"
    assert "E5M2" in info.value and len(wfig.data[1].x) == 123
    shift_box.value = -3  # scale 8x too small: the top values saturate
    rep = quantize_report(sample_tensor("normal", 300), "e5m2", "amax", -3)
    assert rep["clipped"] > 0 and f"clipped {rep['clipped']} of 300" in info.value
    scaling_box.value = "fixed"
    shift_box.value = 0
    kind_box.value = "small"  # a plain cast of values ~1e-6: E5M2's subnormals keep a few of them
    rep = quantize_report(sample_tensor("small", 300), "e5m2", "fixed", 0)
    assert rep["flushed"] > 150 and f"flushed to zero {rep['flushed']} " in info.value
    assert "fixed 2^0" in info.value


def test_fp8_bad_input_is_named():
    with pytest.raises(ValueError, match="fmt must be one of"):
        fp8_grid("e3m4")
    with pytest.raises(ValueError, match="scaling must be one of"):
        quantize_report(torch.randn(8), "e4m3", "delayed")
    with pytest.raises(ValueError, match="shift must be an int"):
        quantize_report(torch.randn(8), "e4m3", "amax", 0.5)
    with pytest.raises(ValueError, match="kind must be one of"):
        sample_tensor("uniform")
