"""The reference backend: plain PyTorch, CPU or GPU. The ground truth for every faster backend."""
from __future__ import annotations

import torch

from ..masks.nm import nm_mask
from ..masks.transposable import transposable_mask
from ..methods.mvue import mvue24
from ..methods.soft_threshold import soft_threshold
from .base import Backend, MvueSeed, is_device_seed
from .report import BackendReport


def generator_on(device: torch.device, generator: MvueSeed | None) -> torch.Generator | None:
    """``generator`` if it lives on ``device``; else a generator there seeded by one draw from it
    (a CPU draw: no host-device sync). Reproducible for a seeded generator. A device seed tensor is
    refused: these draws happen on the host (backends that read a seed on the device run kernels)."""
    if is_device_seed(generator):
        raise TypeError("this MVUE draw runs on the host and needs a torch.Generator; a device seed tensor "
                        "(CUDA-graph mode) is only for backends with reads_seed_from_device")
    if generator is None or generator.device == device:
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
    return torch.Generator(device=device).manual_seed(seed)


class TorchBackend(Backend, BackendReport):
    """The reference: plain PyTorch products of the masked weight, and the reference activation
    products of ``Backend``'s defaults (``references.act24``). token_feature_multiple: as
    ``Backend.token_feature_multiple`` (64 reproduces the cuSPARSELt backend's choice of dense features,
    to compare the two)."""

    name = "torch"

    def __init__(self, token_feature_multiple: int = 1) -> None:
        if isinstance(token_feature_multiple, bool) or not isinstance(token_feature_multiple, int) \
                or token_feature_multiple < 1:
            raise ValueError(f"token_feature_multiple must be an int >= 1, got {token_feature_multiple!r}")
        self.token_feature_multiple = token_feature_multiple

    def mask(self, weight, n, m, transposable):
        if transposable:
            return transposable_mask(weight, n, m, solver="auto", check=False)
        return nm_mask(weight, n, m, dim=1, check=False)

    def sparse_weight(self, weight, mask, beta, n, m):
        if beta is None:
            return weight * mask
        return beta.to(weight.dtype) * soft_threshold(weight, mask, n, m, check=False)

    def prepare(self, sparse_weight):
        return sparse_weight  # the dense tensor with zeros is the operand

    def linear(self, x, operand, bias):
        return torch.nn.functional.linear(x, operand, bias)

    def grad_input(self, grad_out, operand):
        return grad_out @ operand

    def grad_weight(self, grad_out, x, mvue, seed):
        if mvue:
            tokens = grad_out.shape[0]
            pad = (-tokens) % 4
            if pad:  # zero rows change nothing: an all-zero group stays zero, others stay unbiased
                grad_out = torch.nn.functional.pad(grad_out, (0, 0, 0, pad))
                x = torch.nn.functional.pad(x, (0, 0, 0, pad))
            grad_out = mvue24(grad_out, dim=0, generator=generator_on(grad_out.device, seed), check=False)
        return grad_out.t() @ x

    def masked_decay_(self, grad, weight, mask, decay):
        grad.add_(weight.detach() * (~mask), alpha=decay)
