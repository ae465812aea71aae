"""``sparsity_lab.activations.relu2``: the squared ReLU that the dense relu2 FFNs run.

On the CPU it must be exactly the old two-pass expression F.relu(h).square() (values and gradients,
bit for bit), so that the lab GPT, the notebooks and every recorded CPU run are unchanged; on CUDA
the fused kernels must give the same bits (``gpu`` tests at the end). The kernel path of the autograd
function is also run on the CPU here, through the Triton interpreter.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from sparsity_lab import activations
from sparsity_lab.activations import Relu2Fn, relu2
from benchmarks.act24_speed import Relu2FFN
from sparsity_lab.lab.model import GPT, MLP, GPTConfig

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _two_pass(h, dy):
    hh = h.detach().clone().requires_grad_(True)
    y = F.relu(hh).square()
    y.backward(dy)
    return y.detach(), hh.grad


def _fused(h, dy, fn=relu2):
    hh = h.detach().clone().requires_grad_(True)
    y = fn(hh)
    y.backward(dy)
    return y.detach(), hh.grad


def _edge_values(dtype, device="cpu"):
    big = torch.finfo(dtype).max
    tiny = torch.finfo(dtype).smallest_normal
    vals = [0.0, -0.0, 1.0, -1.0, big, -big, 0.75 * big, math.sqrt(big), tiny, -tiny, tiny / 4, math.nan, math.inf,
            -math.inf, 0.5, 3.0]
    return torch.tensor(vals, dtype=torch.float64).to(dtype).to(device)


# --- the CPU implementation: exactly the old expression -------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_values_and_gradients_are_the_two_pass_expression_bit_for_bit(dtype):
    gen = torch.Generator().manual_seed(0)
    h = torch.cat([3 * torch.randn(7, 33, generator=gen).reshape(-1), torch.zeros(5)]).to(dtype)
    h = torch.cat([h, _edge_values(dtype)])
    dy = torch.randn(h.shape, generator=gen).to(dtype)
    dy[-5:] = torch.tensor([math.nan, 1.0, math.inf, 0.0, -2.0]).to(dtype)
    y_old, dh_old = _two_pass(h, dy)
    y_new, dh_new = _fused(h, dy)
    assert _same_bits(y_new, y_old) and _same_bits(dh_new, dh_old)


def test_gradcheck_in_float64():
    h = torch.randn(6, 9, dtype=torch.float64)
    h[0, :3] = torch.tensor([0.3, -0.2, 1e-3], dtype=torch.float64)  # near the kink but not on it
    h.requires_grad_(True)
    assert torch.autograd.gradcheck(relu2, (h,))
    assert torch.autograd.gradgradcheck(relu2, (h,))


def test_saves_only_h():
    saved = []
    h = torch.randn(4, 8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        relu2(h)
    assert len(saved) == 1 and saved[0] is h


def test_bf16_autocast_keeps_the_input_dtype_like_the_two_pass_expression():
    mlp_in = torch.randn(5, 16)
    fc = torch.nn.Linear(16, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = fc(mlp_in)
        new, old = relu2(h), F.relu(h).square()
    assert h.dtype == torch.bfloat16 and new.dtype == old.dtype == torch.bfloat16 and _same_bits(new, old)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a float32 tensor stays float32 (relu, square not cast)
        assert relu2(mlp_in).dtype == torch.float32


def test_torch_compile_traces_it_without_a_graph_break():
    h = torch.randn(7, 13, requires_grad=True)
    compiled = torch.compile(relu2, backend="aot_eager", fullgraph=True)
    y = compiled(h)
    y.backward(torch.ones_like(y))
    y_old, dh_old = _two_pass(h, torch.ones_like(y))
    assert _same_bits(y.detach(), y_old) and _same_bits(h.grad, dh_old)


def test_torch_export_sees_the_plain_aten_ops():
    """Under torch.export (Dynamo) the expression is traced as relu and square: no custom op to export."""
    mlp = MLP(GPTConfig(d_model=16, n_head=2, ffn_kind="relu2"))
    x = torch.randn(2, 3, 16)
    program = torch.export.export(mlp, (x,))
    ops = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert "aten.relu.default" in ops and "aten.square.default" in ops
    assert _same_bits(program.module()(x), _mlp_old(mlp, x))


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="h must be a floating-point torch.Tensor"):
        relu2(torch.arange(4))
    with pytest.raises(TypeError, match="h must be a floating-point torch.Tensor, got list"):
        relu2([1.0])


# --- the models that use it -----------------------------------------------------------------------
def _mlp_old(mlp: MLP, x: torch.Tensor) -> torch.Tensor:
    """The lab MLP's relu2 forward as it was written before: two passes."""
    return mlp.drop(mlp.proj(F.relu(mlp.fc(x)).square()))


