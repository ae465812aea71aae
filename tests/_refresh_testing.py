"""What the tests of the one-pass mask refreshes in training share (kernel 21 on cuSPARSELt, kernel 24 on CUTLASS):
a layer on the fused backend and its twin on the separate calls, trained side by side, compared to the bit."""
import dataclasses

import torch

import sparsity_lab as sl


def _build(method, backend: str):
    torch.manual_seed(0)
    layer = sl.SparseLinear(128, 64, method=dataclasses.replace(method, backend=backend), dtype=torch.bfloat16)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    sl.attach_optimizer(layer, opt)
    return layer, opt


def _step(layer, opt, x, dz):
    out = layer(x)
    out.backward(dz)  # a fixed dZ: MVUE then draws alike whatever the last ulp of the output
    opt.step()
    opt.zero_grad()
    return out.detach()


def assert_trains_exactly_as_the_separate_calls(method, fused_backend: str, separate_backend: str,
                                                after_three_steps=lambda: None) -> None:
    """A 128 -> 64 bf16 layer refreshing its mask every step on ``fused_backend`` and its twin on
    ``separate_backend`` (registered names): over three steps the outputs, masks, flip counts, weights and the
    state dict are the same to the bit, and a run resumed from the fused run's checkpoint continues it exactly.
    ``after_three_steps()`` runs before the resume (the backends' counters are then the three steps')."""
    (fused, fused_opt), (separate, separate_opt) = _build(method, fused_backend), _build(method, separate_backend)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 128, generator=gen, dtype=torch.bfloat16),
                torch.randn(64, 64, generator=gen, dtype=torch.bfloat16)) for _ in range(4)]
    for i, (x, dz) in enumerate(batches[:3]):
        assert torch.equal(_step(fused, fused_opt, x, dz), _step(separate, separate_opt, x, dz)), i
        assert torch.equal(fused.mask, separate.mask) and torch.equal(fused.weight, separate.weight), i
        assert (fused.last_flips, fused.flips_total) == (separate.last_flips, separate.flips_total), i
    assert fused.mask_updates == separate.mask_updates == 3 and fused.flips_total > 0
    after_three_steps()
    saved = fused.state_dict()
    assert saved.keys() == separate.state_dict().keys()
    for key, value in separate.state_dict().items():
        assert torch.equal(saved[key], value), key
    resumed, resumed_opt = _build(method, fused_backend)
    resumed.load_state_dict({k: v.clone() for k, v in saved.items()})
    resumed_opt.load_state_dict(fused_opt.state_dict())
    x, dz = batches[3]
    assert torch.equal(_step(resumed, resumed_opt, x, dz), _step(fused, fused_opt, x, dz))
    assert torch.equal(resumed.mask, fused.mask) and resumed.counters() == fused.counters()
    assert torch.equal(resumed.weight, fused.weight)
