"""A dense phase on an FP8 backend stays FP8: a Dense method (the dense FP8 baseline) and the dense
fine-tune run their products in E4M3 through the backend, not ``F.linear`` in the autocast dtype."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from sparsity_lab import SSTE, Dense, SparseLinear, attach_optimizer
from sparsity_lab.backends import get_backend
from sparsity_lab.backends.fp8_sim import fake_fp8
from sparsity_lab.lab.compare import FP8_VARIANTS, VARIANTS, _apply_rules, variant_config
from sparsity_lab.lab.trainer import TrainConfig, Trainer
from sparsity_lab.lab.model import GPTConfig

CUDA = torch.cuda.is_available()


def _dense_layer(backend: str, seed: int = 0, out_features: int = 32) -> SparseLinear:
    torch.manual_seed(seed)
    # transposable: "cusparselt_fp8" refuses any other mask at set-up (its sparse phase's dX needs it)
    layer = SparseLinear(64, out_features, method=Dense(track_flips=False, transposable=True, backend=backend))
    attach_optimizer(layer, torch.optim.SGD(layer.parameters(), lr=0.0))
    return layer


@pytest.mark.parametrize("backend", ["fp8_reference", "torch_fp8sim"])
def test_dense_method_runs_fp8_products_of_the_dense_weight(backend):
    layer = _dense_layer(backend)
    x = torch.randn(24, 64)
    z = layer(x)
    # the first step scales by the current amax: the products of the rounded operands
    expected = fake_fp8(x, "e4m3") @ fake_fp8(layer.weight.detach(), "e4m3").T + layer.bias.detach()
    torch.testing.assert_close(z, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(z, F.linear(x, layer.weight, layer.bias), rtol=1e-6, atol=1e-6)  # not the exact product
    dz = torch.randn_like(z) * 1e-2
    z.backward(dz)
    exact_dw = dz.T @ x
    assert float((layer.weight.grad - exact_dw).norm() / exact_dw.norm()) < 0.1  # a dense dW, FP8-rounded
    assert not torch.equal(layer.weight.grad, exact_dw)


def test_plain_backends_keep_f_linear_in_a_dense_phase():
    layer = _dense_layer("torch")
    x = torch.randn(8, 64)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)
    assert not get_backend("torch").products_in_dense_phase and get_backend("fp8_reference").products_in_dense_phase


def test_dense_finetune_on_fp8_runs_dense_fp8_products_without_mvue():
    torch.manual_seed(1)
    method = SSTE(mvue=True, transposable=True, backend="fp8_reference", dense_finetune_at=0.5, total_steps=4)
    layer = SparseLinear(64, 64, method=method)
    attach_optimizer(layer, torch.optim.SGD(layer.parameters(), lr=0.0))
    layer.step = 2  # the dense phase
    assert layer.dense_now
    x = torch.randn(16, 64)
    plan = layer.call_plan(x, training=True, grad_needed=True)
    assert plan is not None and plan.mvue is False and plan.decay == 0.0 and plan.operand.dense
    w = layer.weight.detach()
    assert (w == 0).sum() == 0  # the dense W, not S(W), is what the products read
    torch.testing.assert_close(plan.operand.weight, w)


def test_trainer_builds_a_dense_fp8_run_through_the_backend():
    cfg = TrainConfig(model=GPTConfig(vocab_size=256, context=16, n_layer=1, n_head=1, d_model=64),
                      method="dense", method_options={"backend": "fp8_reference"}, steps=2, batch_size=2,
                      eval_interval=2, eval_batches=1, device="cpu", data_max_bytes=200_000)
    trainer = Trainer(cfg)
    assert not trainer.plain_dense and trainer.layers
    plain = Trainer(dataclasses.replace(cfg, method_options={"backend": "torch"}))
    assert plain.plain_dense


def test_compare_fp8_variants_take_their_backends_and_claim_six_is_judged():
    base = TrainConfig(model=GPTConfig(vocab_size=256, context=16, n_layer=1, n_head=1, d_model=64), steps=2)
    for variant, backend in FP8_VARIANTS.items():
        cfg = variant_config(base, variant, {"backend": "triton"}, None, None)
        assert cfg.method_options["backend"] == backend
    assert VARIANTS["sste_mvue_fp8"][1]["transposable"] is True
    rows = {"dense": {"final_val_loss": 1.0}, "sste_mvue": {"final_val_loss": 1.02},
            "sste_mvue_fp8": {"final_val_loss": 1.025}, "dense_fp8": {"final_val_loss": 0.99}}
    claims = {c["claim"][:2]: c for c in _apply_rules(rows)}
    assert claims["6."]["holds"] is True
    assert "dense_fp8" not in claims["5."]["evidence"]  # a dense run is never "the best 2:4"
    rows["sste_mvue_fp8"]["final_val_loss"] = 1.04
    assert {c["claim"][:2]: c for c in _apply_rules(rows)}["6."]["holds"] is False
    assert "6." not in {c["claim"][:2] for c in _apply_rules({"dense": {"final_val_loss": 1.0}})}


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["cusparselt_fp8", "fp8_dense"])
def test_gpu_dense_phase_matches_the_reference(name):
    """Dense W on the GPU engines (dense FP8 products even on the sparse engine) against fp8_reference."""
    torch.manual_seed(4)
    # 64 x 64: the sparse FP8 engine checks the sparse phase's shapes (multiples of 64) at set-up
    real = _dense_layer(name, out_features=64).cuda().to(torch.bfloat16)
    ref = _dense_layer("fp8_reference", out_features=64).cuda().to(torch.bfloat16)
    ref.load_state_dict(real.state_dict())
    x = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16)
    z, z_ref = real(x), ref(x)
    assert float((z.float() - z_ref.float()).norm() / z_ref.float().norm()) < 1e-2
    dz = torch.randn_like(z)
    z.backward(dz)
    z_ref.backward(dz)
    g, g_ref = real.weight.grad.float(), ref.weight.grad.float()
    assert float((g - g_ref).norm() / g_ref.norm()) < 2e-2
