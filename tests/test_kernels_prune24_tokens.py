"""Kernel 17 (gather permuted tokens, 2:4 along the tokens, cuSPARSELt compression) against the reference
``sparsity_lab.references.act24_tokens``; on the GPU, the cuSPARSELt weight-gradient products too."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE

from sparsity_lab.kernels.prune24_tokens import padded_tokens, prune24_tokens
from sparsity_lab.references.act24_tokens import (dense_feature_count, dense_features, tokens24_weight_grad,
                                                  top2of4_tokens_mask)
from sparsity_lab.references.cusparselt_layout import compress24_reference, decompress24_reference

DTYPES = (torch.bfloat16, torch.float16)


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def _fresh(tokens, hidden, dtype, gen, kind):
    a = torch.randn(tokens, hidden, generator=gen)
    if kind == "ties":  # few distinct magnitudes, both signs
        a = torch.randint(-2, 3, (tokens, hidden), generator=gen).float()
    elif kind == "zeros":  # squared ReLU: mostly exact zeros
        a = torch.relu(a - 1.0) ** 2
    elif kind == "wide":  # magnitudes over many decades (within the dtype's range)
        a = a * torch.exp(3 * torch.randn(tokens, hidden, generator=gen))
    return a.to(dtype)


def expected_operand(a, perm, features):
    """B^T = top2of4_tokens(A[P][:, S])^T, padded with zero tokens to a multiple of 64: (|S|, tokens_pad)."""
    b = a[perm][:, features]
    bt = (b * top2of4_tokens_mask(b)).t()
    return F.pad(bt, (0, padded_tokens(a.shape[0]) - a.shape[0])).contiguous()


@settings(max_examples=10, deadline=None)
@given(tokens=st.integers(1, 150), feature_tiles=st.integers(1, 2), extra=st.integers(0, 9),
       dtype=st.sampled_from(DTYPES), kind=st.sampled_from(["plain", "ties", "zeros", "wide"]),
       transposed=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_bytes_equal_the_compressed_reference(tokens, feature_tiles, extra, dtype, kind, transposed, seed):
    gen = torch.Generator().manual_seed(seed)
    n_feat = 64 * feature_tiles
    hidden = n_feat + extra
    a = _fresh(tokens, hidden, dtype, gen, kind)
    if transposed:  # a (tokens, hidden) view of a (hidden, tokens) buffer
        a = a.t().contiguous().t()
    perm = torch.randperm(tokens, generator=gen)
    features = torch.sort(torch.randperm(hidden, generator=gen)[:n_feat]).values
    want = expected_operand(a, perm, features)
    got = prune24_tokens(a.to(DEVICE), perm.to(DEVICE), features.to(DEVICE), check=True).cpu()
    assert torch.equal(_bytes(got), _bytes(compress24_reference(want)))
    assert torch.equal(decompress24_reference(got, n_feat, padded_tokens(tokens)), want)


def test_nan_and_infinities_rank_as_the_reference():
    a = torch.zeros(8, 64, dtype=torch.bfloat16)
    a[:4, 0] = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    a[4:, 1] = torch.tensor([-float("inf"), 3.0, 3.0, 3.0])
    perm, features = torch.arange(8), torch.arange(64)
    got = prune24_tokens(a.to(DEVICE), perm.to(DEVICE), features.to(DEVICE)).cpu()
    want = expected_operand(a, perm, features)
    assert torch.equal(_bytes(got), _bytes(compress24_reference(want)))


def test_bad_inputs_are_refused_with_the_reason():
    a = torch.randn(16, 64, dtype=torch.bfloat16).to(DEVICE)
    perm, feats = torch.arange(16).to(DEVICE), torch.arange(64).to(DEVICE)
    with pytest.raises(TypeError, match="a must have dtype"):
        prune24_tokens(a.float(), perm, feats)
    with pytest.raises(ValueError, match="features must hold a positive multiple of 64"):
        prune24_tokens(a, perm, feats[:32])
    with pytest.raises(ValueError, match="perm must have one entry per token"):
        prune24_tokens(a, perm[:8], feats)
    with pytest.raises(TypeError, match="perm must be a 1-D int32 / int64"):
        prune24_tokens(a, perm.float(), feats)
    with pytest.raises(ValueError, match="perm must be a permutation"):
        prune24_tokens(a, torch.zeros_like(perm), feats, check=True)
    with pytest.raises(ValueError, match="features must be column indices"):
        prune24_tokens(a, perm, feats + 1, check=True)


def _rel(got, want):
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


class _DecompressingOps:
    """cuSPARSELt's product A @ B stood in for on the CPU: the compressed A decompressed through the
    reference layout, then a float32 product rounded to B's dtype."""

    def mm(self, compressed, b, bias, transpose_result, config):
        assert bias is None and not transpose_result
        return (decompress24_reference(compressed, compressed.shape[0], b.shape[0]).float() @ b.float()).to(b.dtype)


def _products_with_stand_in_ops():
    import types

    from sparsity_lab.backends.cusparselt.backend import CusparseltBackend

    backend = CusparseltBackend(ops=_DecompressingOps(), sweep=False)
    backend.algorithms = types.SimpleNamespace(get=lambda key, device: None)  # no algorithm search
    return backend


