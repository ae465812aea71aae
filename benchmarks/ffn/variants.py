"""The FFN variants of ``python -m benchmarks ffn``: dense, ours (``sparsify`` with a method per variant) and PyTorch's
semi-structured path, all built from the same initial weights, and the training step each runs."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.ffn.schema import LIBRARY_ROLES, NEVER, OURS, REFRESH
from benchmarks.ffn.settings import Settings


# --- the FFN variants ----------------------------------------------------------------------------------
class FFN(nn.Module):
    """y = W2 gelu(W1 x): up W1 (ffn, d), down W2 (d, ffn), no bias. x (tokens, d) -> y (tokens, d)."""

    def __init__(self, d: int, ffn: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.up = nn.Linear(d, ffn, bias=False, device=device, dtype=dtype)
        self.act = nn.GELU()
        self.down = nn.Linear(ffn, d, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class SemiStructuredFFN(nn.Module):
    """PyTorch's own 2:4 path: W1, W2 masked row-wise 2:4 by magnitude, ``to_sparse_semi_structured``
    once (weights fixed), ``F.linear`` on them. ``reference`` runs the same masked weights dense."""

    def __init__(self, base: FFN) -> None:
        from torch.sparse import to_sparse_semi_structured

        from sparsity_lab.masks.nm import nm_mask
        super().__init__()
        self.masked = [lin.weight.detach() * nm_mask(lin.weight.detach(), 2, 4, dim=1, check=False)
                       for lin in (base.up, base.down)]
        self.sparse = [to_sparse_semi_structured(w) for w in self.masked]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.gelu(F.linear(x, self.sparse[0])), self.sparse[1])

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.gelu(F.linear(x, self.masked[0])), self.masked[1])


def method_for(variant: str, s: Settings):
    """The SparsityMethod of one of our variants, on the backend the settings give its role."""
    import sparsity_lab as sl

    cslt, auto = s.backends["cusparselt"], s.backends["cusparselt_auto"]
    if variant == "ours_fixed_mask":
        return sl.STE(transposable=True, backend=cslt, mask_refresh_interval=NEVER)
    if variant == "ours_mask_every_step":
        return sl.STE(transposable=True, backend=cslt)
    if variant == "ours_mvue":
        return sl.SSTE(mvue=True, transposable=True, backend=cslt)
    if variant == "cutlass_mvue":  # ours_mvue, the products on CUTLASS
        return sl.SSTE(mvue=True, transposable=True, backend=s.backends["cutlass"])
    if variant in REFRESH:
        return sl.SSTE(mvue=True, transposable=True, backend=cslt, mask_refresh_interval=REFRESH[variant])
    if variant == "auto":
        return sl.SSTE(mvue=True, transposable=True, backend=auto)
    if variant == "sparse_auto":  # auto across libraries (cuSPARSELt, CUTLASS)
        return sl.SSTE(mvue=True, transposable=True, backend=s.backends["sparse_auto"])
    if variant == "auto_refresh10":
        return sl.SSTE(mvue=True, transposable=True, backend=auto, mask_refresh_interval=REFRESH[variant])
    if variant == "ours_mvue_dense_products":
        return sl.SSTE(mvue=True, transposable=True, backend=s.backends["dense_products"])
    raise ValueError(f"variant must be one of {OURS}, got {variant!r}")


def backend_unavailable(name: str) -> str | None:
    """Why backend ``name`` cannot run here (a CUTLASS backend without a Hopper GPU, nvcc or the headers, or
    whose build failed: its ``CutlassUnavailable`` message), else None. Asking builds the CUTLASS library
    once (cached on disk), so a benchmark asks before it starts timing."""
    from sparsity_lab.backends import get_backend
    from sparsity_lab.backends.cutlass.build import CutlassUnavailable

    try:
        get_backend(name)
    except CutlassUnavailable as err:
        return str(err)
    return None


def unavailable_variants(s: Settings) -> dict[str, str]:
    """{variant: why it cannot run here} for the variants of ``LIBRARY_ROLES`` whose library is missing."""
    found = {}
    for variant, role in LIBRARY_ROLES.items():
        reason = backend_unavailable(s.backends[role])
        if reason is not None:
            found[variant] = reason
    return found


def build_ffn(variant: str, d: int, s: Settings) -> nn.Module:
    """The FFN of ``variant``, same initial weights for every variant (same seed)."""
    import sparsity_lab as sl

    torch.manual_seed(0)
    model = FFN(d, 4 * d, s.device, s.dtype)
    if variant == "dense":
        return model
    if variant == "pytorch_semi_structured":
        return SemiStructuredFFN(model)
    sl.sparsify(model, method_for(variant, s), select=["up", "down"])
    # attached only to mark the layers as driven by a training loop; the step counters are advanced
    # by advance_step(model) in the timed step (the optimizer itself never steps here)
    sl.attach_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.0))
    return model


def sparse_backend(model: nn.Module):
    from sparsity_lab.training_hooks import sparse_layers

    layers = sparse_layers(model)
    return layers[0][1].backend if layers else None


def train_step(model: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> Callable[[], None]:
    """One training step of the FFN: grads cleared, forward, backward (dx and the weights' grads),
    then, for 2:4 layers, ``advance_step`` (what the optimizer's post-hook does)."""
    from sparsity_lab.training_hooks import advance_step, sparse_layers

    params = [p for p in model.parameters() if p.requires_grad]
    sparse = bool(sparse_layers(model))

    def step() -> None:
        for p in params:
            p.grad = None
        x.grad = None
        model(x).backward(dy)
        if sparse:
            advance_step(model)
    return step
