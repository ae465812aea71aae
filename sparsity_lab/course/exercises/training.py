"""Exercises on 2:4 training dynamics (notebooks 3, 4 and 9): the flip rate, SR-STE's backward term,
masked decay on gradients against masked decay on weights in one AdamW step, the dense fine-tune
switch, and reading a multi-seed run.

Every check runs your function on fresh random inputs and hand-made edge cases and compares it with
the library (``sparsity_lab``'s layers, hooks and ``torch.optim.AdamW`` where an optimizer is involved).
"""
from __future__ import annotations

import math
import statistics

import torch

from ...methods.flip_rate import flip_rate, overall_flip_rate
from .checking import ExerciseReport, run_check

BETAS, EPS = (0.9, 0.999), 1e-8


def adamw_step(w: torch.Tensor, g: torch.Tensor, lr: float, state: dict) -> torch.Tensor:
    """One Adam step (Kingma and Ba 2015, https://arxiv.org/abs/1412.6980) without weight decay, the
    update AdamW makes when its weight_decay is 0; ``state`` ({"step", "exp_avg", "exp_avg_sq"}, start
    with ``new_adam_state(w)``) is updated in place. Returns the new W:

        m_t = b1 m_{t-1} + (1 - b1) g,   v_t = b2 v_{t-1} + (1 - b2) g^2,
        W  <- W - lr * (m_t / (1 - b1^t)) / (sqrt(v_t / (1 - b2^t)) + eps)
    """
    b1, b2 = BETAS
    state["step"] += 1
    t = state["step"]
    state["exp_avg"] = b1 * state["exp_avg"] + (1 - b1) * g
    state["exp_avg_sq"] = b2 * state["exp_avg_sq"] + (1 - b2) * g * g
    m_hat = state["exp_avg"] / (1 - b1 ** t)
    v_hat = state["exp_avg_sq"] / (1 - b2 ** t)
    return w - lr * m_hat / (v_hat.sqrt() + EPS)


def new_adam_state(w: torch.Tensor) -> dict:
    """Adam's state before its first step: step 0, both moments zero."""
    return {"step": 0, "exp_avg": torch.zeros_like(w), "exp_avg_sq": torch.zeros_like(w)}


def _masks(gen: torch.Generator, shape=(8, 16)) -> tuple[torch.Tensor, torch.Tensor]:
    from ...masks import nm_mask
    w = torch.randn(shape, generator=gen)
    return nm_mask(w), nm_mask(w + 0.5 * torch.randn(shape, generator=gen))


# --- notebook 3 ---------------------------------------------------------------------------------------
def check_flip_rate(fn, show: bool = True, hint: bool = False):
    """fn(previous, current) -> float: the fraction of entries that differ between two boolean masks,
    r = ||m_t XOR m_{t-1}||_1 / D."""
    report = ExerciseReport("flip_rate: the fraction of mask entries that changed",
                            hint="count the entries where the two masks differ (XOR) and divide by the number of "
                                 "entries D of the mask, not by the number of kept entries",
                            solution="training")

    def body(r):
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
        cases = [("two random 2:4 masks", *_masks(gen)), ("identical masks", *[_masks(gen)[0]] * 2)]
        a = _masks(gen, (4, 8))[0]
        cases.append(("a mask and its complement", a, ~a))
        cases.append(("an odd shape (3, 12)", *_masks(gen, (3, 12))))
        for what, prev, cur in cases:
            got = r.call(fn, prev.clone(), cur.clone(), what=f"flip_rate on {what}")
            if got is None:
                return
            want = flip_rate(prev, cur)
            value = float(got) if isinstance(got, (int, float, torch.Tensor)) and torch.as_tensor(got).numel() == 1 else None
            if not r.expect(value is not None, f"{what}: expected one number, got {type(got).__name__}"):
                return
            if not math.isclose(value, want, rel_tol=1e-6, abs_tol=1e-9):
                kept = int(prev.sum())
                extra = ""
                if math.isclose(value, want * prev.numel() / max(kept, 1), rel_tol=1e-6):
                    extra = " (that is the count divided by the kept entries; divide by all D entries)"
                elif math.isclose(value, want / 2, rel_tol=1e-6, abs_tol=1e-9):
                    extra = " (half the right value: count entries that left the mask AND entries that joined it)"
                r.expect(False, f"{what}: got {value:.6g}, expected {want:.6g}{extra}")
                return
    return run_check(report, body, show, hint)


