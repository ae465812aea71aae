"""Bad input to the methods and the layer: a clear error that names the argument."""
import pytest
import torch

import sparsity_lab as sl
from sparsity_lab.methods.flip_rate import mask_flips
from sparsity_lab.methods.mvue import mvue24
from sparsity_lab.methods.soft_threshold import soft_threshold, sste_beta

NAN, INF = float("nan"), float("inf")


# --- method configs ------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n=5, m=4), ValueError, "n must satisfy 1 <= n <= m, got n=5, m=4"),
    (dict(n=0), ValueError, "n must satisfy 1 <= n <= m, got n=0"),
    (dict(m=0), ValueError, "m must be >= 1"),
    (dict(n=2.0), TypeError, r"n must be an int, got float \(2.0\)"),
    (dict(m="4"), TypeError, "m must be an int, got str"),
    (dict(n=True), TypeError, "n must be an int, got bool"),
    (dict(mask_refresh_interval=0), ValueError, "mask_refresh_interval must be an int >= 1, got 0"),
    (dict(mask_refresh_interval=2.5), ValueError, "mask_refresh_interval must be an int >= 1, got 2.5"),
    (dict(mvue=True, n=2, m=8), ValueError, "mvue=True implements MVUE 2:4.*set m=4"),
    (dict(mvue=1), TypeError, "mvue must be True or False, got 1"),
    (dict(transposable="yes"), TypeError, "transposable must be True or False"),
    (dict(total_steps=0), ValueError, "total_steps must be a positive int or None, got 0"),
    (dict(total_steps=10.0), ValueError, "total_steps must be a positive int"),
    (dict(total_steps=10, dense_finetune_at=1.5), ValueError, r"dense_finetune_at must be in \(0, 1\]"),
    (dict(total_steps=10, dense_finetune_at="late"), ValueError, "dense_finetune_at must be in"),
    (dict(dense_finetune_at=0.5), ValueError, "dense_finetune_at=0.5 needs total_steps"),
])
def test_method_config_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        sl.STE(**kwargs)


@pytest.mark.parametrize("cls", [sl.SRSTE, sl.MaskedDecay])
@pytest.mark.parametrize("decay", [-1e-4, NAN, INF, "big", True])
def test_negative_or_non_numeric_decay(cls, decay):
    with pytest.raises(ValueError, match="decay must be a finite number >= 0"):
        cls(decay=decay, total_steps=10)


def test_method_from_name():
    assert isinstance(sl.method_from_name("SR-STE", decay=1e-3), sl.SRSTE)
    assert isinstance(sl.method_from_name("S-STE"), sl.SSTE) and isinstance(sl.method_from_name("ste"), sl.STE)
    assert isinstance(sl.method_from_name("MaskedDecay", total_steps=6), sl.MaskedDecay)
    assert sl.method_from_name("masked_decay", total_steps=6).dense_finetune_step == 5
    with pytest.raises(ValueError, match="unknown method 'rigl'; choose one of"):
        sl.method_from_name("rigl")


# --- mvue24 --------------------------------------------------------------------------------------
def test_mvue_dim_not_divisible_by_4():
    with pytest.raises(ValueError, match="x has size 6 along dim 1, which is not divisible by m=4"):
        mvue24(torch.randn(4, 6))
    with pytest.raises(ValueError, match="x has size 6 along dim 0"):
        mvue24(torch.randn(6, 4), dim=0)


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_mvue_non_finite(bad):
    x = torch.randn(2, 8)
    x[1, 3] = bad
    with pytest.raises(ValueError, match=r"x contains 1 NaN/Inf value\(s\)"):
        mvue24(x)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_mvue_integer_dtype(dtype):
    with pytest.raises(TypeError, match="x must be a floating-point tensor.*got dtype"):
        mvue24(torch.ones(2, 8, dtype=dtype))


def test_mvue_other_bad_arguments():
    with pytest.raises(ValueError, match=r"x is empty \(shape \(0, 8\)\)"):
        mvue24(torch.empty(0, 8))
    with pytest.raises(ValueError, match="method must be 'exact' or 'sequential', got 'fast'"):
        mvue24(torch.randn(2, 8), method="fast")
    with pytest.raises(ValueError, match="dim=2 is out of range for a 2-D tensor"):
        mvue24(torch.randn(2, 8), dim=2)
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        mvue24([1.0, 2.0, 3.0, 4.0])


