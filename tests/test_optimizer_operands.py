"""A 2:4 layer's next operands written by the optimizer's step (kernel 26, ``sparsity_lab.optimizer_operands``): a
run with them trains exactly as the run whose forwards write them (kernel 11), and they are asked for only where
the next forward serves them. CPU: the cuSPARSELt backend on a stand-in library, the kernels in the interpreter."""
import dataclasses
import io

import pytest
import torch
from torch import nn

import sparsity_lab as sl
from sparsity_lab.backends.cusparselt.backend import CusparseltBackend
from sparsity_lab.lab.master_weights import lower_linear_weights
from sparsity_lab.optimizer_operands import operand_request, put_optimizer_operand
from test_cusparselt_backend import FakeCusparselt, registry  # noqa: F401  (registry: a fixture)

pytestmark = pytest.mark.triton
HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


@pytest.fixture
def on_interpreter(monkeypatch, registry):  # noqa: F811
    """The Triton kernels take CPU tensors (interpreter); a backend per run name on the stand-in library."""
    from sparsity_lab.backends.cusparselt import operand

    monkeypatch.setattr(operand, "_triton_device", lambda t: True)
    backends = {}
    for name in ("with", "apart"):
        backends[name] = CusparseltBackend(ops=FakeCusparselt())
        registry.register_backend(f"cusparselt_{name}", lambda b=backends[name]: b)
    return backends


def _run(method, name: str, write_operands: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 64, bias=False), nn.ReLU(), nn.Linear(64, 128, bias=False))
    sl.sparsify(model, dataclasses.replace(method, backend=f"cusparselt_{name}"), select="all")
    opt = lower_linear_weights(model, torch.optim.AdamW, fused_update=True, write_operands=write_operands, **HYPER)
    sl.attach_optimizer(model, opt)
    return model, opt


def _batches(n):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 128, generator=gen).to(torch.bfloat16), torch.randn(32, 128, generator=gen).to(
        torch.bfloat16)) for _ in range(n)]


def _step(model, opt, x, dz):
    out = model(x)
    out.backward(dz)  # a fixed dZ: MVUE then draws alike whatever the last bit of the output
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.detach()


@pytest.mark.parametrize("method", [sl.SSTE(mvue=True, transposable=True, mask_refresh_interval=3),
                                    sl.MaskedDecay(decay=0.3, total_steps=20, transposable=True,
                                                   mask_refresh_interval=2)])