def check_overall_flip_rate(fn, show: bool = True, hint: bool = False):
    """fn(pairs) -> float for pairs = [(previous_mask, current_mask), ...], one pair per layer: the flip
    rate over all layers together, sum of flips / sum of sizes (a big layer counts more than a small one)."""
    report = ExerciseReport("overall_flip_rate: the flip rate of several layers together",
                            hint="add up the flips of every layer and divide by the total number of entries; "
                                 "the mean of the per-layer rates weighs a small layer like a big one",
                            solution="training")

    def body(r):
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
        for shapes in ([(8, 16), (4, 4)], [(16, 32)], [(2, 8), (12, 8), (4, 4)]):
            pairs = [_masks(gen, s) for s in shapes]
            want = overall_flip_rate([(int((p ^ c).sum()), p.numel()) for p, c in pairs])
            got = r.call(fn, [(p.clone(), c.clone()) for p, c in pairs], what=f"overall flip rate of shapes {shapes}")
            if got is None:
                return
            value = float(got)
            if not math.isclose(value, want, rel_tol=1e-6, abs_tol=1e-9):
                mean_of_rates = sum(flip_rate(p, c) for p, c in pairs) / len(pairs)
                extra = " (that is the mean of the per-layer rates)" if math.isclose(value, mean_of_rates, rel_tol=1e-6) else ""
                r.expect(False, f"layers of shapes {shapes}: got {value:.6g}, expected {want:.6g}{extra}")
                return
    return run_check(report, body, show, hint)


def check_srste_gradient(fn, show: bool = True, hint: bool = False):
    """fn(grad, weight, mask, decay) -> the gradient SR-STE hands to the optimizer,
    grad + decay * (1 - m) * W (Zhou et al. 2021): the pruned weights get a pull towards zero."""
    report = ExerciseReport("srste_gradient: SR-STE's backward term",
                            hint="add decay * W only where the mask is False (the pruned weights); the kept "
                                 "weights' gradient is unchanged",
                            solution="training")

    def body(r):
        from ...layers import SparseLinear
        from ...methods.config import SRSTE
        torch.manual_seed(int(torch.randint(0, 2**31, (1,))))
        for decay, (out_f, in_f) in ((0.1, (8, 16)), (2e-4, (4, 12)), (0.0, (4, 8))):
            layer = SparseLinear(in_f, out_f, bias=False, method=SRSTE(decay=decay))
            x = torch.randn(5, in_f)
            layer.attached_optimizer = True  # no optimizer in this check: silence the layer's reminder
            layer(x).pow(2).sum().backward()  # the library's SR-STE gradient
            want = layer.weight.grad.clone()
            plain = want - decay * layer.weight.detach() * ~layer.mask  # the straight-through gradient alone
            got = r.call(fn, plain.clone(), layer.weight.detach().clone(), layer.mask.clone(), decay,
                         what=f"srste_gradient(decay={decay:g})")
            if got is None:
                return
            if isinstance(got, torch.Tensor) and got.shape == want.shape and decay:
                on_kept = plain + decay * layer.weight.detach() * layer.mask
                if torch.allclose(got, on_kept, atol=1e-6):
                    r.expect(False, "you decayed the kept weights: (1 - m) selects the pruned ones (mask False)")
                    return
                if torch.allclose(got, plain - decay * layer.weight.detach() * ~layer.mask, atol=1e-6):
                    r.expect(False, "the term has the wrong sign: it is added to the gradient, so the "
                                    "update W - lr * grad pulls pruned weights towards zero")
                    return
            if not r.expect_tensor(got, want, f"srste_gradient(decay={decay:g})", atol=1e-6, rtol=1e-5):
                return
    return run_check(report, body, show, hint)


# --- notebook 4 ---------------------------------------------------------------------------------------
def _library_steps(method_name: str, w0, grads, mask, decay, lr) -> torch.Tensor:
    """W after len(grads) steps of torch.optim.AdamW (weight_decay 0) on a SparseLinear with the
    library's method and hooks, the gradients set by hand."""
    from ...layers import SparseLinear
    from ...methods.config import method_from_name
    from ...training_hooks import attach_optimizer
    options = {} if method_name == "ste" else {"decay": decay, "dense_finetune_at": None}
    layer = SparseLinear(w0.shape[1], w0.shape[0], bias=False, dtype=torch.float64,
                         method=method_from_name(method_name, **options))
    with torch.no_grad():
        layer.weight.copy_(w0)
        layer.mask.copy_(mask)
    opt = torch.optim.AdamW(layer.parameters(), lr=lr, betas=BETAS, eps=EPS, weight_decay=0.0)
    attach_optimizer(layer, opt)
    for g in grads:
        layer.weight.grad = g.clone()
        opt.step()
    return layer.weight.detach().clone()


