"""Frozen against recomputed S-STE beta over several seeds, with a verdict only when the run is large
enough to judge (notebook 05, section 3).

``beta_seed_runs`` runs :func:`sparsity_lab.course.viz.soft_threshold_view.beta_trace` both ways for each seed
and summarises the end of each run; ``beta_verdict_lines`` turns a summary into printed lines: the
per-claim count of seeds that agree with the min-max spread, or "too small to judge" below
``JUDGE_STEPS`` steps or ``JUDGE_SEEDS`` seeds. Record a full-size run (CPU, about a minute per seed):

    python -m sparsity_lab.course.viz.beta_seeds_view --seeds 3 --steps 300 --out-dir results
"""
from __future__ import annotations

import argparse
import shlex
import sys

from .soft_threshold_view import beta_trace

RESULT_NAME = "sste_beta_seeds_cpu"
JUDGE_STEPS = 300   # the recomputed beta takes off after ~100-200 steps at lr 1e-2 (width 64)
JUDGE_SEEDS = 3
TAIL = 10           # steps averaged at the end of each run


def _tail(values: list[float]) -> float:
    tail = values[-TAIL:]
    return sum(tail) / len(tail)


def beta_seed_runs(seeds: int = 3, steps: int = 300, width: int = 64, lr: float = 1e-2) -> dict:
    """For seeds 0..seeds-1: both runs of beta_trace; returns {"settings", "runs": one dict per seed with
    beta growth of the recomputed run and the tail loss / flip rate of both, "traces": seed 0's traces}."""
    for name, value in (("seeds", seeds), ("steps", steps), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    runs, traces = [], {}
    for seed in range(seeds):
        frozen = beta_trace(recompute=False, steps=steps, width=width, lr=lr, seed=seed)
        recomputed = beta_trace(recompute=True, steps=steps, width=width, lr=lr, seed=seed)
        if seed == 0:
            traces = {"frozen": frozen, "recomputed": recomputed}
        runs.append({"seed": seed, "beta_start": recomputed["beta"][0], "beta_end": recomputed["beta"][-1],
                     "frozen_beta_constant": len(set(frozen["beta"])) == 1,
                     "loss_frozen": _tail(frozen["loss"]), "loss_recomputed": _tail(recomputed["loss"]),
                     "flip_frozen": _tail(frozen["flip_rate"]), "flip_recomputed": _tail(recomputed["flip_rate"])})
    return {"settings": {"seeds": seeds, "steps": steps, "width": width, "lr": lr, "tail_steps": TAIL},
            "runs": runs, "traces": traces}


def beta_verdict_lines(summary: dict) -> list[str]:
    """Printed verdict: each claim with the seeds that agree and the spread, or "too small to judge"."""
    s, runs = summary["settings"], summary["runs"]
    head = f"{s['seeds']} seed(s), {s['steps']} steps, width {s['width']}, lr {s['lr']:g}"
    if s["steps"] < JUDGE_STEPS or s["seeds"] < JUDGE_SEEDS:
        return [f"{head}: too small to judge (needs >= {JUDGE_STEPS} steps, >= {JUDGE_SEEDS} seeds)"]
    growth = [r["beta_end"] / r["beta_start"] for r in runs]
    loss_ratio = [r["loss_recomputed"] / r["loss_frozen"] for r in runs]
    # the frozen beta is constant by construction (it is never updated): a check of the run, not a claim
    constant = sum(r["frozen_beta_constant"] for r in runs)
    claims = [
        ("recomputed beta grows more than 5x", [g > 5 for g in growth], ("growth", growth)),
        ("recomputed run ends with a higher loss", [x > 1 for x in loss_ratio], ("loss ratio", loss_ratio)),
        ("and a higher flip rate", [r["flip_recomputed"] > r["flip_frozen"] for r in runs], None),
    ]
    lines = [head + ":", f"  (a check, not a claim: the frozen beta never moved on {constant} of {len(runs)} seeds; "
                         "nothing updates it)"]
    for text, agree, spread in claims:
        verdict = "HOLDS" if all(agree) else ("FAILS" if not any(agree) else "MIXED")
        extra = f"; {spread[0]} {min(spread[1]):.2f}-{max(spread[1]):.2f}" if spread else ""
        lines.append(f"  [{verdict}] {text}: on {sum(agree)} of {len(agree)} seeds{extra}")
    return lines


def main(argv: list[str] | None = None) -> None:
    from ...provenance import write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--out-dir", default=None, help="folder of the JSON result (default: results/ under the current folder)")
    args = parser.parse_args(argv)
    summary = beta_seed_runs(args.seeds, args.steps, args.width, args.lr)
    summary.pop("traces")
    args_text = " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    path = write_result(RESULT_NAME, summary, directory=args.out_dir,
                        command=f"python -m sparsity_lab.course.viz.beta_seeds_view {args_text}".strip())
    print("\n".join(beta_verdict_lines(summary)))
    print("wrote", path)


if __name__ == "__main__":
    main()
