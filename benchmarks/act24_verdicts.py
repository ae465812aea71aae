"""The verdicts of the 2:4 activation accuracy runs (``act24_accuracy``), from the final validation
losses of each setting at each seed.

Settings: ``gelu`` and ``relu2`` (dense FFNs), ``act24`` (squared ReLU with 2:4 activations, dense
weights), ``act24_ste`` (2:4 activations and 2:4 weights, STE, the last tenth of the steps dense) and
``act24_tok24`` (2:4 activations with the weight gradients 2:4 along permuted tokens).
A seed gives every setting the same initial weights (where the shapes agree) and the same batches, so
each sparse setting is compared with its dense twin seed by seed: the relative gap of seed s is

    g_s = L_sparse(s) / L_relu2(s) - 1.

The rules (ours; "within x %" is one-sided, as in ``compare``'s claim 5: a lower loss is within):
    1. squared ReLU against GELU, dense: the difference of the means, and whether the two settings' ranges
       over the seeds overlap. Holds when relu2's worst seed is below gelu's best (no overlap, relu2 lower).
    2. 2:4 activations cost at most 1 %: g_s <= 0.01 at every seed.
    3. the combined method is within 2 % of dense: g_s <= 0.02 at every seed (``holds``); the same on the
       means of the seeds is reported beside it (``holds_on_mean``).
    4. 2:4 activations with token-dimension 2:4 weight gradients cost at most 1 %: g_s <= 0.01 at every
       seed (the tolerance of rule 2: the weight-gradient approximation should not add a visible cost).
A verdict needs at least MIN_SEEDS seeds and, when the run's steps are given, at least MIN_STEPS steps (a
smoke run on the CPU is not judged); otherwise ``holds`` is None and the evidence says "not judged: N seeds"
or "not judged: N steps".
"""
from __future__ import annotations

import statistics

MIN_SEEDS = 3
MIN_STEPS = 200  # the first recording trained 400 steps
ACT24_TOLERANCE = 0.01  # rule 2
COMBINED_TOLERANCE = 0.02  # rule 3


def _spread(values: list[float]) -> str:
    """'mean (min-max, n seeds)' of final losses."""
    return f"{statistics.fmean(values):.4f} (range {min(values):.4f}-{max(values):.4f}, {len(values)} seeds)"


def _gaps_text(gaps: list[float]) -> str:
    return ("per seed " + ", ".join(f"{100 * g:+.2f} %" for g in gaps)
            + f"; mean {100 * statistics.fmean(gaps):+.2f} %, range {100 * min(gaps):+.2f} to {100 * max(gaps):+.2f} %")


def judge_act24(final_losses: dict, steps: int | None = None, min_seeds: int = MIN_SEEDS,
                min_steps: int = MIN_STEPS) -> list[dict]:
    """The four verdicts of the module docstring.

    final_losses: {seed: {setting: final validation loss}} (seeds as ints or strings, as JSON keeps them);
    steps: the optimizer steps of every run (None: not checked).
    Each verdict: claim, rule, holds (True / False / None: not judged), seeds, evidence, and the numbers
    the rule read (``values``).
    """
    seeds = sorted(final_losses, key=lambda s: int(s))
    if not seeds:
        raise ValueError("final_losses must hold at least one seed")
    why = ""
    if len(seeds) < min_seeds:
        why = f"not judged: {len(seeds)} seed{'s' * (len(seeds) != 1)} (a verdict needs >= {min_seeds}); "
    elif steps is not None and steps < min_steps:
        why = f"not judged: {steps} steps (a verdict needs >= {min_steps}); "
    judged = not why

    def column(setting: str) -> list[float] | None:
        vals = [final_losses[s].get(setting) for s in seeds]
        return None if any(v is None for v in vals) else [float(v) for v in vals]

    def verdict(claim: str, rule: str, needs: tuple[str, ...], judge) -> dict:
        cols = {n: column(n) for n in needs}
        missing = [n for n, c in cols.items() if c is None]
        out = {"claim": claim, "rule": rule, "holds": None, "seeds": [int(s) for s in seeds]}
        if missing:
            return {**out, "evidence": f"not judged: no final loss for {missing} at every seed"}
        holds, evidence, values = judge(cols)
        return {**out, "holds": holds if judged else None, "evidence": why + evidence, "values": values}

    def relu2_vs_gelu(c):
        relu2, gelu = c["relu2"], c["gelu"]
        overlap = max(min(relu2), min(gelu)) <= min(max(relu2), max(gelu))
        diff = statistics.fmean(relu2) - statistics.fmean(gelu)
        paired = [r - g for r, g in zip(relu2, gelu)]
        outcome = "ranges overlap" if overlap else ("relu2 lower" if max(relu2) < min(gelu) else "gelu lower")
        evidence = (f"relu2 {_spread(relu2)}; gelu {_spread(gelu)}; mean difference {diff:+.4f}; "
                    f"per seed {', '.join(f'{d:+.4f}' for d in paired)}; {outcome}")
        return (not overlap and max(relu2) < min(gelu), evidence,
                {"mean_difference": diff, "per_seed_difference": paired, "ranges_overlap": overlap,
                 "outcome": outcome})

    def within(sparse: str, tolerance: float):
        def judge(c):
            gaps = [s / d - 1 for s, d in zip(c[sparse], c["relu2"])]
            mean_gap = statistics.fmean(c[sparse]) / statistics.fmean(c["relu2"]) - 1
            on_mean = mean_gap <= tolerance
            evidence = (f"{sparse} {_spread(c[sparse])}; relu2 {_spread(c['relu2'])}; gap to relu2 {_gaps_text(gaps)}; "
                        f"on the means {100 * mean_gap:+.2f} % ({'within' if on_mean else 'outside'} "
                        f"{100 * tolerance:g} %)")
            return (all(g <= tolerance for g in gaps), evidence,
                    {"per_seed_gap": gaps, "mean_gap": mean_gap, "min_gap": min(gaps), "max_gap": max(gaps),
                     "holds_on_mean": on_mean if judged else None, "tolerance": tolerance})
        return judge

    return [
        verdict("1. squared ReLU reaches a lower validation loss than GELU (dense FFNs)",
                "max over seeds of relu2's final val loss < min over seeds of gelu's (the ranges do not overlap)",
                ("relu2", "gelu"), relu2_vs_gelu),
        verdict("2. 2:4 activations keep the loss of the dense squared-ReLU FFN (within 1 %)",
                "act24 final val <= 1.01 x relu2 final val at every seed (same seed, same batches)",
                ("act24", "relu2"), within("act24", ACT24_TOLERANCE)),
        verdict("3. 2:4 activations + 2:4 weights (STE, dense tail) are within 2 % of the dense loss",
                "act24_ste final val <= 1.02 x relu2 final val at every seed (on the means of the seeds too: "
                "holds_on_mean)", ("act24_ste", "relu2"), within("act24_ste", COMBINED_TOLERANCE)),
        verdict("4. 2:4 activations with weight gradients 2:4 along permuted tokens keep the dense squared-ReLU "
                "loss (within 1 %)",
                "act24_tok24 final val <= 1.01 x relu2 final val at every seed (same seed, same batches)",
                ("act24_tok24", "relu2"), within("act24_tok24", ACT24_TOLERANCE)),
    ]
