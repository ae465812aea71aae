"""The lab GPT's key/value-cached inference (lab/decode.py): prefill + decode steps give the full forward's logits."""
import pytest
import torch

import sparsity_lab as sl
from sparsity_lab.export import ExportFallbackWarning
from sparsity_lab.lab import GPTConfig
from sparsity_lab.lab.decode import decode_step, prefill
from sparsity_lab.lab.model import GPT


@pytest.mark.parametrize("kind", ["gelu", "swiglu"])
def test_cached_decode_equals_the_full_forward(kind):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=16, context=12, ffn_kind=kind)).eval()
    idx = torch.randint(0, 256, (3, 12))
    with torch.no_grad():
        full, _ = model(idx)
    logits, cache = prefill(model, idx[:, :5])
    steps = [logits] + [decode_step(model, idx[:, t:t + 1], cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert cache.length == 12
    with pytest.raises(ValueError, match="exceed the model's context 12"):
        decode_step(model, idx[:, :1], cache)


def test_exported_2_4_model_decodes_with_its_own_layers():
    torch.manual_seed(0)
    model = sl.sparsify(GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, context=8)), sl.STE()).eval()
    with pytest.warns(ExportFallbackWarning):  # the CPU: S(W) kept dense
        served = sl.export(model)
    idx = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        full, _ = model(idx)
    logits, cache = prefill(served, idx[:, :7])
    last = decode_step(served, idx[:, 7:], cache)
    torch.testing.assert_close(torch.cat([logits, last], 1), full, rtol=1e-5, atol=1e-5)


def test_bad_input():
    model = GPT(GPTConfig(n_layer=1, n_head=1, d_model=8, context=4))
    with pytest.raises(ValueError, match="eval-mode"):
        prefill(model, torch.zeros(1, 2, dtype=torch.long))
    _, cache = prefill(model.eval(), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token must have shape \(B, 1\)"):
        decode_step(model, torch.zeros(1, 2, dtype=torch.long), cache)
    with pytest.raises(TypeError, match="run the lab GPT"):
        prefill(torch.nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long))