# --- soft_threshold / sste_beta ---------------------------------------------------------------
@pytest.mark.parametrize("bad", [NAN, INF])
def test_soft_threshold_non_finite(bad):
    w = torch.randn(2, 8)
    w[0, 0] = bad
    with pytest.raises(ValueError, match=r"weight contains 1 NaN/Inf value\(s\)"):
        soft_threshold(w)


def test_soft_threshold_bad_arguments():
    with pytest.raises(TypeError, match="weight must be a floating-point tensor"):
        soft_threshold(torch.ones(2, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="weight is empty"):
        soft_threshold(torch.empty(0, 8))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        soft_threshold(torch.randn(8))
    with pytest.raises(ValueError, match="weight has size 6 along dim 1, which is not divisible by m=4"):
        soft_threshold(torch.randn(2, 6))
    with pytest.raises(ValueError, match="n must satisfy 1 <= n <= m"):
        soft_threshold(torch.randn(2, 8), n=5)
    with pytest.raises(ValueError, match="m must be >= 1"):
        soft_threshold(torch.randn(2, 8), torch.ones(2, 8, dtype=torch.bool), m=0)


def test_soft_threshold_wrong_mask():
    w = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"mask has shape \(8, 4\), expected weight's \(4, 8\)"):
        soft_threshold(w, torch.ones(8, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a bool tensor.*got torch.float32"):
        soft_threshold(w, torch.ones(4, 8))
    with pytest.raises(TypeError, match="mask must be a bool tensor.*got list"):
        soft_threshold(w, [[True] * 8] * 4)


def test_sste_beta_shape_mismatch():
    w = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"soft has shape \(8,\), expected weight's \(4, 8\)"):
        sste_beta(w, torch.ones(8))  # would broadcast silently without the check


# --- flip rate ---------------------------------------------------------------------------------
def test_flip_rate_shape_mismatch():
    with pytest.raises(ValueError, match=r"masks differ in shape: \(2, 4\) vs \(4, 2\)"):
        mask_flips(torch.ones(2, 4, dtype=torch.bool), torch.ones(4, 2, dtype=torch.bool))


# --- the layer -----------------------------------------------------------------------------------
def test_layer_bad_construction():
    with pytest.raises(ValueError, match="in_features has size 10 along dim 1, which is not divisible by m=4"):
        sl.SparseLinear(10, 8, method=sl.STE())
    with pytest.raises(ValueError, match=r"out_features \(transposable mask\) has size 6"):
        sl.SparseLinear(8, 6, method=sl.STE(transposable=True))
    sl.SparseLinear(8, 6, method=sl.STE())  # row-wise masks do not constrain out_features
    with pytest.raises(TypeError, match="method must be a SparsityMethod.*got str"):
        sl.SparseLinear(8, 8, method="ste")
    with pytest.raises(ValueError, match=r"backend must be one of \[.*'torch'.*\], got 'cusparselt9'"):
        sl.SparseLinear(8, 8, method=sl.STE(backend="cusparselt9"))


@pytest.mark.filterwarnings("ignore:SparseLinear is training but no optimizer")
def test_layer_bad_input():
    layer = sl.SparseLinear(8, 4, method=sl.STE())
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., in_features=8\), got \(3, 6\)"):
        layer(torch.randn(3, 6))
    with pytest.raises(TypeError, match="x has dtype torch.float64 but the layer's weight is torch.float32"):
        layer(torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        layer(torch.ones(3, 8, dtype=torch.int64))


def test_layer_extra_state_missing_counters():
    layer = sl.SparseLinear(8, 4, method=sl.STE())
    state = layer.state_dict()
    state["_extra_state"] = state["_extra_state"][:-1]
    with pytest.raises(ValueError, match=r"extra state must hold 7 counters .* got a tensor of shape \(6,\)"):
        sl.SparseLinear(8, 4, method=sl.STE()).load_state_dict(state)
    # the dict of older checkpoints is still read, and a missing counter named
    old = dict(zip(("step", "mask_step", "mask_updates", "last_flips", "flips_total", "mvue_seed"), range(6)))
    state["_extra_state"] = old
    with pytest.raises(ValueError, match=r"extra state lacks counters \['mvue_calls'\]"):
        sl.SparseLinear(8, 4, method=sl.STE()).load_state_dict(state)
