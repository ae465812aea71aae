"""Per-shape choice of cuSPARSELt's FP8 (E4M3) 2:4 algorithm, each candidate checked first.

``FP8SparseProducts`` runs ``A (m, k) @ B (k, n)`` for a compressed 2:4 E4M3 A through the direct
FP8 binding (``fp8_direct``). Per product key (shape and layouts), once, on synthetic operands of
that key: every algorithm id (split-k 1), then split-k 2, 3, 4 (one kernel and two kernels) for the
fastest ids, each checked against the float32 product of the same FP8 values (some ids return wrong
results: https://github.com/pytorch/pytorch/issues/155333) and timed; the fastest correct one is
kept with the whole table (``summary``). Never inside a CUDA-graph capture: the first (eager) step of
each shape chooses.

Where the chosen product scales by a pass after it ("multiply_after"), the search also checks, with the
same algorithm and layout, whether a scalar host alpha scales it ("host_alpha", ``FP8Choice.host_alpha``):
a recipe with host-side scales uses it only where that check passed (``host_alpha_ok``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .ops import AlgConfig

SPLIT_K = ((2, 0), (2, 1), (3, 0), (3, 1), (4, 0), (4, 1))  # (split_k, split_k_mode) tried on the best ids
SPLIT_K_IDS = 3  # how many of the fastest ids get the split-k candidates


@dataclass
class FP8Choice:
    """The algorithm (and, for the weight gradient, the layout) chosen for one product key."""

    config: AlgConfig
    layout: tuple[bool, bool]  # (B passed transposed, result transposed)
    mode: str  # how the scales reach the product (fp8_direct.SCALE_MODES)
    ms: float
    rel_err: float
    tried: list[dict] = field(default_factory=list)
    host_alpha: dict = field(default_factory=dict)  # the host-alpha check: {"rel_err", "ok"} or {"error"}

    @property
    def host_alpha_ok(self) -> bool:
        """True when a scalar host alpha scaled this choice's product correctly (checked by the search)."""
        return bool(self.host_alpha.get("ok"))


