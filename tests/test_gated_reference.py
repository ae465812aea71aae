"""The plain PyTorch gated activations (SwiGLU, GEGLU) against torch's own ops and autograd."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsity_lab.references.gated import activation, activation_grad, gated_backward, gated_forward

TORCH_ACT = {"swiglu": F.silu, "geglu": F.gelu}


@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
def test_forward_is_act_of_first_half_times_second_half(kind):
    h = torch.randn(5, 3, 14, dtype=torch.float64)
    expected = TORCH_ACT[kind](h[..., :7]) * h[..., 7:]
    torch.testing.assert_close(gated_forward(h, kind), expected)


@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
def test_activation_grad_matches_autograd(kind):
    g = torch.linspace(-8, 8, 401, dtype=torch.float64, requires_grad=True)
    (auto,) = torch.autograd.grad(activation(g, kind).sum(), g)
    torch.testing.assert_close(activation_grad(g.detach(), kind), auto)


@settings(max_examples=20, deadline=None)
@given(kind=st.sampled_from(["swiglu", "geglu"]), tokens=st.integers(1, 9), ffn=st.integers(1, 13),
       seed=st.integers(0, 2**31 - 1))
def test_backward_matches_autograd_in_both_layouts(kind, tokens, ffn, seed):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, 2 * ffn, dtype=torch.float64, generator=gen, requires_grad=True)
    dout = torch.randn(tokens, ffn, dtype=torch.float64, generator=gen)
    (auto,) = torch.autograd.grad((TORCH_ACT[kind](h[:, :ffn]) * h[:, ffn:] * dout).sum(), h)
    torch.testing.assert_close(gated_backward(dout, h.detach(), kind), auto)
    # the transposed product's output h^T (2F, T): same numbers, transposed
    ht = h.detach().t().contiguous()
    torch.testing.assert_close(gated_forward(ht, kind, split_dim=0), gated_forward(h.detach(), kind).t())
    torch.testing.assert_close(gated_backward(dout.t().contiguous(), ht, kind, split_dim=0), auto.t())


def test_low_precision_input_is_computed_in_float32_and_rounded_once():
    h = torch.randn(4, 16, dtype=torch.bfloat16)
    out = gated_forward(h, "swiglu")
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (F.silu(h.float()[:, :8]) * h.float()[:, 8:]).to(torch.bfloat16))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="kind"):
        gated_forward(torch.randn(2, 4), "relu")
    with pytest.raises(ValueError, match="even"):
        gated_forward(torch.randn(2, 5))
    with pytest.raises(ValueError, match="split_dim"):
        gated_forward(torch.randn(2, 4, 4), split_dim=1)
    with pytest.raises(ValueError, match="grad_out"):
        gated_backward(torch.randn(2, 3), torch.randn(2, 4))
    with pytest.raises(TypeError, match="h must be"):
        gated_forward(torch.ones(2, 4, dtype=torch.int32))