def _grads_of(module, fn, x, dy):
    for p in module.parameters():
        p.grad = None
    xx = x.detach().clone().requires_grad_(True)
    y = fn(xx)
    y.backward(dy)
    return [y.detach(), xx.grad] + [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("autocast", [False, True])
def test_lab_relu2_mlp_is_unchanged_on_the_cpu(autocast):
    torch.manual_seed(0)
    mlp = MLP(GPTConfig(d_model=32, ffn_kind="relu2", n_head=2, bias=True))
    x, dy = torch.randn(3, 5, 32), torch.randn(3, 5, 32)

    def run(fn):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return _grads_of(mlp, fn, x, dy)

    new, old = run(mlp), run(lambda t: _mlp_old(mlp, t))
    assert all(_same_bits(a, b) for a, b in zip(new, old))


def test_lab_gpt_with_relu2_trains_to_the_same_bits_as_before(monkeypatch):
    """Two optimizer steps of the whole GPT, with the library's relu2 and with the old expression."""
    def train(old: bool):
        if old:
            monkeypatch.setattr(MLP, "forward", _mlp_old)
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, context=16, ffn_kind="relu2"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
        for _ in range(2):
            logits = model(idx)
            logits = logits[0] if isinstance(logits, tuple) else logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), idx.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        monkeypatch.undo()
        return [p.detach().clone() for p in model.parameters()]

    assert all(_same_bits(a, b) for a, b in zip(train(False), train(True)))


def test_bench_act24_dense_ffn_is_unchanged_on_the_cpu():
    torch.manual_seed(0)
    ffn = Relu2FFN(16, 64).to(torch.bfloat16)
    x, dy = torch.randn(9, 16).to(torch.bfloat16), torch.randn(9, 16).to(torch.bfloat16)
    new = _grads_of(ffn, ffn, x, dy)
    old = _grads_of(ffn, lambda t: ffn.proj(F.relu(ffn.fc(t)).square()), x, dy)
    assert all(_same_bits(a, b) for a, b in zip(new, old))


# --- the CUDA path's autograd, run on the CPU through the Triton interpreter (on CUDA where there is one)
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """Route tensors of DEV to the kernels, counting the calls: the fused branch of Relu2Fn as it runs on
    CUDA, here on the CPU through the interpreter (TRITON_INTERPRET=1 is set by conftest.py)."""
    pytest.importorskip("triton")
    from sparsity_lab.kernels import relu2 as module

    calls = []

    class Counting:
        def relu2_forward(self, h):
            calls.append("forward")
            return module.relu2_forward(h)

        def relu2_backward(self, dy, h):
            calls.append("backward")
            return module.relu2_backward(dy, h)

    monkeypatch.setattr(activations, "_fused_kernels",
                        lambda h: Counting() if h.dtype in activations.FUSED_DTYPES else None)
    return calls


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16))  # bf16: the interpreter's casts are off by 1 ulp
def test_fused_branch_of_the_autograd_function_matches_the_two_pass_expression(kernels_on_cpu, dtype):
    gen = torch.Generator().manual_seed(2)
    h = (3 * torch.randn(11, 37, generator=gen)).to(dtype).to(DEV)
    dy = torch.randn(11, 37, generator=gen).to(dtype).to(DEV)
    y, dh = _fused(h, dy)
    assert kernels_on_cpu == ["forward", "backward"]
    y_old, dh_old = _two_pass(h, dy)
    assert _same_bits(y, y_old) and _same_bits(dh, dh_old)
    # a non-contiguous upstream gradient (y.sum().backward() hands in an expanded one)
    hh = h.clone().requires_grad_(True)
    relu2(hh).sum().backward()
    assert _same_bits(hh.grad, _two_pass(h, torch.ones_like(h))[1])


def test_fused_branch_keeps_double_backward_differentiable(kernels_on_cpu):
    h = torch.randn(5, 7, dtype=torch.float32, device=DEV, requires_grad=True)
    (dh,) = torch.autograd.grad(relu2(h).sum(), h, create_graph=True)
    (d2,) = torch.autograd.grad(dh.sum(), h)
    assert kernels_on_cpu == ["forward"]  # the create_graph backward ran the reference's PyTorch ops
    torch.testing.assert_close(d2, 2.0 * (h > 0).float())


