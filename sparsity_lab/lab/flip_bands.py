"""The flip-rate phenomenon over several seeds, with error bands, on a CPU in seconds.

A tiny MLP (``TinyMLP``, its two linears 2:4) learns to imitate a fixed random teacher with
AdamW at a constant learning rate. Each method trains from the same initial weights on the same
batches for a given seed; several seeds give a band per step. The flip rate (Hu et al. 2024,
https://arxiv.org/abs/2404.01847) is

    r_t = || m_t XOR m_{t-1} ||_1 / D,

summed over both layers. The dense run computes the would-be 2:4 masks of its weights: the reference.

    bands = run_flip_bands(seeds=range(5), steps=300)
    bands.band("ste")          # per step: mean and mean -/+ one standard deviation over the seeds
    bands.late("ste")          # per seed: mean flip rate over the last 20 % of the steps
    judge_flip_bands(bands)    # the verdicts, each with its seeds and spread, or "too small to judge"

What the verdicts test (the rules are ours; Hu et al. state the observations in words):
    1. the dense reference's flip rate falls (late < early for every seed);
    2. STE's flip rate stays high: every seed's late STE rate is above every seed's late dense rate;
    3. masked decay on gradients brings it down: every seed's late rate is below every seed's late STE rate;
    4. at the same lambda_W the term on weights (decoupled from AdamW) brings it down less than on
       gradients: every seed's late rate on weights is above every seed's late rate on gradients.
A verdict needs at least MIN_SEEDS seeds and MIN_STEPS steps; smaller runs are "too small to judge".
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import torch
from torch import nn

from ..methods.config import SRSTE, STE, Dense, MaskedDecay, MaskedDecayOnWeights, SparsityMethod
from ..sparsify import flip_report, sparsify
from ..training_hooks import attach_optimizer

EARLY, LATE = (0.0, 0.2), (0.8, 1.0)  # fractions of the steps
MIN_SEEDS, MIN_STEPS = 3, 200
DEFAULT_DECAY = 2e-2


def default_methods(decay: float = DEFAULT_DECAY) -> dict[str, SparsityMethod]:
    """The contestants, one lambda_W for every decay method, and no dense fine-tune (the bands show the
    decay alone): dense reference, STE, SR-STE (term in the backward), masked decay on gradients
    (after clipping, through AdamW) and on weights (after the step, decoupled)."""
    return {"dense": Dense(), "ste": STE(), "srste": SRSTE(decay=decay),
            "masked_decay": MaskedDecay(decay=decay, dense_finetune_at=None),
            "masked_decay_weights": MaskedDecayOnWeights(decay=decay, dense_finetune_at=None)}


class TinyMLP(nn.Module):
    """Linear(width, 4 width), GELU, Linear(4 width, width): the student (and its teacher)."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