def _check_decay_step(fn, method_name: str, title: str, hint_text: str, show: bool, hint: bool):
    report = ExerciseReport(title, hint=hint_text, solution="training")
    other = "masked_decay_weights" if method_name == "masked_decay" else "masked_decay"

    def body(r):
        from ...masks import nm_mask
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
        for decay, lr, shape, scale in ((0.05, 1e-2, (8, 16), 1e-3), (1.0, 1e-3, (4, 8), 1.0), (0.0, 1e-2, (4, 4), 1.0)):
            w0 = torch.randn(shape, generator=gen, dtype=torch.float64)
            mask = nm_mask(w0)
            grads = [scale * torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3)]
            want = _library_steps(method_name, w0, grads, mask, decay, lr)
            w, state = w0.clone(), new_adam_state(w0)
            for step, g in enumerate(grads, 1):
                w = r.call(fn, w.clone(), g.clone(), mask.clone(), decay, lr, state,
                           what=f"your step {step} (decay={decay:g}, lr={lr:g})")
                if w is None:
                    return
                if not isinstance(w, torch.Tensor) or w.shape != w0.shape:
                    r.expect_tensor(w, want, "the weight your step returns")
                    return
            if not torch.allclose(w, want, rtol=1e-6, atol=1e-9) and decay:
                if torch.allclose(w, _library_steps(other, w0, grads, mask, decay, lr), rtol=1e-6, atol=1e-9):
                    where = "on the weights after the step" if method_name == "masked_decay" else \
                        "to the gradient, so AdamW normalised it"
                    r.expect(False, f"after 3 steps (decay={decay:g}, lr={lr:g}) your weights match the term "
                                    f"applied {where}: this exercise is the other placement")
                    return
                if torch.allclose(w, _library_steps("ste", w0, grads, mask, decay, lr), rtol=1e-6, atol=1e-9):
                    r.expect(False, f"after 3 steps (decay={decay:g}) your weights match plain AdamW: the decay "
                                    "term is missing")
                    return
            if not r.expect_tensor(w, want, f"W after 3 steps (decay={decay:g}, lr={lr:g}) vs the library's "
                                            f"{method_name}", rtol=1e-6, atol=1e-9):
                return
    return run_check(report, body, show, hint)


def check_adamw_on_gradients(fn, show: bool = True, hint: bool = False):
    """fn(w, g, mask, decay, lr, state) -> new w: one AdamW step (weight_decay 0, betas (0.9, 0.999),
    eps 1e-8; ``adamw_step`` does it) with masked decay ON THE GRADIENTS: the term
    decay * (1 - m) * W joins g before AdamW reads it (Hu et al. 2024). Three steps in a row are compared
    with ``MaskedDecay`` on a SparseLinear under ``torch.optim.AdamW``."""
    return _check_decay_step(fn, "masked_decay", "adamw_on_gradients: masked decay on gradients, one AdamW step",
                             "the term joins the gradient before AdamW reads it, so it goes through both moments",
                             show, hint)


def check_adamw_on_weights(fn, show: bool = True, hint: bool = False):
    """fn(w, g, mask, decay, lr, state) -> new w: one AdamW step with the plain gradient, then masked
    decay ON THE WEIGHTS, W <- W - lr * decay * (1 - m) * W (decoupled: AdamW never sees the term).
    Compared with ``MaskedDecayOnWeights`` under ``torch.optim.AdamW``."""
    return _check_decay_step(fn, "masked_decay_weights",
                             "adamw_on_weights: masked decay on weights, one AdamW step",
                             "AdamW steps with the plain gradient; then the term acts on the stepped weights, "
                             "scaled by the learning rate", show, hint)


def check_dense_finetune_switch(fn, show: bool = True, hint: bool = False):
    """fn(total_steps, dense_finetune_at) -> the first optimizer step (0-based) that trains dense W:
    round(dense_finetune_at * total_steps), as ``MaskedDecay(total_steps=...).dense_finetune_step``."""
    report = ExerciseReport("dense_finetune_switch: the first dense step",
                            hint="steps are counted from 0; the switch is the nearest integer to the fraction "
                                 "times the planned steps",
                            solution="training")

    def body(r):
        from ...methods.config import MaskedDecay
        for total, at in ((6, 5 / 6), (1000, 5 / 6), (360, 5 / 6), (7, 0.5), (10, 1.0), (11, 5 / 6)):
            want = MaskedDecay(total_steps=total, dense_finetune_at=at).dense_finetune_step
            got = r.call(fn, total, at, what=f"dense_finetune_switch({total}, {at:.4g})")
            if got is None:
                return
            if not r.expect(isinstance(got, int) and not isinstance(got, bool) and got == want,
                            f"dense_finetune_switch({total}, {at:.4g}): got {got!r}, expected {want}"):
                return
    return run_check(report, body, show, hint)