def test_cusparselt_products_with_stand_in_ops_match_the_reference():
    """The cuSPARSELt path's own work (token padding, the dense features, kernels 12, 13 and 17, G[P], where
    the results land) with the sparse product stood in for: Act24MLP with tokens24 against
    TorchBackend(token_feature_multiple=64) on 70 tokens (padded to 128), bf16."""
    from sparsity_lab.activation24 import Act24MLP
    from sparsity_lab.backends.torch_reference import TorchBackend

    if DEVICE.type == "cuda":
        pytest.skip("the stand-in product runs on the CPU (the GPU tests below use cuSPARSELt itself)")
    runs = []
    for backend in (_products_with_stand_in_ops(), TorchBackend(token_feature_multiple=64)):
        torch.manual_seed(0)
        mlp = Act24MLP(32, 128, weight_grads="tokens24", token_seed=4).to(torch.bfloat16)
        mlp.backend = backend
        x = torch.randn(70, 32, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(70, 32, dtype=torch.bfloat16)
        y = mlp(x)
        y.backward(dy)
        runs.append([y.detach(), x.grad, mlp.fc.weight.grad, mlp.proj.weight.grad])
    for name, fast, ref in zip(("y", "dx", "dW1", "dW2"), *runs):
        assert _rel(fast, ref) < 2e-2, (name, _rel(fast, ref))
    gen = torch.Generator().manual_seed(3)
    a = _fresh(70, 192, torch.bfloat16, gen, "zeros")
    g = _fresh(70, 24, torch.bfloat16, gen, "plain")
    perm = torch.randperm(70, generator=gen)
    got = _products_with_stand_in_ops().tokens24_weight_grad(a, g, perm, 64)
    assert _rel(got, tokens24_weight_grad(a.float(), g.float(), perm, 64)) < 1e-2


# --- on the GPU: the cuSPARSELt weight-gradient products (run by hand on the H100) ------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1000, 333, 64])
@pytest.mark.parametrize("kind", ["zeros", "wide", "ties"])
def test_cusparselt_token_weight_grad_matches_the_reference_on_gpu(tokens, kind):
    """C ~ A^T G through kernel 17 and cuSPARSELt against the reference on the same bf16 operands (the
    reference's products in float32), odd token counts, squared-ReLU zeros, wide magnitudes, ties."""
    from sparsity_lab.backends import get_backend

    gen = torch.Generator().manual_seed(tokens)
    hidden, k = 1024, 256
    a = _fresh(tokens, hidden, torch.bfloat16, gen, kind).cuda()
    g = _fresh(tokens, k, torch.bfloat16, gen, "plain").cuda()
    perm = torch.randperm(tokens, generator=gen).cuda()
    backend = get_backend("cusparselt")
    for frac in (0.05, 0.0, 1.0):
        count = dense_feature_count(hidden, frac, backend.token_feature_multiple)
        got = backend.tokens24_weight_grad(a, g, perm, count)
        want = tokens24_weight_grad(a.float(), g.float(), perm, count)
        assert got.shape == (hidden, k) and got.dtype == torch.bfloat16
        assert _rel(got, want) < 1e-2, (frac, _rel(got, want))
        dense, _ = dense_features(a, count)
        torch.testing.assert_close(got[dense].float(), (a[:, dense].float().t() @ g.float()), rtol=2e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("combined", [False, True])
def test_act24_mlp_tokens24_on_cusparselt_matches_the_reference_on_gpu(combined):
    """Act24MLP with weight_grads='tokens24' on cuSPARSELt against TorchBackend(token_feature_multiple=64)
    (the same dense features and permutations): y, dx and both weight gradients, 1000 tokens (padded
    to 1024), alone and with 2:4 weights on both linears."""
    import sparsity_lab as sl
    from sparsity_lab.activation24 import Act24MLP, weight_selector
    from sparsity_lab.backends import get_backend
    from sparsity_lab.backends.torch_reference import TorchBackend

    runs = []
    for products in (get_backend("cusparselt"), TorchBackend(token_feature_multiple=64)):
        torch.manual_seed(0)
        model = torch.nn.Sequential()
        model.add_module("mlp", Act24MLP(256, 1024, weight_grads="tokens24", token_seed=9))
        model = model.cuda().to(torch.bfloat16)
        if combined:
            sl.sparsify(model, sl.STE(transposable=True, backend="cusparselt"), select=weight_selector)
            sl.attach_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.0))
        model.mlp.backend = products
        gen = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(1000, 256, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        dy = torch.randn(1000, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
        y = model(x)
        y.backward(dy)
        runs.append([y.float(), x.grad.float(), model.mlp.fc.weight.grad.float(), model.mlp.proj.weight.grad.float()])
        assert int(model.mlp.token_draws) == 2
    for name, fast, ref in zip(("y", "dx", "dW1", "dW2"), *runs):
        assert _rel(fast, ref) < 2e-2, (name, _rel(fast, ref))