def test_trains_exactly_as_the_forwards_writing_them_and_resumes(on_interpreter, method):
    (fused, fused_opt), (apart, apart_opt) = _run(method, "with", True), _run(method, "apart", False)
    batches = _batches(8)
    for i, (x, dz) in enumerate(batches[:6]):
        assert torch.equal(_step(fused, fused_opt, x, dz), _step(apart, apart_opt, x, dz)), i
        for a, b in zip(fused.parameters(), apart.parameters()):
            assert torch.equal(a, b), i
        for a, b in zip((fused[0], fused[2]), (apart[0], apart[2])):
            assert torch.equal(a.mask, b.mask) and a.counters() == b.counters(), i
    w, s = on_interpreter["with"].stats, on_interpreter["apart"].stats
    interval = method.mask_refresh_interval
    # the steps after which the mask is kept: the optimizer wrote both layers' operands; their forwards wrote none
    kept = sum(1 for step in range(1, 6) if step % interval)
    assert w["optimizer_prepares"] == 2 * kept and s["optimizer_prepares"] == 0
    assert w["fused_prepares"] + w["optimizer_prepares"] == s["fused_prepares"]
    assert w["compressions"] == s["compressions"]
    # through a checkpoint's bytes: a live optimizer's state_dict holds its own moment tensors, which a
    # load_state_dict would share (PyTorch's behaviour), so both runs would then step the same moments
    buffer = io.BytesIO()
    torch.save({"model": fused.state_dict(), "opt": fused_opt.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)
    saved, saved_opt = checkpoint["model"], checkpoint["opt"]
    resumed, resumed_opt = _run(method, "with", True)
    resumed.load_state_dict(saved)
    resumed_opt.load_state_dict(saved_opt)
    for x, dz in batches[6:]:
        assert torch.equal(_step(resumed, resumed_opt, x, dz), _step(fused, fused_opt, x, dz))
    for a, b in zip(resumed.parameters(), fused.parameters()):
        assert torch.equal(a, b)


def test_asked_for_only_where_the_next_forward_serves_it(on_interpreter):
    every_step, _ = _run(sl.SSTE(mvue=True, transposable=True), "with", True)
    model, opt = _run(sl.SSTE(mvue=True, transposable=True, mask_refresh_interval=4), "apart", True)
    x, dz = _batches(1)[0]
    for m in (every_step, model):
        m(x).backward(dz)
    assert operand_request(every_step[0]) is None  # its mask is due at the next forward
    layer = model[0]
    mask, beta = operand_request(layer)
    assert mask is layer.mask and torch.equal(beta, layer.beta)
    layer.operand_in_graph = True  # a CUDA graph prepares it inside the captured step
    assert operand_request(layer) is None
    layer.operand_in_graph = False
    layer.operand_cache.last_request = (torch.float16, True)  # the products ran in another dtype
    assert operand_request(layer) is None
    layer.operand_cache.last_request = (torch.bfloat16, True)
    layer.weight.grad = None
    assert operand_request(layer) is None
    layer.mask_step -= 4  # a stale operand is dropped, not served: the mask is due now
    assert not put_optimizer_operand(layer, (None, None))


def test_bad_settings_name_the_argument(on_interpreter):
    model = nn.Sequential(nn.Linear(64, 64, bias=False))
    with pytest.raises(ValueError, match="write_operands must be True or False"):
        lower_linear_weights(model, torch.optim.AdamW, fused_update=True, write_operands=1, **HYPER)
    model, opt = _run(sl.SSTE(transposable=True, mask_refresh_interval=2), "with", False)
    assert not opt.takes_operand(model[0].weight)
    with pytest.raises(ValueError, match="defer_operand: param is not a lowered weight"):
        opt.defer_operand(model[0].weight, model[0].mask, None)


@pytest.mark.gpu
def test_on_gpu_the_served_operand_is_kernel_11s_of_the_weight_and_training_follows():
    """cuSPARSELt on the GPU: after each step that keeps the mask, the operand the forward is served is bit for bit
    kernel 11's of the bf16 weight the step wrote, and 6 steps follow the run whose forwards write it (the masters
    may differ in the last float32 bits: the two kernels' multiply-adds may contract differently)."""
    from sparsity_lab.kernels import prepare24

    method = sl.SSTE(mvue=True, transposable=True, mask_refresh_interval=3, backend="cusparselt")

    def run(write_operands):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 512, bias=False), nn.ReLU(), nn.Linear(512, 256, bias=False)).cuda()
        sl.sparsify(model, method, select="all")
        opt = lower_linear_weights(model, torch.optim.AdamW, write_operands=write_operands, **HYPER)
        sl.attach_optimizer(model, opt)
        return model, opt

    (model, opt), (apart, apart_opt) = run(True), run(False)
    assert opt.fused_update and opt.takes_operand(model[0].weight)
    gen = torch.Generator(device="cuda").manual_seed(1)
    served = 0
    for step in range(6):
        x = torch.randn(64, 256, device="cuda", generator=gen).to(torch.bfloat16)
        dz = torch.randn(64, 256, device="cuda", generator=gen).to(torch.bfloat16)
        outs = [_step(m, o, x, dz) for m, o in ((model, opt), (apart, apart_opt))]
        torch.testing.assert_close(outs[0].float(), outs[1].float(), rtol=2e-2, atol=2e-2)
        for layer in (model[0], model[2]):
            operand = layer.operand_cache.value
            if operand is not None and layer.operand_cache.entry[0] == layer.operand_cache._key(layer, torch.bfloat16):
                fwd, bwd = prepare24(layer.weight.detach(), layer.mask, layer.beta, out_dtype=torch.bfloat16)
                assert torch.equal(operand.compressed.view(torch.uint8), fwd.view(torch.uint8)), step
                assert torch.equal(operand.compressed_t.view(torch.uint8), bwd.view(torch.uint8)), step
                served += 1
    assert served > 0 and model[0].backend.stats["optimizer_prepares"] > 0
    for a, b in zip(model.parameters(), apart.parameters()):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-3)