def test_without_triton_cuda_tensors_would_run_pytorch_with_one_warning():
    """The import of the kernels fails for want of triton: a Relu2FallbackWarning, then the reference."""
    import subprocess
    import sys

    from test_without_triton import BLOCK_TRITON

    code = BLOCK_TRITON + (
        "import warnings\n"
        "from sparsity_lab import activations\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    assert activations._kernels() is None and activations._kernels() is None\n"
        "assert [x.category.__name__ for x in w] == ['Relu2FallbackWarning'], w\n"
        "assert 'pip install triton' in str(w[0].message)\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# --- GPU: the CUDA path against the two-pass expression --------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32, torch.float16))
@pytest.mark.parametrize("shape", [(1, 1), (3, 4097), (257, 1031), (2, 33, 129)])
def test_gpu_fused_equals_the_two_pass_expression_bit_for_bit(dtype, shape):
    gen = torch.Generator().manual_seed(sum(shape))
    h = (3 * torch.randn(shape, generator=gen)).to(dtype)
    dy = torch.randn(shape, generator=gen).to(dtype)
    flat_h, flat_dy = h.reshape(-1), dy.reshape(-1)
    edge = _edge_values(dtype)[: flat_h.numel()]
    flat_h[: edge.numel()] = edge                      # zeros, -0.0, huge, subnormal, NaN, inf
    flat_dy[: edge.numel()] = edge.flip(0)
    h, dy = h.cuda(), dy.cuda()
    assert activations._fused_kernels(h) is not None, "the CUDA path must run the kernels"
    y, dh = _fused(h, dy)
    y_old, dh_old = _two_pass(h, dy)
    assert torch.equal(torch.isnan(y), torch.isnan(y_old)) and torch.equal(torch.isnan(dh), torch.isnan(dh_old))
    nan_y, nan_dh = torch.isnan(y), torch.isnan(dh)
    assert _same_bits(y.masked_fill(nan_y, 0), y_old.masked_fill(nan_y, 0))
    assert _same_bits(dh.masked_fill(nan_dh, 0), dh_old.masked_fill(nan_dh, 0))
    # non-contiguous input: a transposed view
    if len(shape) == 2 and shape[0] > 1:
        yt, dht = _fused(h.t(), dy.t())
        yt_old, dht_old = _two_pass(h.t(), dy.t())
        assert _same_bits(yt.nan_to_num(0.0), yt_old.nan_to_num(0.0))
        assert _same_bits(dht.nan_to_num(0.0), dht_old.nan_to_num(0.0))


@pytest.mark.gpu
@pytest.mark.parametrize("autocast", [False, True])
def test_gpu_lab_mlp_and_bench_ffn_match_the_two_pass_expression(autocast):
    torch.manual_seed(0)
    mlp = MLP(GPTConfig(d_model=96, ffn_kind="relu2", n_head=2, ffn_hidden=200)).cuda()
    x, dy = torch.randn(3, 37, 96, device="cuda"), torch.randn(3, 37, 96, device="cuda")

    def run(fn, module, x, dy):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            return _grads_of(module, fn, x, dy)

    def same(new, old):
        # the activation is bit for bit (test above), so every product sees identical operands: cuBLAS
        # gives the same bits for the same call on one GPU, and so must the whole FFN
        names = ["y", "dx"] + [f"grad {i}" for i in range(len(new) - 2)]
        differ = [name for name, a, b in zip(names, new, old) if not _same_bits(a, b)]
        assert not differ, f"differ from the two-pass FFN: {differ}"

    same(run(mlp, mlp, x, dy), run(lambda t: _mlp_old(mlp, t), mlp, x, dy))
    ffn = Relu2FFN(96, 384).to(device="cuda", dtype=torch.bfloat16)
    xb, dyb = x.reshape(-1, 96).bfloat16(), dy.reshape(-1, 96).bfloat16()
    same(run(ffn, ffn, xb, dyb), run(lambda t: ffn.proj(F.relu(ffn.fc(t)).square()), ffn, xb, dyb))


@pytest.mark.gpu
def test_gpu_relu2_inside_a_cuda_graph():
    """benchmarks act24 replays the dense FFN from a CUDA graph: the kernels must capture and replay."""
    h = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    relu2(h)  # compile the kernel before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = relu2(h)
    h.copy_(torch.randn_like(h))
    graph.replay()
    torch.cuda.synchronize()
    assert _same_bits(y, F.relu(h).square())