def flip_run(method: SparsityMethod, steps: int, seed: int, lr: float = 3e-3, width: int = 64,
             batch: int = 64, max_norm: float = 1.0) -> tuple[list[float], list[float]]:
    """Train the student for ``steps`` AdamW steps; return its per-step overall flip rate (NaN at the
    first step, which has no previous mask) and its per-step training loss."""
    torch.manual_seed(seed)
    teacher, student = TinyMLP(width), TinyMLP(width)
    sparsify(student, method)
    opt = torch.optim.AdamW(student.parameters(), lr=lr)
    hooks = attach_optimizer(student, opt)
    gen = torch.Generator().manual_seed(seed + 1)
    rates, losses = [], []
    for _ in range(steps):
        x = torch.randn(batch, width, generator=gen)
        with torch.no_grad():
            y = teacher(x)
        loss = (student(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        rates.append(flip_report(student, fresh_only=True)["overall"])  # the masks of this step
        torch.nn.utils.clip_grad_norm_(student.parameters(), max_norm)
        opt.step()
        losses.append(loss.item())
    hooks.remove()
    return rates, losses


def _window(values: list[float], lo: float, hi: float) -> float:
    n = len(values)
    part = [v for v in values[int(lo * n):max(int(lo * n) + 1, int(hi * n))] if math.isfinite(v)]
    return sum(part) / len(part) if part else math.nan


@dataclass
class FlipBands:
    """Per method, per seed, per step flip rates and losses of one multi-seed run."""

    seeds: list[int]
    steps: int
    lr: float
    methods: dict[str, str]  # label -> the method's describe()
    max_norm: float = 1.0
    rates: dict[str, list[list[float]]] = field(default_factory=dict)  # label -> [seed][step]
    losses: dict[str, list[list[float]]] = field(default_factory=dict)

    def band(self, label: str) -> dict[str, list[float]]:
        """Per step: ``mean`` over the seeds and ``lo`` / ``hi`` = mean -/+ one sample standard
        deviation (NaN where a step has no flip rate)."""
        if label not in self.rates:
            raise ValueError(f"no method {label!r} in this run; it has {list(self.rates)}")
        mean, spread = [], []
        for column in zip(*self.rates[label]):
            vals = [v for v in column if math.isfinite(v)]
            mean.append(statistics.fmean(vals) if vals else math.nan)
            spread.append(statistics.stdev(vals) if len(vals) > 1 else 0.0)
        return {"step": list(range(1, self.steps + 1)), "mean": mean,
                "lo": [m - s for m, s in zip(mean, spread)], "hi": [m + s for m, s in zip(mean, spread)]}

    def early(self, label: str) -> list[float]:
        """Per seed: the mean flip rate over the first 20 % of the steps."""
        return [_window(r, *EARLY) for r in self.rates[label]]

    def late(self, label: str) -> list[float]:
        """Per seed: the mean flip rate over the last 20 % of the steps."""
        return [_window(r, *LATE) for r in self.rates[label]]

    def to_dict(self) -> dict:
        return {"seeds": self.seeds, "steps": self.steps, "lr": self.lr, "max_norm": self.max_norm,
                "methods": self.methods,
                "windows": {"early": EARLY, "late": LATE}, "rates": self.rates, "losses": self.losses}

    @classmethod
    def from_dict(cls, d: dict) -> "FlipBands":
        def nan(rows):  # JSON stores NaN as null
            return [[math.nan if v is None else float(v) for v in row] for row in rows]
        return cls(seeds=list(d["seeds"]), steps=int(d["steps"]), lr=float(d["lr"]), methods=dict(d["methods"]),
                   max_norm=float(d.get("max_norm", 1.0)),
                   rates={k: nan(v) for k, v in d["rates"].items()}, losses={k: nan(v) for k, v in d["losses"].items()})


def run_flip_bands(methods: dict[str, SparsityMethod] | None = None, seeds=range(5), steps: int = 300,
                   lr: float = 3e-3, width: int = 64, max_norm: float = 1.0, progress=None) -> FlipBands:
    """Train every method for every seed. methods: label -> method (default ``default_methods()``).
    max_norm: gradient clipping (SR-STE's term is clipped with the gradient, masked decay's is not).
    progress: optional callable(label, seed) called before each run."""
    methods = default_methods() if methods is None else dict(methods)
    seeds = [int(s) for s in seeds]
    if not methods or not all(isinstance(m, SparsityMethod) for m in methods.values()):
        raise ValueError("methods must map labels to SparsityMethod objects (e.g. default_methods())")
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an int >= 2 (a flip rate needs two masks), got {steps!r}")
    if width % 4:
        raise ValueError(f"width must be divisible by 4 (the layers are 2:4), got {width}")
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm!r}")
    bands = FlipBands(seeds=seeds, steps=steps, lr=lr, methods={k: m.describe() for k, m in methods.items()},
                      max_norm=max_norm)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # layers this small gain nothing from threads, and stall on a shared CPU
    try:
        for label, method in methods.items():
            bands.rates[label], bands.losses[label] = [], []
            for seed in seeds:
                if progress is not None:
                    progress(label, seed)
                rates, losses = flip_run(method, steps, seed, lr=lr, width=width, max_norm=max_norm)
                bands.rates[label].append(rates)
                bands.losses[label].append(losses)
    finally:
        torch.set_num_threads(threads)
    return bands


def _spread(values: list[float]) -> str:
    """'mean +- std (min-max) over n seeds'."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return "n/a"
    s = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.fmean(vals):.2e} +- {s:.1e} (range {min(vals):.2e}-{max(vals):.2e}, {len(vals)} seeds)"


def judge_flip_bands(bands: FlipBands, min_seeds: int = MIN_SEEDS, min_steps: int = MIN_STEPS) -> list[dict]:
    """The four verdicts of the module docstring, each a dict with claim, rule, holds (True, False, or
    None when a method is missing or the run is too small to judge), evidence and seeds."""
    small = len(bands.seeds) < min_seeds or bands.steps < min_steps
    why_small = (f"too small to judge: {len(bands.seeds)} seeds x {bands.steps} steps "
                 f"(a verdict needs >= {min_seeds} seeds and >= {min_steps} steps)")
    have = set(bands.rates)

    def verdict(claim, rule, needs, test, evidence):
        missing = [n for n in needs if n not in have]
        if missing:
            return {"claim": claim, "rule": rule, "holds": None, "seeds": bands.seeds,
                    "evidence": f"not run: {missing}"}
        ev = evidence()
        return {"claim": claim, "rule": rule, "holds": None if small else bool(test()), "seeds": bands.seeds,
                "evidence": (why_small + "; " if small else "") + ev}

    out = [verdict(
        "1. the dense reference's flip rate falls", "late < early for every seed (early: first 20 % of the "
        "steps, late: last 20 %)", ["dense"],
        lambda: all(lt < e for lt, e in zip(bands.late("dense"), bands.early("dense"))),
        lambda: f"dense early {_spread(bands.early('dense'))}; late {_spread(bands.late('dense'))}")]
    out.append(verdict(
        "2. STE's flip rate stays high while the dense reference's falls",
        "min over seeds of STE's late flip rate > max over seeds of dense's", ["dense", "ste"],
        lambda: min(bands.late("ste")) > max(bands.late("dense")),
        lambda: f"late STE {_spread(bands.late('ste'))}; dense {_spread(bands.late('dense'))}"))
    out.append(verdict(
        "3. masked decay on gradients brings the flip rate down",
        "max over seeds of masked_decay's late flip rate < min over seeds of STE's", ["ste", "masked_decay"],
        lambda: max(bands.late("masked_decay")) < min(bands.late("ste")),
        lambda: f"late masked_decay {_spread(bands.late('masked_decay'))}; STE {_spread(bands.late('ste'))}"))
    out.append(verdict(
        "4. at the same lambda_W, the term on weights brings it down less than on gradients",
        "min over seeds of masked_decay_weights's late flip rate > max over seeds of masked_decay's",
        ["masked_decay", "masked_decay_weights"],
        lambda: min(bands.late("masked_decay_weights")) > max(bands.late("masked_decay")),
        lambda: f"late on weights {_spread(bands.late('masked_decay_weights'))}; on gradients "
                f"{_spread(bands.late('masked_decay'))}"))
    return out


def verdict_lines(claims: list[dict], width: int | None = None) -> str:
    """The verdicts as text: [HOLDS] / [FAILS] / [NOT JUDGED] claim, rule and evidence; with ``width``,
    each wrapped to that many characters (a continued line indented under its own)."""
    if width is not None and not (isinstance(width, int) and width >= 40):
        raise ValueError(f"width must be None or an integer >= 40, got {width!r}")
    lines = []
    for c in claims:
        tag = {True: "HOLDS", False: "FAILS", None: "NOT JUDGED"}[c["holds"]]
        lines += [f"[{tag}] {c['claim']}", f"    rule: {c['rule']}", f"    {c['evidence']}"]
    if width is None:
        return "\n".join(lines)
    import textwrap

    indent = lambda line: " " * (len(line) - len(line.lstrip()) + 4)  # noqa: E731
    return "\n".join(textwrap.fill(line, width, subsequent_indent=indent(line), break_on_hyphens=False)
                     for line in lines)


RECORDED = "flip_bands_cpu"  # results/flip_bands_cpu.json, written by `sparsity-lab demo --seeds 5 --record ...`


def judged_or_recorded(bands: FlipBands, recorded: str = RECORDED) -> tuple[FlipBands, list[dict], str]:
    """The run whose verdicts can be read: ``bands`` itself when it is large enough to judge, else the
    recorded full-size run from results/ (read with its provenance). Returns (bands, verdicts, source)."""
    if len(bands.seeds) >= MIN_SEEDS and bands.steps >= MIN_STEPS:
        return bands, judge_flip_bands(bands), f"this live run ({len(bands.seeds)} seeds x {bands.steps} steps)"
    from ..provenance import read_result
    stored = read_result(recorded)
    shown = FlipBands.from_dict(stored["flip_bands"])
    p = stored["provenance"]
    command = p["command"].split("__main__.py ")[-1]
    return shown, judge_flip_bands(shown), (f"the recorded run results/{recorded}.json ({len(shown.seeds)} seeds x "
                                            f"{shown.steps} steps; {p['date'][:10]}, `sparsity-lab {command}`)")
