"""``sparsity-lab decay-search``: choose masked decay's lambda_W from short warm-up trials.

THIS IS OUR PROCEDURE. Hu et al. 2024 propose determining a feasible lambda_W during warm-up, but
their exact rule was not available to us; what follows is sparsity-lab's own, documented rule.

Trials: the planned run (its schedule over ``steps``) trained for only ``trial_steps`` steps
(default: the warm-up), once dense (the reference), once with STE (lambda_W = 0, shown for context)
and once with MaskedDecay(lambda_W) (or MaskedDecayOnWeights) for every lambda_W of a log grid (no dense fine-tune: the
trials end long before it). Each trial reports
    L   validation loss at its last step
    r   mean overall flip rate over the last quarter of its steps
Criterion (ours):
    loss_ok(lambda) = L(lambda) / L_dense - 1 <= min over the grid of (L / L_dense - 1) + loss_tolerance
    choice = among loss_ok lambdas, the one whose flip rate is closest to the dense run's
             (smallest |log(r(lambda) / r_dense)|; ties go to the smaller lambda)
Why: a healthy sparse run's masks should change about as often as a dense run's would-be masks.
Far more flips is STE's instability; far fewer is a mask frozen early by too much decay. The loss
condition keeps out lambdas that already cost accuracy in warm-up. ``at_grid_edge`` says when the
choice is the grid's smallest or largest value (widen the grid).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

from ..provenance import write_result
from .arguments import nonnegative_float, output_folder, positive_float, positive_int
from .options import (add_common_arguments, check_data_options, cli_errors, common_method_options, config_from_args,
                      resolve_tokenizer)
from .runlog import finite_json
from .trainer import TrainConfig, Trainer, TrainingDiverged, config_corpus

# Half-decades. The reference constants (6e-5 for GPT-2 124M) sit low in it; small models with
# Adam-normalised updates may need larger values before the decay term is comparable to dW.
DEFAULT_GRID = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)

HELP = ("choose masked decay's lambda_W by short warm-up trials over a log grid, judged by flip rate and "
        "loss against a dense reference. This is sparsity-lab's own procedure: the paper proposes "
        "finding a feasible lambda_W in warm-up but its exact rule was not available to us.")


def _trial(base: TrainConfig, method: str, options: dict, trial_steps: int, corpus) -> dict:
    cfg = replace(base, method=method, method_options=options, eval_at=(trial_steps,), log_path=None,
                  track_flips=method == "dense",  # the dense reference flip rate the rule compares with
                  checkpoint_path=None)
    trainer = Trainer(cfg, corpus=corpus)
    try:
        trainer.run(stop_at=trial_steps)
    except TrainingDiverged as err:
        trainer.close()
        return {"method": method, "options": options, "val_loss": math.nan, "flip_rate": math.nan,
                "status": f"diverged: {err}"}
    trainer.close()
    last = [r["flip_rate"] for r in trainer.history[-max(1, trial_steps // 4):] if r["flip_rate"] is not None]
    return {"method": method, "options": options, "val_loss": trainer.history[-1]["val_loss"],
            "flip_rate": sum(last) / len(last) if last else math.nan, "status": "ok"}


def choose_decay(dense: dict, trials: dict[float, dict], loss_tolerance: float) -> dict:
    """Apply the criterion (module docstring) to finished trials. Returns the choice and per-lambda verdicts."""
    ld, rd = dense["val_loss"], dense["flip_rate"]
    if not (math.isfinite(rd) and rd > 0):
        raise ValueError(f"the dense reference has no flip rate ({rd}); run longer trials")
    gaps = {lam: t["val_loss"] / ld - 1 for lam, t in trials.items() if math.isfinite(t["val_loss"])}
    if not gaps:
        raise ValueError("every masked-decay trial diverged; lower the learning rate or the grid")
    best_gap = min(gaps.values())
    verdicts = {}
    for lam, t in trials.items():
        r = t["flip_rate"]
        distance = abs(math.log(r / rd)) if math.isfinite(r) and r > 0 else math.inf
        verdicts[lam] = {"gap_vs_dense": gaps.get(lam, math.nan), "flip_vs_dense": r / rd,
                         "loss_ok": lam in gaps and gaps[lam] <= best_gap + loss_tolerance,
                         "log_flip_distance": distance}
    candidates = [lam for lam, v in verdicts.items() if v["loss_ok"]]
    chosen = min(candidates, key=lambda lam: (verdicts[lam]["log_flip_distance"], lam))
    return {"decay": chosen, "verdicts": verdicts, "at_grid_edge": chosen in (min(trials), max(trials))}


SEARCH_METHODS = ("masked_decay", "masked_decay_weights")


def search_decay(base: TrainConfig, grid=DEFAULT_GRID, trial_steps: int | None = None,
                 loss_tolerance: float = 0.005, common: dict | None = None, method: str = "masked_decay") -> dict:
    """Run the trials and apply the criterion (module docstring). method: "masked_decay" (the term on
    gradients) or "masked_decay_weights" (on weights, decoupled: it needs far larger lambda_W)."""
    if method not in SEARCH_METHODS:
        raise ValueError(f"method must be one of {SEARCH_METHODS}, got {method!r}")
    grid = sorted(float(g) for g in grid)
    if not grid or not all(math.isfinite(g) and g > 0 for g in grid):
        raise ValueError(f"grid must hold positive lambda_W values, got {grid}")
    if isinstance(loss_tolerance, bool) or not isinstance(loss_tolerance, (int, float)) \
            or not math.isfinite(loss_tolerance) or loss_tolerance < 0:
        raise ValueError(f"loss_tolerance must be a finite number >= 0, got {loss_tolerance!r}")
    trial_steps = max(base.warmup_steps, 1) if trial_steps is None else trial_steps
    if not 1 <= trial_steps <= base.steps:
        raise ValueError(f"trial_steps must be in [1, steps={base.steps}], got {trial_steps}")
    common = common or {}
    corpus = config_corpus(base)
    dense = _trial(base, "dense", common, trial_steps, corpus)
    if not math.isfinite(dense["val_loss"]):
        raise ValueError(f"the dense reference trial diverged ({dense['status']}); lower the learning rate")
    ste = _trial(base, "ste", common, trial_steps, corpus)
    trials = {}
    for lam in grid:
        trials[lam] = _trial(base, method, {**common, "decay": lam, "dense_finetune_at": None},
                             trial_steps, corpus)
        print(f"[decay-search] lambda_W {lam:.1e}: val {trials[lam]['val_loss']:.4f}, "
              f"flip {trials[lam]['flip_rate']:.3e}", flush=True)
    choice = choose_decay(dense, trials, loss_tolerance)
    return {"procedure": "sparsity-lab's own (the paper's exact rule was not available)", "method": method,
            "criterion": {"loss_tolerance": loss_tolerance,
                          "rule": "among lambdas with gap to dense <= best gap + loss_tolerance, the one whose "
                                  "flip rate is closest to the dense run's (ratio); ties to the smaller"},
            "trial_steps": trial_steps, "planned_steps": base.steps, "corpus": corpus.describe(),
            "dense": dense, "ste": ste, "trials": [{"decay": lam, **trials[lam], **choice["verdicts"][lam]}
                                                   for lam in grid],
            "chosen": {k: choice[k] for k in ("decay", "at_grid_edge")}}


def print_evidence(result: dict) -> None:
    d, s = result["dense"], result["ste"]
    print(f"\nDecay search over {result['trial_steps']} warm-up steps; the rule is {result['procedure']}")
    print(f"  dense reference: val {d['val_loss']:.4f}, flip {d['flip_rate']:.3e}")
    print(f"  STE (lambda 0):  val {s['val_loss']:.4f}, flip {s['flip_rate']:.3e}")
    print(f"  {'lambda_W':>9} {'val loss':>9} {'gap %':>7} {'flip':>10} {'flip/dense':>10}  loss ok")
    for t in result["trials"]:
        print(f"  {t['decay']:>9.1e} {t['val_loss']:>9.4f} {100 * t['gap_vs_dense']:>7.2f} {t['flip_rate']:>10.3e} "
              f"{t['flip_vs_dense']:>10.3f}  {'yes' if t['loss_ok'] else 'no'}")
    c = result["chosen"]
    print(f"  rule: {result['criterion']['rule']}")
    edge = "  (at the edge of the grid: widen it)" if c["at_grid_edge"] else ""
    print(f"  chosen lambda_W = {c['decay']:.1e}{edge}")


def add_arguments(parser) -> None:
    parser.description = HELP
    parser.add_argument("--grid", type=decay_grid, default=",".join(f"{g:g}" for g in DEFAULT_GRID),
                        help="comma-separated lambda_W values (default half-decades 1e-6..1e-1)")
    parser.add_argument("--trial-steps", type=positive_int, default=None,
                        help="steps per trial (default: the warm-up steps)")
    parser.add_argument("--loss-tolerance", type=nonnegative_float, default=0.005,
                        help="acceptable gap to dense <= best gap + this (relative; default 0.005)")
    parser.add_argument("--out", type=output_folder, default=None, help="write the evidence to OUT/decay_search.json")
    parser.add_argument("--method", choices=SEARCH_METHODS, default="masked_decay",
                        help="masked decay on gradients (default) or on weights (decoupled)")
    add_common_arguments(parser)


def decay_grid(text) -> list[float]:
    """--grid: comma-separated lambda_W values, each a finite number > 0."""
    try:
        grid = [positive_float(g.strip()) for g in str(text).split(",") if g.strip()]
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers > 0, got {text!r} ({err})") from None
    if not grid:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers > 0, got {text!r}")
    return grid


def check_arguments(args) -> None:
    """The data options (ValueError naming them), before any trial."""
    check_data_options(args, args.out)


@cli_errors("decay-search")
def run(args) -> int:
    check_arguments(args)  # also when run() is called without the command line
    if args.out:
        resolve_tokenizer(args, args.out)
    grid = args.grid if isinstance(args.grid, list) else decay_grid(args.grid)
    result = search_decay(config_from_args(args), grid, args.trial_steps, args.loss_tolerance,
                          common_method_options(args), method=args.method)
    print_evidence(result)
    if args.out:
        path = write_result("decay_search", finite_json(result), directory=Path(args.out))
        print(f"  evidence written to {path}")
    return 0

