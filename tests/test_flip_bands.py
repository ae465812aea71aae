"""The multi-seed flip-rate run (sparsity_lab.lab.flip_bands), its verdicts and its band figures."""
import json
import math

import pytest

from sparsity_lab.lab.flip_bands import (FlipBands, default_methods, judge_flip_bands, run_flip_bands,
                                     verdict_lines)
from sparsity_lab.provenance import read_result


def hand_made(late, steps=200, seeds=(0, 1, 2)):
    """FlipBands whose per-seed rates are constant per half: early 0.02 for all, late as given."""
    rates = {k: [[math.nan] + [0.02] * (steps // 2 - 1) + [v] * (steps // 2) for v in vals] for k, vals in late.items()}
    return FlipBands(seeds=list(seeds), steps=steps, lr=1e-3, methods={k: k for k in late}, rates=rates,
                     losses={k: [[1.0] * steps for _ in seeds] for k in late})


def test_band_is_mean_and_one_standard_deviation():
    b = hand_made({"ste": [0.01, 0.02, 0.03]})
    band = b.band("ste")
    assert math.isnan(band["mean"][0])
    assert band["mean"][-1] == pytest.approx(0.02) and band["hi"][-1] == pytest.approx(0.03)
    assert band["lo"][-1] == pytest.approx(0.01)
    assert b.late("ste") == pytest.approx([0.01, 0.02, 0.03]) and b.early("ste") == pytest.approx([0.02] * 3)
    with pytest.raises(ValueError, match="no method 'dense'"):
        b.band("dense")


def test_verdicts_follow_the_per_seed_late_rates():
    good = hand_made({"dense": [0.005, 0.006, 0.007], "ste": [0.03, 0.031, 0.032],
                      "masked_decay": [0.003, 0.004, 0.004], "masked_decay_weights": [0.029, 0.03, 0.03]})
    assert [c["holds"] for c in judge_flip_bands(good)] == [True, True, True, True]
    # one STE seed inside the dense cloud: the bands overlap, claim 2 fails
    overlap = hand_made({"dense": [0.005, 0.006, 0.007], "ste": [0.006, 0.031, 0.032],
                         "masked_decay": [0.003, 0.004, 0.004], "masked_decay_weights": [0.029, 0.03, 0.03]})
    assert [c["holds"] for c in judge_flip_bands(overlap)][:3] == [True, False, True]
    text = verdict_lines(judge_flip_bands(overlap))
    assert "[FAILS] 2." in text and "3 seeds" in text
    narrow = verdict_lines(judge_flip_bands(overlap), width=60)
    assert max(map(len, narrow.splitlines())) <= 60 and " ".join(narrow.split()) == " ".join(text.split())
    with pytest.raises(ValueError, match="width"):
        verdict_lines([], width=10)


@pytest.mark.parametrize("seeds,steps", [((0, 1), 200), ((0, 1, 2), 40)])
def test_small_runs_are_too_small_to_judge(seeds, steps):
    b = hand_made({"dense": [0.005] * len(seeds), "ste": [0.03] * len(seeds)}, steps=steps, seeds=seeds)
    claims = judge_flip_bands(b)
    assert all(c["holds"] is None for c in claims)
    assert "too small to judge" in claims[1]["evidence"] and "not run" in claims[2]["evidence"]


def test_a_short_live_run_and_its_json_round_trip():
    b = run_flip_bands(methods={k: default_methods()[k] for k in ("dense", "masked_decay_weights")},
                       seeds=[0, 1], steps=6, width=16)
    assert set(b.rates) == {"dense", "masked_decay_weights"} and len(b.rates["dense"]) == 2
    assert math.isnan(b.rates["dense"][0][0]) and all(math.isfinite(v) for v in b.rates["dense"][0][1:])
    from sparsity_lab.lab.runlog import finite_json
    again = FlipBands.from_dict(json.loads(json.dumps(finite_json(b.to_dict()))))
    assert again.late("dense") == b.late("dense") and again.methods == b.methods


def test_run_refuses_bad_input():
    with pytest.raises(ValueError, match="steps must be"):
        run_flip_bands(steps=1)
    with pytest.raises(ValueError, match="width must be divisible by 4"):
        run_flip_bands(seeds=[0], steps=3, width=10)
    with pytest.raises(ValueError, match="methods must map"):
        run_flip_bands(methods={"x": "ste"}, steps=3)


def test_recorded_run_holds_its_verdicts_and_they_are_recomputable():
    recorded = read_result("flip_bands_cpu")
    bands = FlipBands.from_dict(recorded["flip_bands"])
    assert len(bands.seeds) >= 3 and bands.steps >= 200
    assert [c["holds"] for c in judge_flip_bands(bands)] == [c["holds"] for c in recorded["claims"]]


def test_band_figures():
    pytest.importorskip("plotly")
    from sparsity_lab.course.viz.flip_band_view import flip_band_figure, late_flip_figure
    b = hand_made({"dense": [0.005, 0.006, 0.007], "ste": [0.03, 0.031, 0.032]})
    fig = flip_band_figure(b, smooth=1)
    assert len(fig.data) == 4  # a band and a mean line per method
    band, mean = fig.data[2], fig.data[3]
    assert band.fill == "toself" and mean.name == "STE"
    assert mean.y[-1] == pytest.approx(0.031) and max(band.y) == pytest.approx(0.032)
    assert fig.layout.yaxis.type == "log"
    late = late_flip_figure(b)
    assert list(late.data[1].y) == pytest.approx([0.03, 0.031, 0.032])
    with pytest.raises(ValueError, match="labels must name"):
        flip_band_figure(b, labels=["srste"])


def test_judged_or_recorded_falls_back_to_the_recorded_run_only_when_too_small():
    from sparsity_lab.lab.flip_bands import judged_or_recorded
    small = hand_made({"dense": [0.005, 0.006], "ste": [0.03, 0.031]}, seeds=(0, 1))
    shown, claims, source = judged_or_recorded(small)
    assert shown is not small and "results/flip_bands_cpu.json" in source
    assert all(c["holds"] is not None for c in claims)
    large = hand_made({"dense": [0.005, 0.006, 0.007], "ste": [0.03, 0.031, 0.032]})
    shown, claims, source = judged_or_recorded(large)
    assert shown is large and source.startswith("this live run") and claims[1]["holds"] is True


def test_demo_seeds_prints_the_spread_and_records(tmp_path, capsys):
    from sparsity_lab.lab.cli import main
    out = tmp_path / "bands.json"
    assert main(["demo", "--seeds", "2", "--steps", "4", "--size", "8", "--record", str(out)]) == 0
    text = capsys.readouterr().out
    assert "over 2 seeds" in text and "[NOT JUDGED]" in text and "too small to judge" in text
    stored = json.loads(out.read_text())
    assert stored["provenance"]["command"] and FlipBands.from_dict(stored["flip_bands"]).seeds == [0, 1]
    with pytest.raises(SystemExit):
        main(["demo", "--steps", "4", "--size", "8", "--record", str(out)])
    assert "--record needs --seeds" in capsys.readouterr().err
