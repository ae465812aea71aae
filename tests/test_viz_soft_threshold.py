"""The functions behind notebook 05 (S-STE): soft threshold on one group, the sweep, beta, the beta run."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("plotly", reason="plotly is in the test extra; this file needs it")
pytest.importorskip("ipywidgets", reason="ipywidgets is in the test extra; this file needs it")

from sparsity_lab.methods.soft_threshold import soft_threshold, sste_beta  # noqa: E402
from sparsity_lab.course.viz.soft_threshold_view import (beta_figure, beta_trace, beta_trace_figure,  # noqa: E402
                                                  group_outputs, soft_threshold_explorer, soft_threshold_figure,
                                                  sweep_outputs)

finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False)


def _explicit(values):
    """The S-STE definition written out for one group: t = 2nd smallest |a|, keep the two largest."""
    mags = [abs(v) for v in values]
    # rank by descending magnitude, ties to the lowest index (the library's rule)
    order = sorted(range(4), key=lambda i: (-mags[i], i))
    kept = [i in order[:2] for i in range(4)]
    t = max(mags[i] for i in range(4) if not kept[i])
    hard = [v if k else 0.0 for v, k in zip(values, kept)]
    soft = [math.copysign(max(abs(v) - t, 0.0), v) if k else 0.0 for v, k in zip(values, kept)]
    return kept, t, hard, soft


@settings(max_examples=60, deadline=None)
@given(values=st.lists(finite, min_size=4, max_size=4))
def test_group_outputs_follow_the_definition(values):
    out = group_outputs(values)
    kept, t, hard, soft = _explicit(values)
    assert out["kept"] == kept and out["threshold"] == t and out["hard"] == hard
    assert out["soft"] == pytest.approx(soft, abs=0.0)
    assert sum(v != 0 for v in out["soft"]) <= 2


def test_known_group():
    out = group_outputs([0.9, -0.4, 0.3, -1.2])
    assert out["kept"] == [True, False, False, True]
    assert out["threshold"] == pytest.approx(0.4)
    assert out["hard"] == [0.9, 0.0, 0.0, -1.2]
    assert out["soft"] == pytest.approx([0.5, 0.0, 0.0, -0.8])


def test_sweep_hard_jumps_soft_is_continuous():
    grid = torch.linspace(-2, 2, 2001, dtype=torch.float64)
    hard, soft = sweep_outputs([0.9, -0.4, 0.3, -1.2], 2, grid)
    assert hard.shape == soft.shape == (2001, 4)
    step = float(grid[1] - grid[0])
    # soft: every output moves by at most the step (1-Lipschitz in the swept entry); hard: a jump of
    # about the crossing magnitude (0.9 against a2 crossing a0, or 0.4 against a1) appears
    assert float(soft.diff(dim=0).abs().max()) <= step * (1 + 1e-9)
    assert float(hard.diff(dim=0).abs().max()) > 0.35
    for i, x in enumerate(grid.tolist()[::97]):
        ref = group_outputs([0.9, -0.4, x, -1.2])
        assert hard[i * 97].tolist() == ref["hard"] and soft[i * 97].tolist() == pytest.approx(ref["soft"], abs=0)


def test_bad_group_is_named():
    with pytest.raises(ValueError, match="values must be four finite numbers"):
        group_outputs([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="values must be four finite numbers"):
        group_outputs([1.0, 2.0, float("nan"), 0.0])
    with pytest.raises(ValueError, match="index must be"):
        sweep_outputs([1.0, 2.0, 3.0, 4.0], 4, torch.zeros(3))


def test_figure_shows_the_group():
    fig = soft_threshold_figure([0.9, -0.4, 0.3, -1.2])
    assert list(fig.data[1].y) == [0.9, 0.0, 0.0, -1.2]
    assert list(fig.data[3].y) == pytest.approx([0.5, 0.0, 0.0, -0.8])
    assert "t = 0.400" in fig.layout.title.text


def test_explorer_sliders_redraw_bars_and_curves():
    box = soft_threshold_explorer((0.9, -0.4, 0.3, -1.2), sweep_index=2)
    row1, row2, bars, sweep_box, curves, info = box.children
    sliders = list(row1.children) + list(row2.children)
    before_curves = [list(t.y) for t in curves.data]
    sliders[1].value = -1.0  # a1 now beats a0 (|-1.0| > 0.9): the mask changes
    vals = [0.9, -1.0, 0.3, -1.2]
    ref = group_outputs(vals)
    assert list(bars.data[1].y) == ref["hard"] and list(bars.data[3].y) == pytest.approx(ref["soft"])
    assert list(bars.data[0].y) == vals
    assert "t = 0.900" in bars.layout.title.text and "t = 0.900" in info.value
    assert [list(t.y) for t in curves.data] != before_curves
    hard, soft = sweep_outputs(vals, 2, torch.linspace(-2, 2, 401, dtype=torch.float64))
    assert list(curves.data[0].y) == hard[:, 0].tolist() and list(curves.data[4].y) == soft[:, 0].tolist()
    sweep_box.value = 0
    hard, _ = sweep_outputs(vals, 0, torch.linspace(-2, 2, 401, dtype=torch.float64))
    assert list(curves.data[1].y) == hard[:, 1].tolist()
    assert curves.layout.xaxis.title.text == "value of a0"


def test_beta_figure_uses_the_library_beta():
    w = torch.randn(16, 32, generator=torch.Generator().manual_seed(3))
    beta = float(sste_beta(w, soft_threshold(w)))
    fig = beta_figure(w, max_points=50)
    assert f"{beta:.3f}" in fig.data[1].name
    assert len(fig.data[0].x) == 50
    assert list(fig.data[1].y) == pytest.approx([beta * y for y in fig.data[0].y])


def test_beta_trace_frozen_keeps_beta_recomputed_refits_it():
    frozen = beta_trace(False, steps=12, width=8, lr=1e-2)
    again = beta_trace(False, steps=12, width=8, lr=1e-2)
    same = lambda a, b: a == b or (math.isnan(a) and math.isnan(b))  # noqa: E731 (NaN != NaN)
    assert all(same(a, b) for k in frozen for a, b in zip(frozen[k], again[k]))  # deterministic for a seed
    assert len(set(frozen["beta"])) == 1 and all(len(v) == 12 for v in frozen.values())
    assert math.isnan(frozen["flip_rate"][0]) and not math.isnan(frozen["flip_rate"][1])
    recomputed = beta_trace(True, steps=12, width=8, lr=1e-2)
    assert len(set(recomputed["beta"])) > 1
    assert recomputed["loss"][0] == frozen["loss"][0]  # same start: same teacher, data and initial weight
    fig = beta_trace_figure(frozen, recomputed)
    assert len(fig.data) == 8 and list(fig.data[0].y) == frozen["beta"]


def test_beta_trace_recomputed_beta_is_the_least_squares_fit_of_the_final_weight():
    # rebuild the recompute run by hand for a few steps and compare its beta with sste_beta
    steps = 5
    trace = beta_trace(True, steps=steps, width=8, lr=1e-2, seed=1)
    import torch.nn as nn

    from sparsity_lab import SSTE, attach_optimizer, sparsify
    from sparsity_lab.masks.nm import nm_mask
    gen = torch.Generator().manual_seed(1)
    teacher = torch.randn(8, 8, generator=gen) / math.sqrt(8)
    torch.manual_seed(1)
    model = nn.Sequential()
    model.add_module("fc", nn.Linear(8, 8, bias=False))
    sparsify(model, SSTE(), select="all")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    attach_optimizer(model, opt)
    layer = model.fc
    for _ in range(steps):
        x = torch.randn(64, 8, generator=gen)
        loss = (model(x) - x @ teacher.T).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            layer.beta.copy_(sste_beta(layer.weight, soft_threshold(layer.weight, nm_mask(layer.weight, 2, 4))))
    assert trace["beta"][-1] == float(layer.beta)


def test_beta_trace_leaves_the_global_generator_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    beta_trace(False, steps=2, width=8)
    assert torch.equal(torch.rand(3), expected)


def test_beta_trace_bad_arguments():
    with pytest.raises(ValueError, match="width must be a positive multiple of 4"):
        beta_trace(False, steps=2, width=6)
    with pytest.raises(ValueError, match="steps must be a positive int"):
        beta_trace(False, steps=0)