# --- notebook 9 ---------------------------------------------------------------------------------------
def check_flip_trend(fn, show: bool = True, hint: bool = False):
    """fn(flip_rates, steps) -> late / early: flip_rates[i] is the flip rate at step i + 1 (None where no
    mask was computed); early = mean over steps in (0.10 T, 0.20 T], late = mean over (0.70 T, 0.80 T],
    T = steps (the windows of ``sparsity-lab compare``)."""
    report = ExerciseReport("flip_trend: late over early mean flip rate",
                            hint="select steps s (1-based) with lo * T < s <= hi * T, skip None, average, divide",
                            solution="training")

    def body(r):
        from ...lab.compare import run_metrics
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
        for steps, holes in ((100, False), (37, True), (300, True)):
            rates = [float(v) for v in torch.rand(steps, generator=gen) * 0.01]
            if holes:
                rates = [None if i % 3 == 1 else v for i, v in enumerate(rates)]
            rows = [{"step": i + 1, "flip_rate": v, "val_loss": None, "loss": 1.0, "tokens": i + 1,
                     "tokens_per_s": 1.0} for i, v in enumerate(rates)]
            want = run_metrics(rows, steps, switch_step=steps)["flip_trend"]
            got = r.call(fn, list(rates), steps, what=f"flip_trend over {steps} steps")
            if got is None:
                return
            if not r.expect(math.isclose(float(got), want, rel_tol=1e-9),
                            f"{steps} steps{' with None holes' if holes else ''}: got {float(got):.6g}, expected "
                            f"{want:.6g} (check the window edges: (0.1 T, 0.2 T] and (0.7 T, 0.8 T], steps from 1)"):
                return
    return run_check(report, body, show, hint)


def check_seed_band(fn, show: bool = True, hint: bool = False):
    """fn(runs) -> (mean, lo, hi), three lists with one value per step: runs[s][t] is seed s's flip rate
    at step t; mean over the seeds, lo / hi = mean -/+ the sample standard deviation (n - 1), as
    ``FlipBands.band``."""
    report = ExerciseReport("seed_band: mean and one standard deviation per step",
                            hint="go column by column (one step, every seed); statistics.stdev uses n - 1",
                            solution="training")

    def body(r):
        from ...lab.flip_bands import FlipBands
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
        for seeds, steps in ((5, 12), (3, 7), (2, 4)):
            runs = (torch.rand(seeds, steps, generator=gen) * 0.02).tolist()
            band = FlipBands(seeds=list(range(seeds)), steps=steps, lr=1.0, methods={"x": "x"},
                             rates={"x": runs}, losses={"x": runs}).band("x")
            got = r.call(fn, [list(row) for row in runs], what=f"seed_band of {seeds} seeds x {steps} steps")
            if got is None:
                return
            if not r.expect(isinstance(got, (tuple, list)) and len(got) == 3,
                            f"expected (mean, lo, hi), got {type(got).__name__}"):
                return
            for name, values in zip(("mean", "lo", "hi"), got):
                values = torch.as_tensor([float(v) for v in values], dtype=torch.float64)
                if name != "mean" and values.shape == (steps,):
                    pop = [statistics.fmean(c) + (1 if name == "hi" else -1) * statistics.pstdev(c)
                           for c in zip(*runs)]
                    if torch.allclose(values, torch.tensor(pop, dtype=torch.float64), rtol=1e-6):
                        r.expect(False, f"{name}: you used the population standard deviation (n); the band uses "
                                        "the sample one (n - 1)")
                        return
                if not r.expect_tensor(values, torch.tensor(band[name], dtype=torch.float64), name, rtol=1e-6,
                                       atol=1e-12):
                    return
    return run_check(report, body, show, hint)


def check_bands_separated(fn, show: bool = True, hint: bool = False):
    """fn(higher, lower) -> bool: the verdict rule of the multi-seed runs, True when every seed's value in
    ``higher`` is above every seed's value in ``lower`` (min(higher) > max(lower))."""
    report = ExerciseReport("bands_separated: the verdict rule over seeds",
                            hint="compare the lowest seed of one method with the highest seed of the other; "
                                 "comparing the means ignores the spread",
                            solution="training")

    def body(r):
        cases = [([3.0, 3.1, 2.9], [1.0, 1.2, 0.9], True), ([3.0, 1.1, 2.9], [1.0, 1.2, 0.9], False),
                 ([2.0, 2.0], [2.0, 1.0], False), ([5.0], [4.9], True), ([1.0, 1.0, 1.0], [2.0, 0.1, 0.1], False)]
        for higher, lower, want in cases:
            got = r.call(fn, list(higher), list(lower), what=f"bands_separated({higher}, {lower})")
            if got is None:
                return
            if not r.expect(got in (True, False) and bool(got) == want,
                            f"bands_separated({higher}, {lower}): got {got!r}, expected {want}"
                            + (" (the means differ, but the seeds overlap)"
                               if not want and statistics.fmean(higher) > statistics.fmean(lower) else "")):
                return
    return run_check(report, body, show, hint)