class FP8SparseProducts:
    """A (m, k) 2:4 E4M3 compressed times B: per product key, every algorithm id is tried once on
    synthetic operands of that key, checked against the float32 product of the same values
    (some ids return wrong results: pytorch/pytorch#155333) and timed; the fastest correct one is kept.
    Never inside a CUDA-graph capture: the first (eager) step of each shape chooses."""

    max_algorithms = 64
    tolerance = 1e-2  # bfloat16 output: about 2e-3 expected

    def __init__(self, ops=None, compress=None, modes: tuple[str, ...] | None = None) -> None:
        self.modes = modes
        if ops is None:
            from .fp8_direct import FP8DirectOps
            ops = FP8DirectOps()
        if compress is None:
            from ...kernels import compress24 as compress
        self.ops, self.compress = ops, compress
        self.choices: dict[tuple, FP8Choice] = {}

    def _synthetic(self, m, k, n, b_transposed, device):
        gen = torch.Generator(device=device).manual_seed(m * 7 + k * 3 + n)
        a = torch.randn(m, k, device=device, generator=gen)
        keep = torch.rand(m, k // 4, 4, device=device, generator=gen).argsort(-1)[..., :2]
        mask = torch.zeros(m, k // 4, 4, device=device, dtype=torch.bool).scatter_(-1, keep, True).reshape(m, k)
        a = (a * mask * 50).to(torch.float8_e4m3fn)
        b = (torch.randn(n, k, device=device, generator=gen) * 50).to(torch.float8_e4m3fn)
        b_op = b.t() if b_transposed else b.t().contiguous()
        s_a, s_b = torch.rand(2, device=device, generator=gen).unbind() 
        s_a, s_b = s_a + 0.5, s_b + 0.5
        ref = (a.float() @ b.float().t()) * (s_a * s_b)
        return self.compress(a), b_op, (s_a.clone(), s_b.clone()), ref

    def choose(self, m, k, n, layouts, device) -> FP8Choice:
        key = (m, k, n, tuple(layouts))
        found = self.choices.get(key)
        if found is not None:
            return found
        tried, best = [], None
        prev_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            from .fp8_direct import SCALE_MODES
            combos = [(mode, b_t, tr) for mode in self.modes or SCALE_MODES for b_t, tr in layouts]
            for mode, b_t, tr in combos:
                comp, b, (s_a, s_b), ref = self._synthetic(m, k, n, b_t, device)
                ref = ref.t() if tr else ref
                failures = 0
                for alg in range(self.max_algorithms):
                    cfg = AlgConfig(alg)
                    try:
                        out = self.ops.mm(comp, b, s_a, s_b, tr, cfg, mode)
                    except Exception as err:  # an id, a layout or a scale mode this shape does not support
                        tried.append({"alg": alg, "layout": [b_t, tr], "mode": mode,
                                      "error": f"{type(err).__name__}: {err}"[:200]})
                        failures += 1
                        if failures >= 3 or alg == 0:
                            break
                        continue
                    failures = 0
                    rel = float((out.float() - ref).norm() / ref.norm())
                    entry = {"alg": alg, "layout": [b_t, tr], "mode": mode, "rel_err": rel}
                    if rel < self.tolerance:
                        entry["ms"] = self._time(lambda: self.ops.mm(comp, b, s_a, s_b, tr, cfg, mode))
                        if best is None or entry["ms"] < best.ms:
                            best = FP8Choice(cfg, (b_t, tr), mode, entry["ms"], rel)
                    tried.append(entry)
                if best is not None and best.mode == mode:
                    # split-k for the fastest correct ids of this (mode, layout): a split of the k loop
                    # helps when m x n has too few output tiles to fill the GPU
                    fastest = sorted((t for t in tried if "ms" in t and t["mode"] == mode
                                      and t["layout"] == [b_t, tr]), key=lambda t: t["ms"])[:SPLIT_K_IDS]
                    for t in fastest:
                        for split_k, split_mode in SPLIT_K:
                            cfg = AlgConfig(t["alg"], split_k, split_mode)
                            entry = {"alg": t["alg"], "split_k": split_k, "split_k_mode": split_mode,
                                     "layout": [b_t, tr], "mode": mode}
                            try:
                                out = self.ops.mm(comp, b, s_a, s_b, tr, cfg, mode)
                            except Exception as err:
                                entry["error"] = f"{type(err).__name__}: {err}"[:200]
                                tried.append(entry)
                                continue
                            entry["rel_err"] = rel = float((out.float() - ref).norm() / ref.norm())
                            if rel < self.tolerance:
                                entry["ms"] = self._time(lambda: self.ops.mm(comp, b, s_a, s_b, tr, cfg, mode))
                                if entry["ms"] < best.ms:
                                    best = FP8Choice(cfg, (b_t, tr), mode, entry["ms"], rel)
                            tried.append(entry)
                if best is not None:
                    break  # the first (mode, layout) that works is the one used: the lists are in order of preference
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev_tf32
        if best is None:
            raise RuntimeError(f"no cuSPARSELt FP8 algorithm computed A({m}x{k}) @ B({k}x{n}) correctly in layouts "
                               f"{layouts}: {tried[:4]}")
        best.tried = tried
        best.host_alpha = self._check_host_alpha(m, k, n, best, device)
        self.choices[key] = best
        return best

    def _check_host_alpha(self, m, k, n, choice: FP8Choice, device) -> dict:
        """Does the chosen algorithm, with alpha = s_a s_b given as a host float, return the scaled product?
        (Only asked where the scales are not applied inside already: "multiply_after".)"""
        if choice.mode != "multiply_after":
            return {"ok": False, "error": f"not checked: the scales reach the product by {choice.mode!r}"}
        b_t, tr = choice.layout
        comp, b, (s_a, s_b), ref = self._synthetic(m, k, n, b_t, device)
        ref = ref.t() if tr else ref
        alpha = float((s_a * s_b).item())
        try:
            out = self.ops.mm(comp, b, s_a, s_b, tr, choice.config, "host_alpha", alpha=alpha)
        except Exception as err:  # refused: the recipe falls back to the pass (with a warning)
            return {"ok": False, "error": f"{type(err).__name__}: {err}"[:200]}
        rel = float((out.float() - ref).norm() / ref.norm())
        return {"ok": rel < self.tolerance, "rel_err": rel}

    @staticmethod
    def _time(fn, reps: int = 3) -> float:
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        return (time.perf_counter() - t0) * 1e3 / reps

    def mm(self, compressed, b, s_a, s_b, choice: FP8Choice, alpha: float | None = None):
        """The chosen product; with ``alpha`` (s_a s_b as a host float) the scalar alpha scales it inside
        (mode "host_alpha": the caller checks ``choice.host_alpha_ok`` first)."""
        if alpha is not None:
            return self.ops.mm(compressed, b, s_a, s_b, choice.layout[1], choice.config, "host_alpha", alpha=alpha)
        return self.ops.mm(compressed, b, s_a, s_b, choice.layout[1], choice.config, choice.mode)

    def summary(self) -> list[dict]:
        return [{"m": k[0], "k": k[1], "n": k[2], "alg": c.config.alg_id, "split_k": c.config.split_k,
                 "split_k_mode": c.config.split_k_mode, "layout": list(c.layout), "mode": c.mode, "ms": c.ms,
                 "rel_err": c.rel_err, "host_alpha": c.host_alpha, "refused": [t for t in c.tried if "error" in t][:6],
                 "timed": sorted(({kk: t[kk] for kk in ("alg", "split_k", "split_k_mode", "ms") if kk in t}
                                  for t in c.tried if "ms" in t), key=lambda t: t["ms"])[:12],
                 "split_k": self._split_k_summary(c.tried)}
                for k, c in self.choices.items()]

    @staticmethod
    def _split_k_summary(tried: list[dict]) -> dict:
        """How the split-k candidates fared: how many ran correctly, were wrong or raised, and the fastest."""
        split = [t for t in tried if t.get("split_k", 1) != 1]
        timed = sorted((t for t in split if "ms" in t), key=lambda t: t["ms"])
        return {"tried": len(split), "timed": len(timed), "raised": sum("error" in t for t in split),
                "wrong": sum("error" not in t and "ms" not in t for t in split),
                "fastest": {kk: timed[0][kk] for kk in ("alg", "split_k", "split_k_mode", "ms")} if timed else None,
                "first_error": next((t["error"] for t in split if "error" in t), None)}
