"""The multi-seed beta verdict of notebook 05: a verdict only from a run large enough to judge."""
import pytest

from sparsity_lab.course.viz.beta_seeds_view import beta_seed_runs, beta_verdict_lines


def _summary(seeds, steps, growth=30.0, loss=(0.4, 1.8)):
    runs = [{"seed": s, "beta_start": 1.8, "beta_end": 1.8 * growth, "frozen_beta_constant": True,
             "loss_frozen": loss[0], "loss_recomputed": loss[1], "flip_frozen": 0.01, "flip_recomputed": 0.15}
            for s in range(seeds)]
    return {"settings": {"seeds": seeds, "steps": steps, "width": 64, "lr": 1e-2, "tail_steps": 10}, "runs": runs}


def test_small_runs_are_too_small_to_judge():
    for seeds, steps in ((1, 300), (3, 100)):
        lines = beta_verdict_lines(_summary(seeds, steps))
        assert len(lines) == 1 and "too small to judge" in lines[0] and "HOLDS" not in lines[0]


def test_verdicts_carry_seed_counts_and_spread():
    lines = beta_verdict_lines(_summary(3, 300))
    assert "  [HOLDS] recomputed beta grows more than 5x: on 3 of 3 seeds; growth 30.00-30.00" in lines
    mixed = _summary(3, 300)
    mixed["runs"][1]["loss_recomputed"] = 0.1
    assert any(line.startswith("  [MIXED] recomputed run ends with a higher loss: on 2 of 3 seeds") for line in
               beta_verdict_lines(mixed))


def test_a_tiny_live_run_and_bad_arguments():
    summary = beta_seed_runs(seeds=1, steps=3, width=8)
    assert len(summary["runs"]) == 1 and len(summary["traces"]["frozen"]["beta"]) == 3
    with pytest.raises(ValueError, match="seeds must be a positive int"):
        beta_seed_runs(seeds=0)


def test_the_frozen_beta_is_a_check_not_a_verdict():
    """True by construction (nothing updates it): stated as a check of the run, never as [HOLDS]."""
    lines = beta_verdict_lines(_summary(3, 300))
    frozen = [line for line in lines if "frozen beta" in line]
    assert len(frozen) == 1 and "[" not in frozen[0] and "a check, not a claim" in frozen[0] and len(frozen[0]) <= 100
    assert "3 of 3 seeds" in frozen[0]
