"""The decay grid (cached runs behind the decay slider) and the decay-placement measurement."""
import math

import pytest
import torch
from _lab_testing import tiny_config

from sparsity_lab.lab import GPTConfig, Trainer, load_corpus
from sparsity_lab.lab.decay_grid import RunCurve, decay_label, run_decay_grid
from sparsity_lab.lab.decay_placement import where_decay_lands

TINY = GPTConfig(n_layer=1, n_head=2, d_model=16, context=16)
STEPS = 10


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_bytes=50_000)


@pytest.fixture(scope="module")
def grid(corpus):
    return run_decay_grid(tiny_config(TINY, steps=STEPS), [0.3, 0.0, 0.3], method="srste", corpus=corpus)


def test_grid_runs_the_dense_reference_and_one_run_per_distinct_decay(grid):
    assert grid.decays == (0.0, 0.3)  # sorted, duplicates dropped
    assert [c.label for c in grid.curves()] == ["dense reference", "STE (decay 0)", "SR-STE, lambda_W = 3e-01"]
    for curve in grid.curves():
        assert curve.status == "ok"
        assert curve.steps == tuple(range(1, STEPS + 1))
        assert len(curve.loss) == len(curve.flip_rate) == STEPS
        assert math.isnan(curve.flip_rate[0])  # no previous mask at the first step
        assert all(math.isfinite(f) for f in curve.flip_rate[1:])
        assert curve.val_steps[-1] == STEPS and math.isfinite(curve.final_val_loss)
    assert grid.config["method_options"] == {} and grid.config["log_path"] is None


def test_decay_zero_is_exactly_ste_and_a_decay_changes_the_masks(grid, corpus):
    ste = Trainer(tiny_config(TINY, steps=STEPS, method="ste"), corpus=corpus)
    ste.run()
    assert list(grid.runs[0.0].loss) == [r["loss"] for r in ste.history]
    flips = [r["flip_rate"] for r in ste.history[1:]]
    assert list(grid.runs[0.0].flip_rate[1:]) == flips
    assert grid.runs[0.3].flip_rate[1:] != grid.runs[0.0].flip_rate[1:]
    # same initial weights and batches: the decay acts on the gradient, so the first loss is shared
    assert len({grid.runs[d].loss[0] for d in grid.decays}) == 1


def test_masked_decay_grid_never_switches_to_dense(corpus):
    g = run_decay_grid(tiny_config(TINY, steps=6), [0.1], method="masked_decay", corpus=corpus,
                       dense_reference=False)
    assert g.dense is None and g.decays == (0.1,)
    assert all(math.isfinite(f) for f in g.runs[0.1].flip_rate[1:])  # masks computed up to the last step


def test_tidy_and_summary(grid):
    rows = grid.tidy()
    assert len(rows) == 3 * STEPS
    assert set(rows[0]) == {"label", "method", "decay", "step", "loss", "flip_rate", "val_loss"}
    dense_rows = [r for r in rows if r["method"] == "dense"]
    assert [r["loss"] for r in dense_rows] == list(grid.dense.loss)
    evaluated = [r["step"] for r in dense_rows if not math.isnan(r["val_loss"])]
    assert evaluated == list(grid.dense.val_steps)
    summary = grid.summary()
    assert [s["decay"] for s in summary] == [None, 0.0, 0.3]
    assert summary[2]["late_flip_rate"] == grid.runs[0.3].late_flip_rate


def test_late_statistics_average_the_last_tenth_and_skip_missing_values():
    rows = [{"step": s, "loss": float(s), "val_loss": None, "flip_rate": None if s in (1, 20) else s / 100}
            for s in range(1, 21)]
    rows[-1]["val_loss"] = 2.5
    curve = RunCurve.from_history("x", "srste", 0.1, rows)
    assert curve.late_train_loss == pytest.approx((19 + 20) / 2)  # last 10 % of 20 steps = 2 steps
    assert curve.late_flip_rate == pytest.approx(0.19)  # step 20 has no flip rate
    assert curve.final_val_loss == 2.5 and curve.val_steps == (20,)
    assert math.isnan(curve.flip_rate[0])


def test_decay_label():
    assert decay_label("srste", 0.0) == "STE (decay 0)"
    assert decay_label("masked_decay", 3e-4) == "masked decay, lambda_W = 3e-04"
    assert decay_label("srste", 1e-2) == "SR-STE, lambda_W = 1e-02"


@pytest.mark.parametrize("kwargs,match", [
    ({"method": "ste"}, "method must be one of"),
    ({"decays": [-1e-3]}, "decay must be a finite number >= 0"),
    ({"decays": [float("nan")]}, "decay must be a finite number >= 0"),
    ({"decays": "0.1"}, "decays must be a list"),
    ({"decays": []}, "at least one"),
])
def test_bad_input_is_refused_with_a_clear_error(corpus, kwargs, match):
    args = {"decays": [0.1], "method": "srste", **kwargs}
    with pytest.raises(ValueError, match=match):
        run_decay_grid(tiny_config(TINY, steps=2), args.pop("decays"), corpus=corpus, **args)


def test_a_diverging_run_keeps_its_rows_and_says_so(corpus, monkeypatch):
    from sparsity_lab.lab import trainer as trainer_module

    real = trainer_module.Trainer.train_step

    def blow_up_at_step_3(self):
        row = real(self)
        if self.step == 3:
            raise trainer_module.TrainingDiverged("the training loss became nan at step 3")
        return row

    monkeypatch.setattr(trainer_module.Trainer, "train_step", blow_up_at_step_3)
    g = run_decay_grid(tiny_config(TINY, steps=6), [0.1], corpus=corpus, dense_reference=False)
    run = g.runs[0.1]
    assert run.status.startswith("diverged") and run.steps == (1, 2)


@pytest.mark.parametrize("method,in_backward,after_clip", [
    ("masked_decay", False, True), ("srste", True, False), ("ste", False, False)])
def test_where_decay_lands(method, in_backward, after_clip):
    r = where_decay_lands(method, decay=0.05, max_norm=0.01, seed=1)
    assert r["clipped"] and 0 < r["clip_factor"] < 1
    assert (r["added_in_backward"], r["added_after_clip"]) == (in_backward, after_clip)
    if method == "masked_decay":
        # the term is not scaled by clipping: what AdamW reads = clipped gradient + the full term
        assert torch.allclose(r["at_step"], r["after_clip"] + r["term"])
    if method == "srste":
        # the term went through clipping with the gradient: nothing is added after it
        assert torch.equal(r["at_step"], r["after_clip"])
        assert torch.allclose(r["after_clip"], r["clip_factor"] * r["after_backward"])


def test_where_decay_lands_refuses_bad_input():
    with pytest.raises(ValueError, match="method must be"):
        where_decay_lands("sste")
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        where_decay_lands("masked_decay", max_norm=0.0)

